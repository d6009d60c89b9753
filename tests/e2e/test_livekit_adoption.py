"""A LiveKit session outlives its replica (issue #33; docs/continuity.md): two real `lingstream serve` replicas on
one real redis-server and one real `livekit-server`, inside a private network namespace, the reference model on
threads. A Python client (`tests/support/livekit_client.py` `follow`, a process of its own: never `livekit.rtc` in
the pytest process) is in the session's room. The replica running the session is SIGKILLed; the other adopts it
from its Redis checkpoint, joins the same room as the same service participant and publishes; the client, still in
the room, without a new create nor a new join, switches to the new track and gets frames of the chunks after the
checkpoint.

Its own module: it composes its own stack (Redis must be up, inside the namespace, before the replicas start)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from tests.support.fakes.redis_server import REDIS_SERVER, RedisServer
from tests.support.livekit_server_real import LiveKitServerProcess
from tests.support.livekit_stack import LiveKitStack, serve_replica
from tests.support.netns import HOST_A, PrivateNetwork
from tests.support.serving import ROOT, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(LiveKitStack.skip_reason() is not None, reason=str(LiveKitStack.skip_reason())),
    pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not on PATH (scripts/setup.sh installs it)"),
]

TTL_S = 1.5
PREFIX = "lingstream:admission:"
CONFIG = {"width": 128, "height": 96, "chunk_size": 1, "hud": False, "seed": 11}  # the LiveKit tests' size
CLIENT_S = 150.0


def _until(check: Any, what: str, within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)  # polling Redis and other processes against a deadline
    pytest.fail(f"{what}: not within {within} s")


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[Redis, LiveKitStack, LiveKitStack]]:
    with PrivateNetwork(), RedisServer(tmp_path) as redis:
        server = LiveKitServerProcess(HOST_A, free_port(), free_port(), tmp_path / "livekit-server.log")
        settings = {
            "LINGSTREAM_ADMISSION_BACKEND": "redis",
            "LINGSTREAM_REDIS_URL": redis.url,
            "LINGSTREAM_REPLICA_TTL": str(TTL_S),
            "LINGSTREAM_MAX_SESSIONS_PER_WORKER": "1",
        }
        raw = Redis.from_url(redis.url)
        with (
            server,
            serve_replica(server, tmp_path / "r1.log", LINGSTREAM_REPLICA_ID="r1", **settings) as first,
            serve_replica(server, tmp_path / "r2.log", LINGSTREAM_REPLICA_ID="r2", **settings) as second,
        ):
            try:
                yield raw, first, second
            finally:
                raw.close()


def _streaming(replica: LiveKitStack, sid: str) -> dict[str, Any] | None:
    with httpx.Client(base_url=replica.url, timeout=10.0) as client:
        body = client.get(f"/v1/sessions/{sid}").json()
    transport: dict[str, Any] | None = body.get("transport")
    return transport if body.get("status") == "running" and transport else None


def test_a_killed_replicas_livekit_session_is_adopted_into_the_same_room_and_its_client_follows_the_new_track(
    replicas: tuple[Redis, LiveKitStack, LiveKitStack],
) -> None:
    raw, first, second = replicas
    try:
        _adopted_under_a_client(raw, first, second)
    except BaseException:  # pytest does not throw a test's failure into its fixture: the logs are shown here
        for replica in (first, second):
            print(f"--- {replica.log.name}\n{replica.output()[-6000:]}")
        raise


def _adopted_under_a_client(raw: Redis, first: LiveKitStack, second: LiveKitStack) -> None:
    with first.client() as client:
        created = client.post("/v1/sessions", json={"config": CONFIG})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        details = client.get(f"/v1/sessions/{sid}").json()["transport"]
    assert raw.hget(f"{PREFIX}t:{sid}", "replica") == b"r1"
    follower = subprocess.Popen(
        [sys.executable, "-m", "tests.support.livekit_client", "follow", first.url, sid],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert follower.stdout is not None
        assert follower.stdin is not None
        line = follower.stdout.readline()
        if json.loads(line or "{}") != {"joined": True}:
            follower.kill()
            _, err = follower.communicate(timeout=10)
            pytest.fail(f"the client did not join: {line}\n{err[-4000:]}")
        _until(lambda: raw.hget(f"{PREFIX}t:{sid}", "ad"), "the session marked adoptable", within=20)
        killed_at = time.monotonic()
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(timeout=10)
        checkpoint = json.loads(raw.get(f"{PREFIX}ckpt:h:{sid}") or b"{}")
        follower.stdin.write(f"{killed_at}\n")
        follower.stdin.flush()
        _until(lambda: raw.hget(f"{PREFIX}t:{sid}", "replica") == b"r2", "the session adopted by r2", within=30)
        adopted = _until(lambda: _streaming(second, sid), "the session running on r2", within=60)
        # The same room, the same participants: what the client in the room already follows.
        assert (adopted["room"], adopted["identity"], adopted["service_identity"]) == (
            details["room"],
            details["identity"],
            details["service_identity"],
        ), (adopted, details)
        out, err = follower.communicate(timeout=CLIENT_S)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(timeout=10)
    assert follower.returncode == 0, err[-4000:]
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    print(f"follow: {report}")
    assert report["done_early"] is None, report  # the stream never ended: no new create, no new join
    assert len(report["after"]) >= 2, report
    # The adopter went on from its checkpoint: the chunks read after the kill (the lost replica's last frames, then
    # the adopter's) go back, if at all, no further than the checkpoint (one written a chunk before the last the
    # client saw repeats that chunk), never to chunk 0.
    sequence = report["sequence"]
    went_back = [c for i, c in enumerate(sequence) if i and c < max(sequence[:i])]
    assert all(c >= checkpoint["next_chunk"] for c in went_back), (report, checkpoint)
    assert min(report["after"]) >= checkpoint["next_chunk"], (report, checkpoint)
    assert report["track_switches"] >= 1, report  # the adopter's track, in the same room
    assert report["done"] == "client_stop", report
    with httpx.Client(base_url=second.url, timeout=10.0) as client:
        ended = client.get(f"/v1/sessions/{sid}").json()
        metrics = client.get("/metrics").text
    assert ended["status"] == "closed", ended
    assert 'lingstream_sessions_recovered_total{cause="replica_lost"} 1.0' in metrics
    print(f"LiveKit: the first frame of a later chunk {report['first_after_s']} s after the kill (TTL {TTL_S} s)")
    assert "Traceback" not in second.output()
