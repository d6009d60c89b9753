"""Time as the pipeline sees it: a monotonic clock behind a seam so the scheduling core is deterministic in tests."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "MonotonicClock"]


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on a monotonic time line (only differences mean anything)."""
        ...


class MonotonicClock:
    """The real clock: `time.monotonic()`."""

    def now(self) -> float:
        return time.monotonic()
