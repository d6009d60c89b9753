"""The replica figures of `bench.continuity` (issue #33, docs/continuity.md): real `lingstream serve` replicas on a
real redis-server (the reference model at 64x48, the embedded transport, `LINGSTREAM_DRAIN_MODE=hand_off`), one
session slot each, and the Python client with its own reconnect behind one front door per session
(`tests/support/watching.py`), routed as a Service's endpoints are.

- A scripted rolling restart, as a Deployment with `maxSurge: 1` rolls: three replicas, three sessions live; each
  replica in turn gets its replacement (ready), then SIGTERM: it hands its session to the replacement. Per hand-off,
  the gap at the client (the last frame over the lost connection to the first over the joined one):
  `hand_off_recovery_ms_p50/p95`, and the chunks the client never got across each hand-off (the last chunk over the
  lost connection to the first over the joined one), summed: `hand_off_chunks_skipped`; `rolling_sessions_survived`
  / `rolling_sessions_total`: sessions still streaming
  after the restart with their own id, stopped by their client (`client_stop`).
- Replica loss, `kills` times: a spare replica started, then the replica that runs a session SIGKILLed; the spare
  adopts it once the reaper saw the dead replica's liveness lapse (`REPLICA_TTL_S`). The same gap at the client:
  `replica_loss_recovery_ms_p50/p95` (goal: at most the replica TTL + 5 s; `replica_ttl_s` is reported with it),
  and `replica_loss_chunks_skipped` as for a hand-off. `*_unlabelled_frames`: frames over the joined connection
  before its first labelled one (they may be the skipped chunks' own: see `_skipped`).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from admission import percentile
from tests.support.fakes.redis_server import RedisServer
from tests.support.front_door import FrontDoor
from tests.support.serving import Replica, spawn_replica, wait_until_ready
from tests.support.waits import until
from tests.support.watching import SessionWatch, watch_session
from transport.client import ReconnectPolicy, ServiceClient

__all__ = ["REPLICA_TTL_S", "replica_figures"]

REPLICA_TTL_S = 3.0
KEY = "continuity-bench-key-0123456789ab"
CONFIG = {"width": 64, "height": 48, "chunk_size": 1, "hud": False, "seed": 33}
POLICY = ReconnectPolicy(budget_s=REPLICA_TTL_S + 40, stall_s=2.0)


class _Deployment:
    """Replicas started by name on one redis-server; every one still running is killed at the end."""

    def __init__(self, directory: Path, redis_url: str) -> None:
        self._directory = directory
        self._redis_url = redis_url
        self.replicas: dict[str, Replica] = {}

    async def start(self, name: str) -> Replica:
        log = self._directory / f"{name}.log"
        process, port = spawn_replica(
            log,
            redis_url=self._redis_url,
            replica_id=name,
            worker_factory=None,
            LINGSTREAM_REPLICA_TTL=str(REPLICA_TTL_S),
            LINGSTREAM_API_KEYS=KEY,
            LINGSTREAM_TORCH_THREADS="1",
            LINGSTREAM_DRAIN_MODE="hand_off",
            LINGSTREAM_DRAIN_TIMEOUT="40",
        )
        replica = self.replicas[name] = Replica(name, process, port, log)
        await asyncio.to_thread(wait_until_ready, replica.url, process, replica.output, within_s=120)
        return replica

    def stop(self, name: str) -> None:
        """SIGKILL the replica if it still runs, and forget it."""
        process = self.replicas.pop(name).process
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)

    def close(self) -> None:
        for replica in self.replicas.values():
            if replica.process.poll() is None:
                replica.process.kill()
            replica.process.wait(timeout=10)


async def replica_figures(kills: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, RedisServer(Path(tmp)) as server:
        deployment = _Deployment(Path(tmp), server.url)
        try:
            hand_offs, survived, total = await _rolling_restart(deployment)
            losses = [await _replica_loss(deployment, n) for n in range(kills)]
        finally:
            deployment.close()
    hand_off_gaps = [gap for gap, _ in hand_offs]
    loss_gaps = [gap for gap, _ in losses]
    return {
        "hand_off_recovery_ms_p50": _ms(percentile(hand_off_gaps, 50)),
        "hand_off_recovery_ms_p95": _ms(percentile(hand_off_gaps, 95)),
        "hand_off_chunks_skipped": sum(skipped for _, (skipped, _) in hand_offs),
        "hand_off_unlabelled_frames": sum(unlabelled for _, (_, unlabelled) in hand_offs),
        "rolling_sessions_survived": survived,
        "rolling_sessions_total": total,
        "replica_loss_recovery_ms_p50": _ms(percentile(loss_gaps, 50)),
        "replica_loss_recovery_ms_p95": _ms(percentile(loss_gaps, 95)),
        "replica_loss_chunks_skipped": sum(skipped for _, (skipped, _) in losses),
        "replica_loss_unlabelled_frames": sum(unlabelled for _, (_, unlabelled) in losses),
        "replica_ttl_s": REPLICA_TTL_S,
    }


async def _session(door: FrontDoor) -> str:
    async with ServiceClient(door.url, api_key=KEY) as service:
        return (await service.create(config=CONFIG)).id


async def _rolling_restart(deployment: _Deployment) -> tuple[list[tuple[float, tuple[int, int]]], int, int]:
    names = ("r1", "r2", "r3")
    for name in names:
        await deployment.start(name)
    gaps: list[tuple[float, tuple[int, int]]] = []
    async with contextlib.AsyncExitStack() as doors:
        watches: dict[str, SessionWatch] = {}
        for name in names:  # each replica's one slot: the session created through it runs there
            door = await doors.enter_async_context(FrontDoor([deployment.replicas[name].port]))
            watches[name] = SessionWatch(await _session(door), door)
        tasks = [asyncio.create_task(watch_session(watch, KEY, POLICY)) for watch in watches.values()]
        for watch in watches.values():
            await until(_frames(watch, 3), f"frames of {watch.sid}", within=90)
        for name in names:
            old, watch = deployment.replicas[name], watches[name]
            new = await deployment.start(f"{name}-next")
            watch.door.route([new.port])
            await asyncio.sleep(2.0)  # the session's first checkpoint is in Redis well before (a chunk is ~60 ms)
            sent = time.monotonic()
            old.process.send_signal(signal.SIGTERM)
            await asyncio.to_thread(old.process.wait, 60)
            with contextlib.suppress(TimeoutError):
                await until(watch.streaming_again(sent), f"{watch.sid} again", within=60)
            with contextlib.suppress(ValueError):
                gaps.append((watch.gap(sent), _skipped(watch, sent)))
        for watch in watches.values():
            watch.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    survived = sum(1 for watch in watches.values() if _survived(watch))
    for name in names:
        deployment.stop(f"{name}-next")
    return gaps, survived, len(watches)


async def _replica_loss(deployment: _Deployment, n: int) -> tuple[float, tuple[int, int]]:
    owner = await deployment.start(f"k{n}")
    async with FrontDoor([owner.port]) as door:
        watch = SessionWatch(await _session(door), door)
        task = asyncio.create_task(watch_session(watch, KEY, POLICY))
        try:
            await until(_frames(watch, 3), f"frames of {watch.sid}", within=90)
            spare = await deployment.start(f"k{n}-spare")
            door.route([spare.port])
            await asyncio.sleep(2.0)  # its checkpoint and the adoptable mark are in Redis
            killed = time.monotonic()
            owner.process.send_signal(signal.SIGKILL)
            await until(watch.streaming_again(killed), f"{watch.sid} adopted", within=REPLICA_TTL_S + 60)
            return watch.gap(killed), _skipped(watch, killed)
        finally:
            watch.stop.set()
            await asyncio.gather(task, return_exceptions=True)
            for name in (f"k{n}", f"k{n}-spare"):
                deployment.stop(name)


def _frames(watch: SessionWatch, count: int) -> Callable[[], bool]:
    return lambda: len(watch.frames) >= count


def _skipped(watch: SessionWatch, after: float) -> tuple[int, int]:
    """Chunks the client never got around its first rejoin after `after`: between the last chunk over the connection
    it lost and the first labelled one over the one it joined (a repeat counts 0); and the frames over the joined
    connection that came before that one without a chunk label (the client labels an embedded frame once it knows
    the new connection's RTP offset: such frames may be the "skipped" chunks' own)."""
    at = watch.rejoined_at(after)
    before = max((c for t, c in watch.frames if t <= at and c >= 0), default=-1)
    first = next((c for t, c in watch.frames if t > at and c >= 0), before + 1)
    first_at = next((t for t, c in watch.frames if t > at and c >= 0), float("inf"))
    unlabelled = sum(1 for t, c in watch.frames if at < t < first_at and c < 0)
    return max(0, first - before - 1), unlabelled


def _survived(watch: SessionWatch) -> bool:
    """Stopped by its client after it streamed again over a connection joined after its hand-off."""
    stopped = watch.done is not None and watch.done.reason == "client_stop"
    return stopped and watch.stream is not None and watch.stream.statistics().reconnects >= 1


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000
