"""The HTTP routes: `/v1` sessions (REST + server-sent events), health, and the loopback admin drain.

Handlers only translate: authenticate, parse, call `ServiceRuntime`, and turn snapshots into bodies. Errors are
raised as exceptions and answered by the handlers in `service.app` through the table in `service.errors`.

Request order for `POST /v1/sessions`: body size (middleware, before anything reads it) → API key → content type
(415) → JSON and fields (422 `invalid_request`) → image bytes/pixels (413/415) → a caller's LiveKit room (422
`invalid_request` without LiveKit, 422 `room_not_found`, 409 `room_in_use`) → a `webhook_url` of its own (422
`webhook_url_not_allowed`) → the worker's `prepare` (422 `invalid_config`) → admission (201/202/429/503).

The transport routes: `POST /v1/sessions/{id}/webrtc` (the embedded transport's SDP offer; every offer rebinds the
session to a new peer connection), `POST /v1/sessions/{id}/viewers` (one more viewer: LiveKit, a subscribe-only
token; embedded, a viewer credential and the watch URL; 429 beyond `MAX_VIEWERS`), `POST /v1/sessions/{id}/watch`
(the embedded transport's viewer offer, authenticated by the viewer credential instead of an API key) and
`POST /v1/livekit/webhook` (LiveKit's signed webhooks: the signature is the authentication, no API key). With the
redis backend the first three act on the replica that runs the session: on another one, `lookup_here` raises
`SessionElsewhereError`, and the route forwards the request to the owner's advertised address and returns its answer
(`service.scaleout.forwarding`; the viewer's offer asks the registry for the owner first, having no key) or answers
409 `session_on_other_replica`.

Credentials (`service.http.access`): an API key, or a token (issue #35). A create takes a key or a client token
(origin → body → the token's bounds → a create counted against the token, given back when the session takes no
place); a session route takes a key, its session's session token, or for reading and viewers a share link's watch
token (another session's token: 404 as for another key's session; a kind that may not: 403 `token_scope`); the list
and usage take a key only. The token routes themselves are in `service.http.token_routes`. Order for the session
routes: credential → the session (404 for an unknown or another key's session) → the transport's
capability (`transport.base`: the routes ask the active transport for one, e.g. `IssuesViewers`, and name no transport
class; 404 `not_found`, `TransportFeatureError`, when it lacks it; 409 for an offer while LiveKit is active) → the
session's state (409 unless it streams) → the body (415/422) → the transport (422 for an offer it refuses). For the
watch route: the viewer credential (401) → the body → the transport.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse, RedirectResponse, StreamingResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import ValidationError

from pipeline.bidirectional import CloseMode, check_prompt
from service.errors import (
    ForbiddenError,
    InvalidRequestError,
    OriginNotAllowedError,
    PromptTooLargeError,
    RecordingNotFoundError,
    SessionElsewhereError,
    SessionNotStreamingError,
    TokenExhaustedError,
    TransportFeatureError,
    UnsupportedMediaTypeError,
    error_body,
)
from service.http.access import AnyCaller, EventCaller, authenticator, bearer_scheme, session_access
from service.http.bodies import describe_validation_errors, errors_of, is_json, json_body
from service.http.contract import VIEWER_DETAILS_SCHEMA, request_body
from service.http.events import event_stream_response
from service.http.schemas import (
    CreateSessionRequest,
    DrainBody,
    HealthBody,
    RecordingList,
    SessionBody,
    SessionList,
    UsageBody,
    WebhookAck,
    WebrtcAnswer,
    WebrtcOffer,
    drain_body,
    recording_list,
    session_body,
    usage_body,
)
from service.http.token_routes import share_link, within_grant
from service.http.token_schemas import AddViewerRequest, CreatedSessionBody
from service.logs import bind_session_id
from service.runtime.images import decode_image
from service.runtime.recording_catalog import parse_cursor
from service.runtime.runtime import ServiceRuntime
from service.runtime.sessions import SessionSnapshot, SessionState
from service.scaleout.forwarding import ForwardedRoute, Forwarder, was_forwarded
from service.tokens import ClientGrant, Need, origin_allowed
from service.usage.query import parse_since
from service.webhooks.targets import WebhookTargets
from transport.base import (
    AnswersOffers,
    AnswersViewerOffers,
    CallerRoom,
    ChecksCallerRooms,
    IssuesViewers,
    ReceivesWebhooks,
    RenewsJoinDetails,
    Transport,
)
from transport.errors import SessionNotAttachedError, ViewerTokenInvalidError

__all__ = ["describe_validation_errors", "health_router", "internal_router", "operation_id", "v1_router"]


def _runtime(request: Request) -> ServiceRuntime:
    runtime: ServiceRuntime = request.app.state.runtime
    return runtime


async def _owner(request: Request, caller: AnyCaller) -> str:
    """The caller's owner, for routes only an API key may call (a token is refused: 403 token_scope)."""
    return caller.key_owner(f"call {request.method} {request.url.path}")


