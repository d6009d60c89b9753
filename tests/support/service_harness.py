"""Test helpers for the service: a running app with fake workers, a recording transport, an SSE reader."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Mapping, MutableMapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI

from admission import AdmissionController
from pipeline.bidirectional import ChunkOutput
from service.app import create_app, runtime_of
from service.runtime.memory_backend import MemoryAdmissionBackend
from service.runtime.recordings import WriterFactory
from service.runtime.runtime import RuntimeTuning, ServiceRuntime, SessionEvents
from service.settings import load_settings
from tests.support.fakes.clock import FakeClock
from tests.support.fakes.world import FakeWorld
from transport.base import BindingStatistics, DoneStatus, SessionPort, StatusMessage
from transport.errors import SessionNotAttachedError
from transport.session.pacing import PacerStatistics
from transport.session.timers import Timers

FAST = RuntimeTuning(
    create_wait_s=5.0,
    delete_wait_s=0.5,
    sse_keepalive_s=0.05,
    health_interval_s=0.05,
    reader_stop_s=1.0,
    drain_close_grace_s=0.2,
    shutdown_close_s=2.0,
    admission_tick_s=0.05,
)


@dataclass(frozen=True)
class RecordingStatistics:
    sessions: int


class RecordingTransport:
    """A `Transport` that records attach/detach and reads every session's status stream to its end. Its bindings
    send no frames: their statistics are all 0."""

    kind = "fake"

    def __init__(self, *, fail_attach: bool = False) -> None:
        self.fail_attach = fail_attach
        self.ports: dict[str, SessionPort] = {}
        self.statuses: dict[str, list[StatusMessage]] = {}
        self.detached: list[tuple[str, str]] = []
        self.started = False
        self.stopped = False
        self._readers: dict[str, asyncio.Task[None]] = {}

    async def start(self) -> None:
        self.started = True

    async def aclose(self) -> None:
        self.stopped = True
        for task in self._readers.values():
            task.cancel()
        await asyncio.gather(*self._readers.values(), return_exceptions=True)

    async def attach(self, port: SessionPort) -> Mapping[str, object]:
        if self.fail_attach:
            raise RuntimeError("fake attach failure")
        self.ports[port.session_id] = port
        self.statuses[port.session_id] = []
        self._readers[port.session_id] = asyncio.create_task(self._read(port))
        return self.join_details(port.session_id)

    def join_details(self, session_id: str) -> Mapping[str, object]:
        if session_id not in self.ports:
            raise SessionNotAttachedError(session_id)
        return {"kind": "fake", "room": f"room-{session_id}"}

    async def detach(self, session_id: str, reason: str) -> None:
        self.detached.append((session_id, reason))
        reader = self._readers.pop(session_id, None)
        if reader is not None:
            await asyncio.wait_for(reader, timeout=5)

    def statistics(self) -> RecordingStatistics:
        return RecordingStatistics(sessions=len(self.ports) - len(self.detached))

    def binding_statistics(self, session_id: str) -> BindingStatistics:
        if session_id not in self.ports or session_id in {detached for detached, _ in self.detached}:
            raise SessionNotAttachedError(session_id)
        return BindingStatistics(pacer=_NO_FRAMES, frames_unsent=0, track_dropped=None, reconnects={})

    async def _read(self, port: SessionPort) -> None:
        async for message in port.status():
            self.statuses[port.session_id].append(message)
            if isinstance(message, DoneStatus):
                return


_NO_FRAMES = PacerStatistics(
    frames_in=0,
    frames_sent=0,
    dropped_late=0,
    dropped_overflow=0,
    rejected_size=0,
    underruns=0,
    reanchors=0,
    pending=0,
    max_lateness=0.0,
)


@dataclass
class Harness:
    app: FastAPI
    runtime: ServiceRuntime
    workers: list[FakeWorld]
    client: httpx.AsyncClient
    clock: FakeClock | None
    transport: RecordingTransport | None
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def world(self) -> FakeWorld:
        return self.workers[0]

    @property
    def controller(self) -> AdmissionController:
        """The in-memory admission's controller (read-only use: tickets, invariant checks)."""
        return controller_of(self.runtime)

    async def create(self, body: Any = None, **kwargs: Any) -> httpx.Response:
        return await self.client.post("/v1/sessions", json={} if body is None else body, **kwargs)


def controller_of(runtime: ServiceRuntime) -> AdmissionController:
    backend = runtime.backend
    assert isinstance(backend, MemoryAdmissionBackend), "the runtime runs on the in-memory admission"
    return backend.controller


