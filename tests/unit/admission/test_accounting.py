"""Admission's records read back exactly: generated ids, end stamps, deadlines of tickets that stopped waiting,
percentiles between samples, and the driver's closed state. (Written against mutation survivors.)"""

from __future__ import annotations

import asyncio

import pytest

from admission import (
    AdmissionClosedError,
    AdmissionConfig,
    AdmissionConfigError,
    AdmissionDriver,
    TicketReason,
    TicketState,
)
from admission.summary import RingBufferSummary, percentile
from tests.support.admission import make_controller


def test_generated_ids_count_up_and_skip_ids_in_use() -> None:
    controller, _ = make_controller(num_workers=2, queue_size=4)
    controller.create("k", ticket_id="ticket-2")
    assert [controller.create("k").ticket_id for _ in range(2)] == ["ticket-1", "ticket-3"]


def test_a_released_ticket_is_stamped_with_its_end() -> None:
    controller, clock = make_controller()
    controller.create("k", ticket_id="a")
    clock.advance(12.5)
    view = controller.release("a")
    assert (view.state, view.ended_at) == (TicketState.RELEASED, 12.5)


def test_an_admitted_ticket_shows_no_queue_deadlines() -> None:
    controller, clock = make_controller(num_workers=1, queue_timeout=100.0, queue_heartbeat_timeout=10.0)
    controller.create("k", ticket_id="run")
    waiting = controller.create("k", ticket_id="wait")
    assert (waiting.queue_deadline, waiting.heartbeat_deadline) == (100.0, 10.0)
    assert controller.next_deadline() == 10.0
    clock.advance(1.0)
    controller.release("run")
    admitted = controller.get("wait")
    assert admitted.state is TicketState.ADMITTED
    assert (admitted.position, admitted.queue_deadline, admitted.heartbeat_deadline) == (None, None, None)
    assert controller.next_deadline() is None


def test_percentiles_interpolate_between_samples() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([10.0, 20.0], 25) == 12.5
    assert percentile([4.0, 1.0, 3.0, 2.0], 50, method="nearest_rank") == 2.0
    summary = RingBufferSummary(4)
    assert summary.snapshot() == type(summary.snapshot())(0, 0, 0.0, 0.0, 0.0, 0.0)
    for seconds in (1.0, 2.0, 3.0, 4.0):
        summary.record(seconds)
    snapshot = summary.snapshot()
    assert (snapshot.total_count, snapshot.window_count, snapshot.mean, snapshot.p50, snapshot.max) == (
        4,
        4,
        2.5,
        2.0,  # the summaries use nearest rank: always one of the samples
        4.0,
    )


async def test_a_closed_driver_cannot_start_again() -> None:
    controller, _ = make_controller()
    driver = AdmissionDriver(controller)
    driver.start()
    await driver.aclose()
    with pytest.raises(AdmissionClosedError, match=r"^the admission driver is closed$"):
        driver.start()


def test_when_both_deadlines_fall_together_the_queue_timeout_is_the_reason() -> None:
    controller, clock = make_controller(num_workers=1, queue_timeout=10.0, queue_heartbeat_timeout=10.0)
    controller.create("k", ticket_id="run")
    controller.create("k", ticket_id="wait")
    clock.advance(10.0)
    expired = controller.get("wait")
    assert (expired.state, expired.reason, expired.ended_at) == (TicketState.EXPIRED, TicketReason.QUEUE_TIMEOUT, 10.0)


def test_a_config_error_names_the_field() -> None:
    with pytest.raises(AdmissionConfigError, match=r"^wait_window must be"):
        AdmissionConfig(wait_window=0)


def test_the_next_deadline_is_the_earlier_of_queue_and_heartbeat() -> None:
    controller, _ = make_controller(num_workers=1, queue_timeout=5.0, queue_heartbeat_timeout=10.0)
    controller.create("k", ticket_id="run")
    controller.create("k", ticket_id="wait")
    assert controller.next_deadline() == 5.0
    quiet, _ = make_controller(num_workers=1, queue_timeout=5.0, queue_heartbeat_timeout=None)
    quiet.create("k", ticket_id="run")
    quiet.create("k", ticket_id="wait")
    assert quiet.next_deadline() == 5.0


async def test_the_driver_keeps_expiring_tickets_on_its_own() -> None:
    controller, clock = make_controller(num_workers=1, queue_timeout=5.0, queue_heartbeat_timeout=None)
    expired = asyncio.Event()
    controller.subscribe(lambda event: expired.set() if event.ticket.state is TicketState.EXPIRED else None)
    async with AdmissionDriver(controller, tick_interval=0.01):
        controller.create("k", ticket_id="run")
        controller.create("k", ticket_id="wait")
        await asyncio.sleep(0)  # one loop turn: the expiry task ticks once and goes to sleep
        clock.advance(6.0)
        # Nothing here calls the controller: only a later tick of the driver's own task can expire the ticket.
        await asyncio.wait_for(expired.wait(), timeout=5)
    assert controller.get("wait").reason is TicketReason.QUEUE_TIMEOUT