def _transport(request: Request) -> object:
    """The active transport (None: none), read only through its capabilities (`transport.base`): a route asks for
    what it needs, e.g. `isinstance(transport, IssuesViewers)`, never for a kind of transport."""
    transport: Transport | None = getattr(request.app.state, "transport", None)
    return transport


Runtime = Annotated[ServiceRuntime, Depends(_runtime)]
Owner = Annotated[str, Depends(_owner)]
ReadsSession = Annotated[str, Depends(session_access(Need.READ))]
FollowsSession = Annotated[str, Depends(session_access(Need.READ, events=True))]
WatchesSession = Annotated[str, Depends(session_access(Need.WATCH))]
ControlsSession = Annotated[str, Depends(session_access(Need.CONTROL))]
ActiveTransport = Annotated[object, Depends(_transport)]


def operation_id(route: APIRoute) -> str:
    """A route's OpenAPI operation id: its handler's name (`create_session`, `get_session`, `add_viewer`, ...), so
    generated clients read like the API instead of FastAPI's default `create_session_v1_sessions_post`. The app
    passes it as `generate_unique_id_function`; a test pins the set, and a handler's name is part of the contract."""
    return route.name


v1_router = APIRouter(prefix="/v1", tags=["sessions"])


@v1_router.post(
    "/sessions",
    status_code=201,
    response_model=CreatedSessionBody,
    summary="Create a session (admitted: 201, queued: 202), with an API key or a client token",
    responses={
        202: {"model": CreatedSessionBody, "description": "Queued: follow GET or the event stream for the position."},
        **errors_of(401, 403, 409, 413, 415, 422, 429, 500, 503),
    },
    openapi_extra=request_body(CreateSessionRequest, required=True),
)
async def create_session(
    request: Request, response: Response, caller: AnyCaller, runtime: Runtime, transport: ActiveTransport
) -> CreatedSessionBody:
    owner = caller.creator_owner()
    grant = caller.grant if isinstance(caller.grant, ClientGrant) else None
    if grant is not None and not origin_allowed(caller.origin, grant.origins, required=True):
        raise OriginNotAllowedError(f"origin {caller.origin!r} may not use this client token")
    content_type = request.headers.get("content-type", "")
    if not is_json(content_type):
        raise UnsupportedMediaTypeError("send the request body as application/json")
    raw = await request.body()
    try:
        payload = CreateSessionRequest.model_validate_json(raw)
    except ValidationError as exc:
        raise InvalidRequestError(describe_validation_errors(exc.errors())) from None
    max_seconds = payload.max_seconds if grant is None else within_grant(grant, payload.max_seconds, payload.record)
    image = decode_image(payload.image, runtime.config.limits)
    config = _with_prompt(payload.config, payload.prompt)
    caller_room = await _caller_room(payload, transport)
    webhook_url = None
    if payload.webhook_url is not None:
        targets: WebhookTargets = request.app.state.webhook_targets
        webhook_url = await targets.check_own(payload.webhook_url)
    auth = authenticator(request)
    if grant is not None and not await auth.store.claim(grant.token_id, grant.max_creates, grant.expires_at):
        raise TokenExhaustedError(f"this client token has made its {grant.max_creates} session(s) already")
    try:
        snapshot, admitted = await runtime.create(
            owner,
            config,
            image,
            caller_room=caller_room,
            record=payload.record,
            max_seconds=max_seconds,
            webhook_url=webhook_url,
        )
    except BaseException:
        if grant is not None:  # the session took no place: the token keeps its create
            await auth.store.refund(grant.token_id)
        raise
    bind_session_id(snapshot.id)
    response.status_code = 201 if admitted else 202
    response.headers["Location"] = f"/v1/sessions/{snapshot.id}"
    body = CreatedSessionBody(**dict(session_body(snapshot)))
    if grant is not None and auth.codec is not None:
        expires_at = auth.policy.session_expiry(auth.codec.now(), snapshot.max_seconds)
        body.session_token = auth.codec.mint_session(owner, snapshot.id, expires_at=expires_at, origins=grant.origins)
        body.session_token_expires_at = expires_at
    return body


