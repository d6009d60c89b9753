"""A session's control intake, shared by both bindings: bytes from the client in, decoded control to the session.

`ControlIntake.receive(data)` decodes one message (protocol v1), answers a malformed one with an `error` status
(rate-limited, so a flood of garbage cannot make the service flood the client back), drops stale and duplicate
snapshots and prompts (`ControlInbox`), holds prompts to a per-session rate (`prompt_rate` per second, bursts of
`prompt_burst`; one over it is dropped and answered `rate_limited`: each new prompt may cost the model a text
encoding), and hands the rest to `SessionPort.push_control`; a message the session refuses in its state
(`ControlRejectedError`, e.g. `pause` while it drains) is answered with an `error` carrying the session's code.
Nothing a client sends can raise out of `receive`: every outcome is a counter in `statistics()`.

`ControlIntake.call(data, kind)` is the same path for a discrete command that expects an answer (a LiveKit RPC,
`transport.livekit.rpc`): the same decoding, rate and newest-wins rules, but the outcome is returned to the caller
(`CallAnswer`: the session's state after it; `CallRefusal`: a stable code and a message) instead of being sent back
as an `error` status, and so it is never rate-limited: each call gets exactly one answer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from pipeline.bidirectional import ControlMessage, SetPrompt
from pipeline.clock import Clock, MonotonicClock
from transport.base import ErrorStatus, SessionPort, StatusMessage
from transport.errors import ControlRejectedError
from transport.protocol import (
    MAX_INBOUND_BYTES,
    ControlInbox,
    InboxStatistics,
    ProtocolError,
    ProtocolErrorCode,
    control_type,
    decode_control,
)

__all__ = ["PROMPT_BURST", "PROMPT_RATE", "CallAnswer", "CallRefusal", "ControlIntake", "ControlStatistics"]

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
    calls: int = 0
    """Discrete commands that expected an answer (`ControlIntake.call`, LiveKit RPC); their refusals are counted in
    `rejected` / `refused` and `rejected_by_code` like those of messages."""
    forwarded_by: Mapping[tuple[str, str], int] = field(default_factory=lambda: MappingProxyType({}))
    """`forwarded` by how each message came and its wire type: `("packet", "control_state")`, `("rpc", "stop")`, ...
    (`packet`: `receive`, a data packet or data channel message; `rpc`: `call`). Tells a client's RPC use from its
    packet fallback."""


@dataclass(frozen=True, slots=True)
class CallAnswer:
    """A call's command was taken: `state` is the session's state after it (`paused` after a pause, `draining`
    after a stop). `applied` is False for a prompt whose `seq` was not newer than the newest prompt taken (dropped
    as stale or a duplicate, as on the packet path): nothing changed."""

    state: str
    applied: bool = True


@dataclass(frozen=True, slots=True)
class CallRefusal:
    """A call's command was refused: `code` is a stable code of the control protocol (`invalid_message`,
    `rate_limited`, ...) or of the REST error table (`session_not_running`), `message` says why in a sentence."""

    code: str
    message: str


_PUSH_FAILED = CallRefusal("session_not_running", "the session could not take it now")
"""The session failed to take a message (not a refusal of its own): logged; a call is answered with it."""


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
        self._calls = 0
        self._forwarded_by: dict[tuple[str, str], int] = {}

    def receive(self, data: bytes | str) -> None:
        """Take one message from the client; a refusal is answered with an `error` status (rate-limited)."""
        self._received += 1
        outcome = self._take(decode_control(data, max_bytes=self._max_bytes), "packet")
        if isinstance(outcome, CallRefusal) and outcome is not _PUSH_FAILED:  # a push failure is logged, not told
            self._send_error(outcome.code, ErrorStatus(code=outcome.code, message=outcome.message))

    def call(self, data: bytes | str, kind: str) -> CallAnswer | CallRefusal:
        """Take one discrete command that expects an answer: a message of wire type `kind` (`pause`, `prompt`,
        ...; never `control_state`: key snapshots are continuous, they go as packets). Never raises, and nothing is
        sent to the client: the answer is returned."""
        self._calls += 1
        message = decode_control(data, max_bytes=self._max_bytes)
        if not isinstance(message, ProtocolError) and (kind == "control_state" or control_type(message) != kind):
            message = ProtocolError(
                ProtocolErrorCode.INVALID_MESSAGE,
                f"this call takes a {kind!r} message, not {control_type(message)!r}",
            )
        outcome = self._take(message, "rpc")
        if isinstance(outcome, CallRefusal) and outcome is not _PUSH_FAILED:
            self._rejected[outcome.code] = self._rejected.get(outcome.code, 0) + 1
        return outcome

    def _take(self, message: ControlMessage | ProtocolError, via: str) -> CallAnswer | CallRefusal:
        """The rules both paths share: bounds, the prompt rate, newest wins, the session's own refusal. Counts
        everything but the refusal itself (each path counts and answers it its own way); `via` names the path."""
        if isinstance(message, ProtocolError):
            return CallRefusal(str(message.code), message.message)
        if isinstance(message, SetPrompt) and not self._prompts.take():
            self._prompts_rate_limited += 1
            return CallRefusal(
                str(ProtocolErrorCode.RATE_LIMITED), "too many prompts; this one was dropped, send it again"
            )
        if not self._inbox.accept(message):
            return CallAnswer(self._port.state, applied=False)
        try:
            self._port.push_control(message)
        except ControlRejectedError as exc:
            self._refused += 1
            return CallRefusal(exc.code, str(exc))
        except Exception:
            self._push_failures += 1
            logger.warning("session %s refused a control message", self._port.session_id, exc_info=True)
            return _PUSH_FAILED
        self._forwarded += 1
        key = (via, control_type(message))
        self._forwarded_by[key] = self._forwarded_by.get(key, 0) + 1
        return CallAnswer(self._port.state)

    def ignore(self) -> None:
        """Count data that was not for the session (wrong sender, topic or channel)."""
        self._ignored += 1

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
            calls=self._calls,
            forwarded_by=MappingProxyType(dict(self._forwarded_by)),
        )
