"""What a verified token grants: one frozen record per kind of token (`ClientGrant`, `SessionGrant`, `WatchGrant`).

A *client token* is what an app's backend hands a browser instead of its API key: it may create at most
`max_creates` sessions, within the bounds its key chose, until `expires_at`. Each create it makes answers a *session
token*, good for that one session only. A share link carries a *watch token*: it reads its session and mints viewer
credentials, nothing else. Every grant names the `owner` of the API key that issued it (quotas and usage charge
that key) and is checked against the configured keys on every use, so removing a key ends its tokens.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["ClientGrant", "Grant", "SessionGrant", "TokenKind", "WatchGrant"]


class TokenKind(enum.Enum):
    CLIENT = "client"  # creates up to N sessions within its bounds (minted by an API key)
    SESSION = "session"  # one session: read, steer, end, join, viewers, share links, its recording
    WATCH = "watch"  # one session, read-only: its status, its events, viewer credentials (a share link)


@dataclass(frozen=True, slots=True)
class ClientGrant:
    """A client token's grant. `token_id` counts its creates (on every replica); `max_seconds` None: the create
    may ask for any limit the server allows; `record`: creates may ask to be recorded; `origins`: the browser
    origins allowed to use it (empty: any, and none)."""

    owner: str
    token_id: str
    expires_at: float
    max_creates: int
    max_seconds: float | None
    record: bool
    origins: tuple[str, ...]

    kind = TokenKind.CLIENT


@dataclass(frozen=True, slots=True)
class SessionGrant:
    """A session token's grant: the one session it reaches, and the origins of the client token it came from."""

    owner: str
    session_id: str
    expires_at: float
    origins: tuple[str, ...]

    kind = TokenKind.SESSION


@dataclass(frozen=True, slots=True)
class WatchGrant:
    """A share link's watch token: the session it watches and the share it belongs to (what DELETE revokes)."""

    owner: str
    session_id: str
    share_id: str
    expires_at: float

    kind = TokenKind.WATCH


Grant = ClientGrant | SessionGrant | WatchGrant