async def _caller_room(payload: CreateSessionRequest, transport: object) -> CallerRoom | None:
    """The caller's LiveKit room of a create, checked (with the server, or the caller's token read) before the
    session takes a place; a transport that takes only callers' rooms refuses a create without one."""
    if not isinstance(transport, ChecksCallerRooms):
        if payload.livekit is not None:
            raise InvalidRequestError("livekit: this service has no LiveKit transport (LIVEKIT_URL is not set)")
        return None
    if payload.livekit is None:
        return await transport.check_caller_room(None)
    request = payload.livekit
    try:
        room = CallerRoom(
            request.room or "",
            request.controller_identity,
            url=request.url,
            token=request.token,
            agent_identity=request.agent_identity,
        )
    except ValueError as exc:
        raise InvalidRequestError(f"livekit: {exc}") from None
    return await transport.check_caller_room(room)


def _with_prompt(config: dict[str, Any], prompt: str | None) -> dict[str, Any]:
    """The worker's config with the request's `prompt` (checked: 422 `prompt_too_large` over 512 UTF-8 bytes)."""
    if prompt is None:
        return config
    if "prompt" in config:
        raise InvalidRequestError("give the prompt once: as `prompt` or as `config.prompt`, not both")
    try:
        check_prompt(prompt)
    except ValueError as exc:
        if "UTF-8 bytes" in str(exc):
            raise PromptTooLargeError(f"prompt: {exc}") from None
        raise InvalidRequestError(f"prompt: {exc}") from None
    return {**config, "prompt": prompt}


@v1_router.get(
    "/usage",
    response_model=UsageBody,
    summary="The caller's key's usage and quota (aggregated over every replica with the redis backend)",
    tags=["usage"],
    responses=errors_of(401, 422, 503),
)
async def get_usage(
    owner: Owner,
    runtime: Runtime,
    since: Annotated[
        str | None,
        Query(
            description="RFC 3339 time with an offset (2026-12-01T18:00:00Z) or Unix seconds; counted from the "
            "start of its hour. Default (and at most): the 35 days kept."
        ),
    ] = None,
) -> UsageBody:
    start = parse_since(since, time.time())
    report = await runtime.usage(owner, start)
    return usage_body(report, runtime.config.admission.quota_of(owner))


@v1_router.get("/sessions", response_model=SessionList, summary="The caller's sessions", responses=errors_of(401))
async def list_sessions(owner: Owner, runtime: Runtime) -> SessionList:
    return SessionList(sessions=[session_body(snapshot) for snapshot in await runtime.sessions_of(owner)])


@v1_router.get(
    "/sessions/{session_id}",
    response_model=SessionBody,
    summary="A session's live status (a heartbeat while queued)",
    responses=errors_of(401, 403, 404),
)
async def get_session(
    session_id: str, owner: ReadsSession, caller: AnyCaller, runtime: Runtime, transport: ActiveTransport
) -> SessionBody:
    bind_session_id(session_id)
    snapshot = await runtime.lookup(owner, session_id)
    body = session_body(snapshot)
    if caller.redacted:  # a watch token: no controller's join details (LiveKit's are a controller token)
        body.transport = None
        return body
    if isinstance(transport, RenewsJoinDetails) and snapshot.transport is not None and snapshot.state in _STREAMING:
        # Only LiveKit's details go stale (the join token's TTL is short): mint a fresh token, same identity. The
        # embedded transport's offer URL never changes. Detached a moment ago: the session is ending, keep the old.
        # Run by another replica (shared admission): mint it from the room and identity that replica published.
        with contextlib.suppress(SessionNotAttachedError):
            if runtime.runs_here(snapshot.id):
                body.transport = dict(transport.join_details(snapshot.id))
            else:
                body.transport = dict(transport.rejoin_details(snapshot.id, snapshot.transport))
    return body


