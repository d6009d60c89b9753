"""How long tokens live and how much a client token may ask for: `TokenPolicy` and its bounds.

A client token lives `ttl_seconds` (default 300, at most 600) and makes at most `max_creates` sessions (default 1,
at most 100). A session token is good for its session's lifetime plus the reconnect grace: its `exp` covers the
longest the session can last (the queue wait, its time limit, the grace, a minute of slack; at most a day), and on
every use the session itself is checked: once it has ended, the token works for `reconnect_grace` more seconds (the
page reads the final status) and is expired after. A share link's watch token lives as long, from when it was made.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CLIENT_TTL_DEFAULT_S",
    "CLIENT_TTL_MAX_S",
    "MAX_CREATES_BOUND",
    "SESSION_TOKEN_MAX_S",
    "TokenPolicy",
]

CLIENT_TTL_DEFAULT_S = 300
CLIENT_TTL_MAX_S = 600
MAX_CREATES_BOUND = 100
SESSION_TOKEN_MAX_S = 86_400.0
_SLACK_S = 60.0


@dataclass(frozen=True, slots=True)
class TokenPolicy:
    """The deployment's times a session token's life is made of (`RECONNECT_GRACE`, `QUEUE_TIMEOUT`)."""

    reconnect_grace_s: float
    queue_timeout_s: float

    def session_expiry(self, now: float, max_seconds: float | None) -> float:
        """The `exp` of a token for a session created now with time limit `max_seconds` (None: none)."""
        life = self.queue_timeout_s + (SESSION_TOKEN_MAX_S if max_seconds is None else max_seconds)
        return now + min(life + self.reconnect_grace_s + _SLACK_S, SESSION_TOKEN_MAX_S)

    def watch_expiry(self, now: float, ends_at: float | None) -> float:
        """The `exp` of a share link made now for a session that ends by `ends_at` (None: unknown)."""
        bound = now + SESSION_TOKEN_MAX_S
        return bound if ends_at is None else min(bound, max(now, ends_at) + self.reconnect_grace_s + _SLACK_S)

    def session_over(self, terminal: bool, updated_at: float, now: float) -> bool:
        """Whether a session ended longer than the reconnect grace ago (its tokens are then expired)."""
        return terminal and now > updated_at + self.reconnect_grace_s
