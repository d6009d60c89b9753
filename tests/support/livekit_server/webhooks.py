"""Signed webhooks to the service, as LiveKit sends them: a JSON `WebhookEvent` body and, in `Authorization`, a JWT
of the API key signed with its secret whose `sha256` claim is the base64 SHA-256 of the body.

One sender task posts them in the order they happened, one at a time, each attempt bounded; a failure is counted
and logged, not retried (the real server retries; the service must not depend on either).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import Counter

import aiohttp
from google.protobuf.json_format import MessageToJson
from livekit import api
from livekit.protocol import models

from tests.support.fakes.livekit import sign_webhook

__all__ = ["WebhookSender"]

logger = logging.getLogger(__name__)

_TIMEOUT_S = 5.0
_BOUND = 1024


class WebhookSender:
    """Posts `(event, room, participant)` to `url` (no url: counted as skipped). `start()` on the loop, `close()`
    waits for what is queued, bounded by the per-request timeout."""

    def __init__(self, url: str | None, api_key: str, api_secret: str, counters: Counter[str]) -> None:
        self._url = url
        self._key = api_key
        self._secret = api_secret
        self._counters = counters
        self._queue: asyncio.Queue[tuple[str, str] | None] = asyncio.Queue(_BOUND)
        self._task: asyncio.Task[None] | None = None
        self.sent: list[str] = []  # the event names, in order (what tests read)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="webhooks")

    def queue(self, event: str, room: models.Room, participant: models.ParticipantInfo | None) -> None:
        message = api.WebhookEvent(event=event, room=room, id="EV_" + secrets.token_hex(6), created_at=int(time.time()))
        if participant is not None:
            message.participant.CopyFrom(participant)
        if self._url is None:
            self._counters["webhooks_skipped"] += 1
            return
        try:
            self._queue.put_nowait((event, MessageToJson(message)))
        except asyncio.QueueFull:
            self._counters["webhooks_dropped"] += 1

    async def _run(self) -> None:
        assert self._url is not None or self._queue.empty()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_TIMEOUT_S)) as session:
            while (item := await self._queue.get()) is not None:
                event, body = item
                headers = {
                    "Authorization": sign_webhook(body, self._key, self._secret),
                    "Content-Type": "application/webhook+json",
                }
                try:
                    async with session.post(self._url or "", data=body.encode(), headers=headers) as response:
                        ok = response.status < 300
                except (aiohttp.ClientError, TimeoutError) as exc:
                    logger.warning("webhook to %s failed: %s", self._url, exc)
                    ok = False
                self._counters["webhooks_sent" if ok else "webhooks_failed"] += 1
                if ok:
                    self.sent.append(event)

    async def close(self) -> None:
        if self._task is None:
            return
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(None)
        try:
            async with asyncio.timeout(_TIMEOUT_S * 2):
                await self._task
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