@v1_router.delete(
    "/sessions/{session_id}",
    response_model=SessionBody,
    summary="End a session (idempotent): 200 ended, 202 closing",
    responses={202: {"model": SessionBody, "description": "Closing; the final status follows."}, **errors_of(401, 404)},
)
async def delete_session(
    session_id: str,
    response: Response,
    owner: ControlsSession,
    runtime: Runtime,
    mode: Annotated[Literal["drain", "cancel"], Query(description="drain: deliver the chunk in progress")] = "drain",
) -> SessionBody:
    bind_session_id(session_id)
    snapshot = await runtime.delete(owner, session_id, CloseMode(mode))
    response.status_code = 200 if snapshot.terminal else 202
    return session_body(snapshot)


@v1_router.post(
    "/sessions/{session_id}/pause",
    response_model=SessionBody,
    summary="Pause a running session (idempotent): it keeps its slot and state, generates nothing, holds its picture",
    responses=errors_of(401, 404, 409),
)
async def pause_session(session_id: str, owner: ControlsSession, runtime: Runtime) -> SessionBody:
    bind_session_id(session_id)
    return session_body(await runtime.pause(owner, session_id, True))


@v1_router.post(
    "/sessions/{session_id}/resume",
    response_model=SessionBody,
    summary="Resume a paused session (idempotent)",
    responses=errors_of(401, 404, 409),
)
async def resume_session(session_id: str, owner: ControlsSession, runtime: Runtime) -> SessionBody:
    bind_session_id(session_id)
    return session_body(await runtime.pause(owner, session_id, False))


_REDIRECT: dict[int | str, dict[str, Any]] = {
    302: {
        "description": "With an object store (LINGSTREAM_RECORDINGS_S3_*): the presigned URL of the object, valid "
        "for LINGSTREAM_RECORDINGS_S3_URL_TTL seconds, in `Location` (any replica answers).",
        "headers": {"Location": {"schema": {"type": "string"}, "description": "The presigned URL."}},
    }
}


@v1_router.get(
    "/sessions/{session_id}/recording",
    summary="The session's recording, H.264 in MP4 (owner only; once the session has ended): the file, or a 302 to "
    "the object store",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"video/mp4": {}}, "description": "The MP4."},
        **_REDIRECT,
        **errors_of(401, 404, 409, 503),
    },
)
async def get_recording(session_id: str, owner: ControlsSession, runtime: Runtime) -> Response:
    bind_session_id(session_id)
    outcome = await runtime.recording(owner, session_id)
    if outcome.video_url is not None:
        return RedirectResponse(outcome.video_url, status_code=302)
    assert outcome.video is not None  # READY outcomes carry their files
    return _recording_file(outcome.video, "video/mp4", session_id, f"{session_id}.mp4")


@v1_router.get(
    "/sessions/{session_id}/recording/controls",
    summary="The recording's control trace (JSON Lines, the format `lingstream generate --controls` replays): the "
    "file, or a 302 to the object store",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/x-ndjson": {}}, "description": "The trace."},
        **_REDIRECT,
        **errors_of(401, 404, 409, 503),
    },
)
async def get_recording_controls(session_id: str, owner: ControlsSession, runtime: Runtime) -> Response:
    bind_session_id(session_id)
    outcome = await runtime.recording(owner, session_id)
    if outcome.trace_url is not None:
        return RedirectResponse(outcome.trace_url, status_code=302)
    assert outcome.trace is not None
    return _recording_file(outcome.trace, "application/x-ndjson", session_id, f"{session_id}.controls.jsonl")


