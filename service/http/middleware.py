"""ASGI middleware: bounding request bodies before anything parses them, and CORS that tells refused origins nothing.

`BodyLimitMiddleware` answers 413 `payload_too_large` (in the one error shape) when a request declares a
`Content-Length` above the limit, and otherwise reads the body itself, at most `max_bytes` of it, before the app
runs: a chunked upload that grows past the limit is answered 413 too, and never more than `max_bytes` are held in
memory. The app then reads the buffered body; later `receive()` calls (disconnect notices for streams) pass through.

`StrictCORSMiddleware` is Starlette's CORS middleware, except for origins it does not allow: Starlette still sends
them the allowed methods, headers and max-age on a refused preflight (in plain text) and the exposed headers on
other requests; only `Access-Control-Allow-Origin` is left out. Here they get no CORS header at all, and a refused
preflight answers in the one JSON error shape.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import JSONResponse, Response
from starlette.types import Receive as StarletteReceive
from starlette.types import Scope as StarletteScope
from starlette.types import Send as StarletteSend

from service.errors import PayloadTooLargeError, error_body, http_status_spec, lookup

__all__ = ["BodyLimitMiddleware", "StrictCORSMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimitMiddleware:
    """Rejects request bodies larger than `max_bytes` with 413 before routing; buffers the rest (bounded)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._reject(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._reject(send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _reject(self, send: Send) -> None:
        error = PayloadTooLargeError(f"the request body is larger than {self.max_bytes} bytes")
        spec = lookup(error)
        status, code = (413, "payload_too_large") if spec is None else (spec.status, spec.code)
        payload = json.dumps(error_body(code, str(error))).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload, "more_body": False})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class StrictCORSMiddleware(CORSMiddleware):
    """CORS for the configured origins only: a refused preflight says nothing about the policy to anyone else."""

    def preflight_response(self, request_headers: Headers) -> Response:
        response = super().preflight_response(request_headers)
        if response.status_code < 400:
            return response
        spec = http_status_spec(response.status_code)
        reason = bytes(response.body).decode("utf-8", "replace")
        headers: dict[str, str] = {}
        if self.is_allowed_origin(origin=request_headers["origin"]):
            headers = {k: v for k, v in response.headers.items() if k.lower().startswith("access-control-")}
        return JSONResponse(error_body(spec.code, reason), status_code=spec.status, headers=headers)

    async def simple_response(
        self, scope: StarletteScope, receive: StarletteReceive, send: StarletteSend, request_headers: Headers
    ) -> None:
        # Starlette calls this for requests without an Origin too (a health check, a server-side client): those are
        # passed through untouched.
        origin = request_headers.get("origin")
        if origin is not None and self.is_allowed_origin(origin=origin):
            await super().simple_response(scope, receive, send, request_headers)
        else:
            await self.app(scope, receive, send)
