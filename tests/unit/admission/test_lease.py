"""Behaviour of the execution lease (layer 2): strict FIFO, round-robin turns, no starvation, cancellation."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from admission import (
    ExecutionLease,
    LeaseAlreadyRequestedError,
    LeaseCore,
    LeaseSessionRemovedError,
)
from tests.support.fakes.clock import FakeClock
from tests.support.waits import until

pytestmark = pytest.mark.timeout(10)


def test_core_grants_in_strict_fifo_order() -> None:
    core = LeaseCore(FakeClock())
    tickets = {sid: core.request(sid) for sid in "abcd"}
    assert core.holder == "a"
    assert core.waiters == ("b", "c", "d")
    granted = []
    current: int | None = tickets["a"]
    while current is not None:
        next_ticket = core.release(current)
        if next_ticket is not None:
            assert core.is_granted(next_ticket)
            granted.append(core.holder)
        current = next_ticket
    assert granted == ["b", "c", "d"]
    assert core.holder is None


def test_core_release_is_idempotent_and_withdraws_waiters() -> None:
    core = LeaseCore(FakeClock())
    a, b, c = (core.request(s) for s in "abc")
    assert core.release(b) is None  # a waiter withdraws; nobody is granted
    assert core.waiters == ("c",)
    assert core.release(b) is None
    assert core.release(a) == c
    assert core.release(a) is None  # stale ticket: no-op, c keeps the grant
    assert core.holder == "c"


async def test_grants_are_strict_fifo() -> None:
    lease = ExecutionLease()
    order: list[str] = []

    async def chunk(session_id: str) -> None:
        async with lease.grant(session_id):
            order.append(session_id)

    # The grant is left before the task group waits for the queued chunks.
    async with asyncio.TaskGroup() as group, lease.grant("first"):
        for session_id in ("s1", "s2", "s3", "s4", "s5"):
            group.create_task(chunk(session_id))
            await until(lambda sid=session_id: sid in lease.statistics().waiters, f"{session_id} waiting", yields=1000)  # type: ignore[misc]
        assert lease.statistics().waiters == ("s1", "s2", "s3", "s4", "s5")
        # Leaving the first grant lets the queued chunks run, strictly in request order.
    assert order == ["s1", "s2", "s3", "s4", "s5"]


async def test_three_busy_sessions_take_turns_one_chunk_each() -> None:
    lease = ExecutionLease()
    order: list[str] = []
    everyone_queued = asyncio.Event()

    async def busy_session(session_id: str) -> None:
        for _ in range(10):
            async with lease.grant(session_id):
                order.append(session_id)
                if len(order) == 1:
                    await everyone_queued.wait()
                await asyncio.sleep(0)

    async with asyncio.TaskGroup() as group:
        for session_id in "abc":
            group.create_task(busy_session(session_id))
        await until(lambda: lease.statistics().waiters == ("b", "c"), "b and c waiting", yields=1000)
        everyone_queued.set()
    assert order == list("abc" * 10)
    stats = lease.statistics()
    assert dict(stats.grants_per_session) == {"a": 10, "b": 10, "c": 10}
    assert stats.total_grants == 30


async def test_a_session_that_reacquires_as_fast_as_it_can_cannot_starve_another() -> None:
    lease = ExecutionLease()
    order: list[str] = []
    polite_done = asyncio.Event()
    refused = 0

    async def greedy() -> None:
        nonlocal refused
        while not polite_done.is_set():
            async with lease.grant("greedy"):
                order.append("greedy")
                # Spamming input while holding buys no second place.
                with pytest.raises(LeaseAlreadyRequestedError, match="holds the lease"):
                    async with lease.grant("greedy"):
                        pass
                refused += 1
                await asyncio.sleep(0)

    async def polite() -> None:
        await until(lambda: lease.holder == "greedy", "greedy to hold the lease", yields=1000)
        for _ in range(10):
            async with lease.grant("polite"):
                order.append("polite")
                await asyncio.sleep(0)
        polite_done.set()

    async with asyncio.TaskGroup() as group:
        group.create_task(greedy())
        group.create_task(polite())

    first, last = order.index("polite"), len(order) - 1 - order[::-1].index("polite")
    window = order[first - 1 : last + 1]
    assert all(x != y for x, y in itertools.pairwise(window))  # strictly alternating while both want
    counts = lease.statistics().grants_per_session
    assert counts["polite"] == 10
    assert counts["greedy"] <= 12
    assert refused == counts["greedy"]


async def test_a_second_request_while_waiting_is_rejected() -> None:
    lease = ExecutionLease()
    async with lease.grant("a"):
        waiter = asyncio.create_task(_run_chunk(lease, "b", []))
        await until(lambda: lease.statistics().waiters == ("b",), "b waiting", yields=1000)
        assert lease.has_place("b")
        with pytest.raises(LeaseAlreadyRequestedError, match="already waiting"):
            async with lease.grant("b"):
                pass
        assert lease.statistics().waiters == ("b",)  # the refused request did not disturb the queued one
    await waiter


async def _run_chunk(
    lease: ExecutionLease, session_id: str, order: list[str], gate: asyncio.Event | None = None
) -> None:
    async with lease.grant(session_id):
        order.append(session_id)
        if gate is not None:
            await gate.wait()


async def test_cancelling_a_waiter_removes_it_from_the_queue() -> None:
    lease = ExecutionLease()
    order: list[str] = []
    gate = asyncio.Event()
    holder = asyncio.create_task(_run_chunk(lease, "a", order, gate))
    await until(lambda: lease.holder == "a", "a to hold the lease", yields=1000)
    b = asyncio.create_task(_run_chunk(lease, "b", order))
    c = asyncio.create_task(_run_chunk(lease, "c", order))
    await until(lambda: lease.statistics().waiters == ("b", "c"), "b and c waiting", yields=1000)
    b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await b
    assert lease.statistics().waiters == ("c",)
    assert not lease.has_place("b")
    gate.set()
    await holder
    await c
    assert order == ["a", "c"]
    assert lease.holder is None


async def test_a_waiter_cancelled_right_after_its_grant_passes_the_grant_on() -> None:
    lease = ExecutionLease()
    order: list[str] = []
    async with lease.grant("a"):
        b = asyncio.create_task(_run_chunk(lease, "b", order))
        c = asyncio.create_task(_run_chunk(lease, "c", order))
        await until(lambda: lease.statistics().waiters == ("b", "c"), "b and c waiting", yields=1000)
    # Leaving the block granted b, but b's task has not resumed yet: cancel it now.
    assert lease.holder == "b"
    b.cancel()
    with pytest.raises(asyncio.CancelledError):
        await b
    await c
    assert order == ["c"]
    assert lease.statistics().holder is None
    assert lease.statistics().waiters == ()


async def test_an_exception_in_the_chunk_releases_the_lease() -> None:
    lease = ExecutionLease()
    with pytest.raises(RuntimeError, match="chunk failed"):
        async with lease.grant("a"):
            raise RuntimeError("chunk failed")
    assert lease.holder is None
    async with lease.grant("b"):
        assert lease.holder == "b"


async def test_removing_a_waiting_session_fails_its_grant_and_forgets_it() -> None:
    lease = ExecutionLease()
    order: list[str] = []
    async with lease.grant("a"):
        b = asyncio.create_task(_run_chunk(lease, "b", order))
        c = asyncio.create_task(_run_chunk(lease, "c", order))
        await until(lambda: lease.statistics().waiters == ("b", "c"), "b and c waiting", yields=1000)
        lease.remove_session("b")
        lease.remove_session("b")
        with pytest.raises(LeaseSessionRemovedError):
            await b
        assert lease.statistics().waiters == ("c",)
    await c
    assert order == ["c"]
    assert "b" not in lease.statistics().grants_per_session


async def test_removing_the_holding_session_keeps_the_grant_until_its_chunk_ends() -> None:
    lease = ExecutionLease()
    order: list[str] = []
    async with lease.grant("a"):
        b = asyncio.create_task(_run_chunk(lease, "b", order))
        await until(lambda: lease.statistics().waiters == ("b",), "b waiting", yields=1000)
        lease.remove_session("a")
        assert lease.holder == "a"  # never two holders: the chunk in flight ends first
        assert not order
    await b
    assert order == ["b"]
    assert dict(lease.statistics().grants_per_session) == {"b": 1}


def test_statistics_report_holder_waiters_grants_and_wait_times() -> None:
    clock = FakeClock(100.0)
    core = LeaseCore(clock, wait_window=8)
    a = core.request("a")  # granted at once: waited 0
    b = core.request("b")
    c = core.request("c")
    clock.advance(2.0)
    assert core.release(a) == b  # b waited 2
    clock.advance(3.0)
    assert core.release(b) == c  # c waited 5
    core.request("a")
    stats = core.statistics()
    assert stats.holder == "c"
    assert stats.holder_since == 105.0
    assert stats.waiters == ("a",)
    assert dict(stats.grants_per_session) == {"a": 1, "b": 1, "c": 1}
    assert stats.total_grants == 3
    wait = stats.wait_time
    assert (wait.total_count, wait.window_count, wait.p50, wait.p95, wait.max) == (3, 3, 2.0, 5.0, 5.0)
    assert wait.mean == pytest.approx(7.0 / 3.0)


def test_wait_time_summary_is_bounded_by_its_window() -> None:
    clock = FakeClock()
    core = LeaseCore(clock, wait_window=4)
    for i in range(10):
        ticket = core.request(f"s{i}")
        core.release(ticket)
    wait = core.statistics().wait_time
    assert (wait.total_count, wait.window_count) == (10, 4)