@v1_router.get(
    "/recordings",
    response_model=RecordingList,
    summary="The caller's recordings, oldest first, in pages (with Redis: every replica's)",
    tags=["recordings"],
    responses=errors_of(401, 403, 422, 503),
)
async def list_recordings(
    owner: Owner,
    runtime: Runtime,
    since: Annotated[
        str | None,
        Query(
            description="RFC 3339 time with an offset (2026-12-01T18:00:00Z) or Unix seconds: recordings started "
            "then or later. Default: all that are kept."
        ),
    ] = None,
    cursor: Annotated[str | None, Query(max_length=300, description="`next_cursor` of the previous page.")] = None,
    limit: Annotated[int, Query(ge=1, le=500, description="Recordings per page.")] = 100,
) -> RecordingList:
    start = parse_since(since, time.time(), retention_s=math.inf)  # 422 invalid_since; None: every one kept
    if cursor is not None:
        try:
            parse_cursor(cursor)
        except ValueError:
            raise InvalidRequestError("cursor: not a next_cursor this service gave") from None
    entries = await runtime.recordings_of(owner, start, cursor, limit)
    return recording_list(entries, limit)


_FILE_BLOCK = 256 * 1024


def _recording_file(path: Path, media_type: str, session_id: str, filename: str) -> StreamingResponse:
    """A recording's file, served from a handle opened now: retention may remove the file at any moment (a GET that
    found it READY can lose the race), and an open handle still reads it whole, where opening the path later would
    fail with a 500. Gone already: 404 recording_not_found."""
    try:
        handle = path.open("rb")
    except FileNotFoundError as exc:
        raise RecordingNotFoundError(
            f"the recording of session {session_id!r} was removed to keep the recordings' retention (oldest first)"
        ) from exc
    size = os.fstat(handle.fileno()).st_size

    async def blocks() -> AsyncIterator[bytes]:
        try:
            while block := await asyncio.to_thread(handle.read, _FILE_BLOCK):
                yield block
        finally:
            handle.close()

    headers = {"Content-Length": str(size), "Content-Disposition": f'attachment; filename="{filename}"'}
    return StreamingResponse(blocks(), media_type=media_type, headers=headers)


@v1_router.get(
    "/sessions/{session_id}/events",
    summary="Server-sent events: one `session` event per change, keep-alive comments (a heartbeat while queued)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "The event stream."}, **errors_of(401, 404)},
)
async def session_events(
    session_id: str, owner: FollowsSession, caller: EventCaller, runtime: Runtime
) -> StreamingResponse:
    bind_session_id(session_id)
    snapshot, subscription = await runtime.follow(owner, session_id)
    heartbeat = runtime.config.admission.queue_heartbeat_timeout
    keepalive = runtime.tuning.sse_keepalive_s
    if heartbeat is not None:
        keepalive = min(keepalive, heartbeat / 3)
    return event_stream_response(runtime, snapshot, subscription, keepalive, redact=caller.redacted)


_STREAMING = frozenset(
    {
        SessionState.ADMITTED,
        SessionState.RUNNING,
        SessionState.PAUSED,
        SessionState.RECOVERING,
        SessionState.DRAINING,
    }
)


def _conflict(message: str) -> SessionNotStreamingError:
    return SessionNotStreamingError(message)


def _require_streaming(snapshot: SessionSnapshot) -> None:
    """409 unless the session is past the queue and not ended (its transport binding exists or is being made)."""
    if snapshot.state is SessionState.QUEUED:
        raise _conflict(
            f"session {snapshot.id!r} is queued (position {snapshot.queue_position}); connect once it is running"
        )
    if snapshot.terminal:
        raise _conflict(f"session {snapshot.id!r} has ended ({snapshot.state.value}); create a new one")


