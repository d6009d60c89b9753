"""Bounded duration summaries: the last N samples in a ring buffer, summarised on demand.

Admission records queue waits and session lengths, the lease records wait times. Memory stays bounded however long
the service runs: only the newest `window` samples are kept (overflow policy: drop the oldest), while the total count
covers every sample ever recorded.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from admission.errors import AdmissionConfigError

__all__ = ["DurationSummary", "RingBufferSummary"]


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


def _nearest_rank(ordered: list[float], fraction: float) -> float:
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


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
            p50=_nearest_rank(ordered, 0.50),
            p95=_nearest_rank(ordered, 0.95),
            max=ordered[-1],
        )
