"""A TCP proxy in front of a real server, in the test's event loop: network outages on demand.

`tests.support.fakes.redis_server.RedisServer.stop()` is an outage in which Redis also loses its data. A network outage
keeps it: the server goes on, only its clients lose it. `TcpProxy` sits between the clients and the server and
makes both kinds the admission backend must ride out:

- `refuse()`: every open connection is cut and new ones are accepted and closed at once (the client sees a
  connection error); each attempt is recorded in `attempts` (event-loop time), so a test can read a client's
  retry schedule.
- `lose_replies()`: requests still reach the server, which acts on them, but no reply comes back (a partition
  after the request went out).
- `cut_at_reply_to(marker)`: the reply to the first request that contains `marker` is dropped and cuts every
  connection, then new ones are refused: the server acted, the caller learns at once that the link broke.
- `lose_requests()`: requests are dropped on the way (recorded in `lost_requests`): the server never hears of
  them and the client waits (a partition before the request went out).
- `restore()`: cut what is open (it may carry stale replies) and pass new connections again.

Use it as an async context manager; `url` is a Redis URL for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType
from typing import Self

__all__ = ["TcpProxy"]


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, client: asyncio.StreamWriter, server: asyncio.StreamWriter) -> None:
        self.client = client
        self.server = server
        self.marked = False  # it carried the request whose reply cuts everything

    def close(self) -> None:
        self.client.close()
        self.server.close()


class TcpProxy:
    """Forwards 127.0.0.1:`port` to 127.0.0.1:`target_port`; see the module docstring."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._server: asyncio.Server | None = None
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self._refusing = False
        self._losing = False
        self._dropping = False
        self._cut_after: bytes | None = None
        self.port = 0
        self.attempts: list[float] = []
        """Event-loop times of the connections refused."""
        self.lost_requests = bytearray()
        """What `lose_requests()` dropped."""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def __aenter__(self) -> Self:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        self._cut()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)

    def refuse(self) -> None:
        """Cut every connection; accept and close new ones at once (recorded in `attempts`)."""
        self._refusing, self._losing, self._dropping, self._cut_after = True, False, False, None
        self._cut()

    def lose_replies(self) -> None:
        """Requests go on reaching the server; replies are dropped (on open connections too)."""
        self._losing = True

    def cut_at_reply_to(self, marker: bytes) -> None:
        """The reply to the first request from now on that contains `marker` is dropped and cuts everything, as
        `refuse()`."""
        self._cut_after = marker

    def lose_requests(self) -> None:
        """Requests are dropped (on open connections too) and recorded in `lost_requests`; no reply comes."""
        self._dropping = True

    def restore(self) -> None:
        """Cut what is open and pass new connections again."""
        self._refusing, self._losing, self._dropping, self._cut_after = False, False, False, None
        self._cut()

    def _cut(self) -> None:
        for link in list(self._links):
            link.close()
        self._links.clear()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            if self._refusing:
                self.attempts.append(asyncio.get_running_loop().time())
                return
            try:
                server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self._target_port)
            except OSError:
                return
            link = _Link(writer, server_writer)
            self._links.add(link)
            try:
                await asyncio.gather(self._requests(reader, link), self._replies(server_reader, link))
            finally:
                self._links.discard(link)
                link.close()
                with contextlib.suppress(OSError):
                    await server_writer.wait_closed()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            self._handlers.discard(task)

    async def _requests(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if self._dropping:
                    self.lost_requests += data
                    continue
                if self._cut_after is not None and self._cut_after in data:
                    link.marked, self._cut_after = True, None
                link.server.write(data)
                await link.server.drain()
        link.close()

    async def _replies(self, reader: asyncio.StreamReader, link: _Link) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                if link.marked:
                    self.refuse()
                    break
                if self._losing:
                    continue
                link.client.write(data)
                await link.client.drain()
        link.close()
