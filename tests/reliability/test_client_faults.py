"""Clients that misbehave: one that vanishes while queued (its heartbeat stops, it loses its place and the queue
moves up), and ones that never read (an SSE subscriber keeps a bounded buffer and is released when it goes; a
swarm of never-reading TCP connections leaves a real server's memory flat and its answers prompt; with
LINGSTREAM_MAX_CONNECTIONS their number is capped too)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx

from tests.support.fakes.world import FakeWorld
from tests.support.reliability import WAIT_S, Events, running_app, samples
from tests.support.service_harness import metric
from tests.support.serving import serve
from tests.support.waits import until

HEARTBEAT_S = 1.5


async def test_a_client_vanishing_while_queued_loses_its_place_and_the_queue_moves_up(tmp_path: Path) -> None:
    with serve(
        tmp_path,
        LINGSTREAM_QUEUE_SIZE="4",
        LINGSTREAM_QUEUE_HEARTBEAT_TIMEOUT=str(HEARTBEAT_S),
    ) as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=10.0) as client:
            await service.wait_ready(client)
            running = (await client.post("/v1/sessions", json={})).json()
            vanishing = (await client.post("/v1/sessions", json={})).json()
            listening = (await client.post("/v1/sessions", json={})).json()
            polling = (await client.post("/v1/sessions", json={})).json()
            assert [s["queue_position"] for s in (vanishing, listening, polling)] == [1, 2, 3]
            began = time.monotonic()
            async with Events(client, f"/v1/sessions/{vanishing['id']}/events") as gone:
                await gone.until(lambda snapshots: bool(snapshots))
            # The vanishing client's TCP connection is closed now: uvicorn notices, its stream stops heartbeating.
            async with Events(client, f"/v1/sessions/{listening['id']}/events") as events:

                async def poll() -> None:
                    while True:
                        await client.get(f"/v1/sessions/{polling['id']}")
                        await asyncio.sleep(HEARTBEAT_S / 4)

                poller = asyncio.create_task(poll())
                try:
                    await events.until(lambda s: bool(s) and s[-1]["queue_position"] == 1, within=HEARTBEAT_S * 5)
                    await asyncio.sleep(max(0.0, began + 2.5 * HEARTBEAT_S - time.monotonic()))
                    listed = {s["id"]: s for s in (await client.get("/v1/sessions")).json()["sessions"]}
                    assert (listed[vanishing["id"]]["status"], listed[vanishing["id"]]["reason"]) == (
                        "expired",
                        "heartbeat_lost",
                    )
                    # The ones that kept talking kept their places (over two heartbeat timeouts).
                    assert (listed[listening["id"]]["status"], listed[listening["id"]]["queue_position"]) == (
                        "queued",
                        1,
                    )
                    assert (listed[polling["id"]]["status"], listed[polling["id"]]["queue_position"]) == ("queued", 2)
                    await client.delete(f"/v1/sessions/{running['id']}")
                    await events.until(lambda s: bool(s) and s[-1]["status"] == "running")
                finally:
                    poller.cancel()
                    await asyncio.gather(poller, return_exceptions=True)
            text = (await client.get("/metrics")).text
            assert metric(text, 'lingstream_admissions_total{result="heartbeat_lost"}') == 1
            assert metric(text, "lingstream_admission_queue_depth") == 1


async def test_an_sse_subscriber_that_never_reads_keeps_a_bounded_buffer_and_is_released_when_it_goes() -> None:
    async with running_app(lambda s: [FakeWorld()], queue_size=64) as app:
        await app.create()
        ahead = [(await app.create()).json()["id"] for _ in range(40)]
        tail = (await app.create()).json()
        assert tail["queue_position"] == 41
        session = app.runtime._table[tail["id"]]
        blocked = asyncio.Event()
        disconnect = asyncio.Event()
        sent: list[MutableMapping[str, Any]] = []

        requested = False

        async def receive() -> dict[str, Any]:
            nonlocal requested
            if not requested:
                requested = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message)
            if message["type"] == "http.response.body" and len(sent) >= 3:
                blocked.set()
                await asyncio.Event().wait()  # a client that never reads: its socket buffer is full, for good

        path = f"/v1/sessions/{tail['id']}/events"
        scope = _http_scope(path)
        stream = asyncio.create_task(app.app(scope, receive, send))
        async with asyncio.timeout(5):
            await blocked.wait()
        assert session.snapshots.statistics().subscribers == 1
        for sid in ahead:
            await app.client.delete(f"/v1/sessions/{sid}")  # the tail moves up 40 places: 40 new snapshots
        assert (await app.get(tail["id"]))["queue_position"] == 1
        (subscription,) = session.snapshots._subscribers
        assert len(subscription._items) <= app.runtime.tuning.buffers.snapshots  # bounded: the oldest were dropped
        assert subscription.dropped >= 40 - app.runtime.tuning.buffers.snapshots - 1
        assert subscription._items[-1].queue_position == 1  # and the newest is always kept
        disconnect.set()
        async with asyncio.timeout(5):
            await stream
        assert session.snapshots.statistics().subscribers == 0


def _http_scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver")],
        "client": ("127.0.0.1", 50002),
        "server": ("testserver", 80),
    }


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")


async def test_never_reading_connections_leave_a_real_server_flat_and_responsive(tmp_path: Path) -> None:
    readers = 60
    with serve(tmp_path, LINGSTREAM_QUEUE_SIZE="64", LINGSTREAM_QUEUE_HEARTBEAT_TIMEOUT="30") as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=10.0) as client:
            await service.wait_ready(client)
            await client.post("/v1/sessions", json={"config": {"fps": 60}})
            ahead = [(await client.post("/v1/sessions", json={})).json()["id"] for _ in range(30)]
            tail = (await client.post("/v1/sessions", json={})).json()["id"]
            baseline = _rss_mb(service.process.pid)
            sockets: list[socket.socket] = []
            try:
                for _ in range(readers):
                    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
                    sock.connect(("127.0.0.1", service.port))
                    sock.sendall(f"GET /v1/sessions/{tail}/events HTTP/1.1\r\nHost: x\r\n\r\n".encode())
                    sockets.append(sock)  # ... and never read
                for sid in ahead:  # 30 position changes for every never-reading subscriber
                    await client.delete(f"/v1/sessions/{sid}")
                started = time.monotonic()
                for _ in range(20):
                    assert (await client.get("/healthz")).status_code == 200
                    created = await client.post("/v1/sessions", json={})
                    assert created.status_code == 202
                    await client.delete(f"/v1/sessions/{created.json()['id']}")
                elapsed = time.monotonic() - started
                grown = _rss_mb(service.process.pid) - baseline
                assert grown < 25, f"RSS grew {grown:.1f} MB with {readers} never-reading connections"
                assert elapsed < 10, f"40 requests took {elapsed:.1f} s beside never-reading connections"
                status = (await client.get(f"/v1/sessions/{tail}")).json()
                assert (status["status"], status["queue_position"]) == ("queued", 1)
            finally:
                for sock in sockets:
                    with contextlib.suppress(OSError):
                        sock.close()
            text = (await client.get("/metrics")).text
            await until(lambda: _settled(client), "the never-reading streams to be released", within=10)
    assert "Traceback" not in service.output()
    assert samples(text, "lingstream_sessions")['{state="queued"}'] == 1


async def _settled(client: httpx.AsyncClient) -> bool:
    text = (await client.get("/metrics")).text
    active = samples(text, "http_server_active_requests")
    return sum(active.values()) <= 1  # only this /metrics request


async def test_max_connections_caps_open_connections_and_frees_with_them(tmp_path: Path) -> None:
    """With LINGSTREAM_MAX_CONNECTIONS a swarm of idle keep-alive connections cannot grow past the cap: the next
    one is answered 503 at once (by uvicorn, before the app), and a closed connection makes room again."""
    with serve(tmp_path, LINGSTREAM_MAX_CONNECTIONS="3") as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=10.0) as client:
            await service.wait_ready(client)
        held: list[socket.socket] = []
        try:
            for _ in range(2):  # uvicorn refuses once the open connections reach the cap, the new one included
                sock = socket.create_connection(("127.0.0.1", service.port), timeout=10)
                held.append(sock)
                assert _status_of(sock) == 200  # answered, then left open and idle
            extra = socket.create_connection(("127.0.0.1", service.port), timeout=10)
            held.append(extra)
            assert _status_of(extra) == 503
            for sock in held:
                sock.close()
            held.clear()
            await until(
                lambda: _healthy_on_new_connection(service.port),
                "a slot freed by the closed connections",
                within=WAIT_S,
            )
        finally:
            for sock in held:
                with contextlib.suppress(OSError):
                    sock.close()
    assert "Traceback" not in service.output()


def _status_of(sock: socket.socket) -> int:
    """Sends GET /healthz on a keep-alive connection and returns the answer's status code (the body is read too)."""
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ", 2)[1])


async def _healthy_on_new_connection(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        return _status_of(sock) == 200
