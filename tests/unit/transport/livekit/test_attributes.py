"""The attribute coalescer on a fake clock: a burst goes out at once, then one update per interval, each carrying
the latest value of what changed meanwhile."""

from __future__ import annotations

import pytest

from tests.support.fakes.clock import FakeClock
from transport.livekit.attributes import AttributeCoalescer


def test_a_burst_goes_out_at_once_then_one_per_interval() -> None:
    clock = FakeClock()
    coalescer = AttributeCoalescer(burst=3, interval=20.0)
    for state in ("running", "paused", "running"):
        coalescer.offer({"state": state}, clock.now())
        assert coalescer.take(clock.now()) == {"state": state}
    coalescer.offer({"state": "paused"}, clock.now())
    assert coalescer.take(clock.now()) is None  # the bucket is empty
    assert coalescer.next_at(clock.now()) == pytest.approx(20.0)
    clock.advance(19.9)
    assert coalescer.take(clock.now()) is None
    clock.advance(0.1)
    assert coalescer.take(clock.now()) == {"state": "paused"}
    assert coalescer.next_at(clock.now()) is None  # nothing pending


def test_changes_while_waiting_merge_and_the_latest_value_wins() -> None:
    clock = FakeClock()
    coalescer = AttributeCoalescer(burst=1, interval=20.0)
    coalescer.offer({"state": "running", "ends_at": ""}, clock.now())
    assert coalescer.take(clock.now()) == {"state": "running", "ends_at": ""}
    coalescer.offer({"state": "paused"}, clock.now())
    clock.advance(5)
    coalescer.offer({"state": "running"}, clock.now())  # back to what was published: drops out
    clock.advance(5)
    coalescer.offer({"state": "draining", "ends_at": "1800000000"}, clock.now())
    clock.advance(10)
    assert coalescer.take(clock.now()) == {"state": "draining", "ends_at": "1800000000"}
    stats = coalescer.statistics()
    assert (stats.offered, stats.published, stats.coalesced, stats.pending) == (4, 2, 1, 0)


def test_a_change_undone_before_it_went_out_sends_nothing() -> None:
    clock = FakeClock()
    coalescer = AttributeCoalescer(burst=1, interval=20.0)
    coalescer.offer({"state": "running"}, clock.now())
    coalescer.take(clock.now())
    coalescer.offer({"state": "paused"}, clock.now())
    coalescer.offer({"state": "running"}, clock.now())
    clock.advance(60)
    assert coalescer.take(clock.now()) is None
    assert coalescer.next_at(clock.now()) is None


def test_the_rate_stays_bounded_whatever_the_offers() -> None:
    # Toggling every second for ten minutes: at most burst + t / interval updates, never more.
    clock = FakeClock()
    coalescer = AttributeCoalescer(burst=3, interval=20.0)
    sent = 0
    for second in range(600):
        coalescer.offer({"state": "paused" if second % 2 else "running"}, clock.now())
        if coalescer.take(clock.now()) is not None:
            sent += 1
        clock.advance(1.0)
    assert sent <= 3 + 600 / 20
    assert sent >= 600 / 20  # and it keeps up: one per interval while changes keep coming


def test_joining_publishes_without_spending_a_token() -> None:
    clock = FakeClock()
    coalescer = AttributeCoalescer(burst=1, interval=20.0)
    coalescer.joined({"session_id": "s1", "state": "running"})
    coalescer.offer({"state": "running"}, clock.now())
    assert coalescer.take(clock.now()) is None  # nothing changed
    coalescer.offer({"state": "paused"}, clock.now())
    assert coalescer.take(clock.now()) == {"state": "paused"}
    assert coalescer.published == {"session_id": "s1", "state": "paused"}


def test_nonsense_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="burst"):
        AttributeCoalescer(burst=0)
    with pytest.raises(ValueError, match="interval"):
        AttributeCoalescer(interval=0)
