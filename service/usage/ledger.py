"""`UsageLedger`: per-owner usage counts in wall-clock buckets, and `UsageTotals`, the record they are read as.

Counts are kept per owner and per bucket of `USAGE_BUCKET_S` (one hour) of wall-clock time, for
`USAGE_RETENTION_S` (35 days, a billing month with room); a span of session-seconds that crosses a bucket edge is
split at it, so a query `since` a bucket's start counts exactly the seconds after it. Alongside, all-time totals per
owner (never pruned, so they only grow: what `/metrics` exports as counters). Pure and synchronous: time comes in as
arguments. The Redis scripts keep the same buckets (`service.scaleout.redis_side.prelude`, with these constants).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["USAGE_BUCKET_S", "USAGE_RETENTION_S", "UsageLedger", "UsageReport", "UsageTotals"]

USAGE_BUCKET_S = 3600
"""The resolution of `since`: counts are kept per owner and per wall-clock hour."""

USAGE_RETENTION_S = 35 * 86_400
"""How long bucketed counts are kept (the all-time totals behind /metrics are kept for ever)."""


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """One owner's usage: `running_s` session-seconds holding a slot, `queued_s` session-seconds waiting in the
    queue, `sessions` creates accepted (admitted or queued), `chunks` and `frames` generated."""

    running_s: float = 0.0
    queued_s: float = 0.0
    sessions: int = 0
    chunks: int = 0
    frames: int = 0

    def __add__(self, other: UsageTotals) -> UsageTotals:
        return UsageTotals(
            running_s=self.running_s + other.running_s,
            queued_s=self.queued_s + other.queued_s,
            sessions=self.sessions + other.sessions,
            chunks=self.chunks + other.chunks,
            frames=self.frames + other.frames,
        )


ZERO = UsageTotals()


@dataclass(frozen=True, slots=True)
class UsageReport:
    """What `GET /v1/usage` answers for one owner: the totals counted from `since` (a bucket's start, Unix seconds)
    up to `until` (when it was read)."""

    owner: str
    since: float
    until: float
    totals: UsageTotals


class UsageLedger:
    """Bucketed per-owner counts; see the module docstring. Not thread-safe (one event loop)."""

    def __init__(self, *, bucket_s: int = USAGE_BUCKET_S, retention_s: int = USAGE_RETENTION_S) -> None:
        if bucket_s <= 0 or retention_s < bucket_s:
            raise ValueError(f"need 0 < bucket_s ({bucket_s}) <= retention_s ({retention_s})")
        self._bucket_s = bucket_s
        self._retention_s = retention_s
        self._buckets: dict[str, dict[int, UsageTotals]] = {}
        self._totals: dict[str, UsageTotals] = {}

    @property
    def bucket_s(self) -> int:
        return self._bucket_s

    def bucket_start(self, at: float) -> float:
        """The start of the bucket that holds wall time `at`."""
        return float(math.floor(at / self._bucket_s) * self._bucket_s)

    def add(self, owner: str, at: float, amounts: UsageTotals) -> None:
        """Count `amounts` for `owner` in the bucket of wall time `at`."""
        bucket = math.floor(at / self._bucket_s)
        buckets = self._buckets.setdefault(owner, {})
        if bucket not in buckets:
            oldest = math.floor((at - self._retention_s) / self._bucket_s)
            for stale in [b for b in buckets if b < oldest]:
                del buckets[stale]
        buckets[bucket] = buckets.get(bucket, ZERO) + amounts
        self._totals[owner] = self._totals.get(owner, ZERO) + amounts

    def add_span(self, owner: str, start: float, end: float, *, queued: bool) -> None:
        """Count the session-seconds from `start` to `end` (wall time) as running (or `queued`), split at bucket
        edges. An empty or inverted span counts nothing."""
        while start < end:
            edge = (math.floor(start / self._bucket_s) + 1) * self._bucket_s
            stop = min(edge, end)
            seconds = stop - start
            self.add(owner, start, UsageTotals(queued_s=seconds) if queued else UsageTotals(running_s=seconds))
            start = stop

    def since(self, owner: str, since: float) -> UsageTotals:
        """`owner`'s counts in the buckets from the one holding `since` on (kept ones only)."""
        first = math.floor(since / self._bucket_s)
        total = ZERO
        for bucket, amounts in self._buckets.get(owner, {}).items():
            if bucket >= first:
                total = total + amounts
        return total

    def totals(self) -> Mapping[str, UsageTotals]:
        """Every owner's all-time totals (since this ledger was made)."""
        return dict(self._totals)
