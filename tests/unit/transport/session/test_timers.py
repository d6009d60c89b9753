"""`GraceTimer`: one pending deadline on the timers seam, replaced by a restart, silent once cancelled."""

from __future__ import annotations

import pytest

from tests.support.fakes.transport_timers import FakeTimers
from transport.session.timers import GraceTimer


def _timer() -> tuple[GraceTimer, FakeTimers, list[str]]:
    timers = FakeTimers()
    expired: list[str] = []
    return GraceTimer(timers, expired.append), timers, expired


def test_expiry_passes_on_the_reason_and_leaves_nothing_pending() -> None:
    timer, timers, expired = _timer()
    timer.start(5.0, "the client left")
    assert timer.pending
    timers.advance(4.9)
    assert expired == []
    timers.advance(0.1)
    assert expired == ["the client left"]
    assert not timer.pending
    assert timers.live == []


def test_a_cancelled_timer_never_fires() -> None:
    timer, timers, expired = _timer()
    timer.start(5.0, "the client left")
    timer.cancel()
    timer.cancel()  # a no-op the second time
    timers.advance(60.0)
    assert expired == []
    assert not timer.pending


def test_a_restart_replaces_the_deadline_and_the_reason() -> None:
    timer, timers, expired = _timer()
    timer.start(5.0, "the client never connected")
    timers.advance(3.0)
    timer.start(5.0, "the client did not reconnect")
    (live,) = timers.live
    assert live.due == 8.0
    timers.advance(60.0)
    assert expired == ["the client did not reconnect"]


def test_the_expiry_callback_may_start_the_next_deadline() -> None:
    timers = FakeTimers()
    expired: list[str] = []

    def on_expiry(reason: str) -> None:
        expired.append(reason)
        if len(expired) == 1:
            timer.start(1.0, "second")

    timer = GraceTimer(timers, on_expiry)
    timer.start(1.0, "first")
    timers.advance(5.0)
    assert expired == ["first", "second"]
    assert not timer.pending


async def test_the_fake_timers_give_up_on_a_predicate_that_never_holds_and_name_it() -> None:
    # A regression that never reaches the awaited state must fail fast with a message, not hang until the test
    # timeout.
    timers = FakeTimers()
    timers.call_later(3.0, lambda: None)
    with pytest.raises(AssertionError, match=r"within 0\.05 s .*live timers due in \[3\.0\]"):
        await timers.wait_until(lambda: False, within=0.05)
