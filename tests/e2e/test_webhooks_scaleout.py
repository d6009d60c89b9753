"""A replica killed with a webhook delivery pending: another replica delivers it, and ends its session (issue #35).

Two real `lingstream serve` replicas on one real redis-server (fake workers through the test-only hook) post their
webhooks to a real receiver on loopback. The receiver leaves every request unanswered while replica r1 sends the
`session.running` event of a session it runs; r1 is then SIGKILLed (its lease on the delivery is never settled),
the receiver starts answering, and r2 delivers the same event (same id, signed) once r1's lease and its liveness
TTL ran out — the deliveries live in Redis, not in the replica that queued them. r2 also reaps r1 and declares the
session lost with it: its `session.ended` (failed, `replica_lost`, signed) arrives once, from r2.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from tests.support.fakes.redis_server import NEEDS_REDIS_SERVER, RedisServer
from tests.support.serving import spawn_replica
from tests.support.waits import until
from tests.support.webhook_receiver import webhook_receiver
from transport.client import SIGNATURE_HEADER, verify_webhook

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    NEEDS_REDIS_SERVER,
]

SECRET = "whsec-e2e-0123456789"
TTL_S = 1.5
ATTEMPT_TIMEOUT_S = 1.0  # the lease on a claimed delivery is this + 5 s
STARTUP_S = 90.0  # two replicas importing at once on a loaded 2-core machine took over 40 s (2026-12-02)


def _start(tmp_path: Path, name: str, redis_url: str, hook_url: str) -> tuple[subprocess.Popen[bytes], str, Path]:
    log = tmp_path / f"{name}.log"
    process, port = spawn_replica(
        log,
        redis_url=redis_url,
        replica_id=name,
        LINGSTREAM_REPLICA_TTL=str(TTL_S),
        LINGSTREAM_DRAIN_TIMEOUT="2",
        LINGSTREAM_WEBHOOK_URLS=hook_url,
        LINGSTREAM_WEBHOOK_SECRET=SECRET,
        LINGSTREAM_WEBHOOK_TIMEOUT=str(ATTEMPT_TIMEOUT_S),
    )
    return process, f"http://127.0.0.1:{port}", log


def _output(log: Path) -> str:
    return log.read_text(errors="replace")


async def _ready(client: httpx.AsyncClient, process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"a replica exited with {process.returncode}:\n{_output(log)}")
        with contextlib.suppress(httpx.TransportError):
            if (await client.get(url + "/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.05)  # polling a subprocess with a deadline
    pytest.fail(f"a replica was not ready in {STARTUP_S} s:\n{_output(log)}")


async def test_a_delivery_pending_on_a_killed_replica_is_delivered_by_another(tmp_path: Path) -> None:
    async with webhook_receiver(hang=True) as receiver:
        with RedisServer(tmp_path) as server:
            r1 = _start(tmp_path, "r1", server.url, receiver.url)
            r2 = _start(tmp_path, "r2", server.url, receiver.url)
            try:
                async with httpx.AsyncClient(timeout=15.0) as client:
                    await asyncio.gather(_ready(client, *r1), _ready(client, *r2))
                    created_at = time.monotonic()
                    created = await client.post(r1[1] + "/v1/sessions", json={})
                    assert created.status_code == 201, created.text  # admitted at once: r1 runs it
                    sid = created.json()["id"]
                    await receiver.wait_for(lambda: receiver.events("session.running"), "r1 to send running")
                    event_id = receiver.events("session.running")[0]["id"]
                    # The session runs through two of r1's heartbeats (TTL / 3 apart): the reaper counts its running
                    # time up to r1's last one, so a kill right after the admission would leave it 0.
                    await asyncio.sleep(TTL_S)
                    r1[0].kill()  # SIGKILL: its claim on the delivery is never settled
                    r1[0].wait(timeout=10)
                    killed_at = time.monotonic()
                    receiver.hang = False
                    await receiver.wait_for(
                        lambda: any(r.event["id"] == event_id for r in receiver.answered_2xx),
                        "r2 to deliver r1's pending event",
                        within_s=30.0,
                    )
                    took = time.monotonic() - killed_at
                    delivered = next(r for r in receiver.answered_2xx if r.event["id"] == event_id)
                    event = verify_webhook(SECRET, delivered.body, delivered.headers[SIGNATURE_HEADER])
                    assert event["data"]["session_id"] == sid  # type: ignore[index]
                    assert took < ATTEMPT_TIMEOUT_S + 5 + TTL_S + 5  # the lease, the TTL, r2's polling

                    await receiver.wait_for(
                        lambda: any(r.event["type"] == "session.ended" for r in receiver.answered_2xx),
                        "r2 to send the lost session's end",
                        within_s=30.0,
                    )
                    ended = next(r for r in receiver.answered_2xx if r.event["type"] == "session.ended")
                    lost = verify_webhook(SECRET, ended.body, ended.headers[SIGNATURE_HEADER])
                    data = lost["data"]
                    assert isinstance(data, dict)
                    assert (data["session_id"], data["status"], data["reason"]) == (sid, "failed", "replica_lost")
                    assert data["error"]["code"] == "replica_lost"
                    assert 0 < data["running_seconds"] < killed_at - created_at
                    assert data["frames"] is None  # counted on r1, lost with it

                    async def r2_counted() -> bool:  # r2 counts the delivery once it read the receiver's answer
                        text = (await client.get(r2[1] + "/metrics")).text
                        return 'lingstream_webhook_deliveries_total{result="delivered"}' in text

                    await until(r2_counted, "r2 to count its delivery", every=0.1)
            finally:
                for process, _url, _log in (r1, r2):
                    if process.poll() is None:
                        process.kill()
                    process.wait(timeout=10)
            assert len({event["id"] for event in receiver.events("session.ended")}) == 1  # r2 reaped it once
            assert "Traceback" not in _output(r2[2])
