"""`LocalStageActor`: one thread per stage, FIFO, the caller's context, cancellation, and results delivered to the
loop in batches (one wake-up for every result that finished while the loop was busy)."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from pipeline import ActorUnavailableError, FunctionStage, LocalStageActor, StageCall, StageFailedError

pytestmark = pytest.mark.timeout(30)

WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


class _Recording:
    """A stage that records what ran on which thread, in which context; calls wait for `gate` when it is set."""

    def __init__(self) -> None:
        self.ran: list[tuple[str, int, str]] = []
        self.threads: set[int] = set()
        self.gate: threading.Event | None = None
        self.started = threading.Event()
        self.released: list[str] = []
        self.on_release: Callable[[], None] | None = None

    def process(self, call: StageCall) -> Mapping[str, object]:
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(10)
        self.threads.add(threading.get_ident())
        self.ran.append((call.session_id, call.sequence_id, WHO.get()))
        return {"out": call.sequence_id}

    def release(self, session_id: str) -> None:
        self.released.append(session_id)
        if self.on_release is not None:
            self.on_release()


def _call(seq: int, session: str = "s") -> StageCall:
    return StageCall("only", session, seq, {"input": seq})


async def test_calls_run_in_order_on_one_thread_of_their_own_in_the_callers_context() -> None:
    stage = _Recording()
    actor = LocalStageActor("only", stage)
    await actor.start()
    try:
        WHO.set("caller")
        results = [await actor.invoke(_call(i)) for i in range(3)]
        await actor.release_session("s")
    finally:
        await actor.aclose()
    assert results == [{"out": 0}, {"out": 1}, {"out": 2}]
    assert stage.ran == [("s", 0, "caller"), ("s", 1, "caller"), ("s", 2, "caller")]
    assert stage.released == ["s"]
    assert len(stage.threads) == 1
    assert threading.get_ident() not in stage.threads
    assert (actor.statistics().calls, actor.statistics().in_flight) == (3, 0)


async def test_results_that_finish_while_the_loop_is_busy_arrive_with_one_wake_up() -> None:
    loop = asyncio.get_running_loop()
    wakeups = 0
    original = loop.call_soon_threadsafe

    def counting(callback: Callable[..., object], *args: Any, **kwargs: Any) -> asyncio.Handle:
        nonlocal wakeups
        wakeups += 1
        return original(callback, *args, **kwargs)

    stage = _Recording()
    actor = LocalStageActor("only", stage)
    await actor.start()
    try:
        loop.call_soon_threadsafe = counting  # type: ignore[method-assign,assignment]
        calls = [asyncio.create_task(actor.invoke(_call(i))) for i in range(5)]
        await asyncio.sleep(0)  # every task has handed its call to the thread
        released = threading.Event()
        stage.on_release = released.set
        release = asyncio.create_task(actor.release_session("s"))
        await asyncio.sleep(0)
        # The loop stays busy until the thread ran the release, which it does only after posting all five results.
        assert released.wait(10)
        results = await asyncio.gather(*calls)
        await release
    finally:
        loop.call_soon_threadsafe = original  # type: ignore[method-assign]
        await actor.aclose()
    assert [r["out"] for r in results] == [0, 1, 2, 3, 4]
    assert wakeups == 1


async def test_a_cancelled_call_finishes_on_the_thread_and_its_result_is_dropped() -> None:
    stage = _Recording()
    stage.gate = threading.Event()
    actor = LocalStageActor("only", stage)
    await actor.start()
    try:
        call = asyncio.create_task(actor.invoke(_call(0)))
        await asyncio.to_thread(stage.started.wait, 10)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        stage.gate.set()
        assert await actor.invoke(_call(1)) == {"out": 1}  # the thread went on: FIFO after the cancelled call
    finally:
        await actor.aclose()
    assert [seq for _, seq, _ in stage.ran] == [0, 1]
    assert actor.statistics().in_flight == 0


async def test_stop_waits_for_the_call_in_flight_then_the_actor_refuses_calls() -> None:
    stage = _Recording()
    stage.gate = threading.Event()
    actor = LocalStageActor("only", stage)
    await actor.start()
    call = asyncio.create_task(actor.invoke(_call(0)))
    await asyncio.to_thread(stage.started.wait, 10)
    stopping = asyncio.create_task(actor.aclose())
    await asyncio.sleep(0)
    assert not stopping.done()
    assert not actor.healthy
    stage.gate.set()
    await stopping
    assert await call == {"out": 0}
    with pytest.raises(ActorUnavailableError):
        await actor.invoke(_call(1))
    await actor.aclose()  # idempotent


async def test_a_stage_exception_is_a_stage_failure_and_a_release_exception_propagates() -> None:
    def broken(call: StageCall) -> Mapping[str, object]:
        raise ValueError("bad input")

    class _BadRelease(FunctionStage):
        def release(self, session_id: str) -> None:
            raise RuntimeError("cannot free")

    actor = LocalStageActor("only", _BadRelease(broken))
    await actor.start()
    try:
        with pytest.raises(StageFailedError, match="ValueError: bad input"):
            await actor.invoke(_call(0))
        with pytest.raises(RuntimeError, match="cannot free"):
            await actor.release_session("s")
        assert actor.statistics().failures == 1
    finally:
        await actor.aclose()


async def test_start_call_reports_each_outcome_on_the_loop_in_the_context_it_was_given() -> None:
    def maybe_broken(call: StageCall) -> Mapping[str, object]:
        if call.sequence_id == 1:
            raise ValueError("bad input")
        return {"out": (call.sequence_id, WHO.get())}

    loop_thread = threading.get_ident()
    outcomes: list[tuple[object, str, str]] = []
    both = asyncio.Event()

    def done(outputs: Mapping[str, object] | None, error: BaseException | None) -> None:
        outcomes.append((outputs if error is None else type(error).__name__, WHO.get(), str(error or "")))
        assert threading.get_ident() == loop_thread
        if len(outcomes) == 2:
            both.set()

    actor = LocalStageActor("only", FunctionStage(maybe_broken))
    await actor.start()
    try:
        for seq, who in ((0, "first"), (1, "second")):
            context = contextvars.copy_context()
            context.run(WHO.set, who)
            actor.start_call(_call(seq), done, context)
        assert actor.statistics().in_flight == 2
        await asyncio.wait_for(both.wait(), 10)
    finally:
        await actor.aclose()
    assert [(o[0], o[1]) for o in outcomes] == [({"out": (0, "first")}, "first"), ("StageFailedError", "second")]
    assert "ValueError: bad input" in outcomes[1][2]
    assert (actor.statistics().calls, actor.statistics().in_flight, actor.statistics().failures) == (2, 0, 1)


async def test_start_call_on_a_stopped_actor_reports_it_unavailable_and_stop_delivers_every_outcome_first() -> None:
    stage = _Recording()
    stage.gate = threading.Event()
    actor = LocalStageActor("only", stage)
    outcomes: list[object] = []

    def done(outputs: Mapping[str, object] | None, error: BaseException | None) -> None:
        outcomes.append(outputs if error is None else error)

    await actor.start()
    for seq in range(3):
        actor.start_call(_call(seq), done, contextvars.copy_context())
    stopping = asyncio.create_task(actor.aclose())
    await asyncio.to_thread(stage.started.wait, 10)
    assert not stopping.done()
    stage.gate.set()
    await stopping
    assert outcomes == [{"out": 0}, {"out": 1}, {"out": 2}]  # in order, all before stop returned

    unavailable = asyncio.get_running_loop().create_future()
    actor.start_call(_call(3), lambda _outputs, error: unavailable.set_result(error), contextvars.copy_context())
    assert isinstance(await unavailable, ActorUnavailableError)


async def test_what_a_stage_sets_in_its_context_does_not_reach_the_outcomes_delivery() -> None:
    def setting(call: StageCall) -> Mapping[str, object]:
        WHO.set("stage")
        return {"out": WHO.get()}

    delivered = asyncio.get_running_loop().create_future()
    actor = LocalStageActor("only", FunctionStage(setting))
    await actor.start()
    try:
        context = contextvars.copy_context()
        context.run(WHO.set, "caller")
        actor.start_call(_call(0), lambda outputs, _error: delivered.set_result((outputs, WHO.get())), context)
        assert await delivered == ({"out": "stage"}, "caller")
        assert context[WHO] == "caller"
    finally:
        await actor.aclose()
