"""`tests.support.waits`: the one wait helper polls sync and async predicates, and its failure names what it waited
for and how long (or how many loop turns)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from tests.support.waits import until, until_sync


async def test_until_returns_once_a_sync_or_async_predicate_holds() -> None:
    calls: list[int] = []

    def sync() -> bool:
        calls.append(1)
        return len(calls) >= 3

    async def asynchronous() -> bool:
        await asyncio.sleep(0)
        return len(calls) >= 3

    await until(sync, "three calls", every=0)
    await until(asynchronous, "three calls")
    assert len(calls) == 3


async def test_until_fails_naming_what_and_the_time_waited() -> None:
    with pytest.raises(AssertionError, match=r"waited 0\.05 s for the door to open"):
        await until(lambda: False, "the door to open", within=0.05)


async def test_until_with_yields_counts_loop_turns_not_seconds() -> None:
    turns = 0

    async def count() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    counter = asyncio.create_task(count())
    try:
        await until(lambda: turns >= 5, "five turns", yields=50)
        with pytest.raises(AssertionError, match="waited 3 turns of the event loop for never"):
            await until(lambda: False, "never", yields=3)
    finally:
        counter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await counter


async def test_a_timeout_inside_the_predicate_is_not_taken_for_the_deadline() -> None:
    async def times_out() -> bool:
        async with asyncio.timeout(0):
            await asyncio.sleep(1)
        return True

    with pytest.raises(TimeoutError):
        await until(times_out, "the predicate", within=5)


async def test_errors_it_is_told_to_ignore_count_as_not_yet_and_others_end_the_wait() -> None:
    attempts: list[int] = []

    def refused_twice() -> bool:
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionRefusedError("restarting")
        return True

    await until(refused_twice, "the third attempt", ignoring=(ConnectionRefusedError,), every=0)
    assert len(attempts) == 3
    attempts.clear()
    with pytest.raises(ConnectionRefusedError):  # not in `ignoring`: the first refusal ends the wait
        await until(refused_twice, "a refusal", ignoring=(TimeoutError,))
    assert len(attempts) == 1


def test_until_sync_fails_naming_what_and_the_time_waited() -> None:
    until_sync(lambda: True, "truth")
    with pytest.raises(AssertionError, match=r"waited 0\.05 s for the page"):
        until_sync(lambda: False, "the page", within=0.05, every=0.01)
