"""The service participant's attributes: the session's state where LiveKit keeps such state, rate-bounded.

LiveKit syncs a participant's attributes to everyone in the room, late joiners included, and React's
`useParticipantAttributes` reads them; so the service participant carries the session's state there:

| attribute                | value                                                                  |
|--------------------------|------------------------------------------------------------------------|
| `lingstream.session_id`  | the session's id (also how a caller's room is known to hold a session) |
| `lingstream.state`       | the session's state: `running`, `paused`, `draining`, `closed`, ...    |
| `lingstream.controller`  | the identity whose control the session takes                           |
| `lingstream.ends_at`     | Unix seconds the session ends by (absent while it has no time limit)   |
| `lk.publish_on_behalf`   | the agent the video is published for (only when the create named one)  |

Each update is a signalling round trip the server fans out to the whole room, and LiveKit advises at most one every
few seconds, so updates are coalesced (`AttributeCoalescer`, a pure core with an injected clock): a token bucket of
`burst` updates that refills one token every `interval` seconds. A change while a token is left goes out at once;
one while none is left waits for the next token, and changes meanwhile merge into it (the latest value of each
attribute wins; a value changed back to what was last published drops out). With the defaults (burst 3, one per
20 s) that is at most 3 + t/20 updates in any t seconds: a pause and a resume show at once, a client that toggles
pause every second gets one update per 20 s, each with the state at that moment. `ends_at` changes rarely (the
time limit starts once); the state is the one that moves. LiveKit removes an attribute set to "": that is how
`ends_at` stays absent without a time limit (measured on livekit-server 1.13.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ATTRIBUTE_BURST",
    "ATTRIBUTE_INTERVAL",
    "CONTROLLER_ATTRIBUTE",
    "ENDS_AT_ATTRIBUTE",
    "PUBLISH_ON_BEHALF_ATTRIBUTE",
    "SESSION_ID_ATTRIBUTE",
    "STATE_ATTRIBUTE",
    "AttributeCoalescer",
    "AttributeStatistics",
]

SESSION_ID_ATTRIBUTE = "lingstream.session_id"
STATE_ATTRIBUTE = "lingstream.state"
CONTROLLER_ATTRIBUTE = "lingstream.controller"
ENDS_AT_ATTRIBUTE = "lingstream.ends_at"
PUBLISH_ON_BEHALF_ATTRIBUTE = "lk.publish_on_behalf"
"""LiveKit's convention: the participant publishes on behalf of that agent (`useVoiceAssistant().videoTrack`)."""

ATTRIBUTE_BURST = 3
ATTRIBUTE_INTERVAL = 20.0


@dataclass(frozen=True, slots=True)
class AttributeStatistics:
    """`offered`: changes offered; `published`: updates taken for sending; `coalesced`: offers that joined an
    update already pending; `pending`: attributes waiting for a token now."""

    offered: int
    published: int
    coalesced: int
    pending: int


class AttributeCoalescer:
    """Decides when the service participant's attributes are sent; sends nothing itself.

    `offer(changes, now)` merges changes in; `take(now)` returns the attributes to send now (and spends a token) or
    None; `next_at(now)` is when a pending update may go (None: nothing pending). The driver (the binding) calls
    `take` after each offer and, when it returns None with something pending, again at `next_at`. `now` is any
    monotonic clock's seconds.
    """

    def __init__(self, *, burst: int = ATTRIBUTE_BURST, interval: float = ATTRIBUTE_INTERVAL) -> None:
        if burst < 1:
            raise ValueError(f"burst must be at least 1, got {burst}")
        if not interval > 0:
            raise ValueError(f"interval must be positive, got {interval}")
        self._burst = burst
        self._interval = interval
        self._tokens = float(burst)
        self._refilled_at: float | None = None
        self._published: dict[str, str] = {}
        self._pending: dict[str, str] = {}
        self._offered = 0
        self._sent = 0
        self._coalesced = 0

    @property
    def published(self) -> Mapping[str, str]:
        """Every attribute as last taken for sending."""
        return dict(self._published)

    def _refill(self, now: float) -> None:
        if self._refilled_at is None:
            self._refilled_at = now
            return
        elapsed = max(0.0, now - self._refilled_at)
        self._tokens = min(float(self._burst), self._tokens + elapsed / self._interval)
        self._refilled_at = now

    def joined(self, attributes: Mapping[str, str]) -> None:
        """The participant (re)joined carrying `attributes` (sent with the join, spending no token)."""
        self._published.update(attributes)
        for name, value in attributes.items():
            if self._pending.get(name) == value:
                del self._pending[name]

    def offer(self, changes: Mapping[str, str], now: float) -> None:
        self._refill(now)
        self._offered += 1
        if self._pending:
            self._coalesced += 1
        for name, value in changes.items():
            if self._published.get(name) == value:
                self._pending.pop(name, None)  # changed back before it went out
            else:
                self._pending[name] = value

    def take(self, now: float) -> dict[str, str] | None:
        self._refill(now)
        if not self._pending or self._tokens < 1.0:
            return None
        self._tokens -= 1.0
        update, self._pending = self._pending, {}
        self._published.update(update)
        self._sent += 1
        return update

    def next_at(self, now: float) -> float | None:
        self._refill(now)
        if not self._pending:
            return None
        return now + max(0.0, (1.0 - self._tokens) * self._interval)

    def statistics(self) -> AttributeStatistics:
        return AttributeStatistics(
            offered=self._offered, published=self._sent, coalesced=self._coalesced, pending=len(self._pending)
        )
