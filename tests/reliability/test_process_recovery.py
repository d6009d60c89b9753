"""A session outlives its model worker (issue #33, docs/continuity.md): through the whole service (`processes`
placement, 2 DiT ranks, the reference model), a DiT rank SIGKILLed in the middle of a chunk does not end the
session. It moves to `recovering` (REST and the client's `state` status), the group restarts, the session is
re-seeded from its checkpoint on it and goes on with the same id and slot; its chunks continue without a gap, and
every frame, before and after the kill, equals what the reference model makes for the same controls, pose and seed
without any interruption (replayed here, stage by stage).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from admission import ExecutionLease
from pipeline.bidirectional import ChunkOutput, ControlState
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.policy.recovery import RecoveryBudget
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceWorldModel
from service.settings import Settings
from service.workers import process_placement, worker_options
from tests.support.reliability import WAIT_S, replay_uninterrupted, running_app, samples, total, wait_status
from tests.support.service_harness import FramesTransport
from tests.support.sharded_world import FAULT_CHUNK, KILL_ONCE_SEED, FaultyShardedFactory
from tests.support.waits import until
from tests.support.worker_stages import SPAWN
from transport.base import StateStatus

in_module_loop = pytest.mark.asyncio(loop_scope="module")

SMALL = {"width": 64, "height": 48, "fps": 16, "chunk_size": 1, "hud": False}
HELD = frozenset({"w", "l"})
STARTED = SPAWN.Event()
RECOVERY_BOUND_S = 60.0
"""Kill to the first chunk after it, on this shared 2-core machine (the group's restart back-off is 0.2 s)."""


def recovering_workers(settings: Settings) -> list[LingBotService]:
    """The product's placement for these settings over the reference model with a kill-once fault in rank 1."""
    workers = []
    for options in worker_options(settings):
        placement = dataclasses.replace(
            process_placement(options),
            factory=FaultyShardedFactory(STARTED),
            restart_backoff_initial_s=0.2,
            stop_timeout_s=2.0,
        )
        budget = RecoveryBudget(attempts=options.recovery_attempts, timeout_s=options.recovery_timeout)
        workers.append(
            LingBotService(placement, lease=ExecutionLease(), history=options.session_history, recovery=budget)
        )
    return workers


def replay(config: LingBotSessionConfig, chunks: list[ChunkOutput]) -> list[np.ndarray[Any, Any]]:
    """What the reference model makes, uninterrupted, for these chunks' controls (stage by stage, in one thread)."""
    return replay_uninterrupted(ReferenceWorldModel("cpu"), config, chunks)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def app() -> AsyncIterator[Any]:
    transport = FramesTransport()
    overrides: dict[str, Any] = {
        "stage_placement": "processes",
        "denoise_ranks": 2,
        "torch_threads": 1,
        "max_sessions_per_worker": 2,
        "queue_size": 2,
        "recovery_attempts": 3,
        "recovery_timeout": 60,
    }
    async with running_app(recovering_workers, transport=transport, **overrides) as running:
        yield running, transport


@in_module_loop
async def test_a_rank_killed_mid_chunk_leaves_its_session_running_with_the_frames_of_an_uninterrupted_run(
    app: Any,
) -> None:
    running, transport = app
    created = (await running.create({"config": {**SMALL, "seed": KILL_ONCE_SEED}})).json()
    assert created["status"] == "running", created
    sid = str(created["id"])
    transport.ports[sid].push_control(ControlState(1, HELD))
    assert await asyncio.to_thread(STARTED.wait, 60), "rank 1 never reached the faulty chunk"
    # Killed before chunk 0 reached the reader, the checkpoint still says chunk 0 and the session merely restarts:
    # equal frames would then prove no re-seed. Wait for it, so the re-seed goes on from a later chunk.
    await until(lambda: len(transport.chunks[sid]) >= 1, "chunk 0 before the kill", within=WAIT_S)
    worker: LingBotService = running.workers[0]
    dit = worker.worker_statistics()["denoise"]
    assert dit.incarnation == 1

    os.kill(dit.pids[1], signal.SIGKILL)
    killed_at = time.monotonic()

    recovering = await wait_status(running, sid, "recovering", within=WAIT_S)
    assert recovering["id"] == sid
    text = await running.metrics()
    assert total(text, "lingstream_admission_slots_retained") == 1  # the slot stays held while it is rebuilt
    await until(
        lambda: any(c.index > FAULT_CHUNK for c in transport.chunks[sid]),
        "a chunk after the kill",
        within=RECOVERY_BOUND_S,
    )
    recovery_s = time.monotonic() - killed_at
    await until(lambda: len(transport.chunks[sid]) >= FAULT_CHUNK + 5, "frames to go on", within=WAIT_S)
    assert (await running.get(sid))["status"] == "running"

    states = [s.state for s in transport.statuses[sid] if isinstance(s, StateStatus)]
    assert states[-2:] == ["recovering", "running"], states
    assert worker.worker_statistics()["denoise"].incarnation == 2
    chunks = list(transport.chunks[sid])
    assert [c.index for c in chunks] == list(range(len(chunks)))  # no gap, no chunk twice
    assert all(c.applied_seq == 1 for c in chunks[1:])
    config = LingBotSessionConfig.from_mapping({**SMALL, "seed": KILL_ONCE_SEED})
    for chunk, expected in zip(chunks, replay(config, chunks), strict=True):
        assert np.array_equal(chunk.frames, expected), f"chunk {chunk.index} differs from the uninterrupted run"

    text = await running.metrics()
    assert samples(text, "lingstream_sessions_recovered_total") == {'{cause="worker_lost"}': 1.0}
    assert total(text, "lingstream_session_recovery_seconds_count") == 1
    assert (await running.client.delete(f"/v1/sessions/{sid}")).json()["status"] == "closed"

    async def slot_back() -> bool:
        return total(await running.metrics(), "lingstream_admission_slots_retained") == 0

    await until(slot_back, "the slot to go back", within=WAIT_S)
    print(f"recovery (kill to the first chunk after it, in-process): {recovery_s:.2f} s")
