"""Faults in the model worker's process groups, through the whole service (`processes` placement, 2 DiT ranks,
decode in its own group): a denoise rank SIGKILLed mid-chunk, and a rank that never answers. Either way the
sessions on that worker fail with a stable reason, their slots are freed, `/readyz` says not ready until the group
has restarted (with back-off) and ready after, the next session runs, and the service process carries on.

One app (its process groups are the expensive part) serves both tests, one after the other.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from admission import ExecutionLease
from pipeline.bidirectional import ControlState
from pipeline.lingbot.policy.service import LingBotService
from service.settings import Settings
from service.workers import process_placement, worker_options
from tests.support.reliability import WAIT_S, App, running_app, samples, total, wait_status
from tests.support.service_harness import RecordingTransport
from tests.support.sharded_world import KILL_SEED, STUCK_SEED, FaultyShardedFactory
from tests.support.waits import until
from tests.support.worker_stages import SPAWN
from transport.base import ChunkStatus, DoneStatus

in_module_loop = pytest.mark.asyncio(loop_scope="module")

CALL_TIMEOUT_S = 4.0
SMALL = {"width": 64, "height": 48, "fps": 16, "chunk_size": 1, "hud": False}
HELD = frozenset({"w"})
STARTED = SPAWN.Event()


def faulty_workers(settings: Settings) -> list[LingBotService]:
    """The product's own placement for these settings, over the faulty reference model and a short call timeout."""
    workers = []
    for options in worker_options(settings):
        placement = dataclasses.replace(
            process_placement(options),
            factory=FaultyShardedFactory(STARTED),
            call_timeout_s=CALL_TIMEOUT_S,
            restart_backoff_initial_s=0.2,
            stop_timeout_s=2.0,
        )
        workers.append(LingBotService(placement, lease=ExecutionLease(), history=options.session_history))
    return workers


@dataclasses.dataclass
class Harness:
    app: App
    transport: RecordingTransport

    @property
    def worker(self) -> LingBotService:
        worker: LingBotService = self.app.workers[0]
        return worker

    def chunks(self, session_id: str) -> int:
        return sum(isinstance(status, ChunkStatus) for status in self.transport.statuses.get(session_id, []))

    async def start_session(self, seed: int) -> str:
        created = (await self.app.create({"config": {**SMALL, "seed": seed}})).json()
        assert created["status"] == "running", created
        self.transport.ports[created["id"]].push_control(ControlState(1, HELD))  # keep generating
        return str(created["id"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def harness() -> AsyncIterator[Harness]:
    transport = RecordingTransport()
    overrides: dict[str, Any] = {
        "stage_placement": "processes",
        "denoise_ranks": 2,
        "torch_threads": 1,
        "max_sessions_per_worker": 2,
        "queue_size": 2,
    }
    async with running_app(faulty_workers, transport=transport, **overrides) as app:
        yield Harness(app, transport)


async def _expect_unready_then_ready(harness: Harness) -> None:
    runtime = harness.app.runtime
    await until(lambda: not runtime.readiness().ready, "readiness to turn false", within=CALL_TIMEOUT_S + 10)
    assert (await harness.app.client.get("/readyz")).status_code == 503
    await until(lambda: runtime.readiness().ready, "the restarted group to make the worker ready", within=60)
    assert (await harness.app.client.get("/readyz")).status_code == 200


async def _slots_free_and_next_session_runs(harness: Harness) -> None:
    text = await harness.app.metrics()
    assert total(text, "lingstream_admission_slots_retained") == 0
    assert total(text, "lingstream_admission_slot_mismatch") == 0
    fresh = await harness.start_session(seed=7)
    await until(lambda: harness.chunks(fresh) >= 3, "the next session on the restarted group", within=WAIT_S)
    assert (await harness.app.client.delete(f"/v1/sessions/{fresh}")).json()["status"] == "closed"


@in_module_loop
async def test_a_denoise_rank_killed_mid_chunk_fails_its_sessions_and_the_group_restarts(harness: Harness) -> None:
    pid = os.getpid()
    doomed = await harness.start_session(KILL_SEED)
    bystander = await harness.start_session(seed=1)  # its DiT state lives in the same group
    assert await asyncio.to_thread(STARTED.wait, 60), "rank 1 never reached the faulty chunk"
    dit = harness.worker.worker_statistics()["denoise"]
    assert dit.incarnation == 1
    rank_1 = dit.pids[1]

    os.kill(rank_1, signal.SIGKILL)

    await _expect_unready_then_ready(harness)
    for session in (doomed, bystander):
        failed = await wait_status(harness.app, session, "failed")
        assert failed["error"]["code"] == "model_failure"
        message = failed["error"]["message"]
        assert "actor 'denoise' died (incarnation 1)" in message
        assert f"rank 1 (pid {rank_1}) exited with exit code -9 (SIGKILL)" in message
        assert harness.transport.statuses[session][-1] == DoneStatus("model_failure")
    groups = harness.worker.worker_statistics()
    assert (groups["denoise"].incarnation, groups["denoise"].restarts) == (2, 1)
    assert groups["encode"].incarnation == groups["decode"].incarnation == 1  # only the dead group restarted
    assert os.getpid() == pid
    restarts = samples(await harness.app.metrics(), "lingstream_pipeline_actor_restarts_total")
    assert restarts['{stage="denoise",worker="0"}'] == 1
    await _slots_free_and_next_session_runs(harness)


@in_module_loop
async def test_a_rank_that_never_answers_is_caught_by_the_call_timeout(harness: Harness) -> None:
    before = harness.worker.worker_statistics()["denoise"].incarnation
    stuck = await harness.start_session(STUCK_SEED)

    await _expect_unready_then_ready(harness)
    failed = await wait_status(harness.app, stuck, "failed")
    assert failed["error"]["code"] == "model_failure"
    message = failed["error"]["message"]
    assert f"actor 'denoise' died (incarnation {before})" in message
    # Rank 1 never answers; rank 0 waits for it in the all-gather: neither finished the call.
    assert f"rank(s) 0, 1 did not finish stage 'denoise' session '{stuck}' sequence 1" in message
    assert f"within {CALL_TIMEOUT_S:g} s (stuck)" in message
    assert harness.worker.worker_statistics()["denoise"].incarnation == before + 1
    await _slots_free_and_next_session_runs(harness)
