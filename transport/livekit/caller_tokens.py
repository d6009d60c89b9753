"""A join token the caller minted for the service participant: read, checked, and never shown.

The avatar-provider pattern of LiveKit Agents: the caller (a voice agent, an app's backend) mints a token for the
service's participant in its own room and hands over `{url, token}`; the service joins with it and never holds the
caller's API secret, so any LiveKit project (Cloud included) works. Without the secret the signature cannot be
checked here (the LiveKit server does that when the service joins), but the claims can be read, and a token that
could not work is refused before the session takes a place: `read_caller_token` checks its shape, that it joins one
named room as a named identity, that it has not expired, and that its grants let the service do its job (publish a
camera track and data, and update its own attributes, where the session's state lives). The caller's URL must match
the deployment's allow-list (`caller_url_allowed`): the service dials it, so an open list would let any caller
point the service at any host.

The token itself is a credential: `CallerToken` keeps it out of its repr, and nothing here logs or echoes it.
"""

from __future__ import annotations

import base64
import binascii
import fnmatch
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from transport.errors import CallerTokenError

__all__ = ["MAX_CALLER_TOKEN_BYTES", "CallerToken", "caller_url_allowed", "read_caller_token"]

MAX_CALLER_TOKEN_BYTES = 8192
"""Longest token accepted (LiveKit's are a few hundred bytes; attributes and room configs make them longer)."""

_EXPIRY_MARGIN = 5.0  # seconds a token must still be valid for: joining takes a moment
_CLOCK_SKEW = 60.0  # seconds a token's `nbf` may lie in the future (the caller's clock may run ahead)
_KINDS = frozenset({"", "agent", "standard"})
_SCHEMES = {"ws": "ws", "http": "ws", "wss": "wss", "https": "wss"}


@dataclass(frozen=True, slots=True)
class CallerToken:
    """What a caller's token says: the room it joins, the identity it joins as, when it expires (Unix seconds), its
    participant kind ("" when it names none: standard)."""

    url: str
    room: str
    identity: str
    expires_at: float
    kind: str
    token: str = field(repr=False)


def read_caller_token(url: str, token: str, *, now: float) -> CallerToken:
    """Read and check a caller's `token` for `url` at wall-clock `now`; raises `CallerTokenError` saying what is
    wrong (never quoting the token)."""
    parts = urlsplit(url)
    if parts.scheme not in _SCHEMES or not parts.hostname:
        raise CallerTokenError(f"livekit.url must be a ws://, wss://, http:// or https:// URL with a host, got {url!r}")
    if not token or len(token) > MAX_CALLER_TOKEN_BYTES or not token.isascii():
        raise CallerTokenError(
            f"livekit.token must be a LiveKit access token (a JWT of at most {MAX_CALLER_TOKEN_BYTES} characters)"
        )
    segments = token.split(".")
    if len(segments) != 3 or not all(segments):
        raise CallerTokenError("livekit.token is not a JWT (three base64url parts separated by dots)")
    header = _json_segment(segments[0], "header")
    if not isinstance(header.get("alg"), str):
        raise CallerTokenError("livekit.token's header names no signing algorithm")
    claims = _json_segment(segments[1], "claims")
    identity = claims.get("sub")
    if not isinstance(identity, str) or not identity:
        raise CallerTokenError("livekit.token names no identity (`sub`): mint it with an identity for the service")
    video = claims.get("video")
    if not isinstance(video, Mapping):
        raise CallerTokenError("livekit.token has no video grant: it must grant joining one room")
    room = video.get("room")
    if video.get("roomJoin") is not True or not isinstance(room, str) or not room:
        raise CallerTokenError("livekit.token must grant roomJoin to one named room")
    _check_grants(video)
    expires_at = claims.get("exp")
    if not isinstance(expires_at, int | float) or isinstance(expires_at, bool):
        raise CallerTokenError("livekit.token has no expiry (`exp`)")
    if expires_at < now + _EXPIRY_MARGIN:
        raise CallerTokenError("livekit.token has expired (or expires within seconds): mint a fresh one")
    not_before = claims.get("nbf")
    if isinstance(not_before, int | float) and not isinstance(not_before, bool) and not_before > now + _CLOCK_SKEW:
        raise CallerTokenError("livekit.token is not valid yet (`nbf` lies in the future)")
    kind = claims.get("kind", "")
    if not isinstance(kind, str) or kind not in _KINDS:
        raise CallerTokenError(f"livekit.token's kind must be agent (or standard), got {kind!r}")
    return CallerToken(url=url, room=room, identity=identity, expires_at=float(expires_at), kind=kind, token=token)


def _check_grants(video: Mapping[str, object]) -> None:
    # LiveKit's defaults for a grant left out: canPublish, canPublishData and canSubscribe true;
    # canUpdateOwnMetadata false; canPublishSources empty (any source).
    if video.get("canPublish") is False:
        raise CallerTokenError("livekit.token must grant canPublish: the service publishes the video track")
    sources = video.get("canPublishSources")
    if isinstance(sources, Sequence) and not isinstance(sources, str) and sources and "camera" not in sources:
        raise CallerTokenError("livekit.token's canPublishSources must include camera (the video track's source)")
    if video.get("canPublishData") is False:
        raise CallerTokenError("livekit.token must grant canPublishData: the session's statuses travel as data")
    if video.get("canUpdateOwnMetadata") is not True:
        raise CallerTokenError(
            "livekit.token must grant canUpdateOwnMetadata: the session's state is published as participant "
            "attributes (lingstream.session_id, lingstream.state, ...)"
        )


def _json_segment(segment: str, what: str) -> dict[str, object]:
    try:
        raw = base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4))
        value = json.loads(raw)
    except (binascii.Error, ValueError):
        raise CallerTokenError(f"livekit.token's {what} is not base64url-encoded JSON") from None
    if not isinstance(value, dict):
        raise CallerTokenError(f"livekit.token's {what} is not a JSON object")
    return value


def caller_url_allowed(url: str, patterns: Sequence[str]) -> bool:
    """Whether the service may dial `url`: one of `patterns` matches it. A pattern is `*` (any), or
    `scheme://host[:port]` where host may start with `*.` (any subdomain); ws:// and http:// are the same, as are
    wss:// and https://; a pattern without a port matches the scheme's default and any explicit port."""
    parts = urlsplit(url)
    scheme = _SCHEMES.get(parts.scheme)
    host = (parts.hostname or "").lower()
    if scheme is None or not host:
        return False
    for pattern in patterns:
        if pattern == "*":
            return True
        allowed = urlsplit(pattern)
        allowed_host = (allowed.hostname or "").lower()
        if _SCHEMES.get(allowed.scheme) != scheme or not allowed_host:
            continue
        if allowed.port is not None and allowed.port != parts.port:
            continue
        if allowed_host.startswith("*."):
            if fnmatch.fnmatchcase(host, allowed_host) and host.count(".") >= allowed_host.count("."):
                return True
        elif host == allowed_host:
            return True
    return False
