"""A session's server-sent event stream (`GET /v1/sessions/{id}/events`): its snapshots as `session` events.

The body starts with a `retry` hint and the current snapshot, then sends one event per later snapshot (a slow
reader skips intermediate ones: every snapshot is complete, and the sequence number, the event id, only grows) and a
keep-alive comment after `keepalive` seconds without one. Every event and keep-alive is a heartbeat of the session
(a queued session keeps its place while a stream is open). It ends after the terminal snapshot, and the
subscription ends with the response however it ends (see `_EventStreamResponse`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi.responses import StreamingResponse

from service.http.schemas import session_body
from service.runtime.runtime import ServiceRuntime, SnapshotStream
from service.runtime.sessions import SessionSnapshot

__all__ = ["event_stream_response"]


def event_stream_response(
    runtime: ServiceRuntime,
    first: SessionSnapshot,
    subscription: SnapshotStream,
    keepalive: float,
    *,
    redact: bool = False,
) -> StreamingResponse:
    """The streaming response of one client's event stream, from `first` on. `redact`: leave the join details out
    (a share link's watcher must not read the controller's)."""
    return _EventStreamResponse(
        subscription,
        _event_stream(runtime, first, subscription, keepalive, redact),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


class _EventStreamResponse(StreamingResponse):
    """The SSE response; it unsubscribes when it ends, however it ends.

    A client that stops reading and then disconnects is noticed while the stream waits in `send`: Starlette then
    cancels the stream without closing its body iterator, so the iterator's own `with subscription` would only
    run when the garbage collector finds the suspended generator, and until then the session kept publishing to it.
    """

    def __init__(self, subscription: SnapshotStream, content: AsyncIterator[str], **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self._subscription = subscription

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._subscription.close()


async def _event_stream(
    runtime: ServiceRuntime,
    first: SessionSnapshot,
    subscription: SnapshotStream,
    keepalive: float,
    redact: bool,
) -> AsyncIterator[str]:
    """The SSE body. Ends after the terminal snapshot; closing it (client gone) unsubscribes at once."""
    with subscription:
        yield "retry: 3000\n\n"
        yield _sse_event(first, redact)
        last = first.sequence
        if first.terminal:
            return
        while True:
            try:
                async with asyncio.timeout(keepalive):
                    snapshot = await anext(subscription)
            except TimeoutError:
                runtime.heartbeat(first.id)
                yield ": keep-alive\n\n"
                continue
            except StopAsyncIteration:
                return
            runtime.heartbeat(first.id)
            if snapshot.sequence <= last:
                continue
            last = snapshot.sequence
            yield _sse_event(snapshot, redact)
            if snapshot.terminal:
                return


def _sse_event(snapshot: SessionSnapshot, redact: bool) -> str:
    body = session_body(snapshot)
    if redact:
        body.transport = None
    data = body.model_dump_json()
    return f"event: session\nid: {snapshot.sequence}\ndata: {data}\n\n"
