"""A session's control intake, shared by both bindings: bytes from the client in, decoded control to the session.

`ControlIntake.receive(data)` decodes one message (protocol v1), answers a malformed one with an `error` status
(rate-limited, so a flood of garbage cannot make the service flood the client back), drops stale and duplicate
snapshots and prompts (`ControlInbox`), holds prompts to a per-session rate (`prompt_rate` per second, bursts of
`prompt_burst`; one over it is dropped and answered `rate_limited`: each new prompt may cost the model a text
encoding), and hands the rest to `SessionPort.push_control`; a message the session refuses in its state
(`ControlRejectedError`, e.g. `pause` while it drains) is answered with an `error` carrying the session's code.
Nothing a client sends can raise out of `receive`: every outcome is a counter in `statistics()`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pipeline.bidirectional import SetPrompt
from pipeline.clock import Clock, MonotonicClock
from transport.base import ErrorStatus, SessionPort, StatusMessage
from transport.errors import ControlRejectedError
from transport.protocol import (
    MAX_INBOUND_BYTES,
    ControlInbox,
    InboxStatistics,
    ProtocolError,
    ProtocolErrorCode,
    decode_control,
    error_status,
)

__all__ = ["PROMPT_BURST", "PROMPT_RATE", "ControlIntake", "ControlStatistics"]

logger = logging.getLogger(__name__)

PROMPT_RATE = 1.0
"""Prompts a session may send per second, sustained (each new prompt may cost the model a text encoding)."""
PROMPT_BURST = 5
"""Prompts a session may send at once before `PROMPT_RATE` applies."""


@dataclass(frozen=True, slots=True)
class ControlStatistics:
    """`received`: messages from the controlling client. `rejected`: protocol errors, also by code.
    `forwarded`: handed to the session. `push_failures`: the session refused one (e.g. it was closing).
    `ignored`: data that was not for us (another topic or channel, or a participant that is not the controller).
    `error_replies` / `error_replies_suppressed`: `error` statuses sent back, and those the rate limit held back.
    `prompts_rate_limited`: prompts dropped over the prompt rate. `refused`: messages the session refused in its
    state (`ControlRejectedError`), also by code (in `rejected_by_code`, with the protocol errors)."""

    received: int
    rejected: int
    rejected_by_code: Mapping[str, int]
    forwarded: int
    push_failures: int
    ignored: int
    error_replies: int
    error_replies_suppressed: int
    inbox: InboxStatistics
    prompts_rate_limited: int = 0
    refused: int = 0


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
    are limited to `error_rate` per second with bursts of `error_burst`; the rest are counted, not sent. Prompts are
    limited to `prompt_rate` per second with bursts of `prompt_burst` (see the module docstring).
    """

    def __init__(
        self,
        port: SessionPort,
        reply: Callable[[StatusMessage], None],
        *,
        max_bytes: int = MAX_INBOUND_BYTES,
        error_rate: float = 5.0,
        error_burst: int = 10,
        prompt_rate: float = PROMPT_RATE,
        prompt_burst: int = PROMPT_BURST,
        clock: Clock | None = None,
    ) -> None:
        self._port = port
        self._reply = reply
        self._max_bytes = max_bytes
        self._inbox = ControlInbox()
        clock = clock if clock is not None else MonotonicClock()
        self._errors = _TokenBucket(error_rate, error_burst, clock)
        self._prompts = _TokenBucket(prompt_rate, prompt_burst, clock)
        self._prompts_rate_limited = 0
        self._refused = 0
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
        if isinstance(message, SetPrompt) and not self._prompts.take():
            self._prompts_rate_limited += 1
            self._reject(
                ProtocolError(ProtocolErrorCode.RATE_LIMITED, "too many prompts; this one was dropped, send it again")
            )
            return
        if not self._inbox.accept(message):
            return
        try:
            self._port.push_control(message)
        except ControlRejectedError as exc:
            self._refused += 1
            self._send_error(exc.code, ErrorStatus(code=exc.code, message=str(exc)))
            return
        except Exception:
            self._push_failures += 1
            logger.warning("session %s refused a control message", self._port.session_id, exc_info=True)
            return
        self._forwarded += 1

    def ignore(self) -> None:
        """Count data that was not for the session (wrong sender, topic or channel)."""
        self._ignored += 1

    def _reject(self, error: ProtocolError) -> None:
        self._send_error(str(error.code), error_status(error))

    def _send_error(self, code: str, status: ErrorStatus) -> None:
        self._rejected[code] = self._rejected.get(code, 0) + 1
        if not self._errors.take():
            self._error_replies_suppressed += 1
            return
        self._error_replies += 1
        logger.debug("session %s: rejected control message: %s", self._port.session_id, status.message)
        self._reply(status)

    def statistics(self) -> ControlStatistics:
        return ControlStatistics(
            received=self._received,
            rejected=sum(self._rejected.values()) - self._refused,
            rejected_by_code=MappingProxyType(dict(self._rejected)),
            forwarded=self._forwarded,
            push_failures=self._push_failures,
            ignored=self._ignored,
            error_replies=self._error_replies,
            error_replies_suppressed=self._error_replies_suppressed,
            inbox=self._inbox.statistics(),
            prompts_rate_limited=self._prompts_rate_limited,
            refused=self._refused,
        )