@v1_router.post(
    "/sessions/{session_id}/webrtc",
    response_model=WebrtcAnswer,
    summary="Embedded WebRTC: answer the browser's SDP offer (every new offer rebinds the session)",
    responses=errors_of(401, 404, 409, 413, 415, 422),
    openapi_extra=request_body(WebrtcOffer, required=True),
)
async def answer_webrtc_offer(
    session_id: str, request: Request, owner: ControlsSession, runtime: Runtime, transport: ActiveTransport
) -> WebrtcAnswer | Response:
    bind_session_id(session_id)
    try:
        snapshot = await runtime.lookup_here(owner, session_id)
    except SessionElsewhereError as elsewhere:
        return await _forwarded(request, ForwardedRoute.OFFER, elsewhere)
    if not isinstance(transport, AnswersOffers):
        if transport is not None:  # (LiveKit: its clients join a room instead)
            raise _conflict("this service streams through LiveKit: join the room named in the session's transport")
        raise TransportFeatureError("the embedded WebRTC transport is not enabled here")
    _require_streaming(snapshot)
    offer = await json_body(request, WebrtcOffer)
    try:
        sdp, kind = await transport.answer(session_id, offer.sdp, offer.type)
    except SessionNotAttachedError:
        raise _conflict(f"session {session_id!r} is not connected to the transport (starting or ending)") from None
    if kind != "answer":  # pragma: no cover - aiortc always answers an offer with an answer
        raise _conflict(f"the transport answered with an SDP of type {kind!r}")
    return WebrtcAnswer(sdp=sdp, type="answer")


@v1_router.post(
    "/sessions/{session_id}/viewers",
    status_code=201,
    response_model=None,
    summary="Watch-only join details for one more viewer (LiveKit: a subscribe-only token; embedded: a viewer "
    "credential and the watch URL), or with `share: true` a share link",
    responses={
        201: {
            "description": "The viewer's details (`LiveKitViewer` or `EmbeddedViewer`, on `kind`).",
            "content": {"application/json": {"schema": VIEWER_DETAILS_SCHEMA}},
        },
        **errors_of(401, 403, 404, 409, 422, 429),
    },
    openapi_extra=request_body(AddViewerRequest, required=False),
)
async def add_viewer(
    session_id: str,
    request: Request,
    owner: WatchesSession,
    caller: AnyCaller,
    runtime: Runtime,
    transport: ActiveTransport,
) -> dict[str, Any] | Response:
    bind_session_id(session_id)
    wanted = await _viewer_request(request)
    if wanted.share:
        caller.session_owner(session_id, Need.CONTROL)  # a watch token cannot make share links
        snapshot = await runtime.lookup(owner, session_id)
        if not isinstance(transport, IssuesViewers):
            raise TransportFeatureError("viewers need a transport (LiveKit or embedded WebRTC)")
        return share_link(request, owner, snapshot)
    try:
        snapshot = await runtime.lookup_here(owner, session_id)
    except SessionElsewhereError as elsewhere:
        return await _forwarded(request, ForwardedRoute.VIEWERS, elsewhere)
    if not isinstance(transport, IssuesViewers):
        raise TransportFeatureError("viewers need a transport (LiveKit or embedded WebRTC)")
    _require_streaming(snapshot)
    try:
        return dict(transport.viewer_details(session_id))  # TooManyViewersError: 429
    except SessionNotAttachedError:
        raise _conflict(f"session {session_id!r} is not connected to its transport (starting or ending)") from None


