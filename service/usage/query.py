"""The `since` of `GET /v1/usage`: an RFC 3339 time with its offset (`2026-12-01T18:00:00Z`) or Unix seconds.

`parse_since` returns Unix seconds, clamped to the retention window (older counts are gone, so the answer starts
where they do), and raises `InvalidUsageQueryError` (422 `invalid_since`) for anything else: a time without an
offset, a time in the future, a number that is not finite.
"""

from __future__ import annotations

import math
from datetime import datetime

from service.errors import InvalidUsageQueryError
from service.usage.ledger import USAGE_RETENTION_S

__all__ = ["parse_since"]

_SLACK_S = 5.0  # clocks of a client and the service may disagree a little


def parse_since(raw: str | None, now: float, *, retention_s: float = USAGE_RETENTION_S) -> float:
    """`raw` as Unix seconds (None or empty: the start of the retention window), clamped to that window."""
    oldest = now - retention_s
    if raw is None or not raw.strip():
        return oldest
    text = raw.strip()
    try:
        since = float(text)
    except ValueError:
        since = _rfc3339(text)
    if not math.isfinite(since):
        raise InvalidUsageQueryError(f"since must be a finite number of Unix seconds, got {raw!r}")
    if since > now + _SLACK_S:
        raise InvalidUsageQueryError(f"since ({raw!r}) is in the future; usage is counted up to now")
    return max(since, oldest)


def _rfc3339(text: str) -> float:
    try:
        moment = datetime.fromisoformat(text.replace("z", "Z"))
    except ValueError:
        raise InvalidUsageQueryError(
            f"since must be an RFC 3339 time with an offset (2026-12-01T18:00:00Z) or Unix seconds, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        raise InvalidUsageQueryError(f"since needs an offset (Z or +hh:mm): {text!r} names no time zone")
    return moment.timestamp()
