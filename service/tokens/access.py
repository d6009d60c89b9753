"""Who is calling and what they may reach: `Caller` (an API key's owner, or a token's grant) and its checks.

Every `/v1` route asks the caller for what it needs, once, before it touches a session: `key_owner` for what only an
API key may do (list sessions, usage, mint client tokens), `creator_owner` for a create (a key, or a client token),
`session_owner(session_id, need)` for a session route. A session or watch token names one session: for any other id
the answer is `SessionNotFoundError` (404), exactly what another key's session answers, so a token tells nothing
about sessions it does not hold. What each kind may do on its session is the `Need` table below; a kind that may not
gets `TokenScopeError` (403). Pure: no I/O, no clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from service.errors import OriginNotAllowedError, SessionNotFoundError, TokenScopeError
from service.tokens.grants import ClientGrant, Grant, SessionGrant, WatchGrant

__all__ = ["Caller", "Need", "origin_allowed"]


class Need(enum.Enum):
    """What a session route does with its session, and so which tokens may call it."""

    READ = "read"  # GET, the event stream: session and watch tokens
    WATCH = "watch"  # one more viewer's credential: session and watch tokens
    CONTROL = "control"  # DELETE, pause/resume, the controller's offer, share links, the recording: session tokens


_WATCH_MAY = frozenset({Need.READ, Need.WATCH})


def origin_allowed(origin: str | None, allowed: tuple[str, ...], *, required: bool) -> bool:
    """Whether a request's `Origin` passes a token's `origins` (empty: any). `required`: a request without one is
    refused too (a create: browsers always send Origin on a POST; a same-origin GET may carry none)."""
    if not allowed:
        return True
    if origin is None:
        return not required
    return origin.rstrip("/") in allowed


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated caller: `owner` is the API key's owner fingerprint (a token's: the key that issued it);
    `grant` is None for an API key (or anonymous), else the token's grant. `origin`: the request's Origin header."""

    owner: str
    grant: Grant | None = None
    origin: str | None = None

    @property
    def is_key(self) -> bool:
        return self.grant is None

    @property
    def redacted(self) -> bool:
        """A watch token reads its session without the controller's join details (a LiveKit controller token)."""
        return isinstance(self.grant, WatchGrant)

    def key_owner(self, action: str) -> str:
        """The owner, for what only an API key may do (`action` names it in the refusal)."""
        if self.grant is not None:
            raise TokenScopeError(f"a {self.grant.kind.value} token cannot {action}: that needs the API key")
        return self.owner

    def creator_owner(self) -> str:
        """The owner a create is charged to: an API key's, or a client token's parent key's."""
        if self.grant is None or isinstance(self.grant, ClientGrant):
            return self.owner
        raise TokenScopeError(f"a {self.grant.kind.value} token cannot create sessions: use a client token")

    def session_owner(self, session_id: str, need: Need) -> str:
        """The owner to look `session_id` up with, if this caller may do `need` on it; else 404 (not its session)
        or 403 (its session, but not for this token's kind)."""
        grant = self.grant
        if grant is None:
            return self.owner
        if isinstance(grant, ClientGrant):
            raise TokenScopeError("a client token only creates sessions: use the session token the create answered")
        if grant.session_id != session_id:
            raise SessionNotFoundError(session_id)
        if isinstance(grant, SessionGrant):
            if not origin_allowed(self.origin, grant.origins, required=False):
                raise OriginNotAllowedError(f"origin {self.origin!r} may not use this session token")
            return self.owner
        if need not in _WATCH_MAY:
            raise TokenScopeError("a watch token (a share link) only watches its session")
        return self.owner
