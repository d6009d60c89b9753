"""A session's control intake, shared by both bindings: bytes from the client in, decoded control to the session.

`ControlIntake.receive(data)` decodes one message (protocol v1), answers a malformed one with an `error` status
(rate-limited, so a flood of garbage cannot make the service flood the client back), drops stale and duplicate
snapshots (`ControlInbox`), and hands the rest to `SessionPort.push_control`. Nothing a client sends can raise out
of `receive`: every outcome is a counter in `statistics()`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pipeline.clock import Clock, MonotonicClock
from transport.base import SessionPort, StatusMessage
from transport.protocol import (
    MAX_INBOUND_BYTES,
    ControlInbox,
    InboxStatistics,
    ProtocolError,
    decode_control,
    error_status,
)

__all__ = ["ControlIntake", "ControlStatistics"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ControlStatistics:
    """`received`: messages from the controlling client. `rejected`: protocol errors, also by code.
    `forwarded`: handed to the session. `push_failures`: the session refused one (e.g. it was closing).
    `ignored`: data that was not for us (another topic or channel, or a participant that is not the controller).
    `error_replies` / `error_replies_suppressed`: `error` statuses sent back, and those the rate limit held back."""

    received: int
    rejected: int
    rejected_by_code: Mapping[str, int]
    forwarded: int
    push_failures: int
    ignored: int
    error_replies: int
    error_replies_suppressed: int
    inbox: InboxStatistics


class _TokenBucket:
    def __init__(self, rate: float, burst: int, clock: Clock) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._tokens = float(burst)
        self._clock = clock
        self._last = clock.now()

    def take(self) -> bool:
        now = self._clock.now()
        self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return True
        return False


class ControlIntake:
    """Decode, validate, de-duplicate and forward one session's control messages.

    `reply` sends a status message back to the client; it must not block (the bindings queue it). Error replies
    are limited to `error_rate` per second with bursts of `error_burst`; the rest are counted, not sent.
    """

    def __init__(
        self,
        port: SessionPort,
        reply: Callable[[StatusMessage], None],
        *,
        max_bytes: int = MAX_INBOUND_BYTES,
        error_rate: float = 5.0,
        error_burst: int = 10,
        clock: Clock | None = None,
    ) -> None:
        self._port = port
        self._reply = reply
        self._max_bytes = max_bytes
        self._inbox = ControlInbox()
        self._errors = _TokenBucket(error_rate, error_burst, clock if clock is not None else MonotonicClock())
        self._received = 0
        self._rejected: dict[str, int] = {}
        self._forwarded = 0
        self._push_failures = 0
        self._ignored = 0
        self._error_replies = 0
        self._error_replies_suppressed = 0

    def receive(self, data: bytes | str) -> None:
        self._received += 1
        message = decode_control(data, max_bytes=self._max_bytes)
        if isinstance(message, ProtocolError):
            self._reject(message)
            return
        if not self._inbox.accept(message):
            return
        try:
            self._port.push_control(message)
        except Exception:
            self._push_failures += 1
            logger.warning("session %s refused a control message", self._port.session_id, exc_info=True)
            return
        self._forwarded += 1

    def ignore(self) -> None:
        """Count data that was not for the session (wrong sender, topic or channel)."""
        self._ignored += 1

    def _reject(self, error: ProtocolError) -> None:
        code = str(error.code)
        self._rejected[code] = self._rejected.get(code, 0) + 1
        if not self._errors.take():
            self._error_replies_suppressed += 1
            return
        self._error_replies += 1
        logger.debug("session %s: rejected control message: %s", self._port.session_id, error.message)
        self._reply(error_status(error))

    def statistics(self) -> ControlStatistics:
        return ControlStatistics(
            received=self._received,
            rejected=sum(self._rejected.values()),
            rejected_by_code=MappingProxyType(dict(self._rejected)),
            forwarded=self._forwarded,
            push_failures=self._push_failures,
            ignored=self._ignored,
            error_replies=self._error_replies,
            error_replies_suppressed=self._error_replies_suppressed,
            inbox=self._inbox.statistics(),
        )