@contextlib.asynccontextmanager
async def running_service(
    *,
    clock: FakeClock | None = None,
    transport: RecordingTransport | None = None,
    tuning: RuntimeTuning = FAST,
    world: dict[str, Any] | None = None,
    client: tuple[str, int] = ("127.0.0.1", 50000),
    recording_writer: WriterFactory | None = None,
    timers: Timers | None = None,
    events: SessionEvents | None = None,
    wall_clock: Callable[[], float] | None = None,
    **settings: Any,
) -> AsyncIterator[Harness]:
    """An app on fake workers with its lifespan running and the workers started; `settings` are overrides."""
    loaded = load_settings(**settings)
    workers: list[FakeWorld] = []

    def factory(s: Any) -> list[FakeWorld]:
        workers.extend(FakeWorld(**(world or {})) for _ in range(s.num_workers))
        return workers

    app = create_app(
        loaded,
        worker_factory=factory,
        transport=transport,
        clock=clock,
        tuning=tuning,
        recording_writer=recording_writer,
        timers=timers,
        events=events,
        wall_clock=wall_clock,
    )
    async with app.router.lifespan_context(app):
        runtime = runtime_of(app)
        await runtime.wait_ready()
        asgi = httpx.ASGITransport(app=app, client=client)
        async with httpx.AsyncClient(transport=asgi, base_url="http://testserver") as http:
            yield Harness(app, runtime, workers, http, clock, transport)


class SseStream:
    """Drives a streaming ASGI response directly (httpx's ASGI transport buffers whole bodies)."""

    def __init__(self, app: FastAPI, path: str, headers: Mapping[str, str] | None = None) -> None:
        self._app = app
        self._path, _, self._query = path.partition("?")
        self._headers = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
        self._messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._disconnect = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._buffer = ""
        self.status: int | None = None
        self.comments = 0

    async def __aenter__(self) -> SseStream:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": self._path,
            "raw_path": self._path.encode(),
            "query_string": self._query.encode(),
            "root_path": "",
            "headers": [(b"host", b"testserver"), *self._headers],
            "client": ("127.0.0.1", 50001),
            "server": ("testserver", 80),
        }
        sent_request = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_request
            if not sent_request:
                sent_request = True
                return {"type": "http.request", "body": b"", "more_body": False}
            await self._disconnect.wait()
            return {"type": "http.disconnect"}

        async def send(message: MutableMapping[str, Any]) -> None:
            await self._messages.put(dict(message))

        self._task = asyncio.create_task(self._app(scope, receive, send))
        start = await asyncio.wait_for(self._messages.get(), timeout=5)
        assert start["type"] == "http.response.start"
        self.status = start["status"]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._disconnect.set()
        assert self._task is not None
        await asyncio.wait_for(self._task, timeout=5)

    async def body(self) -> bytes:
        """The whole body (for error answers)."""
        chunks = []
        while True:
            message = await asyncio.wait_for(self._messages.get(), timeout=5)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def next_item(self, within: float = 5.0) -> dict[str, Any] | None:
        """The next event as `{"event", "id", "data"}`, `{"comment": text}`, or None at the end of the stream."""
        while True:
            if "\n\n" in self._buffer:
                block, self._buffer = self._buffer.split("\n\n", 1)
                item = _parse_block(block)
                if item is None:
                    continue
                if "comment" in item:
                    self.comments += 1
                return item
            message = await asyncio.wait_for(self._messages.get(), timeout=within)
            self._buffer += message.get("body", b"").decode()
            if not message.get("more_body", False) and "\n\n" not in self._buffer:
                return None

    async def next_event(self, within: float = 5.0) -> dict[str, Any] | None:
        """The next `session` event's decoded data, skipping comments; None at the end."""
        while True:
            item = await self.next_item(within)
            if item is None:
                return None
            if item.get("event") == "session":
                data: dict[str, Any] = json.loads(item["data"])
                return data


def _parse_block(block: str) -> dict[str, Any] | None:
    item: dict[str, Any] = {}
    for line in block.split("\n"):
        if line.startswith(":"):
            return {"comment": line[1:].strip()}
        name, _, value = line.partition(": ")
        if name in ("event", "id", "data", "retry"):
            item[name] = value
    if "retry" in item and len(item) == 1:
        return None
    return item


async def wait_status(svc: Harness, session_id: str, *statuses: str, within: float = 5.0) -> dict[str, Any]:
    """Poll GET until the session's status is one of `statuses` (fails the test at the deadline)."""
    async with asyncio.timeout(within):
        while True:
            response = await svc.client.get(f"/v1/sessions/{session_id}", headers=svc.headers)
            body: dict[str, Any] = response.json()
            if body.get("status") in statuses:
                return body
            await asyncio.sleep(0)


def metric(text: str, name: str) -> float:
    """The value of one sample line (`name` includes its labels) of a Prometheus exposition."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name!r} in /metrics")


class FramesTransport(RecordingTransport):
    """A `RecordingTransport` that also keeps every whole chunk the session hands its transport."""

    def __init__(self) -> None:
        super().__init__()
        self.chunks: dict[str, list[ChunkOutput]] = {}
        self._frame_readers: list[asyncio.Task[None]] = []

    async def attach(self, port: SessionPort) -> Mapping[str, object]:
        self.chunks[port.session_id] = []
        self._frame_readers.append(asyncio.create_task(self._frames(port)))
        return await super().attach(port)

    async def _frames(self, port: SessionPort) -> None:
        async for item in port.chunks():
            if isinstance(item, ChunkOutput):
                self.chunks[port.session_id].append(item)

    async def aclose(self) -> None:
        for task in self._frame_readers:
            task.cancel()
        await asyncio.gather(*self._frame_readers, return_exceptions=True)
        await super().aclose()