@v1_router.post(
    "/sessions/{session_id}/watch",
    response_model=WebrtcAnswer,
    summary="Embedded WebRTC: answer a viewer's SDP offer (authenticated by its viewer credential, not an API key)",
    responses=errors_of(401, 404, 409, 413, 415, 422, 429),
    openapi_extra=request_body(WebrtcOffer, required=True),
)
async def answer_watch_offer(
    session_id: str,
    request: Request,
    runtime: Runtime,
    transport: ActiveTransport,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> WebrtcAnswer | Response:
    bind_session_id(session_id)
    forwarder = _forwarder(request)
    if forwarder is not None and not runtime.runs_here(session_id) and not was_forwarded(request.headers.items()):
        # The credential is good only on the replica that minted it, the owner: it checks it. (Not forwarded, or
        # forwarded already: answered here as without forwarding, which reveals nothing without a credential.)
        replica = await forwarder.runs_on(session_id)
        if replica is not None:
            with contextlib.suppress(SessionElsewhereError):
                return await _forwarded(request, ForwardedRoute.WATCH, SessionElsewhereError(session_id, replica))
    token = _viewer_token(request.headers.get("authorization"))
    if not isinstance(transport, AnswersViewerOffers):
        raise ViewerTokenInvalidError(
            "viewer credentials exist only on the embedded transport; with LiveKit, join the room with the viewer token"
        )
    transport.verify_viewer(session_id, token)  # ViewerTokenError: 401, before anything else is revealed
    offer = await json_body(request, WebrtcOffer)
    try:
        sdp, kind = await transport.answer_viewer(session_id, token, offer.sdp, offer.type)
    except SessionNotAttachedError:
        raise _conflict(f"session {session_id!r} is not connected to the transport (it has ended)") from None
    if kind != "answer":  # pragma: no cover - aiortc always answers an offer with an answer
        raise _conflict(f"the transport answered with an SDP of type {kind!r}")
    return WebrtcAnswer(sdp=sdp, type="answer")


def _forwarder(request: Request) -> Forwarder | None:
    forwarder: Forwarder | None = getattr(request.app.state, "forwarder", None)
    return forwarder


async def _forwarded(request: Request, route: ForwardedRoute, elsewhere: SessionElsewhereError) -> Response:
    """The answer of the replica that runs the session to this request (`service.scaleout.forwarding`); raises
    `elsewhere` (409 `session_on_other_replica`) when this replica forwards nothing, or this request cannot be."""
    forwarder = _forwarder(request)
    if forwarder is None:
        raise elsewhere
    answer = await forwarder.forward(
        route,
        elsewhere,
        method=request.method,
        headers=request.headers.items(),
        query=request.url.query,
        body=await request.body(),
    )
    return Response(answer.body, status_code=answer.status, headers=dict(answer.headers))


async def _viewer_request(request: Request) -> AddViewerRequest:
    """The viewers route's optional body: none (or empty) is one viewer."""
    if not await request.body():
        return AddViewerRequest()
    return await json_body(request, AddViewerRequest)


def _viewer_token(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ViewerTokenInvalidError("send the viewer credential as `Authorization: Bearer <viewer_token>`")
    return token.strip()


@v1_router.post(
    "/livekit/webhook",
    response_model=WebhookAck,
    tags=["livekit"],
    summary="LiveKit webhooks (authenticated by LiveKit's signature in Authorization, not by an API key)",
    responses=errors_of(401, 404, 413),
)
async def livekit_webhook(request: Request, transport: ActiveTransport) -> WebhookAck:
    if not isinstance(transport, ReceivesWebhooks):
        raise TransportFeatureError("LiveKit webhooks need the LiveKit transport")
    body = await request.body()
    transport.handle_webhook(body, request.headers.get("authorization"))  # WebhookError: 401
    return WebhookAck()


health_router = APIRouter(tags=["health"])


@health_router.get("/healthz", response_model=HealthBody, summary="Liveness: 200 while the process is up")
async def health() -> HealthBody:
    return HealthBody(status="ok")


@health_router.get(
    "/readyz",
    response_model=HealthBody,
    summary="Readiness: 200 when started, not draining and every model worker is ready",
    responses=errors_of(503),
)
async def ready(request: Request, runtime: Runtime) -> Response:
    readiness = runtime.readiness()
    if readiness.ready:
        body: dict[str, object] = {"status": "ready"}
        memory: dict[str, object] | None = request.app.state.model_memory
        start: Callable[[], dict[str, object]] | None = request.app.state.model_start
        if memory is not None:
            body["model_memory"] = memory
        if start is not None:
            body["model_start"] = start()
        return JSONResponse(body)
    return JSONResponse(error_body(readiness.code or "not_ready", readiness.reason or "not ready"), status_code=503)


internal_router = APIRouter(prefix="/internal", include_in_schema=False)

_FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


def _loopback_only(request: Request) -> None:
    """Admin endpoints answer only direct calls from this host (a proxy on loopback forwarding for others is
    recognised by its forwarding headers and refused too)."""
    host = request.client.host if request.client is not None else ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback or any(name in request.headers for name in _FORWARDING_HEADERS):
        raise ForbiddenError("internal endpoints answer only direct requests from the loopback interface")


@internal_router.post("/drain", response_model=DrainBody, status_code=202, dependencies=[Depends(_loopback_only)])
async def start_drain(runtime: Runtime) -> DrainBody:
    runtime.start_drain("admin request")
    return drain_body(runtime.drain_status())


@internal_router.get("/drain", response_model=DrainBody, dependencies=[Depends(_loopback_only)])
async def drain_status(runtime: Runtime) -> DrainBody:
    return drain_body(runtime.drain_status())
