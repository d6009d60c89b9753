"""Viewers of a session: the places they take (`ViewerSeats`) and the embedded transport's viewer credentials.

A viewer watches a session it does not control: the same video and status messages, no control. Both transports
give each session at most `max_viewers` of them. A place is taken when the owner asks for a viewer's join details
(a LiveKit token, or an embedded credential) and held until the viewer leaves; a place whose credential was never
used frees itself when the credential's time to join runs out. So the owner cannot hand out more credentials than
there are places, and a viewer that has left makes room for the next at once.

`ViewerSeats` is the pure bookkeeping (no clock of its own: every call takes `now`, in the same seconds as the
credentials' `expires_at`). `ViewerCredentials` mints and checks the embedded transport's credentials: an HMAC over
the session id, a random viewer id and the expiry, keyed by a secret that lives only in this process (a credential
is good only on the replica that minted it, which is also the only one that can serve the viewer).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from transport.errors import TooManyViewersError, ViewerTokenExpiredError, ViewerTokenInvalidError

__all__ = ["DEFAULT_MAX_VIEWERS", "ViewerCredential", "ViewerCredentials", "ViewerSeats", "ViewerStatistics"]

DEFAULT_MAX_VIEWERS = 8
_VERSION = "v1"
_MAX_TOKEN_CHARS = 256


@dataclass(frozen=True, slots=True)
class ViewerStatistics:
    """`watching`: viewers connected now; `pending`: places held by credentials not used yet (and not expired);
    `refused_full`: requests for a place refused because every place was taken; `left`: viewers that left."""

    limit: int
    watching: int
    pending: int
    joined_total: int
    refused_full: int
    left: int


class ViewerSeats:
    """The places of one session's viewers: at most `limit` watching viewers plus unused, unexpired credentials.

    `reserve` takes a place for a new credential (or raises `TooManyViewersError`); `join` turns it into a watching
    viewer (a viewer joining again keeps its place; one that comes with a credential whose place was freed gets a
    place if one is free); `leave` frees it. Idempotent where a transport's events may repeat (join, leave).
    """

    def __init__(self, session_id: str, limit: int) -> None:
        if limit < 0:
            raise ValueError(f"a session's viewer limit must not be negative, got {limit}")
        self._session_id = session_id
        self._limit = limit
        self._pending: dict[str, float] = {}
        self._watching: set[str] = set()
        self._joined_total = 0
        self._refused_full = 0
        self._left = 0

    @property
    def limit(self) -> int:
        return self._limit

    def _expire(self, now: float) -> None:
        for viewer_id in [v for v, expires_at in self._pending.items() if expires_at <= now]:
            del self._pending[viewer_id]

    def _check_room(self) -> None:
        if len(self._pending) + len(self._watching) >= self._limit:
            self._refused_full += 1
            raise TooManyViewersError(self._session_id, self._limit)

    def reserve(self, viewer_id: str, expires_at: float, now: float) -> None:
        """Hold a place for a credential until `expires_at` (or until it is used)."""
        self._expire(now)
        self._check_room()
        self._pending[viewer_id] = expires_at

    def join(self, viewer_id: str, now: float) -> bool:
        """The viewer connects; False when it was already watching (a rejoin). Raises `TooManyViewersError` for a
        viewer with no place held whose place cannot be found again."""
        if viewer_id in self._watching:
            return False
        self._expire(now)
        if self._pending.pop(viewer_id, None) is None:
            self._check_room()
        self._watching.add(viewer_id)
        self._joined_total += 1
        return True

    def admit(self, viewer_id: str) -> None:
        """A viewer is there whether or not a place was free (LiveKit tells us after the fact); it counts."""
        if viewer_id in self._watching:
            return
        self._pending.pop(viewer_id, None)
        self._watching.add(viewer_id)
        self._joined_total += 1

    def leave(self, viewer_id: str) -> None:
        if viewer_id in self._watching:
            self._watching.discard(viewer_id)
            self._left += 1

    def watching(self, viewer_id: str) -> bool:
        return viewer_id in self._watching

    def statistics(self, now: float) -> ViewerStatistics:
        self._expire(now)
        return ViewerStatistics(
            limit=self._limit,
            watching=len(self._watching),
            pending=len(self._pending),
            joined_total=self._joined_total,
            refused_full=self._refused_full,
            left=self._left,
        )


@dataclass(frozen=True, slots=True)
class ViewerCredential:
    """A minted credential: `token` goes to the viewer; `expires_at` (Unix seconds) is when it stops admitting."""

    viewer_id: str
    token: str
    expires_at: float


class ViewerCredentials:
    """Mints and verifies embedded viewer credentials: `v1.<viewer id>.<expiry>.<HMAC-SHA256>`, bound to a session.

    The key is random per instance unless one is given (tests). `verify` compares in constant time and raises
    `ViewerTokenInvalidError` (malformed, forged, another session's) or `ViewerTokenExpiredError`.
    """

    def __init__(self, ttl: float, *, key: bytes | None = None) -> None:
        if not ttl > 0:
            raise ValueError(f"a viewer credential's time to join must be positive, got {ttl}")
        self._ttl = ttl
        self._key = key if key is not None else secrets.token_bytes(32)

    @property
    def ttl(self) -> float:
        return self._ttl

    def _sign(self, session_id: str, viewer_id: str, expires: int) -> str:
        message = f"{_VERSION}|{session_id}|{viewer_id}|{expires}".encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode("ascii")

    def mint(self, session_id: str, now: float) -> ViewerCredential:
        viewer_id = secrets.token_hex(6)
        expires = int(now + self._ttl)
        token = f"{_VERSION}.{viewer_id}.{expires}.{self._sign(session_id, viewer_id, expires)}"
        return ViewerCredential(viewer_id=viewer_id, token=token, expires_at=float(expires))

    def verify(self, token: str, session_id: str, now: float) -> str:
        """The viewer id of a genuine, unexpired credential for `session_id`."""
        parts = token.split(".") if len(token) <= _MAX_TOKEN_CHARS else []
        if len(parts) != 4 or parts[0] != _VERSION or not parts[2].isdigit():
            raise ViewerTokenInvalidError("not a viewer credential of this service")
        _, viewer_id, expires_text, signature = parts
        expected = self._sign(session_id, viewer_id, int(expires_text))
        if not hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii", "replace")):
            raise ViewerTokenInvalidError("the viewer credential is not valid for this session")
        if int(expires_text) <= now:
            raise ViewerTokenExpiredError("the viewer credential has expired; ask the session's owner for a new one")
        return viewer_id
