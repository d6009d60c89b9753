"""The retry schedule of webhook deliveries: a pure core that decides, given how an attempt went, whether a delivery
is done, is tried again (and when), or is given up.

No clock and no randomness of its own: the caller passes the time and the jitter draw, so a test can walk a
delivery through every step. The nominal delays grow exponentially (`first_delay_s * factor ** (n - 1)` after the
n-th failed attempt, capped at `max_delay_s`), each shortened by up to `jitter` of itself (a draw in [0, 1)) so that
the retries of many deliveries failed by one outage do not arrive together; after `max_attempts` attempts the
delivery is given up. An answer 2xx delivers; 410 Gone gives up at once (the receiver says the endpoint is no more);
any other answer, a timeout or a connection error is tried again.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Decision", "RetryPolicy", "Verdict"]


class Verdict(enum.Enum):
    # The receiver answered 2xx: the delivery is done.
    DELIVERED = "delivered"
    # It failed, and is tried again at `Decision.retry_at`.
    RETRY = "retried"
    # It failed for the last time (attempts exhausted, or 410 Gone): it is dropped.
    GIVE_UP = "failed"


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    retry_at: float | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential retries (see the module docstring). The defaults try 8 times over about 4 minutes:
    after 1, 2, 4, 8, 16, 32 and 64 s (less the jitter)."""

    max_attempts: int = 8
    first_delay_s: float = 1.0
    factor: float = 2.0
    max_delay_s: float = 300.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"a retry policy needs max_attempts >= 1, got {self.max_attempts}")
        if self.first_delay_s <= 0 or self.factor < 1 or self.max_delay_s < self.first_delay_s:
            raise ValueError("a retry policy needs first_delay_s > 0, factor >= 1 and max_delay_s >= first_delay_s")
        if not 0 <= self.jitter < 1:
            raise ValueError(f"a retry policy's jitter is a fraction in [0, 1), got {self.jitter}")

    def delay_after(self, attempts: int, draw: float = 0.0) -> float | None:
        """The wait before the next attempt once `attempts` attempts failed (None: give up). `draw` in [0, 1)."""
        if attempts >= self.max_attempts:
            return None
        nominal = min(self.max_delay_s, self.first_delay_s * self.factor ** (attempts - 1))
        return nominal * (1.0 - self.jitter * draw)

    def decide(self, attempts: int, status: int | None, now: float, draw: float = 0.0) -> Decision:
        """The outcome of attempt number `attempts` (1-based), answered with HTTP `status` (None: no answer)."""
        if status is not None and 200 <= status < 300:
            return Decision(Verdict.DELIVERED)
        if status == 410:
            return Decision(Verdict.GIVE_UP)
        delay = self.delay_after(attempts, draw)
        if delay is None:
            return Decision(Verdict.GIVE_UP)
        return Decision(Verdict.RETRY, now + delay)

    def schedule(self) -> tuple[float, ...]:
        """The nominal waits between attempts (no jitter): what docs/webhooks.md lists."""
        return tuple(
            delay for attempts in range(1, self.max_attempts) if (delay := self.delay_after(attempts)) is not None
        )
