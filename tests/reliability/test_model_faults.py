"""Faults inside the model workers, through the whole service: a stage raising mid-chunk, a stage's cleanup hook
failing, and a worker process killed with SIGKILL mid-chunk. In each case the session at fault ends with a clean
error status, every other session carries on, no admission slot leaks, and the worker serves new sessions."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest

from pipeline.bidirectional import ControlState
from pipeline.core import PipelineSessionState
from pipeline.errors import SessionPoisonedError
from tests.support.process_world import ProcessWorld
from tests.support.reliability import WAIT_S, App, running_app, samples, total, wait_status
from tests.support.service_harness import RecordingTransport
from tests.support.waits import until
from tests.support.worker_stages import SPAWN
from tests.support.worlds import FAIL_AT_CHUNK, FAIL_SEED, POISON_SEED, TINY, faulty_lingbot_workers
from transport.base import ChunkStatus, DoneStatus, ErrorStatus

HELD = frozenset({"w"})


def _chunks(transport: RecordingTransport, session_id: str) -> int:
    return sum(isinstance(message, ChunkStatus) for message in transport.statuses.get(session_id, []))


async def _slots_consistent(app: App) -> dict[str, Any]:
    text = await app.metrics()
    return {
        "mismatch": total(text, "lingstream_admission_slot_mismatch"),
        "retained": total(text, "lingstream_admission_slots_retained"),
        "live": total(text, "lingstream_sessions"),
        "text": text,
    }


async def test_a_stage_raising_mid_chunk_fails_only_its_session_and_frees_its_slot() -> None:
    transport = RecordingTransport()
    async with running_app(faulty_lingbot_workers, transport=transport, max_sessions_per_worker=2) as app:
        doomed = (await app.create({"config": {**TINY, "seed": FAIL_SEED}})).json()
        healthy = (await app.create({"config": {**TINY, "seed": 1}})).json()
        waiting = (await app.create({"config": {**TINY, "seed": 2}})).json()
        assert (doomed["status"], healthy["status"], waiting["status"]) == ("running", "running", "queued")
        for session in (doomed, healthy):
            transport.ports[session["id"]].push_control(ControlState(1, HELD))  # keep generating

        failed = await wait_status(app, doomed["id"], "failed")
        assert failed["error"]["code"] == "model_failure"
        assert "injected denoise failure" in failed["error"]["message"]
        statuses = transport.statuses[doomed["id"]]
        assert _chunks(transport, doomed["id"]) == FAIL_AT_CHUNK  # the chunks before the fault were delivered
        assert isinstance(statuses[-2], ErrorStatus)
        assert statuses[-2].code == "model_failure"
        assert statuses[-1] == DoneStatus("model_failure")

        # The freed slot goes to the queue head; the other running session keeps generating.
        admitted = await wait_status(app, waiting["id"], "running")
        assert admitted["queue_position"] is None
        before = _chunks(transport, healthy["id"])
        await until(
            lambda: _chunks(transport, healthy["id"]) >= before + 3, "the healthy session to go on", within=WAIT_S
        )
        assert (await app.get(healthy["id"]))["status"] == "running"

        figures = await _slots_consistent(app)
        assert figures["mismatch"] == 0
        assert figures["retained"] == 2
        assert samples(figures["text"], "lingstream_sessions_ended_total")['{state="failed"}'] == 1
        failures = samples(figures["text"], "lingstream_pipeline_actor_failures_total")
        assert failures['{stage="denoise",worker="0"}'] == 1

        for session in (healthy, waiting):
            deleted = await app.client.delete(f"/v1/sessions/{session['id']}")
            assert deleted.json()["status"] == "closed"
        figures = await _slots_consistent(app)
        assert (figures["retained"], figures["mismatch"], figures["live"]) == (0, 0, 0)


async def test_a_failing_cleanup_hook_poisons_the_session_id_until_the_retry_succeeds() -> None:
    transport = RecordingTransport()
    async with running_app(faulty_lingbot_workers, transport=transport) as app:
        worker = app.workers[0]
        orchestrator = worker.orchestrator
        poisoned = (await app.create({"config": {**TINY, "seed": POISON_SEED}})).json()
        await until(lambda: _chunks(transport, poisoned["id"]) >= 1, "the first chunk", within=WAIT_S)
        closed = (await app.client.delete(f"/v1/sessions/{poisoned['id']}")).json()
        assert closed["status"] == "closed"

        # The decoder's release failed: the id is poisoned and can never be opened again until a retry works.
        assert orchestrator.session_state(poisoned["id"]) is PipelineSessionState.POISONED
        text = await app.metrics()
        assert samples(text, "lingstream_pipeline_sessions_poisoned") == {'{worker="0"}': 1.0}
        assert total(text, "lingstream_pipeline_cleanup_failures_total") == 1
        with pytest.raises(SessionPoisonedError, match="decode"):
            orchestrator.open_session(poisoned["id"])

        # The admission slot came back: the next session runs on the same worker.
        other = (await app.create({"config": {**TINY, "seed": 3}})).json()
        assert other["status"] == "running"
        await until(lambda: _chunks(transport, other["id"]) >= 1, "the next session's first chunk", within=WAIT_S)

        # The service retries the failed release by itself (after RETRY_S); the retry succeeds and clears the poison.
        await until(lambda: orchestrator.statistics().core.poisoned_sessions == (), "the release retry", within=10)
        assert worker.decoder.release_attempts[poisoned["id"]] == 2
        text = await app.metrics()
        assert samples(text, "lingstream_pipeline_sessions_poisoned") == {'{worker="0"}': 0.0}
        assert total(text, "lingstream_pipeline_cleanup_failures_total") == 1
        assert (await app.client.delete(f"/v1/sessions/{other['id']}")).json()["status"] == "closed"
        figures = await _slots_consistent(app)
        assert (figures["retained"], figures["mismatch"], figures["live"]) == (0, 0, 0)


async def test_a_worker_process_killed_mid_chunk_fails_its_sessions_and_the_others_continue() -> None:
    started = [SPAWN.Event(), SPAWN.Event()]
    transport = RecordingTransport()

    def factory(settings: Any) -> list[ProcessWorld]:
        return [ProcessWorld(started[index]) for index in range(settings.num_workers)]

    async with running_app(factory, transport=transport, num_workers=2, max_sessions_per_worker=2, queue_size=2) as app:
        blocking = (await app.create({"config": {"block_at": 3}})).json()
        holder = (await app.create({})).json()
        bystander = (await app.create({})).json()
        assert {blocking["status"], holder["status"], bystander["status"]} == {"running"}
        where = {sid: index for index, world in enumerate(app.workers) for sid in world.session_ids()}
        victim = where[blocking["id"]]
        doomed = [sid for sid, index in where.items() if index == victim]
        spared = [sid for sid, index in where.items() if index != victim]
        assert spared, where
        assert await asyncio.to_thread(started[victim].wait, 30), "the blocking chunk never started"
        (pid,) = app.workers[victim].actor.worker_statistics().pids

        os.kill(pid, signal.SIGKILL)

        for sid in doomed:
            failed = await wait_status(app, sid, "failed")
            assert failed["error"]["code"] == "model_failure"
            assert "died" in failed["error"]["message"]
            assert transport.statuses[sid][-1] == DoneStatus("model_failure")
        await until(lambda: not app.runtime.readiness().ready, "readiness to turn false", within=5)
        before = {sid: _chunks(transport, sid) for sid in spared}
        await until(
            lambda: all(_chunks(transport, sid) >= before[sid] + 3 for sid in spared),
            "the sessions on the other worker to go on",
            within=WAIT_S,
        )
        await until(lambda: app.runtime.readiness().ready, "readiness to recover", within=30)
        assert (await app.client.get("/readyz")).status_code == 200
        assert app.workers[victim].actor.incarnation == 2

        retained = samples(await app.metrics(), "lingstream_admission_slots_retained")
        assert retained[f'{{worker="{victim}"}}'] == 0
        fresh = (await app.create({})).json()
        assert fresh["status"] == "running"
        await until(
            lambda: _chunks(transport, fresh["id"]) >= 2, "a new session on the restarted worker", within=WAIT_S
        )
        text = await app.metrics()
        assert samples(text, "lingstream_pipeline_actor_restarts_total")[f'{{stage="render",worker="{victim}"}}'] == 1
        for sid in [*spared, fresh["id"]]:
            assert (await app.client.delete(f"/v1/sessions/{sid}")).json()["status"] == "closed"
        figures = await _slots_consistent(app)
        assert (figures["retained"], figures["mismatch"], figures["live"]) == (0, 0, 0)
