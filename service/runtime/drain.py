"""`Drain`: the runtime's drain, from its start (SIGTERM, `POST /internal/drain`) to the end of the last session.

Problem: an instance that is told to go away should let its running sessions finish, yet still be gone by a
deadline. Order: the runtime stops admitting and tells its running sessions first (`ServiceRuntime.start_drain`);
then `run` waits for the sessions to end by themselves until `grace` before the deadline (`grace` is
`drain_close_grace_s`, at most a quarter of the drain timeout), asks every one left to close with DRAIN, and at the
deadline cancels what is still open; a session that does not end within `shutdown_close_s` after that is logged and
left to `aclose()`. Then the drain is complete (`complete`, `wait`), which is when the server exits. `run` is a task
the runtime owns: cancelling it (at `aclose()`) stops the waits, and `aclose()` marks the drain complete itself.

With `hand_off` (`LINGSTREAM_DRAIN_MODE=hand_off`, a shared admission; docs/continuity.md) `run` first hands the running
and paused sessions to other replicas (a paused one stays paused there): every `tuning.hand_off_retry_s` it offers each
such session to `hand_off` (which asks admission for room elsewhere and, if there is, stops the session here to be
adopted there), until none is left or half the drain timeout has passed. Only then are the sessions still here told that
the service drains (`announce`), and the wait above runs for them: with nowhere to go, the drain is today's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pipeline.bidirectional import CloseMode
from service.runtime.records import DrainStatus, RuntimeTuning
from service.runtime.session_table import SessionTable
from service.runtime.sessions import Session, SessionState

__all__ = ["Drain"]

logger = logging.getLogger(__name__)


class Drain:
    """One runtime's drain: its deadline (loop time, once begun) and whether every session has ended since."""

    def __init__(
        self,
        timeout_s: float,
        tuning: RuntimeTuning,
        table: SessionTable,
        request_close: Callable[[Session, CloseMode, str], None],
        *,
        hand_off: Callable[[Session], Awaitable[bool | None]] | None = None,
        announce: Callable[[], None] = lambda: None,
    ) -> None:
        self._timeout_s = timeout_s
        self._tuning = tuning
        self._table = table
        self._request_close = request_close
        self._hand_off = hand_off
        self._announce = announce
        self._deadline: float | None = None
        self._complete = asyncio.Event()

    @property
    def started(self) -> bool:
        """A drain began (it stays begun, through the runtime's close)."""
        return self._deadline is not None

    @property
    def hands_off(self) -> bool:
        """Running sessions are handed to other replicas before anything else (then `announce` tells the rest)."""
        return self._hand_off is not None

    @property
    def complete(self) -> bool:
        """A begun drain has ended every session (or the runtime has closed)."""
        return self._complete.is_set()

    def begin(self) -> None:
        """The drain begins now: its deadline is `timeout_s` away."""
        self._deadline = asyncio.get_running_loop().time() + self._timeout_s

    def mark_complete(self) -> None:
        """Nothing is left to drain (the runtime closed)."""
        self._complete.set()

    async def wait(self) -> None:
        await self._complete.wait()

    def status(self) -> DrainStatus:
        deadline_in = None
        if self._deadline is not None:
            deadline_in = max(0.0, self._deadline - asyncio.get_running_loop().time())
        return DrainStatus(
            draining=self.started,
            complete=self.complete,
            running=len(self._table.admitted()),
            queued=len(self._table.queued()),
            deadline_in_s=deadline_in,
        )

    async def run(self) -> None:
        """Wait for the sessions to end, closing (drain, then cancel) those still open as the deadline nears."""
        deadline = self._deadline
        if deadline is None:  # pragma: no cover - begin() sets it before the runtime spawns this
            return
        if self._hand_off is not None:
            await self._hand_off_running(self._hand_off, deadline - self._timeout_s / 2)
            self._announce()
        grace = min(self._tuning.drain_close_grace_s, self._timeout_s / 4)
        if not await self._table.wait_idle(deadline - grace):
            for session in self._table.admitted():
                self._request_close(session, CloseMode.DRAIN, "service_drain")
            if not await self._table.wait_idle(deadline):
                for session in self._table.admitted():
                    self._request_close(session, CloseMode.CANCEL, "drain_deadline")
                loop = asyncio.get_running_loop()
                if not await self._table.wait_idle(loop.time() + self._tuning.shutdown_close_s):
                    logger.error("drain: %d session(s) did not close after cancel", self._table.live_count)
        logger.warning("drain complete")
        self._complete.set()

    async def _hand_off_running(self, hand_off: Callable[[Session], Awaitable[bool | None]], until: float) -> None:
        """Offer each running or paused session to `hand_off` (True: handed off; False: no room yet; None: never
        from here) every `hand_off_retry_s` until none is left to offer or `until` (loop time). A session that closes
        or cannot go is left to the wait; one still starting or recovering is offered once it runs."""
        loop = asyncio.get_running_loop()
        done: set[str] = set()
        while True:
            left = [s for s in self._table.admitted() if s.id not in done and not s.terminal]
            for session in left:
                if session.close_mode is not None:
                    done.add(session.id)
                elif session.state in (SessionState.RUNNING, SessionState.PAUSED):
                    outcome = await hand_off(session)
                    if outcome is not False:
                        done.add(session.id)
            if all(s.id in done for s in left) or loop.time() >= until:
                return
            await asyncio.sleep(self._tuning.hand_off_retry_s)  # asking admission again for room elsewhere
