"""The asyncio shell around admission: awaiting admission, background expiry, closing, and capacity exactness
under many concurrent create/delete tasks."""

from __future__ import annotations

import asyncio
import random

import pytest

from admission import (
    AdmissionClosedError,
    AdmissionConfigError,
    AdmissionDriver,
    AdmissionEvent,
    AdmissionEventKind,
    TicketReason,
    TicketState,
)
from tests.support.admission import assert_invariants, make_controller

pytestmark = pytest.mark.timeout(20)


async def test_wait_until_admitted_returns_once_a_slot_frees() -> None:
    controller, _ = make_controller(num_workers=1)
    async with AdmissionDriver(controller) as driver:
        controller.create("k", ticket_id="a")
        controller.create("k", ticket_id="b")
        waiting = asyncio.create_task(driver.wait_until_admitted("b"))
        other = asyncio.create_task(driver.wait_until_admitted("b"))
        await asyncio.sleep(0)
        assert not waiting.done()
        controller.release("a")
        admitted = await waiting
        assert (admitted.state, admitted.worker) == (TicketState.ADMITTED, 0)
        assert await other == admitted
        assert (await driver.wait_until_admitted("b")).state is TicketState.ADMITTED  # not queued: at once


async def test_wait_until_admitted_reports_a_ticket_that_left_the_queue_unadmitted() -> None:
    controller, _ = make_controller(num_workers=1)
    async with AdmissionDriver(controller) as driver:
        controller.create("k", ticket_id="a")
        controller.create("k", ticket_id="b")
        waiting = asyncio.create_task(driver.wait_until_admitted("b"))
        await asyncio.sleep(0)
        controller.cancel("b")
        view = await waiting
        assert (view.state, view.reason) == (TicketState.CANCELLED, TicketReason.CLIENT_CANCELLED)


async def test_background_task_expires_tickets_without_any_other_call() -> None:
    controller, clock = make_controller(num_workers=1, queue_timeout=30.0, queue_heartbeat_timeout=None)
    expired: asyncio.Future[AdmissionEvent] = asyncio.get_running_loop().create_future()

    def on_event(event: AdmissionEvent) -> None:
        if event.kind is AdmissionEventKind.EXPIRED and not expired.done():
            expired.set_result(event)

    controller.subscribe(on_event)
    async with AdmissionDriver(controller, tick_interval=0.005):
        controller.create("k", ticket_id="a")
        controller.create("k", ticket_id="b")
        clock.advance(30.0)
        event = await asyncio.wait_for(expired, timeout=5.0)
    assert (event.ticket.ticket_id, event.ticket.reason) == ("b", TicketReason.QUEUE_TIMEOUT)


async def test_closing_the_driver_cancels_its_task_and_fails_pending_waits() -> None:
    controller, _ = make_controller(num_workers=1)
    driver = AdmissionDriver(controller)
    driver.start()
    controller.create("k", ticket_id="a")
    controller.create("k", ticket_id="b")
    waiting = asyncio.create_task(driver.wait_until_admitted("b"))
    await asyncio.sleep(0)
    await driver.aclose()
    await driver.aclose()
    with pytest.raises(AdmissionClosedError):
        await waiting
    with pytest.raises(AdmissionClosedError):
        await driver.wait_until_admitted("b")
    with pytest.raises(AdmissionClosedError):
        driver.start()
    assert controller.release("a").state is TicketState.RELEASED  # the controller itself still works


async def test_cancelling_a_wait_leaves_the_ticket_queued() -> None:
    controller, _ = make_controller(num_workers=1)
    async with AdmissionDriver(controller) as driver:
        controller.create("k", ticket_id="a")
        controller.create("k", ticket_id="b")
        waiting = asyncio.create_task(driver.wait_until_admitted("b"))
        await asyncio.sleep(0)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert controller.get("b").state is TicketState.QUEUED
        controller.release("a")
        assert controller.get("b").state is TicketState.ADMITTED


async def test_two_hundred_concurrent_create_delete_tasks_keep_capacity_exact() -> None:
    workers, per_worker = 3, 2
    capacity = workers * per_worker
    controller, _ = make_controller(
        num_workers=workers,
        max_sessions_per_worker=per_worker,
        queue_size=100,
        queue_timeout=1e9,
        queue_heartbeat_timeout=None,
    )
    peak = 0

    def watch(event: AdmissionEvent) -> None:
        nonlocal peak
        if event.kind is AdmissionEventKind.ADMITTED:
            retained = controller.statistics().retained
            peak = max(peak, sum(retained))
            assert sum(retained) <= capacity
            assert all(count <= per_worker for count in retained)

    controller.subscribe(watch)
    outcomes: dict[str, int] = {"created": 0, "admitted": 0, "rejected": 0, "gave_up": 0, "cancelled_task": 0}

    async def client(index: int, driver: AdmissionDriver) -> None:
        rng = random.Random(index)
        ticket_id = f"s{index}"
        for _ in range(rng.randint(0, 3)):
            await asyncio.sleep(0)
        view = controller.create(f"key-{index % 7}", ticket_id=ticket_id)
        outcomes["created"] += 1
        if view.state is TicketState.REJECTED:
            outcomes["rejected"] += 1
            return
        try:
            if view.state is TicketState.QUEUED:
                if rng.random() < 0.15:
                    for _ in range(rng.randint(0, 5)):
                        await asyncio.sleep(0)
                    outcomes["gave_up"] += 1
                    return  # the finally below deletes the still-queued (or just admitted) ticket
                view = await driver.wait_until_admitted(ticket_id)
            assert view.state is TicketState.ADMITTED
            outcomes["admitted"] += 1
            for _ in range(rng.randint(0, 6)):
                await asyncio.sleep(0)
            assert_invariants(controller)
        finally:
            controller.release(ticket_id)
            controller.release(ticket_id)  # a duplicate DELETE changes nothing

    async def cancelled_client(index: int, driver: AdmissionDriver) -> None:
        task = asyncio.create_task(client(index, driver))
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            outcomes["cancelled_task"] += 1

    async with AdmissionDriver(controller) as driver, asyncio.TaskGroup() as group:
        for index in range(200):
            if index % 10 == 9:
                group.create_task(cancelled_client(index, driver))
            else:
                group.create_task(client(index, driver))

    stats = controller.statistics()
    assert stats.retained == (0, 0, 0)
    assert stats.queue_depth == 0
    assert controller.list_tickets() == ()
    assert 0 < peak <= capacity
    assert stats.admitted_total == stats.released_total
    assert stats.admitted_total + stats.rejected_total + stats.cancelled_total == outcomes["created"]
    assert min(outcomes["cancelled_task"], outcomes["rejected"], outcomes["gave_up"]) > 0  # every path was taken
    assert outcomes["admitted"] > capacity
    assert_invariants(controller)


def test_driver_rejects_a_non_positive_tick_interval() -> None:
    controller, _ = make_controller()
    with pytest.raises(AdmissionConfigError, match="tick_interval"):
        AdmissionDriver(controller, tick_interval=0.0)
