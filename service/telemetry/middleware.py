"""`TelemetryMiddleware`: per request `http.server.request.duration` and `http.server.active_requests`, and a SERVER
span whose parent is the W3C `traceparent` the request carried. Labels and span names use the route template
(`/v1/sessions/{session_id}`), never the path, so no session id leaks. Its instruments and tracer are those of
`service.telemetry.otel.Telemetry`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace as trace_api
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

if TYPE_CHECKING:
    from service.telemetry.otel import Telemetry

__all__ = ["TelemetryMiddleware"]

_UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})  # probes and scrapes: metrics only, no spans
_HTTP_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TelemetryMiddleware:
    """ASGI middleware: HTTP server metrics and a SERVER span for every request.

    Install it outermost, so that answers from inner middleware (413 from the body bound, CORS preflights) are
    measured too. The span is current while the app handles the request, so what the handler starts (a session's
    span) is its child. Probes and scrapes (`/healthz`, `/readyz`, `/metrics`) are measured but not traced.
    Attributes follow the HTTP semantic conventions: `http.request.method`, `http.route` (the template, absent
    when nothing matched), `http.response.status_code`, `url.scheme`, `error.type` (5xx or an exception).
    """

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self._telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        telemetry = self._telemetry
        started = time.perf_counter()
        method = str(scope.get("method", "")).upper()
        method = method if method in _HTTP_METHODS else "_OTHER"
        base: dict[str, Any] = {"http.request.method": method, "url.scheme": str(scope.get("scheme", "http"))}
        span: Span | None = None
        if scope.get("path") not in _UNTRACED_PATHS:
            carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", ())}
            span = telemetry.tracer.start_span(
                method if method != "_OTHER" else "HTTP",
                context=telemetry.propagator.extract(carrier),
                kind=SpanKind.SERVER,
                attributes={**base, "network.protocol.version": str(scope.get("http_version", "1.1"))},
            )
        status: int | None = None

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        telemetry.http_active.add(1, base)
        error: BaseException | None = None
        try:
            if span is None:
                await self.app(scope, receive, send_and_watch)
            else:
                with trace_api.use_span(span, record_exception=False, set_status_on_exception=False):
                    await self.app(scope, receive, send_and_watch)
        except BaseException as exc:
            error = exc
            if status is None and not isinstance(exc, asyncio.CancelledError):
                status = 500  # what the server's outermost error handler answers for it
            raise
        finally:
            telemetry.http_active.add(-1, base)
            self._finish(scope, span, base, status, error, time.perf_counter() - started)

    def _finish(
        self,
        scope: Scope,
        span: Span | None,
        base: Mapping[str, Any],
        status: int | None,
        error: BaseException | None,
        duration: float,
    ) -> None:
        attributes = dict(base)
        route = getattr(scope.get("route"), "path", None)
        if isinstance(route, str) and route:
            attributes["http.route"] = route
        else:
            route = None
        if status is not None:
            attributes["http.response.status_code"] = status
        error_type = type(error).__qualname__ if error is not None else None
        if error_type is None and status is not None and status >= 500:
            error_type = str(status)
        if error_type is not None:
            attributes["error.type"] = error_type
        self._telemetry.http_duration.record(duration, attributes)
        if span is None:
            return
        method = str(base["http.request.method"])
        name = method if method != "_OTHER" else "HTTP"
        span.update_name(f"{name} {route}" if route else name)
        span.set_attributes(attributes)
        if error_type is not None:
            span.set_status(Status(StatusCode.ERROR, error_type))
        span.end()
