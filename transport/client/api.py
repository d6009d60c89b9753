"""The REST half of the Python client: create a session, follow it through the queue, end it.

`ServiceClient` speaks the service's `/v1` API (docs/api.md) with httpx. Every error answer becomes the typed
exception of its stable code (`transport.client.errors`); a service that cannot be reached is an
`UnreachableError`. `follow(id)` reads the session's server-sent events (the queue heartbeat while it waits) and
yields one `SessionInfo` per change; `wait_streaming(id)` follows until the session streams and raises
`SessionEndedError` if it ends first.

    async with ServiceClient("http://127.0.0.1:8080", api_key=None) as service:
        info = await service.create(config={"fps": 16})
        info = await service.wait_streaming(info.id, on_update=lambda i: print(i.status, i.queue_position))
        ...
        await service.delete(info.id)
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, overload

import httpx

from transport.client.errors import ApiError, SessionEndedError, UnreachableError, api_error

__all__ = [
    "STREAMING_STATUSES",
    "TERMINAL_STATUSES",
    "ClientToken",
    "RecordingInfo",
    "ServiceClient",
    "SessionInfo",
    "ShareLinkInfo",
    "UsageInfo",
]

TERMINAL_STATUSES = frozenset({"closed", "expired", "failed", "cancelled"})
STREAMING_STATUSES = frozenset({"running", "paused", "recovering", "draining"})
_DEFAULT_TIMEOUT_S = 30.0
_REDIRECTS = frozenset({301, 302, 303, 307, 308})


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """A session as the service last described it (the session body of docs/api.md).

    `transport` holds the join details (`kind` is `embedded` or `livekit`) once the session streams; `error` is
    `(code, message)` when it failed; `body` is the whole JSON body as received."""

    id: str
    status: str
    reason: str | None
    queue_position: int | None
    transport: Mapping[str, Any] | None
    width: int
    height: int
    fps: float
    config: Mapping[str, Any]
    error: tuple[str, str] | None
    body: Mapping[str, Any] = field(repr=False)
    session_token: str | None = field(default=None, repr=False)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def streaming(self) -> bool:
        return self.status in STREAMING_STATUSES and self.transport is not None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> SessionInfo:
        try:
            video = body["video"]
            error = body.get("error")
            return cls(
                id=str(body["id"]),
                status=str(body["status"]),
                reason=body.get("reason"),
                queue_position=body.get("queue_position"),
                transport=body.get("transport"),
                width=int(video["width"]),
                height=int(video["height"]),
                fps=float(video["fps"]),
                config=body.get("config") or {},
                error=None if not error else (str(error["code"]), str(error["message"])),
                body=body,
                session_token=body.get("session_token"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ApiError(200, "bad_response", f"not a session body: {exc!r}") from exc

    def ended_error(self) -> SessionEndedError:
        code, message = self.error if self.error is not None else (None, None)
        return SessionEndedError(self.id, self.status, self.reason, code, message)


@dataclass(frozen=True, slots=True)
class RecordingInfo:
    """One of the key's recordings (`GET /v1/recordings`): its session, state (`ready`, `failed`, `uploading`,
    ...), the code that stopped a failed one, frames and bytes, when it started and last changed (ISO 8601 UTC
    strings, as sent); `body` is the item as received."""

    session_id: str
    state: str
    code: str | None
    frames: int
    bytes: int
    started_at: str
    updated_at: str
    body: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> RecordingInfo:
        try:
            return cls(
                session_id=str(body["session_id"]),
                state=str(body["state"]),
                code=body.get("code"),
                frames=int(body["frames"]),
                bytes=int(body["bytes"]),
                started_at=str(body["started_at"]),
                updated_at=str(body["updated_at"]),
                body=body,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ApiError(200, "invalid_response", f"not a recording: {exc}") from None


@dataclass(frozen=True, slots=True)
class UsageInfo:
    """`GET /v1/usage`: the key's usage from `since` to `until` (ISO 8601 UTC strings, as the service sent them) and
    its quota (`None`: no bound); `body` is the whole JSON body as received."""

    key: str
    since: str
    until: str
    running_seconds: float
    queued_seconds: float
    sessions: int
    chunks: int
    frames: int
    max_running: int | None
    max_queued: int | None
    body: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> UsageInfo:
        try:
            quota = body["quota"]
            return cls(
                key=str(body["key"]),
                since=str(body["since"]),
                until=str(body["until"]),
                running_seconds=float(body["running_seconds"]),
                queued_seconds=float(body["queued_seconds"]),
                sessions=int(body["sessions"]),
                chunks=int(body["chunks"]),
                frames=int(body["frames"]),
                max_running=quota.get("max_running"),
                max_queued=quota.get("max_queued"),
                body=body,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ApiError(200, "bad_response", f"not a usage body: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class ClientToken:
    """A client token (`ServiceClient.client_token`): hand `token` to a browser or another process, which creates
    with `ServiceClient(url, token=...)`; each create answers its session's `session_token`."""

    token: str = field(repr=False)
    token_id: str
    expires_at: float
    max_creates: int
    max_seconds: float | None
    record: bool
    origins: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShareLinkInfo:
    """A share link (`ServiceClient.share`): `watch_url` (relative to the service's URL) opens the page as a viewer;
    `watch_token` is watch-only (`ServiceClient(url, token=...)` reads the session, follows it and adds viewers);
    `share_id` revokes it (`revoke_share`); `expires_at` is the latest it works (Unix seconds)."""

    share_id: str
    watch_url: str = field(repr=False)  # it carries the watch token
    watch_token: str = field(repr=False)
    expires_at: float
    body: Mapping[str, Any] = field(repr=False)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ShareLinkInfo:
        try:
            return cls(
                share_id=str(body["share_id"]),
                watch_url=str(body["watch_url"]),
                watch_token=str(body["watch_token"]),
                expires_at=float(body["expires_at"]),
                body=body,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ApiError(201, "bad_response", f"not a share link: {exc!r}") from exc


class ServiceClient:
    """The REST API of one lingstream service. Use as an async context manager (or call `aclose()`).

    `url` is the service's base URL; `api_key` the bearer key when the service has keys, or `token` a client,
    session or watch token instead (docs/integrate.md: a client token creates, and the created `SessionInfo`
    carries the session token for the rest; `with_token` gives a client that uses it); `timeout` bounds every
    request but the event stream (which may stay open while a session waits). Pass `http` to share an
    `httpx.AsyncClient` (this object then does not close it)."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        token: str | None = None,
        timeout: float = _DEFAULT_TIMEOUT_S,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        if api_key and token:
            raise ValueError("give an API key or a token, not both")
        self.url = url.rstrip("/")
        credential = api_key or token
        headers = {"Authorization": f"Bearer {credential}"} if credential else {}
        self._owns_http = http is None
        self._http = http if http is not None else httpx.AsyncClient(timeout=timeout)
        self._headers = headers
        self._timeout = timeout

    def with_token(self, token: str) -> ServiceClient:
        """A client of the same service and connection pool that authenticates with `token` (e.g. a created
        session's `session_token`); closing it leaves this one's connections open."""
        return ServiceClient(self.url, token=token, timeout=self._timeout, http=self._http)

    async def __aenter__(self) -> ServiceClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()

    def absolute(self, path: str) -> str:
        """A URL of the service from a path the service gave (e.g. the embedded transport's `offer_url`)."""
        return path if path.startswith(("http://", "https://")) else f"{self.url}{path}"

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One request; a non-2xx answer raises its typed `ApiError`, a network failure `UnreachableError`."""
        url = self.absolute(path)
        try:
            response = await self._http.request(method, url, headers=self._headers, **kwargs)
        except httpx.TransportError as exc:
            raise UnreachableError(f"{method} {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise _error_of(response)
        return response

    # -- sessions ---------------------------------------------------------------------------------------------

    async def create(
        self,
        *,
        config: Mapping[str, Any] | None = None,
        image: bytes | None = None,
        livekit: Mapping[str, Any] | None = None,
        prompt: str | None = None,
        max_seconds: float | None = None,
        record: bool = False,
        webhook_url: str | None = None,
    ) -> SessionInfo:
        """`POST /v1/sessions`: admitted (`running`, or `admitted` when it took long) or `queued`.

        `image` is the reference image's bytes (PNG, JPEG or WebP); `livekit` the LiveKit options of the create
        (`{"room": ..., "controller_identity": ...}`: publish into an existing room, docs/livekit.md); `prompt` the
        text the session starts from; `max_seconds` its time limit (at most the server's); `record` records it
        (`recording(id)` downloads it once it ended; a service without LINGSTREAM_RECORDINGS_DIR answers 422
        `recording_not_configured`); `webhook_url` an endpoint of this session's own for its webhook events
        (docs/webhooks.md: it must start with one of the service's LINGSTREAM_WEBHOOK_ALLOWED_PREFIXES, else 422
        `webhook_url_not_allowed`)."""
        body: dict[str, Any] = {"config": dict(config or {})}
        if record:
            body["record"] = True
        if webhook_url is not None:
            body["webhook_url"] = webhook_url
        if prompt is not None:
            body["prompt"] = prompt
        if max_seconds is not None:
            body["max_seconds"] = max_seconds
        if image is not None:
            body["image"] = base64.b64encode(image).decode("ascii")
        if livekit is not None:
            body["livekit"] = dict(livekit)
        response = await self.request("POST", "/v1/sessions", json=body)
        return SessionInfo.from_body(response.json())

    async def get(self, session_id: str) -> SessionInfo:
        """`GET /v1/sessions/{id}` (a heartbeat while queued; LiveKit join tokens come fresh)."""
        return SessionInfo.from_body((await self.request("GET", f"/v1/sessions/{session_id}")).json())

    async def sessions(self) -> list[SessionInfo]:
        """`GET /v1/sessions`: this key's live and remembered sessions, oldest first."""
        sessions = (await self.request("GET", "/v1/sessions")).json()["sessions"]
        return [SessionInfo.from_body(body) for body in sessions]

    async def delete(self, session_id: str, mode: Literal["drain", "cancel"] = "drain") -> SessionInfo:
        """`DELETE /v1/sessions/{id}`: the final session, or one still `draining` (the close goes on)."""
        response = await self.request("DELETE", f"/v1/sessions/{session_id}", params={"mode": mode})
        return SessionInfo.from_body(response.json())

    async def pause(self, session_id: str) -> SessionInfo:
        """`POST /v1/sessions/{id}/pause` (idempotent): it generates nothing until resumed and keeps its state."""
        return SessionInfo.from_body((await self.request("POST", f"/v1/sessions/{session_id}/pause")).json())

    async def resume(self, session_id: str) -> SessionInfo:
        """`POST /v1/sessions/{id}/resume` (idempotent)."""
        return SessionInfo.from_body((await self.request("POST", f"/v1/sessions/{session_id}/resume")).json())

    # -- recordings, viewers, usage ---------------------------------------------------------------------------

    @overload
    async def recording(self, session_id: str) -> bytes: ...
    @overload
    async def recording(self, session_id: str, path: str | os.PathLike[str]) -> Path: ...
    async def recording(self, session_id: str, path: str | os.PathLike[str] | None = None) -> bytes | Path:
        """`GET /v1/sessions/{id}/recording`: the ended session's MP4, as bytes, or streamed to `path` (returned).
        409 `recording_not_ready` while it is still being finished: retry."""
        return await self._download(f"/v1/sessions/{session_id}/recording", path)

    @overload
    async def recording_controls(self, session_id: str) -> bytes: ...
    @overload
    async def recording_controls(self, session_id: str, path: str | os.PathLike[str]) -> Path: ...
    async def recording_controls(self, session_id: str, path: str | os.PathLike[str] | None = None) -> bytes | Path:
        """`GET /v1/sessions/{id}/recording/controls`: the recording's control trace (JSON Lines, what
        `lingstream generate --controls` replays), as bytes or streamed to `path` (returned)."""
        return await self._download(f"/v1/sessions/{session_id}/recording/controls", path)

    async def recordings(self, since: str | float | None = None, *, page: int = 100) -> list[RecordingInfo]:
        """`GET /v1/recordings`: this key's recordings started at `since` or later (RFC 3339 with an offset, or Unix
        seconds; default: every one kept), oldest first, every page read (`page` per request)."""
        found: list[RecordingInfo] = []
        params: dict[str, str | int] = {"limit": page}
        if since is not None:
            params["since"] = str(since)
        while True:
            body = (await self.request("GET", "/v1/recordings", params=params)).json()
            found.extend(RecordingInfo.from_body(item) for item in body["recordings"])
            if not body.get("next_cursor"):
                return found
            params["cursor"] = str(body["next_cursor"])

    async def _download(self, path: str, to: str | os.PathLike[str] | None) -> bytes | Path:
        """GET a recording's file from the service, or, when it answers a redirect (a recording in an object store:
        a presigned URL), from where it points, without this client's credentials."""
        if to is None:
            response = await self.request("GET", path)
            if response.status_code not in _REDIRECTS:
                return response.content
            return (await self._fetch(response.headers["location"], {})).content
        url = self.absolute(path)
        target = Path(to)
        partial = target.with_name(target.name + ".part")
        try:
            async with self._http.stream("GET", url, headers=self._headers) as response:
                location = response.headers.get("location") if response.status_code in _REDIRECTS else None
                if location is None:
                    await _save(response, partial)
            if location is not None:
                url = location
                async with self._http.stream("GET", url) as response:  # a presigned URL: no credentials of ours
                    await _save(response, partial)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise UnreachableError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        partial.replace(target)  # a reader never sees half a file under the final name
        return target

    async def client_token(
        self,
        *,
        ttl_seconds: int | None = None,
        max_creates: int | None = None,
        max_seconds: float | None = None,
        record: bool = False,
        origins: Sequence[str] = (),
    ) -> ClientToken:
        """`POST /v1/client_tokens` (API key only): a short-lived token that creates at most `max_creates` sessions
        (default 1) within the bounds given, charged to this key; 404 `tokens_not_configured` without
        LINGSTREAM_TOKEN_SECRET."""
        body: dict[str, Any] = {"record": record, "origins": list(origins)}
        for name, value in (("ttl_seconds", ttl_seconds), ("max_creates", max_creates), ("max_seconds", max_seconds)):
            if value is not None:
                body[name] = value
        answer = (await self.request("POST", "/v1/client_tokens", json=body)).json()
        return ClientToken(
            token=str(answer["token"]),
            token_id=str(answer["token_id"]),
            expires_at=float(answer["expires_at"]),
            max_creates=int(answer["max_creates"]),
            max_seconds=None if answer["max_seconds"] is None else float(answer["max_seconds"]),
            record=bool(answer["record"]),
            origins=tuple(answer["origins"]),
        )

    async def share(self, session_id: str) -> ShareLinkInfo:
        """`POST /v1/sessions/{id}/viewers` with `share: true`: a share link whose watch token mints a viewer's
        credential on each use (`ShareLinkInfo`); 404 `tokens_not_configured` without LINGSTREAM_TOKEN_SECRET."""
        response = await self.request("POST", f"/v1/sessions/{session_id}/viewers", json={"share": True})
        return ShareLinkInfo.from_body(response.json())

    async def revoke_share(self, session_id: str, share_id: str) -> None:
        """`DELETE /v1/sessions/{id}/viewers/{share_id}`: the share link's watch token is refused from now on."""
        await self.request("DELETE", f"/v1/sessions/{session_id}/viewers/{share_id}")

    async def _fetch(self, url: str, headers: Mapping[str, str]) -> httpx.Response:
        try:
            response = await self._http.get(url, headers=dict(headers))
        except httpx.TransportError as exc:
            raise UnreachableError(f"GET {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise _error_of(response)
        return response

    async def add_viewer(self, session_id: str) -> dict[str, Any]:
        """`POST /v1/sessions/{id}/viewers`: watch-only join details for one more viewer (LiveKit: a subscribe-only
        token; embedded: `viewer_token` and `watch_url`); 429 `too_many_viewers` beyond the service's bound."""
        body: dict[str, Any] = (await self.request("POST", f"/v1/sessions/{session_id}/viewers")).json()
        return body

    async def answer_offer(self, offer_url: str, sdp: str, *, within: float | None = None) -> str:
        """`POST /v1/sessions/{id}/webrtc` (the embedded transport's `offer_url`): the service's SDP answer to
        `sdp`, within `within` seconds (default: the client's timeout). `EmbeddedLink` calls it; every offer
        rebinds the session to the new peer connection."""
        limit = self._timeout if within is None else within
        response = await self.request("POST", offer_url, json={"sdp": sdp, "type": "offer"}, timeout=limit)
        return str(response.json()["sdp"])

    async def answer_watch_offer(self, offer_url: str, viewer_token: str, sdp: str) -> str:
        """`POST /v1/sessions/{id}/watch` (the `offer_url` of an embedded viewer's details, from `add_viewer`): the
        SDP answer to a viewer's offer, authenticated by its `viewer_token` instead of the API key."""
        url = self.absolute(offer_url)
        headers = {"Authorization": f"Bearer {viewer_token}"}
        try:
            response = await self._http.post(url, headers=headers, json={"sdp": sdp, "type": "offer"})
        except httpx.TransportError as exc:
            raise UnreachableError(f"POST {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise _error_of(response)
        return str(response.json()["sdp"])

    async def usage(self, since: str | float | None = None) -> UsageInfo:
        """`GET /v1/usage`: this key's usage since `since` (RFC 3339 with an offset, or Unix seconds; counted from
        the start of its hour; default: the 35 days kept) and its quota."""
        params = {} if since is None else {"since": str(since)}
        return UsageInfo.from_body((await self.request("GET", "/v1/usage", params=params)).json())

    # -- the event stream -------------------------------------------------------------------------------------

    async def follow(self, session_id: str) -> AsyncIterator[SessionInfo]:
        """The session's server-sent events: the current snapshot, then one per change; ends after the terminal
        one. While the stream is open it is a queued session's heartbeat."""
        url = self.absolute(f"/v1/sessions/{session_id}/events")
        timeout = httpx.Timeout(self._timeout, read=None)  # keep-alive comments come every <= 15 s
        try:
            async with self._http.stream("GET", url, headers=self._headers, timeout=timeout) as response:
                if response.status_code >= 400:
                    await response.aread()
                    raise _error_of(response)
                data: list[str] = []
                async for line in response.aiter_lines():
                    if line.startswith("data:"):
                        data.append(line[5:].removeprefix(" "))
                    elif not line and data:
                        info = SessionInfo.from_body(json.loads("\n".join(data)))
                        data = []
                        yield info
                        if info.terminal:
                            return
        except httpx.TransportError as exc:
            raise UnreachableError(f"GET {url}: {type(exc).__name__}: {exc}") from exc

    async def wait_streaming(
        self, session_id: str, *, on_update: Callable[[SessionInfo], None] | None = None
    ) -> SessionInfo:
        """Follow the session until it streams (`running` or `draining`, with join details); `on_update` sees
        every snapshot on the way (the queue position while queued). Raises `SessionEndedError` when it ends
        first."""
        async for info in self.follow(session_id):
            if on_update is not None:
                on_update(info)
            if info.streaming:
                # The event carries the details as they were published; GET mints a fresh LiveKit token.
                return await self.get(session_id) if info.transport is not None else info
            if info.terminal:
                raise info.ended_error()
        info = await self.get(session_id)
        if info.streaming:
            return info
        raise info.ended_error()


async def _save(response: httpx.Response, path: Path) -> None:
    if response.status_code >= 400:
        await response.aread()
        raise _error_of(response)
    with path.open("wb") as handle:
        async for block in response.aiter_bytes():
            handle.write(block)


def _error_of(response: httpx.Response) -> ApiError:
    code, message = f"http_{response.status_code}", response.text[:200]
    try:
        error = response.json()["error"]
        code, message = str(error["code"]), str(error["message"])
    except (ValueError, KeyError, TypeError):
        pass
    retry_after: float | None = None
    header = response.headers.get("retry-after")
    if header is not None:
        try:
            retry_after = float(header)
        except ValueError:
            retry_after = None
    return api_error(response.status_code, code, message, retry_after=retry_after)
