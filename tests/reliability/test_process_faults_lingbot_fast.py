"""A LingBot-World-Fast DiT rank killed mid-chunk under Ulysses context parallelism (`processes`, 2 DiT ranks, the
tiny checkpoint): the session fails exactly as with the reference model's sharded DiT (`test_process_faults.py`):
`model_failure` naming the dead rank, `/readyz` not ready until the group restarted, then the next session runs.
Rank 0 is inside an all-to-all with rank 1 when rank 1 dies, which is where a CP group spends its collectives."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from admission import ExecutionLease
from pipeline.bidirectional import ControlState
from pipeline.lingbot.policy.service import LingBotService
from service.settings import Settings
from service.workers import lingbot_fast_options, process_placement, worker_options
from tests.support.reliability import WAIT_S, App, running_app, wait_status
from tests.support.service_harness import RecordingTransport
from tests.support.sharded_world import KILL_SEED, FaultyShardedFactory
from tests.support.waits import until
from tests.support.worker_stages import SPAWN
from transport.base import ChunkStatus, DoneStatus

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")

in_module_loop = pytest.mark.asyncio(loop_scope="module")

CALL_TIMEOUT_S = 8.0
SMALL = {"width": 64, "height": 48, "fps": 16, "chunk_size": 1, "hud": False}
"""12 tokens a latent frame: two ranks split them."""
STARTED = SPAWN.Event()


def faulty_workers(settings: Settings) -> list[LingBotService]:
    """The product's placement for these settings, its DiT ranks LingBot-World-Fast's with rank 1's fault."""
    from pipeline.lingbot.models import LingBotFastFactory

    workers = []
    for options in worker_options(settings):
        inner = LingBotFastFactory(lingbot_fast_options(options))
        placement = dataclasses.replace(
            process_placement(options),
            factory=FaultyShardedFactory(STARTED, inner=inner),
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
        self.transport.ports[created["id"]].push_control(ControlState(1, frozenset({"w"})))  # keep generating
        return str(created["id"])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def harness(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    from pipeline.lingbot.models import write_tiny_model

    model: Path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    transport = RecordingTransport()
    overrides: dict[str, Any] = {
        "model": "lingbot-fast",
        "model_path": model,
        "stage_placement": "processes",
        "denoise_ranks": 2,
        "torch_threads": 1,
        "max_sessions_per_worker": 1,
        "queue_size": 2,
    }
    async with running_app(faulty_workers, transport=transport, **overrides) as app:
        yield Harness(app, transport)


@in_module_loop
@pytest.mark.timeout(400)  # three process groups loading the model stack, twice for the DiT's
async def test_a_cp_rank_killed_mid_chunk_fails_the_session_and_the_group_restarts(harness: Harness) -> None:
    pid = os.getpid()
    doomed = await harness.start_session(KILL_SEED)
    assert await asyncio.to_thread(STARTED.wait, 120), "rank 1 never reached the faulty chunk"
    dit = harness.worker.worker_statistics()["denoise"]
    rank_1 = dit.pids[1]

    os.kill(rank_1, signal.SIGKILL)

    runtime = harness.app.runtime
    await until(lambda: not runtime.readiness().ready, "readiness to turn false", within=CALL_TIMEOUT_S + 20)
    failed = await wait_status(harness.app, doomed, "failed")
    assert failed["error"]["code"] == "model_failure"
    message = failed["error"]["message"]
    assert "actor 'denoise' died (incarnation 1)" in message
    assert f"rank 1 (pid {rank_1}) exited with exit code -9 (SIGKILL)" in message
    assert harness.transport.statuses[doomed][-1] == DoneStatus("model_failure")
    await until(lambda: runtime.readiness().ready, "the restarted group to make the worker ready", within=180)
    groups = harness.worker.worker_statistics()
    assert (groups["denoise"].incarnation, groups["denoise"].restarts) == (2, 1)
    assert os.getpid() == pid
    fresh = await harness.start_session(seed=7)
    await until(lambda: harness.chunks(fresh) >= 2, "the next session on the restarted group", within=WAIT_S * 2)
    assert (await harness.app.client.delete(f"/v1/sessions/{fresh}")).json()["status"] == "closed"
