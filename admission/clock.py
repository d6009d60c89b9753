"""Time as admission sees it: a monotonic clock behind a seam, so the admission and lease cores are deterministic."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "MonotonicClock"]


class Clock(Protocol):
    """The time seam. Tests inject a fake whose time moves only when told to."""

    def now(self) -> float:
        """Seconds on a monotonic time line (only differences mean anything); never decreases."""
        ...


class MonotonicClock:
    """The real clock: `time.monotonic()`."""

    def now(self) -> float:
        return time.monotonic()
