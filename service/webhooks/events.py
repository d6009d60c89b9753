"""The webhook event: what a receiver gets, built from a session at one moment of its life (pure).

Body (JSON, UTF-8)::

    {"id": "evt_…", "type": "session.ended", "created_at": 1764680000.123,
     "data": {"session_id": "…", "status": "closed", "reason": "client_closed", "error": null,
              "queued_seconds": 0.0, "running_seconds": 12.5, "frames": 200, ...}}

`id` is unique per event and the same on every retry of it (and for every endpoint it goes to): receivers
de-duplicate on it. `data` holds the session's id, status, reason and error code at that moment, plus the kind's own
facts (a warning's `code`, `message` and `ends_in_s`; a recording's figures) and, on `session.ended`, its times
and frames.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["SessionTally", "WebhookEvent", "new_event_id"]


def new_event_id() -> str:
    return "evt_" + secrets.token_urlsafe(16)


@dataclass(slots=True)
class SessionTally:
    """What the ended event reports that a session does not keep: when it started running (wall seconds) and the
    frames it generated on this replica."""

    running_at: float | None = None
    frames: int = 0

    def times(self, created_at: float, now: float) -> dict[str, float]:
        """`queued_seconds`: created to running (to the end if it never ran); `running_seconds`: running to the
        end, pauses included (0 if it never ran)."""
        started = self.running_at
        queued = (started if started is not None else now) - created_at
        running = 0.0 if started is None else now - started
        return {"queued_seconds": round(max(0.0, queued), 3), "running_seconds": round(max(0.0, running), 3)}


@dataclass(frozen=True, slots=True)
class WebhookEvent:
    """One event, as every endpoint receives it (`body()` is the exact bytes that are signed and sent)."""

    id: str
    type: str
    created_at: float
    data: Mapping[str, object]

    def body(self) -> bytes:
        return json.dumps(
            {"id": self.id, "type": self.type, "created_at": round(self.created_at, 3), "data": dict(self.data)},
            separators=(",", ":"),
            sort_keys=False,
        ).encode()
