"""The token routes (issue #35): `POST /v1/client_tokens` (an API key mints a client token) and `DELETE
/v1/sessions/{id}/viewers/{share_id}` (revoke a share link), with the helpers `service.http.routes` uses for a
create made with a client token (`within_grant`) and for `POST .../viewers` with `"share": true` (`share_link`).

Without `LINGSTREAM_TOKEN_SECRET` minting answers 404 `tokens_not_configured` (the capability is not there, as for
a transport route). A client token's bounds are checked against the server's own (`max_seconds` above
`MAX_SESSION_SECONDS` is 422 `max_seconds_over_limit` when minting, as it would be when creating); a create asking
for more than its token allows is 403 `token_bounds`.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request

from service.errors import (
    InvalidRequestError,
    MaxSecondsTooLargeError,
    RecordingNotConfiguredError,
    TokenBoundsError,
    TokensNotConfiguredError,
)
from service.http.access import AnyCaller, authenticator
from service.http.auth import share_key
from service.http.bodies import errors_of, json_body
from service.http.contract import request_body
from service.http.token_schemas import ClientTokenBody, ClientTokenRequest, ShareRevokedBody
from service.runtime.runtime import ServiceRuntime
from service.runtime.sessions import SessionSnapshot
from service.tokens import SESSION_TOKEN_MAX_S, ClientGrant, Need, TokenCodec

__all__ = ["share_link", "tokens_router", "within_grant"]

_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+$")
_SHARE_ID = re.compile(r"[0-9a-f]{1,64}")
_REVOCATION_SLACK_S = 120.0

tokens_router = APIRouter(prefix="/v1", tags=["tokens"])


def _codec(request: Request) -> TokenCodec:
    codec = authenticator(request).codec
    if codec is None:
        raise TokensNotConfiguredError(
            "this service has no LINGSTREAM_TOKEN_SECRET: client tokens and share links are off"
        )
    return codec


@tokens_router.post(
    "/client_tokens",
    status_code=201,
    response_model=ClientTokenBody,
    summary="Mint a short-lived client token for a browser (API key only): it creates at most max_creates sessions "
    "within its bounds; each create answers a session token",
    responses=errors_of(401, 403, 404, 415, 422),
    openapi_extra=request_body(ClientTokenRequest, required=False),
)
async def create_client_token(request: Request, caller: AnyCaller) -> ClientTokenBody:
    owner = caller.key_owner("mint client tokens")
    codec = _codec(request)
    wanted = await json_body(request, ClientTokenRequest) if await request.body() else ClientTokenRequest()
    runtime: ServiceRuntime = request.app.state.runtime
    limit = runtime.config.max_session_seconds
    if wanted.max_seconds is not None and limit is not None and wanted.max_seconds > limit:
        raise MaxSecondsTooLargeError(f"max_seconds={wanted.max_seconds:g} is above this server's limit of {limit:g} s")
    if wanted.record and runtime.config.recordings is None:
        raise RecordingNotConfiguredError("record: this service has no LINGSTREAM_RECORDINGS_DIR")
    origins = []
    for origin in wanted.origins:
        if not _ORIGIN.match(origin.rstrip("/")):
            raise InvalidRequestError(f"origins: {origin!r} is not an origin (scheme://host[:port], http or https)")
        origins.append(origin.rstrip("/"))
    token, grant = codec.mint_client(
        owner,
        ttl_s=wanted.ttl_seconds,
        max_creates=wanted.max_creates,
        max_seconds=None if wanted.max_seconds is None else float(wanted.max_seconds),
        record=wanted.record,
        origins=origins,
    )
    return ClientTokenBody(
        token=token,
        token_id=grant.token_id,
        expires_at=grant.expires_at,
        max_creates=grant.max_creates,
        max_seconds=grant.max_seconds,
        record=grant.record,
        origins=list(grant.origins),
    )


@tokens_router.delete(
    "/sessions/{session_id}/viewers/{share_id}",
    response_model=ShareRevokedBody,
    summary="Revoke a share link (idempotent; every replica refuses its watch token from then on)",
    responses=errors_of(401, 403, 404, 422),
)
async def revoke_share(session_id: str, share_id: str, request: Request, caller: AnyCaller) -> ShareRevokedBody:
    owner = caller.session_owner(session_id, Need.CONTROL)
    runtime: ServiceRuntime = request.app.state.runtime
    await runtime.lookup(owner, session_id)  # 404 for a session that is not the caller's
    codec = _codec(request)
    if not _SHARE_ID.fullmatch(share_id):
        raise InvalidRequestError("share_id: not a share id (the `share_id` of a share link)")
    auth = authenticator(request)
    until = codec.now() + SESSION_TOKEN_MAX_S + _REVOCATION_SLACK_S  # no watch token outlives this
    await auth.store.revoke(share_key(session_id, share_id), until)
    return ShareRevokedBody(share_id=share_id)


def within_grant(grant: ClientGrant, max_seconds: float | None, record: bool) -> float | None:
    """The time limit of a create made with `grant`: the create's own (at most the token's), else the token's;
    `TokenBoundsError` for a create that asks for more than the token allows."""
    if record and not grant.record:
        raise TokenBoundsError('this client token does not allow "record": true')
    if grant.max_seconds is None:
        return max_seconds
    if max_seconds is None:
        return grant.max_seconds
    if max_seconds > grant.max_seconds:
        raise TokenBoundsError(f"this client token allows max_seconds up to {grant.max_seconds:g}")
    return max_seconds


def share_link(request: Request, owner: str, snapshot: SessionSnapshot) -> dict[str, Any]:
    """A new share link of `owner`'s session `snapshot` (the caller may control it: checked by the route)."""
    codec = _codec(request)
    auth = authenticator(request)
    expires_at = auth.policy.watch_expiry(codec.now(), snapshot.ends_at)
    token, grant = codec.mint_watch(owner, snapshot.id, expires_at=expires_at)
    url = f"/?watch={quote(snapshot.id, safe='')}&token={quote(token, safe='')}"
    return {
        "kind": "share",
        "share_id": grant.share_id,
        "watch_url": url,
        "watch_token": token,
        "expires_at": expires_at,
    }
