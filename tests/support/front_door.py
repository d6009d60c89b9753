"""`FrontDoor`: one address in front of several replicas, as a Kubernetes Service or a load balancer is: each TCP
connection goes to the first replica (in the order given) that accepts it, so the clients of a test reach "the
service" and keep reaching it when the replica they used dies. It forwards bytes and understands no HTTP; it runs
on the test's event loop, on loopback.

    async with FrontDoor([r1.port, r2.port]) as door:
        client = ServiceClient(door.url)

`ThreadedFrontDoor` is the same on an event loop of its own, on a thread, for a synchronous test (Playwright's sync
API drives the page in Chromium: the browser's WebRTC media still goes to the replica's own candidates).

Why not a real proxy: the property a test needs is only "a connection the dead replica refuses goes to a live one",
which a dozen lines give without a binary to install; a real load balancer's health checks would only delay it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Sequence
from types import TracebackType

__all__ = ["FrontDoor", "ThreadedFrontDoor"]

_PIPE_BYTES = 1 << 16


class FrontDoor:
    """Forwards each connection to the first of `ports` (on `host`, 127.0.0.1 unless told) that accepts it.
    `connections[port]` counts the connections each replica got. Use as an async context manager; closing ends every
    forwarded connection."""

    def __init__(self, ports: Sequence[int], *, host: str = "127.0.0.1") -> None:
        self._ports = tuple(ports)
        self._host = host
        self._server: asyncio.Server | None = None
        self._pipes: set[asyncio.Task[None]] = set()
        self.connections: dict[int, int] = dict.fromkeys(self._ports, 0)

    @property
    def url(self) -> str:
        assert self._server is not None, "the front door is not open"
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def route(self, ports: Sequence[int]) -> None:
        """New connections go to `ports` from now on (as a Service's endpoints change when pods become ready or
        drain); connections already forwarded stay where they are."""
        self._ports = tuple(ports)
        for port in self._ports:
            self.connections.setdefault(port, 0)

    async def __aenter__(self) -> FrontDoor:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in tuple(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if server is not None:
            await server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        for port in self._ports:
            with contextlib.suppress(OSError):
                upstream = await asyncio.open_connection(self._host, port)
                self.connections[port] += 1
                break
        if upstream is None:  # no replica accepts: the client sees its connection closed, as behind a balancer
            writer.close()
            return
        up_reader, up_writer = upstream
        pipes = (
            asyncio.create_task(_pipe(reader, up_writer), name="front-door-up"),
            asyncio.create_task(_pipe(up_reader, writer), name="front-door-down"),
        )
        self._pipes.update(pipes)
        try:
            await asyncio.gather(*pipes, return_exceptions=True)
        finally:
            self._pipes.difference_update(pipes)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(_PIPE_BYTES):
            sink.write(data)
            await sink.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        sink.close()


class ThreadedFrontDoor:
    """A `FrontDoor` on its own event loop and thread, for synchronous tests: `with ThreadedFrontDoor(ports)`."""

    def __init__(self, ports: Sequence[int], *, host: str = "127.0.0.1") -> None:
        self._door = FrontDoor(ports, host=host)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="front-door", daemon=True)

    @property
    def url(self) -> str:
        return self._door.url

    @property
    def connections(self) -> dict[int, int]:
        return self._door.connections

    def route(self, ports: Sequence[int]) -> None:
        """`FrontDoor.route`, on the door's own loop (done when this returns)."""
        asyncio.run_coroutine_threadsafe(self._route(ports), self._loop).result(timeout=10)

    async def _route(self, ports: Sequence[int]) -> None:
        self._door.route(ports)

    def __enter__(self) -> ThreadedFrontDoor:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._door.__aenter__(), self._loop).result(timeout=10)
        return self

    def __exit__(
        self, _type: type[BaseException] | None, _exc: BaseException | None, _tb: TracebackType | None
    ) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._door.__aexit__(None, None, None), self._loop).result(timeout=10)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()
