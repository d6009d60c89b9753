"""`DeliveryLedger` and `SessionDelivery`: which checkpoint a successor goes on from, and when it is published (the
last chunk the client was sent, not the last one generated; issue #33)."""

from __future__ import annotations

import asyncio

import pytest

from service.runtime.delivery import HELD_CHECKPOINTS, DeliveryLedger, SessionDelivery
from tests.support.fakes.world import FakeCheckpoint


def after(chunk: int) -> FakeCheckpoint:
    """The checkpoint taken when `chunk` was generated: it goes on from the next one."""
    return FakeCheckpoint("s1", chunk + 1, "", 0)


def test_a_chunks_checkpoint_is_published_only_once_its_frames_were_delivered() -> None:
    ledger = DeliveryLedger(tracks_delivery=True)
    assert ledger.settled
    ledger.read(0)
    assert ledger.generated(after(0)) is None
    ledger.read(1)
    assert ledger.generated(after(1)) is None  # two chunks in flight: nothing a successor may go on from yet
    assert not ledger.settled
    assert ledger.delivered(0) == after(0)
    assert ledger.delivered(0) is None  # reported once
    assert ledger.generated(after(2)) is None
    assert ledger.delivered(1) == after(1)
    assert ledger.delivered(2) == after(2)
    assert ledger.settled  # every chunk read was delivered
    stats = ledger.statistics()
    assert (stats.delivered_through, stats.held, stats.published, stats.superseded) == (2, 0, 3, 0)


def test_a_delivery_that_covers_several_chunks_publishes_the_newest_and_passes_over_the_rest() -> None:
    ledger = DeliveryLedger(tracks_delivery=True)
    for chunk in range(3):
        ledger.generated(after(chunk))
    # Late frames dropped, or a chunk the broadcast skipped: the pacer moved past chunks 0 and 1 at once.
    assert ledger.delivered(1) == after(1)
    assert ledger.statistics().superseded == 1
    assert ledger.delivered(2) == after(2)


def test_a_chunk_delivered_before_its_checkpoint_came_is_published_as_it_comes() -> None:
    ledger = DeliveryLedger(tracks_delivery=True)
    assert ledger.delivered(4) is None  # progressive decode: its frames went out before the whole chunk was read
    assert ledger.generated(after(4)) == after(4)
    assert ledger.generated(after(5)) is None


def test_without_delivery_reports_every_checkpoint_is_published_as_it_is_generated() -> None:
    ledger = DeliveryLedger(tracks_delivery=False)
    assert ledger.generated(after(0)) == after(0)
    assert ledger.generated(after(1)) == after(1)
    assert ledger.settled


def test_held_checkpoints_are_bounded_the_oldest_dropped_first() -> None:
    ledger = DeliveryLedger(tracks_delivery=True)
    for chunk in range(HELD_CHECKPOINTS + 3):
        ledger.generated(after(chunk))
    stats = ledger.statistics()
    assert (stats.held, stats.overflowed) == (HELD_CHECKPOINTS, 3)
    # The dropped ones are gone: delivering chunk 1 publishes nothing older than what is held, the next newer one.
    assert ledger.delivered(1) is None
    assert ledger.delivered(3) == after(3)
    with pytest.raises(ValueError, match="at least one"):
        DeliveryLedger(tracks_delivery=True, bound=0)


def test_after_close_nothing_is_published_not_even_a_chunk_delivered_later() -> None:
    ledger = DeliveryLedger(tracks_delivery=True)
    ledger.generated(after(0))
    ledger.generated(after(1))
    ledger.close()  # the session ended here while both chunks were in flight
    assert ledger.delivered(1) is None
    assert ledger.generated(after(2)) is None
    assert ledger.settled
    assert ledger.statistics().closed
    quiet = DeliveryLedger(tracks_delivery=False)
    quiet.close()
    assert quiet.generated(after(0)) is None


def test_checkpoints_that_ran_ahead_of_the_reader_are_not_waited_for() -> None:
    """A worker's checkpoint may describe chunks its reader has not taken yet (they wait in its queue); a hand-off's
    cancel drops those: settled once every chunk read was delivered, the last published one the last read's."""
    ledger = DeliveryLedger(tracks_delivery=True)
    ledger.read(0)
    ledger.generated(after(0))
    ledger.read(1)
    ledger.generated(after(3))  # taken when chunk 1 was read: chunks 2 and 3 were queued already
    assert ledger.delivered(0) == after(0)
    assert not ledger.settled
    assert ledger.delivered(1) is None  # after(3) still waits for chunk 3, which nobody will read now
    assert ledger.settled


def test_a_paused_session_publishes_its_chunks_in_flight_as_they_go_out() -> None:
    """Pause generates nothing new; the chunks generated before it are still paced out, and their checkpoints go."""
    ledger = DeliveryLedger(tracks_delivery=True)
    for chunk in (6, 7):
        ledger.read(chunk)
        ledger.generated(after(chunk))
    # paused here: nothing more is read
    assert ledger.delivered(6) == after(6)
    assert ledger.delivered(7) == after(7)
    assert ledger.settled


async def test_session_delivery_publishes_in_order_and_a_hand_off_waits_until_it_settles() -> None:
    published: list[int] = []
    delivery = SessionDelivery(lambda checkpoint: published.append(checkpoint.next_chunk), tracks_delivery=True)
    assert await delivery.wait_settled(0.01)  # nothing in flight
    for chunk in (0, 1):
        delivery.read(chunk)
        delivery.generated(after(chunk))
    assert not await delivery.wait_settled(0.01)
    waiter = asyncio.create_task(delivery.wait_settled(5))
    delivery.delivered(0)
    await asyncio.sleep(0)
    assert not waiter.done()
    delivery.delivered(1)
    assert await waiter
    assert published == [1, 2]
    delivery.read(2)
    delivery.generated(after(2))
    delivery.close()
    delivery.delivered(2)
    assert published == [1, 2]  # closed: the third never goes
    assert await delivery.wait_settled(0.01)
