"""A session outlives its replica (issue #33; docs/continuity.md): two real `lingstream serve` replicas on one real
redis-server, the reference model on threads, the embedded transport. The replica running a session is SIGKILLed;
the other adopts it from its Redis checkpoint (same id, its slot moved in one script), and the Python client,
connecting again through the surviving replica with the same session id and API key, gets frames of the chunks
after the checkpoint, not a new session from chunk 0. That the reference model's frames after adoption are the
frames of an unbroken run, bit for bit, is proven at the worker (`tests/unit/pipeline/lingbot/policy/
test_reseed.py`): here they cross a lossy video codec.

Its own module, not a test of `test_scaleout.py`: those replicas run fake workers, which cannot be rebuilt from a
checkpoint; this one needs the reference model (each replica's start costs a torch import)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from redis.asyncio import Redis

from tests.support.fakes.redis_server import REDIS_SERVER, RedisServer
from tests.support.front_door import FrontDoor
from tests.support.serving import Replica, spawn_replica
from tests.support.waits import until
from transport.base import StateStatus
from transport.client import LiveStream, ReconnectPolicy, ServiceClient, connect

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not on PATH (scripts/setup.sh installs it)"),
]

TTL_S = 1.5
PREFIX = "lingstream:admission:"
KEY = "adoption-test-key-0123456789abcd"
CONFIG = {"width": 64, "height": 48, "chunk_size": 1, "hud": False, "seed": 11}
STARTUP_S = 90.0
# The client's own reconnect, with a budget for this test's TTL (the default, 45 s, covers the default 10 s TTL).
POLICY = ReconnectPolicy(budget_s=TTL_S + 40, stall_s=2.0)


async def _ready(http: httpx.AsyncClient, replica: Replica) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if replica.process.poll() is not None:
            pytest.fail(f"replica {replica.name} exited with {replica.process.returncode}:\n{replica.output()}")
        with contextlib.suppress(httpx.TransportError):
            if (await http.get(replica.url + "/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.1)  # polling a subprocess with a deadline
    pytest.fail(f"replica {replica.name} was not ready in {STARTUP_S} s:\n{replica.output()}")


@contextlib.asynccontextmanager
async def _replicas(tmp_path: Path) -> AsyncIterator[tuple[Redis, dict[str, Replica]]]:
    with RedisServer(tmp_path) as server:
        raw = Redis.from_url(server.url)
        replicas: dict[str, Replica] = {}
        for name in ("r1", "r2"):
            log = tmp_path / f"{name}.log"
            process, port = spawn_replica(
                log,
                redis_url=server.url,
                replica_id=name,
                worker_factory=None,
                LINGSTREAM_REPLICA_TTL=str(TTL_S),
                LINGSTREAM_API_KEYS=KEY,
                LINGSTREAM_TORCH_THREADS="1",
            )
            replicas[name] = Replica(name, process, port, log)
        try:
            async with httpx.AsyncClient(timeout=15.0) as http:
                await asyncio.gather(*(_ready(http, replica) for replica in replicas.values()))
            yield raw, replicas
        except BaseException:
            for replica in replicas.values():
                print(f"--- {replica.name}\n{replica.output()[-8000:]}")
            raise
        finally:
            for replica in replicas.values():
                if replica.process.poll() is None:
                    replica.process.kill()
                replica.process.wait(timeout=10)
            await raw.aclose()


async def _chunks_seen(stream: LiveStream, count: int, within: float) -> list[int]:
    """Chunk indices of the frames received until `count` distinct chunks came."""
    seen: list[int] = []
    async with asyncio.timeout(within):
        while len(seen) < count:
            frame = await stream.next_frame()
            assert frame is not None, f"the stream ended: {stream.done}"
            if frame.chunk is not None and frame.chunk.index not in seen:
                seen.append(frame.chunk.index)
    return seen


async def test_a_killed_replicas_session_is_adopted_and_its_client_follows_it_by_itself(tmp_path: Path) -> None:
    async with _replicas(tmp_path) as (raw, replicas), FrontDoor([replicas["r1"].port, replicas["r2"].port]) as door:
        first, second = replicas["r1"], replicas["r2"]
        async with ServiceClient(door.url, api_key=KEY) as service:
            created = await service.create(config=CONFIG)  # through the front door: r1 takes it
            sid = created.id
            stream = await connect(service, await service.wait_streaming(sid), reconnect=POLICY)
            states: list[tuple[float, StateStatus]] = []
            stream.add_status_listener(
                lambda m: states.append((time.monotonic(), m)) if isinstance(m, StateStatus) else None
            )
            try:
                await stream.send_keys(["w", "l"])
                before = await _chunks_seen(stream, 3, within=60)
                assert (await raw.hget(f"{PREFIX}t:{sid}", "replica")) == b"r1"
                await until(lambda: raw.hget(f"{PREFIX}t:{sid}", "ad"), "the session marked adoptable", within=10)
                header = await raw.get(f"{PREFIX}ckpt:h:{sid}")
                assert header is not None
                killed_at = time.monotonic()
                first.process.send_signal(signal.SIGKILL)
                first.process.wait(timeout=10)
                checkpoint = json.loads(await raw.get(f"{PREFIX}ckpt:h:{sid}") or header)
                resume_at = checkpoint["next_chunk"]
                assert resume_at > max(before) - 2  # written at the chunk boundaries as they came

                # Nothing more is done by hand: the same stream notices the silence, asks the service (the front
                # door now reaches r2 only), is refused until r2 adopted the session, joins it there, sends its
                # held keys again, and its frames go on.
                after: list[int] = []
                async with asyncio.timeout(TTL_S + 60):
                    while len(after) < 2:
                        frame = await stream.next_frame()
                        assert frame is not None, f"the stream ended: {stream.done} {stream.errors}"
                        chunk = frame.chunk
                        if chunk is not None and frame.received_at > _rejoined_at(states) and chunk.index not in after:
                            after.append(chunk.index)
                recovered_s = time.monotonic() - killed_at
                assert min(after) >= resume_at, (before, resume_at, after)  # it went on; no chunk 0 again
                assert await _on(raw, sid, b"r2")
                assert await raw.hgetall(f"{PREFIX}held:r2") == {sid.encode(): b"0"}
                stats = stream.statistics()
                assert stats.reconnects == 1, stats
                told = [(s.state, s.detail) for at, s in states if at > killed_at]
                assert told[0][0] == "recovering", told  # surfaced to the caller, then running again
                assert ("running", "reconnected") in told, told
                assert door.connections[second.port] > 0
                done = await stream.stop()
                assert done.reason == "client_stop", done
            finally:
                await stream.aclose()
            ended = await service.get(sid)
            assert ended.status == "closed", ended
            metrics = (await service.request("GET", "/metrics")).text
            assert 'lingstream_sessions_recovered_total{cause="replica_lost"} 1.0' in metrics
            # Counted from r1's last heartbeat: the reaper waited at least one TTL after it before orphaning.
            recovery_s = _sample(metrics, 'lingstream_session_recovery_seconds_sum{cause="replica_lost"}')
            assert TTL_S <= recovery_s < TTL_S + 60, recovery_s
        print(f"states after the kill: {told}; recovery_seconds{{replica_lost}} {recovery_s:.2f} s")
        print(
            f"the client joined the adopted session by itself {stats.last_recovery_s:.2f} s after giving its "
            f"connection up; first frame of a later chunk {recovered_s:.2f} s after the kill (TTL {TTL_S} s)"
        )
        await until(lambda: _no_slots(raw), "every slot back, no orphan left", within=10)
        assert "Traceback" not in second.output()


def _sample(metrics: str, name: str) -> float:
    line = next(line for line in metrics.splitlines() if line.startswith(name + " "))
    return float(line.rsplit(" ", 1)[1])


def _rejoined_at(states: list[tuple[float, StateStatus]]) -> float:
    return next((at for at, state in states if state.detail == "reconnected"), float("inf"))


async def _on(raw: Redis, sid: str, replica: bytes) -> bool:
    fields = await raw.hmget(f"{PREFIX}t:{sid}", ["replica", "state"])
    return fields == [replica, b"admitted"] and await raw.zscore(f"{PREFIX}orphans", sid) is None


async def _no_slots(raw: Redis) -> bool:
    held = [key async for key in raw.scan_iter(match=f"{PREFIX}held:*")]
    orphans = await raw.zcard(f"{PREFIX}orphans")
    checkpoints = [key async for key in raw.scan_iter(match=f"{PREFIX}ckpt:*")]
    return not held and orphans == 0 and not checkpoints
