"""Benchmark of sessions that outlive their model worker (issue #33, docs/continuity.md). About 15 s on 2 cores
(13.5 s measured at a load of 3.6; about 3 minutes while restarted ranks were spawned, before the forkserver).

`--quick` (a smoke run of about 15 s, for the tests: its recovery figures are not the ones to compare) kills no
process: the session runs on threads and its denoise stage raises once (cause `stage_failed`), so the re-seed path
runs without a group restart (`group_restart_ms_p50` is null).

Measures, in one run:
- recovery_ms_p50 / recovery_ms_p95: worker loss. The whole service in-process (its real lifespan, `processes`
  placement, one DiT rank with decode co-located, the reference model at 64x48, chunk_size 1, compute_scale 4), one
  session holding keys; the DiT group's rank is SIGKILLed at a random moment while the session streams, `--kills`
  times (one session each). The time from the last frame the session's transport port received before the kill to
  the first it received after it (the frames a binding paces out; no WebRTC hop in between), per kill.
  `kill_to_first_frame_ms_p50` is the same from the kill itself, `worker_loss_chunks_skipped` the chunks the port
  never handed over across the kills, summed (goal 0: the re-seed goes on from the chunk after the last one handed
  to the reader, and what the reader took is still paced out), `group_restart_ms_p50` the part of it until the
  group was ready again (the rest is the re-seed and its first chunk). `sessions_survived` / `sessions_total`: kills
  after which the session ran on (the others failed with `model_failure`).
- checkpoint_bytes_per_session: the serialised checkpoint of a LingBot-World-Fast session at 832x480 without a
  reference image, its history ring full at the defaults (window 18, sink 6, lookback 4: 10 chunks of clean latents,
  `history.py`); checkpoint_reference_bytes_per_session the reference model's (no history: the JSON header only);
  checkpoint_image_bytes_832x480 what a reference image adds once (float32 as the session holds it);
  checkpoint_history_chunk_bytes_832x480 one chunk of history serialised, what a Redis write adds per chunk (the
  store writes each chunk once, `service/scaleout/checkpoints.py`). Computed on real objects of those shapes.
- checkpoint_ms_per_chunk: what a chunk boundary costs the session policy for that session (the pose integrated for
  the chunk, the chunk's history appended to the ring, the frozen record built), mean of 2 000 (the latents are
  made before the clock starts: they arrive with the frames); checkpoint_share_of_chunk_period: that over the
  chunk's media duration at 16 fps (the goal: at most 1 %). checkpoint_history_serialise_ms_832x480: serialising one
  chunk of history (on the Redis writer's task, never the chunk loop), mean of 50.

- hand_off_recovery_ms_p50 / _p95, rolling_sessions_survived / rolling_sessions_total, replica_loss_recovery_ms_p50 /
  _p95 and replica_ttl_s: real replicas on a real redis-server, a scripted rolling restart (drain hand-off) and
  `--replica-kills` SIGKILLed replicas, measured at the Python client (`bench/_replicas.py` says how), with
  hand_off_chunks_skipped / replica_loss_chunks_skipped: the chunks the client never got across each recovery, summed
  (goal 0). `--quick`
  starts no replica: these are null.

The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import random
import signal
import time
from collections.abc import Mapping
from typing import Any

import torch

from admission import ExecutionLease, percentile
from bench._common import report
from bench._replicas import replica_figures
from pipeline.bidirectional import ChunkItem, ControlState
from pipeline.lingbot.camera import CameraChunk, PoseIntegrator
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint, SessionCheckpoint
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.history import ChunkHistory, ChunkRecord, HistorySpec, SessionHistory
from pipeline.lingbot.policy.recovery import RecoveryBudget
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceDiT, ReferenceWorldModel
from pipeline.lingbot.seam import WorldModelParts
from service.settings import Settings
from service.workers import process_placement, worker_options
from tests.support.reliability import App, running_app, wait_status
from tests.support.service_harness import RecordingTransport
from tests.support.waits import until
from transport.base import SessionPort

CONFIG = {"width": 64, "height": 48, "fps": 16, "chunk_size": 1, "hud": False, "compute_scale": 4.0}
HELD = frozenset({"w", "l"})


def workers(settings: Settings) -> list[LingBotService]:
    built = []
    for options in worker_options(settings):
        placement = dataclasses.replace(process_placement(options), restart_backoff_initial_s=0.2, stop_timeout_s=2.0)
        budget = RecoveryBudget(attempts=options.recovery_attempts, timeout_s=options.recovery_timeout)
        built.append(LingBotService(placement, lease=ExecutionLease(), recovery=budget))
    return built


class FrameTimes(RecordingTransport):
    """Records when the session's port hands each frame-carrying item (a chunk's part, or a whole chunk) over, and
    its chunk index."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: dict[str, list[float]] = {}
        self.chunks: dict[str, list[int]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    async def attach(self, port: SessionPort) -> Mapping[str, object]:
        self.frames[port.session_id] = []
        self.chunks[port.session_id] = []
        self._tasks.append(asyncio.create_task(self._read(port)))
        return await super().attach(port)

    async def _read(self, port: SessionPort) -> None:
        item: ChunkItem
        async for item in port.chunks():
            self.frames[port.session_id].append(time.monotonic())
            self.chunks[port.session_id].append(item.index)

    def skipped(self, session_id: str, at: float) -> int:
        """Chunks the session's port never handed over across the moment `at`: between the last chunk before it and
        the first after it (0: the recovery went on from the chunk after the last one handed over, or repeated it)."""
        times, chunks = self.frames[session_id], self.chunks[session_id]
        before = max((c for t, c in zip(times, chunks, strict=True) if t <= at), default=-1)
        after = next(c for t, c in zip(times, chunks, strict=True) if t > at)
        return max(0, after - before - 1)

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await super().aclose()


async def worker_loss(kills: int, rng: random.Random) -> dict[str, Any]:
    transport = FrameTimes()
    overrides: dict[str, Any] = {
        "stage_placement": "processes",
        "denoise_ranks": 1,
        "torch_threads": 1,
        "max_sessions_per_worker": 1,
        "recovery_attempts": 3,
        "recovery_timeout": 120,
    }
    outcomes: list[tuple[float, float, float, bool, int] | None] = []
    async with running_app(workers, transport=transport, **overrides) as app:
        for _ in range(kills):
            outcomes.append(await one_kill(app, transport, rng))
    done = [outcome for outcome in outcomes if outcome is not None]
    return {
        "recovery_ms_p50": _ms(percentile([gap for gap, _, _, _, _ in done], 50)),
        "recovery_ms_p95": _ms(percentile([gap for gap, _, _, _, _ in done], 95)),
        "kill_to_first_frame_ms_p50": _ms(percentile([after for _, after, _, _, _ in done], 50)),
        "group_restart_ms_p50": _ms(percentile([restart for _, _, restart, _, _ in done], 50)),
        "worker_loss_chunks_skipped": sum(skipped for _, _, _, _, skipped in done),
        "sessions_survived": sum(running for _, _, _, running, _ in done),
        "sessions_total": kills,
        "load_average_1m": os.getloadavg()[0],
    }


async def one_kill(app: App, transport: FrameTimes, rng: random.Random) -> tuple[float, float, float, bool, int] | None:
    """One session, its DiT group killed while it streams: (last frame before to first after, kill to first frame
    after, kill to the group ready again, whether the session still runs, chunks skipped across the kill); None when
    no frame came after."""
    worker: LingBotService = app.workers[0]
    created = (await app.create({"config": CONFIG})).json()
    sid = str(created["id"])
    transport.ports[sid].push_control(ControlState(1, HELD))
    frames = transport.frames[sid]
    await until(lambda: len(frames) >= 6, "frames before the kill", within=120)
    await asyncio.sleep(rng.uniform(0.0, 0.5))
    group = worker.worker_statistics()["denoise"]
    seen = len(frames)
    os.kill(group.pids[0], signal.SIGKILL)
    killed = time.monotonic()
    last_before = frames[seen - 1]

    def restarted() -> bool:
        return worker.worker_statistics()["denoise"].incarnation > group.incarnation and worker.ready

    await until(restarted, "the group to restart", within=120)
    restart = time.monotonic() - killed
    try:
        await until(lambda: frames[-1] > killed, "a frame after the kill", within=120)
    except AssertionError:
        return None
    first_after = next(at for at in frames if at > killed)
    running = (await app.get(sid))["status"] == "running"
    skipped = transport.skipped(sid, killed)
    await app.client.delete(f"/v1/sessions/{sid}")
    await wait_status(app, sid, "closed", "failed", within=60)
    return first_after - last_before, first_after - killed, restart, running, skipped


class _RaisesOnce:
    """The reference DiT, raising once in chunk 4 (`--quick`); a `ReseedableDenoiser`. `failed_at`: when."""

    def __init__(self) -> None:
        self.inner = ReferenceDiT("cpu")
        self.failed_at: float | None = None

    def create_cache(self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor) -> None:
        self.inner.create_cache(session_id, config, base_latent)

    def reseed_cache(
        self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor, resume: ResumePoint
    ) -> None:
        self.inner.reseed_cache(session_id, config, base_latent, resume)

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        if chunk_index == 4 and self.failed_at is None:
            self.failed_at = time.monotonic()
            raise RuntimeError("bench: a stage fault in chunk 4")
        return self.inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)

    def release_cache(self, session_id: str) -> None:
        self.inner.release_cache(session_id)


