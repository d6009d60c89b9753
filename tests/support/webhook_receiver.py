"""A real HTTP webhook receiver on loopback (aiohttp), for the webhook tests: it records every request (body,
headers), answers each with the next status of a script (then 200), or never answers (`hang`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    path: str
    body: bytes
    headers: Mapping[str, str]

    @property
    def event(self) -> dict[str, Any]:
        parsed: dict[str, Any] = json.loads(self.body)
        return parsed


@dataclass
class WebhookReceiver:
    """`statuses`: what the first requests are answered with (then 200); `hang`: leave each request that comes
    while it is set unanswered (for good). `answered_2xx`: the requests answered 2xx."""

    statuses: list[int] = field(default_factory=list)
    hang: bool = False
    received: list[Received] = field(default_factory=list)
    answered_2xx: list[Received] = field(default_factory=list)
    url: str = ""
    _arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        got = Received(request.path, await request.read(), dict(request.headers))
        self.received.append(got)
        self._arrived.set()
        if self.hang:
            await asyncio.Event().wait()
        status = self.statuses.pop(0) if self.statuses else 200
        if 200 <= status < 300:
            self.answered_2xx.append(got)
            self._arrived.set()
        return web.Response(status=status, text="ok")

    def events(self, type_: str | None = None) -> list[dict[str, Any]]:
        return [r.event for r in self.received if type_ is None or r.event["type"] == type_]

    async def wait_for(self, predicate: Any, what: str, within_s: float = 10.0) -> None:
        """Until `predicate()` holds, re-checked as each request arrives."""
        async with asyncio.timeout(within_s):
            while not predicate():
                self._arrived.clear()
                try:
                    async with asyncio.timeout(0.5):
                        await self._arrived.wait()
                except TimeoutError:
                    continue
        assert predicate(), what


@asynccontextmanager
async def webhook_receiver(*, statuses: list[int] | None = None, hang: bool = False) -> AsyncIterator[WebhookReceiver]:
    receiver = WebhookReceiver(statuses=list(statuses or []), hang=hang)
    app = web.Application()
    app.router.add_post("/{tail:.*}", receiver.handle)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    receiver.url = f"http://127.0.0.1:{port}/hooks"
    try:
        yield receiver
    finally:
        await runner.cleanup()
