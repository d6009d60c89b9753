"""A LingBot-World-Fast DiT rank killed mid-chunk under Ulysses context parallelism (`processes`, 2 DiT ranks, the
tiny checkpoint), with the product's recovery budget (issue #33, docs/continuity.md): the session is not failed. It
moves to `recovering`, the group restarts (forked from the forkserver), the session is re-seeded on it with its
history (the clean latents that came back with the frames, replayed into the KV cache on both ranks; the generator
restored; the VAE primed with them) and goes on with the same id: its chunks continue with no gap and no repeat,
every chunk keeps the contract (4 x chunk_size frames after the first, the first frame index continuing), and the
frames after the kill are the frames of an uninterrupted run of the same session (replayed in this process on one
rank: no jump). Rank 0 is inside an all-to-all with rank 1 when rank 1 dies, which is where a CP group spends its
collectives."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio

from admission import ExecutionLease
from pipeline.bidirectional import ChunkOutput, ControlState
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.policy.service import LingBotService
from service.settings import Settings
from service.workers import lingbot_fast_options, process_placement, recovery_budget, worker_options
from tests.support.reliability import WAIT_S, App, replay_uninterrupted, running_app, wait_status
from tests.support.service_harness import FramesTransport
from tests.support.sharded_world import FAULT_CHUNK, KILL_ONCE_SEED, FaultyShardedFactory
from tests.support.waits import until
from tests.support.worker_stages import SPAWN
from transport.base import ChunkStatus, StateStatus

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")

in_module_loop = pytest.mark.asyncio(loop_scope="module")

CALL_TIMEOUT_S = 8.0
SMALL = {"width": 64, "height": 48, "fps": 16, "chunk_size": 1, "hud": False}
"""12 tokens a latent frame: two ranks split them."""
STARTED = SPAWN.Event()
OPTIONS: list[Any] = []  # the LingBotFastOptions the workers were built with (for the uninterrupted replay)


def faulty_workers(settings: Settings) -> list[LingBotService]:
    """The product's placement and recovery budget for these settings, its DiT ranks LingBot-World-Fast's with rank
    1's kill-once fault."""
    from pipeline.lingbot.models import LingBotFastFactory

    workers = []
    for options in worker_options(settings):
        inner = LingBotFastFactory(lingbot_fast_options(options))
        OPTIONS.append(inner.options)
        placement = dataclasses.replace(
            process_placement(options),
            factory=FaultyShardedFactory(STARTED, inner=inner),
            call_timeout_s=CALL_TIMEOUT_S,
            restart_backoff_initial_s=0.2,
            stop_timeout_s=2.0,
        )
        workers.append(
            LingBotService(
                placement, lease=ExecutionLease(), history=options.session_history, recovery=recovery_budget(options)
            )
        )
    return workers


@dataclasses.dataclass
class Harness:
    app: App
    transport: FramesTransport

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


def replay(config: LingBotSessionConfig, chunks: list[ChunkOutput]) -> list[np.ndarray[Any, Any]]:
    """What the tiny model makes, uninterrupted and on one rank, for these chunks' controls (in this process)."""
    from pipeline.lingbot.models import LingBotFastWorldModel

    return replay_uninterrupted(LingBotFastWorldModel.load(OPTIONS[0]), config, chunks)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def harness(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Harness]:
    from pipeline.lingbot.models import write_tiny_model

    model: Path = write_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)
    transport = FramesTransport()
    overrides: dict[str, Any] = {
        "model": "lingbot-fast",
        "model_path": model,
        "stage_placement": "processes",
        "denoise_ranks": 2,
        "torch_threads": 1,
        "max_sessions_per_worker": 1,
        "queue_size": 2,
        "recovery_attempts": 3,
        "recovery_timeout": 120,
    }
    async with running_app(faulty_workers, transport=transport, **overrides) as app:
        yield Harness(app, transport)


@in_module_loop
@pytest.mark.timeout(400)  # three process groups loading the model stack
async def test_a_cp_rank_killed_mid_chunk_leaves_its_session_running_from_a_reseeded_cache(harness: Harness) -> None:
    sid = await harness.start_session(KILL_ONCE_SEED)
    assert await asyncio.to_thread(STARTED.wait, 120), "rank 1 never reached the faulty chunk"
    dit = harness.worker.worker_statistics()["denoise"]
    assert dit.incarnation == 1

    # Chunk 0 reaches the reader first (decoded on the group's second lane while rank 1 hangs in chunk 1), so the
    # checkpoint is past it and the re-seed replays history; killed earlier, the session would start again at 0.
    await until(lambda: len(harness.transport.chunks[sid]) >= 1, "chunk 0 before the kill", within=WAIT_S)
    os.kill(dit.pids[1], signal.SIGKILL)
    killed_at = time.monotonic()

    await wait_status(harness.app, sid, "recovering", within=CALL_TIMEOUT_S + 20)
    chunks = harness.transport.chunks[sid]
    await until(lambda: any(c.index >= FAULT_CHUNK for c in chunks), "the re-seeded chunk", within=WAIT_S * 2)
    recovery_s = time.monotonic() - killed_at
    await until(lambda: any(c.index > FAULT_CHUNK + 2 for c in chunks), "chunks after it", within=WAIT_S * 2)
    assert (await harness.app.get(sid))["status"] == "running"
    states = [s.state for s in harness.transport.statuses[sid] if isinstance(s, StateStatus)]
    assert states[-2:] == ["recovering", "running"], states
    assert harness.worker.worker_statistics()["denoise"].incarnation == 2

    seen = list(chunks)
    assert [c.index for c in seen] == list(range(len(seen)))  # no gap, no chunk twice
    chunk_size = SMALL["chunk_size"]
    for previous, chunk in itertools.pairwise(seen):
        assert chunk.first_frame_index == previous.first_frame_index + len(previous.frames)
        assert chunk.frames.shape == (4 * chunk_size, SMALL["height"], SMALL["width"], 3), chunk.index
    for chunk in seen[FAULT_CHUNK:]:
        assert int(chunk.frames.max()) > int(chunk.frames.min()), f"chunk {chunk.index} is one constant"
    config = LingBotSessionConfig.from_mapping({**SMALL, "seed": KILL_ONCE_SEED})
    expected = replay(config, seen)
    differences = [
        float(np.abs(c.frames.astype(np.int32) - e.astype(np.int32)).mean())
        for c, e in zip(seen, expected, strict=True)
    ]
    print(f"mean |frame - uninterrupted| per chunk (the kill in chunk {FAULT_CHUNK}): {differences}")
    for chunk, frames in zip(seen, expected, strict=True):
        assert np.array_equal(chunk.frames, frames), f"chunk {chunk.index} differs from the uninterrupted run"
    assert (await harness.app.client.delete(f"/v1/sessions/{sid}")).json()["status"] == "closed"
    print(f"recovery (kill to the re-seeded chunk's frames, in-process): {recovery_s:.2f} s")
