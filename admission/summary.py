"""Bounded duration summaries: the last N samples in a ring buffer, summarised on demand; and `percentile`.

Admission records queue waits and session lengths, the lease records wait times. Memory stays bounded however long
the service runs: only the newest `window` samples are kept (overflow policy: drop the oldest), while the total count
covers every sample ever recorded.

`percentile` is the project's one percentile helper (`pipeline.metrics` re-exports it; the service's metrics use it
too). It lives here because admission imports nothing but the standard library.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from admission.errors import AdmissionConfigError

__all__ = ["DurationSummary", "PercentileMethod", "RingBufferSummary", "percentile"]

PercentileMethod = Literal["linear", "nearest_rank"]
"""`linear`: interpolate between the two closest ranks (numpy's default). `nearest_rank`: the smallest sample with at
least q % of the samples at or below it (always one of the samples)."""


def percentile(values: Iterable[float], q: float, *, method: PercentileMethod = "linear") -> float | None:
    """The q-th percentile (0..100) of `values`; None for no values. Raises `ValueError` for q outside 0..100."""
    ordered = sorted(values)
    if not ordered:
        return None
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside 0..100")
    if method == "nearest_rank":
        return ordered[max(1, math.ceil(q / 100.0 * len(ordered))) - 1]
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True, slots=True)
class DurationSummary:
    """A snapshot of recent durations, in seconds.

    `total_count` counts every sample ever recorded; `window_count` and the figures below it describe only the
    newest samples kept in the ring buffer. With no samples, every figure is 0.0.
    """

    total_count: int
    window_count: int
    mean: float
    p50: float
    p95: float
    max: float


class RingBufferSummary:
    """Keeps the newest `window` durations and summarises them; O(1) per sample, O(n log n) per snapshot."""

    def __init__(self, window: int) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise AdmissionConfigError(f"a summary window must hold at least one sample, got {window!r}")
        self._samples: deque[float] = deque(maxlen=window)
        self._total = 0

    def record(self, seconds: float) -> None:
        self._samples.append(max(0.0, seconds))
        self._total += 1

    def mean(self) -> float | None:
        """Mean of the window, or None when nothing was recorded yet."""
        if not self._samples:
            return None
        return sum(self._samples) / len(self._samples)

    def snapshot(self) -> DurationSummary:
        if not self._samples:
            return DurationSummary(self._total, 0, 0.0, 0.0, 0.0, 0.0)
        ordered = sorted(self._samples)
        return DurationSummary(
            total_count=self._total,
            window_count=len(ordered),
            mean=sum(ordered) / len(ordered),
            p50=_nearest_rank(ordered, 50),
            p95=_nearest_rank(ordered, 95),
            max=ordered[-1],
        )


def _nearest_rank(ordered: list[float], q: float) -> float:
    value = percentile(ordered, q, method="nearest_rank")
    assert value is not None  # the caller has samples
    return value
