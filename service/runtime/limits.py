"""The deadlines of running sessions: each one's time limit, and the longest a paused session may stay paused.

A session that runs with a time limit (`max_seconds`: its own from the create request, else the server's
`LINGSTREAM_MAX_SESSION_SECONDS`) gets a `warning` status `warning_s` (30) seconds before its end, then it is closed
with reason `time_limit`. A paused session gets the same warning before `LINGSTREAM_MAX_PAUSE` runs out, then it is
closed with reason `paused_too_long`; resuming cancels the pause's deadlines. A session handed over paused from a
draining replica keeps its pause's start: its deadline counts from there, not from its arrival. The time limit counts
from the moment the session starts running (the queue does not count) and goes on while it is paused (a paused session
holds its slot). A limit shorter than the warning lead warns at once.

`SessionDeadlines` only keeps timers and calls back; the runtime decides what a warning and an expiry do. Timers run
on the `transport.session.timers.Timers` seam (the event loop in production,
`tests.support.fakes.transport_timers.FakeTimers` in
tests), so "the session ends at its limit" is tested without waiting real seconds. Everything runs on the event loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from service.runtime.sessions import Session
from transport.base import WarningStatus
from transport.session.timers import TimerHandle, Timers

__all__ = ["PAUSED_TOO_LONG", "TIME_LIMIT", "LimitsConfig", "SessionDeadlines"]

logger = logging.getLogger(__name__)

TIME_LIMIT = "time_limit"
"""The reason (and warning code) of a session ended by its time limit."""
PAUSED_TOO_LONG = "paused_too_long"
"""The reason (and warning code) of a session ended because it stayed paused longer than the longest pause."""


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """`max_pause_s`: the longest pause; `warning_s`: how long before a deadline the client is warned."""

    max_pause_s: float = 300.0
    warning_s: float = 30.0


class _Deadline:
    """One deadline with its warning: two timers, cancelled together."""

    __slots__ = ("_handles",)

    def __init__(self, handles: tuple[TimerHandle, ...]) -> None:
        self._handles = handles

    def cancel(self) -> None:
        for handle in self._handles:
            handle.cancel()


class SessionDeadlines:
    """Time limits and pause limits of every running session (see the module docstring).

    `on_warning(session, status)` publishes a warning; `on_expired(session, reason)` ends the session. Each is called
    once per deadline at most, on the event loop, and never after `ended(session)` or (for the pause) `resumed`.
    """

    def __init__(
        self,
        config: LimitsConfig,
        timers: Timers,
        *,
        on_warning: Callable[[Session, WarningStatus], None],
        on_expired: Callable[[Session, str], None],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._timers = timers
        self._on_warning = on_warning
        self._on_expired = on_expired
        self._wall_clock = wall_clock
        self._limits: dict[str, _Deadline] = {}
        self._pauses: dict[str, _Deadline] = {}

    @property
    def config(self) -> LimitsConfig:
        return self._config

    def pending(self, session_id: str) -> tuple[bool, bool]:
        """Whether the session has a time-limit deadline and a pause deadline pending (for tests and metrics)."""
        return session_id in self._limits, session_id in self._pauses

    def running(self, session: Session) -> None:
        """The session started running: its time limit (if any) starts now. A second call changes nothing."""
        seconds = session.max_seconds
        if seconds is None or session.id in self._limits:
            return
        session.time_limit_started(self._wall_clock() + seconds)
        self._limits[session.id] = self._start(
            session, seconds, TIME_LIMIT, f"the session reaches its time limit of {seconds:g} s"
        )

    def paused(self, session: Session, *, elapsed_s: float = 0.0) -> None:
        """The session paused: it ends `max_pause_s` after its pause began, `elapsed_s` ago (0: now; more: a session
        handed over paused from a draining replica, whose pause goes on counting). A second call changes nothing."""
        if session.id in self._pauses:
            return
        longest = self._config.max_pause_s
        self._pauses[session.id] = self._start(
            session,
            max(0.0, longest - elapsed_s),
            PAUSED_TOO_LONG,
            f"the session has been paused for the longest pause ({longest:g} s)",
        )

    def resumed(self, session: Session) -> None:
        deadline = self._pauses.pop(session.id, None)
        if deadline is not None:
            deadline.cancel()

    def ended(self, session: Session) -> None:
        """The session is over (or closing): no more warnings or expiries for it. Idempotent."""
        for table in (self._limits, self._pauses):
            deadline = table.pop(session.id, None)
            if deadline is not None:
                deadline.cancel()

    def _start(self, session: Session, seconds: float, code: str, why: str) -> _Deadline:
        lead = min(self._config.warning_s, seconds)
        warn_in = seconds - lead

        def warn() -> None:
            self._on_warning(session, WarningStatus(code, f"ends in {lead:g} s: {why}", lead))

        def expire() -> None:
            table = self._limits if code == TIME_LIMIT else self._pauses
            table.pop(session.id, None)
            logger.info("session %s: %s", session.id, why)
            self._on_expired(session, code)

        if warn_in <= 0:
            warn()
            return _Deadline((self._timers.call_later(seconds, expire),))
        return _Deadline((self._timers.call_later(warn_in, warn), self._timers.call_later(seconds, expire)))