async def stage_fault() -> dict[str, Any]:
    """`--quick`: one session on threads whose denoise stage raises once; the same figures as `worker_loss`."""
    transport = FrameTimes()
    faulty = _RaisesOnce()

    def build(settings: Settings) -> list[LingBotService]:
        world = ReferenceWorldModel("cpu")
        parts = WorldModelParts(world.encoder, faulty, world.decoder)
        return [LingBotService(parts, lease=ExecutionLease(), recovery=RecoveryBudget())]

    async with running_app(build, transport=transport) as app:
        created = (await app.create({"config": CONFIG})).json()
        sid = str(created["id"])
        transport.ports[sid].push_control(ControlState(1, HELD))
        frames = transport.frames[sid]
        await until(lambda: faulty.failed_at is not None and frames[-1] > faulty.failed_at, "a frame after", within=60)
        failed_at = faulty.failed_at
        assert failed_at is not None
        last_before = max(at for at in frames if at <= failed_at)
        first_after = next(at for at in frames if at > failed_at)
        running = (await app.get(sid))["status"] == "running"
        skipped = transport.skipped(sid, failed_at)
        await app.client.delete(f"/v1/sessions/{sid}")
    return {
        "recovery_ms_p50": _ms(first_after - last_before),
        "recovery_ms_p95": _ms(first_after - last_before),
        "kill_to_first_frame_ms_p50": _ms(first_after - failed_at),
        "group_restart_ms_p50": None,
        "worker_loss_chunks_skipped": skipped,
        "sessions_survived": int(running),
        "sessions_total": 1,
        "load_average_1m": os.getloadavg()[0],
    }


LINGBOT_FAST_HISTORY = HistorySpec.for_cache(3, 18, 6, 18, 4)
"""LingBot-World-Fast's history at the defaults (`LingBotFastOptions`: window 18, sink 6, lookback 4)."""


def _history_chunks(config: LingBotSessionConfig, count: int) -> list[ChunkHistory]:
    """`count` chunks of history of `config`'s shapes (random latents, a CPU generator's state: 5 056 bytes)."""
    from pipeline.lingbot.camera import CameraController

    camera = CameraController(config.pose_steps(), config.camera_intrinsics())
    generator = torch.Generator().manual_seed(0)
    state = bytes(generator.get_state().numpy())
    latent = torch.randn(16, config.chunk_size, config.latent_height, config.latent_width, generator=generator)
    chunks = []
    for index in range(count):
        control = camera.chunk_control(ControlSnapshot.from_keys(7, HELD), index, config.chunk_size).camera
        chunks.append(ChunkHistory(ChunkRecord(index, control, "a snowy night", state, LINGBOT_FAST_HISTORY), latent))
    return chunks


def checkpoint_cost(rounds: int = 2000) -> dict[str, Any]:
    config = LingBotSessionConfig.from_mapping({"chunk_size": 3, "width": 832, "height": 480})
    camera = PoseIntegrator(config.pose_steps())
    snapshot = ControlSnapshot.from_keys(7, HELD)
    arriving = _history_chunks(config, rounds)  # as they come back with the frames
    history = SessionHistory()
    started = time.perf_counter()
    checkpoint = None
    for index in range(rounds):
        camera.chunk_poses(snapshot, first_chunk=index == 0, latent_frames=config.chunk_size)
        history = history.append(arriving[index])
        checkpoint = SessionCheckpoint(
            session_id="s",
            config=config,
            image=None,
            next_chunk=index + 1,
            pose=camera.pose,
            prompt="a snowy night",
            prompt_seq=3,
            applied_seq=7,
            latest=snapshot,
            frames_emitted=12 * index + 9,
            taken_at=time.monotonic(),
            history=history,
        )
    per_chunk_ms = (time.perf_counter() - started) / rounds * 1000
    assert checkpoint is not None
    newest = history.chunks[-1]
    started = time.perf_counter()
    for _ in range(50):
        part = newest.to_bytes()
    serialise_ms = (time.perf_counter() - started) / 50 * 1000
    chunk_media_ms = 1000 * 4 * config.chunk_size / config.fps
    image = torch.zeros(3, 480, 832)
    reference = dataclasses.replace(checkpoint, history=SessionHistory())
    return {
        "checkpoint_bytes_per_session": len(checkpoint.to_bytes()),
        "checkpoint_reference_bytes_per_session": len(reference.to_bytes()),
        "checkpoint_history_chunks": len(history.chunks),
        "checkpoint_history_chunk_bytes_832x480": len(part),
        "checkpoint_history_serialise_ms_832x480": serialise_ms,
        "checkpoint_image_bytes_832x480": image.numel() * image.element_size(),
        "checkpoint_ms_per_chunk": per_chunk_ms,
        "checkpoint_share_of_chunk_period": per_chunk_ms / chunk_media_ms,
    }


_NO_REPLICAS: dict[str, Any] = dict.fromkeys(
    (
        "hand_off_recovery_ms_p50",
        "hand_off_recovery_ms_p95",
        "hand_off_chunks_skipped",
        "hand_off_unlabelled_frames",
        "rolling_sessions_survived",
        "rolling_sessions_total",
        "replica_loss_recovery_ms_p50",
        "replica_loss_recovery_ms_p95",
        "replica_loss_chunks_skipped",
        "replica_loss_unlabelled_frames",
        "replica_ttl_s",
    )
)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a stage fault on threads instead of kills (about 15 s)")
    parser.add_argument("--kills", type=int, default=5, help="worker kills, one session each (default 5)")
    parser.add_argument("--replica-kills", type=int, default=3, help="replica SIGKILLs, one session each (default 3)")
    args = parser.parse_args()
    started = time.perf_counter()
    figures = checkpoint_cost()
    figures.update(asyncio.run(stage_fault() if args.quick else worker_loss(args.kills, random.Random(33))))
    figures.update(_NO_REPLICAS if args.quick else asyncio.run(replica_figures(args.replica_kills)))
    report(figures, started)


if __name__ == "__main__":
    main()
