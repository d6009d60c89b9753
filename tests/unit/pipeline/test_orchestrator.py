"""The asyncio orchestrator end to end over fake and real (thread) actors."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import AsyncIterator, Callable, Mapping

import pytest

from pipeline import (
    CloseMode,
    FunctionStage,
    LocalStageActor,
    OutputItem,
    OutputStream,
    PipelineSessionState,
    SessionClosedError,
    SessionFailedError,
    SessionPoisonedError,
    StageCall,
    StreamingPipelineOrchestrator,
)
from pipeline.errors import PipelineSpecError, UnknownSessionError
from tests.support.fakes.actors import FakeActor, passthrough
from tests.support.graphs import grouped_spec, join_spec, linear_spec
from tests.support.waits import until


def fake_actors(*names: str, gated: bool = False) -> dict[str, FakeActor]:
    produces = {"encode": ("a0",), "denoise": ("a1",), "decode": ("out",)}
    return {n: FakeActor(n, passthrough(produces.get(n, ("out",))), gated=gated) for n in names}


async def take(stream: OutputStream, n: int) -> list[OutputItem]:
    return [await anext(stream) for _ in range(n)]


async def settled(orch: StreamingPipelineOrchestrator, predicate: Callable[[], bool]) -> None:
    """Wait until `predicate` holds and no stage call is running: from then on nothing changes unless the test
    acts, so a negative assertion made after it cannot be a race with work still under way."""
    await until(
        lambda: predicate() and orch.statistics().calls_running == 0,
        "the predicate with no stage call running",
        every=0,
    )


async def test_actor_set_must_match_the_stages() -> None:
    with pytest.raises(PipelineSpecError, match=r"missing \['decode'\]"):
        StreamingPipelineOrchestrator(linear_spec(), fake_actors("encode", "denoise"))


async def test_interleaved_sessions_each_get_their_outputs_in_order() -> None:
    actors = fake_actors("encode", "denoise", "decode")
    async with StreamingPipelineOrchestrator(linear_spec(), actors) as orch:
        streams = {sid: orch.open_session(sid) for sid in ("a", "b", "c")}

        async def feed(sid: str) -> None:
            for i in range(20):
                await orch.submit(sid, {"input": (i, f"{sid}{i}")})

        async with asyncio.TaskGroup() as tg:
            for sid in streams:
                tg.create_task(feed(sid))
            results = {sid: tg.create_task(take(stream, 20)) for sid, stream in streams.items()}
        for sid, task in results.items():
            items = task.result()
            assert [i.sequence_id for i in items] == list(range(20))
            assert [i.payload for i in items] == [f"{sid}{i}" for i in range(20)]
        # the sessions really interleaved on the shared actors
        order = [c.session_id for c in actors["denoise"].calls]
        assert len({order.index(s) for s in ("a", "b", "c")}) == 3
        assert order[:3] != ["a", "a", "a"]


async def test_submit_waits_for_room_and_resumes_when_outputs_are_read() -> None:
    async with StreamingPipelineOrchestrator(
        linear_spec(capacity=1, output_capacity=1), fake_actors("encode", "denoise", "decode")
    ) as orch:
        stream = orch.open_session("s")
        accepted = 0

        async def feed() -> None:
            nonlocal accepted
            for i in range(10):
                await orch.submit("s", {"input": (i, i)})
                accepted += 1

        feeder = asyncio.create_task(feed())
        await settled(orch, lambda: not orch.has_room("s", ("input",)))
        # Nobody reads: one unread output and one item on each of the three edges, and the feeder waits for room.
        assert accepted == 4
        assert not feeder.done()
        items = await take(stream, 10)
        await feeder
        assert [i.sequence_id for i in items] == list(range(10))


async def test_cancelled_submit_submits_nothing() -> None:
    actors = fake_actors("only", gated=True)
    actors_only = actors["only"]
    async with StreamingPipelineOrchestrator(linear_spec("only", capacity=1), dict(actors)) as orch:
        orch.open_session("s")
        await orch.submit("s", {"input": (0, 0)})
        await orch.submit("s", {"input": (1, 1)})  # 0 is in flight, 1 waits on the edge
        waiter = asyncio.create_task(orch.submit("s", {"input": (2, 2)}))
        await asyncio.sleep(0)  # one loop turn: the waiter runs until it waits for room
        assert not waiter.done()
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert orch.next_sequence("s", "input") == 2
        closing = asyncio.create_task(orch.close_session("s", CloseMode.CANCEL))
        await asyncio.sleep(0)
        actors_only.finish("s", 0)
        report = await closing
        assert report.discarded_items == 1  # sequence 1, queued on the edge


async def test_stage_failure_fails_only_its_session_and_emitted_outputs_stay_readable() -> None:
    def fragile(call: StageCall) -> Mapping[str, object]:
        if call.session_id == "bad" and call.sequence_id == 2:
            raise ValueError("bad latent")
        return {"out": call.inputs["input"]}

    actor = FakeActor("only", fragile)
    async with StreamingPipelineOrchestrator(
        linear_spec("only", capacity=8, output_capacity=8), {"only": actor}
    ) as orch:
        bad = orch.open_session("bad")
        good = orch.open_session("good")
        for i in range(4):
            await orch.submit("bad", {"input": (i, i)})
            await orch.submit("good", {"input": (i, i)})
        assert [i.payload for i in await take(good, 4)] == [0, 1, 2, 3]
        assert [i.payload for i in await take(bad, 2)] == [0, 1]
        with pytest.raises(SessionFailedError, match="bad latent"):
            await anext(bad)
        # the failed session was released automatically; a second close returns the same report
        report = await orch.close_session("bad")
        assert report.state is PipelineSessionState.CLOSED
        assert report.failure is not None
        assert "stage 'only' failed for session 'bad' at sequence 2" in report.failure
        assert actor.released == ["bad"]
        assert orch.session_state("good") is PipelineSessionState.OPEN
        await orch.submit("good", {"input": (4, 4)})
        assert (await anext(good)).payload == 4
        with pytest.raises(SessionClosedError, match="was closed"):  # released; closed while its report is kept
            await orch.submit("bad", {"input": (9, 9)})


@contextlib.asynccontextmanager
async def _denoise_failed_behind_a_decode() -> AsyncIterator[
    tuple[StreamingPipelineOrchestrator, OutputStream, FakeActor]
]:
    """Two chunks in flight (issue #32): sequence 0 held in a gated decode, then sequence 1's denoise failed. Yields
    the orchestrator, session "s"'s output stream and the decode actor (`decode.finish("s", 0, ...)` settles 0)."""

    def fragile(call: StageCall) -> Mapping[str, object]:
        if call.sequence_id == 1:
            raise ValueError("bad latent")
        return {"a0": call.inputs["input"]}

    denoise = FakeActor("denoise", fragile)
    decode = FakeActor("decode", passthrough(("out",)), gated=True)
    async with StreamingPipelineOrchestrator(
        linear_spec("denoise", "decode"), {"denoise": denoise, "decode": decode}
    ) as orch:
        stream = orch.open_session("s")
        await orch.submit("s", {"input": (0, "zero")})
        await until(lambda: ("s", 0) in decode.pending, "decode of sequence 0 running")
        await orch.submit("s", {"input": (1, "one")})
        await until(lambda: denoise.failures == 1, "denoise of sequence 1 failed")
        yield orch, stream, decode


async def test_a_stage_error_waits_for_the_earlier_sequences_in_flight_downstream() -> None:
    """Sequence 0 decodes while sequence 1's denoise fails (issue #32: two chunks in flight): 0 still comes out,
    then the failure; with nothing earlier in flight the failure is at once (the other test above)."""
    async with _denoise_failed_behind_a_decode() as (orch, stream, decode):
        assert orch.session_state("s") is PipelineSessionState.OPEN  # held until sequence 0 settles
        decode.finish("s", 0)
        assert (await anext(stream)).payload == "zero"
        with pytest.raises(SessionFailedError, match="bad latent"):
            await anext(stream)
        report = await orch.close_session("s")
        assert report.failure is not None
        assert "at sequence 1" in report.failure
        assert report.slot_leaks == 0


async def test_a_held_stage_error_fails_at_once_when_the_earlier_sequence_fails_too() -> None:
    async with _denoise_failed_behind_a_decode() as (orch, stream, decode):
        decode.finish("s", 0, RuntimeError("decode broke"))
        with pytest.raises(SessionFailedError, match="decode broke"):
            await anext(stream)
        report = await orch.close_session("s")
        assert report.slot_leaks == 0
        assert orch.statistics().calls_running == 0


async def test_close_reports_are_kept_for_the_newest_sessions_only() -> None:
    actors = fake_actors("encode", "denoise", "decode")
    async with StreamingPipelineOrchestrator(linear_spec(), actors, kept_reports=2) as orch:
        reports = {}
        for sid in ("a", "b", "c"):
            orch.open_session(sid)
            reports[sid] = await orch.close_session(sid)
        for sid in ("b", "c"):
            assert await orch.close_session(sid) is reports[sid]  # idempotent while kept
        with pytest.raises(UnknownSessionError):
            await orch.close_session("a")
    with pytest.raises(ValueError, match="kept_reports"):
        StreamingPipelineOrchestrator(linear_spec(), fake_actors("encode", "denoise", "decode"), kept_reports=0)


_WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


@pytest.mark.parametrize("kind", ["loop", "thread"])
async def test_stage_calls_and_listeners_run_in_the_context_their_session_was_opened_in(kind: str) -> None:
    seen: list[tuple[str, str, str]] = []

    def recording(call: StageCall) -> Mapping[str, object]:
        seen.append((call.stage_id, call.session_id, _WHO.get()))
        return passthrough(("out",))(call)

    actor = FakeActor("only", recording) if kind == "loop" else LocalStageActor("only", FunctionStage(recording))
    actors: dict[str, FakeActor | LocalStageActor] = {"only": actor}
    async with StreamingPipelineOrchestrator(linear_spec("only"), actors) as orch:
        orch.add_stage_listener("only", lambda sid, _seq: seen.append(("listener", sid, _WHO.get())))
        streams = {}
        for sid in ("a", "b"):
            token = _WHO.set(sid)  # e.g. the session id a service binds for its log lines
            streams[sid] = orch.open_session(sid)
            _WHO.reset(token)
        _WHO.set("trigger")
        for i in range(3):  # one task submits for both: the calls must not inherit its context
            await orch.submit("a", {"input": (i, i)})
            await orch.submit("b", {"input": (i, i)})
        for stream in streams.values():
            await take(stream, 3)
        await orch.close_session("a")
        await orch.close_session("b")
        assert orch._contexts == {}  # a closed session's context is not kept
    assert len(seen) == 12
    assert all(who == sid for _, sid, who in seen), seen


async def test_drain_delivers_every_accepted_chunk() -> None:
    actors = fake_actors("encode", "denoise", "decode")
    async with StreamingPipelineOrchestrator(linear_spec(capacity=4, output_capacity=16), actors) as orch:
        stream = orch.open_session("s")
        for i in range(6):
            await orch.submit("s", {"input": (i, i)})
        report = await orch.close_session("s", CloseMode.DRAIN)
        items = [item async for item in stream]
        assert [i.sequence_id for i in items] == list(range(6))
        assert report.outputs_emitted == 6
        assert report.slot_leaks == 0
        assert report.discarded_items == 0


async def test_cancel_discards_queued_work_and_waits_for_the_call_in_flight() -> None:
    actors = fake_actors("encode", "denoise", "decode", gated=True)
    async with StreamingPipelineOrchestrator(linear_spec(capacity=4), actors) as orch:
        stream = orch.open_session("s")
        for i in range(4):
            await orch.submit("s", {"input": (i, i)})
        await actors["encode"].call_started.wait()
        closing = asyncio.create_task(orch.close_session("s", CloseMode.CANCEL))
        await until(
            lambda: orch.session_state("s") is PipelineSessionState.CANCELLING, "session s to be cancelling", every=0
        )
        assert not closing.done()  # encode of sequence 0 is still running (gated): the close waits for it
        actors["encode"].finish("s", 0)
        report = await closing
        assert report.state is PipelineSessionState.CLOSED
        assert report.discarded_items == 3
        assert report.slot_leaks == 0
        assert [c.stage_id for a in actors.values() for c in a.calls] == ["encode"]
        assert [item async for item in stream] == []
        assert orch.statistics().core.stale_results == 1


async def test_release_runs_in_reverse_topological_order_and_a_failure_poisons_until_retried() -> None:
    actors = fake_actors("encode", "denoise", "decode")
    log: list[str] = []
    for actor in actors.values():
        actor.release_log = log
    actors["denoise"].release_failures["s"] = 1
    async with StreamingPipelineOrchestrator(linear_spec(), actors) as orch:
        orch.open_session("s")
        report = await orch.close_session("s")
        assert log == ["decode", "encode"]
        assert report.state is PipelineSessionState.POISONED
        assert set(report.failed_stages) == {"denoise"}
        with pytest.raises(SessionPoisonedError):
            orch.open_session("s")
        retry = await orch.retry_release("s")
        assert retry.state is PipelineSessionState.CLOSED
        assert log == ["decode", "encode", "denoise"]  # only the failed stage was retried
        assert orch.statistics().core.cleanup_failures == 1
        orch.open_session("s")


async def test_resource_group_serialises_and_returns_the_permit_after_a_failure() -> None:
    running = 0
    peak = 0
    gate = asyncio.Event()
    started = asyncio.Event()

    class Counting(FakeActor):
        async def invoke(self, call: StageCall) -> Mapping[str, object]:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            started.set()
            try:
                await gate.wait()
                return await super().invoke(call)
            finally:
                running -= 1

    def fail_first(call: StageCall) -> Mapping[str, object]:
        if call.sequence_id == 0 and call.session_id == "s":
            raise RuntimeError("first call fails")
        return {"lx": 1}

    actors = {
        "left": Counting("left", fail_first, capacity=4),
        "right": Counting("right", lambda c: {"ry": 2}, capacity=4),
    }
    async with StreamingPipelineOrchestrator(grouped_spec(group_size=1), actors) as orch:
        orch.open_session("s")
        orch.open_session("t")
        await orch.submit("s", {"x": (0, 0), "y": (0, 0)})
        await orch.submit("t", {"x": (0, 0), "y": (0, 0)})
        # The core dispatches synchronously on submit: one permit, so one call of the four was started.
        assert sum(orch.statistics().core.in_flight_by_stage.values()) == 1
        await asyncio.wait_for(started.wait(), timeout=5)
        assert running == 1
        gate.set()
        stream_t = orch.outputs("t")
        got = await take(stream_t, 2)
        assert sorted(i.artifact for i in got) == ["lx", "ry"]
        assert peak == 1
        assert orch.statistics().core.in_flight_by_stage == {"left": 0, "right": 0}


async def test_actor_death_fails_dependent_sessions_and_new_sessions_run_after_restart() -> None:
    actors = fake_actors("only", gated=True)
    actor = actors["only"]
    async with StreamingPipelineOrchestrator(linear_spec("only", capacity=4), dict(actors)) as orch:
        doomed = orch.open_session("doomed")
        await orch.submit("doomed", {"input": (0, 0)})
        await actor.call_started.wait()
        actor.die("SIGKILL")
        assert not orch.ready
        with pytest.raises(SessionFailedError, match="died"):
            await anext(doomed)
        actor.restart()
        assert orch.ready
        fresh = orch.open_session("fresh")
        actor.gated = False
        await orch.submit("fresh", {"input": (0, "ok")})
        assert (await anext(fresh)).payload == "ok"


async def test_a_submit_waiting_for_room_when_its_session_fails_and_is_released_raises_session_closed() -> None:
    # A chunk loop waits for room while a worker dies under its session: the orchestrator fails and releases the
    # session, and the waiting submit must say the session closed (what a re-seed recovers from), not that the id
    # is unknown (issue #33: seen as a "chunk loop crashed" that ended a recoverable session).
    actors = fake_actors("only", gated=True)
    actor = actors["only"]
    async with StreamingPipelineOrchestrator(linear_spec("only", capacity=1), dict(actors)) as orch:
        orch.open_session("s")
        await orch.submit("s", {"input": (0, 0)})
        await orch.submit("s", {"input": (1, 1)})  # 0 is in flight, 1 waits on the edge
        waiter = asyncio.create_task(orch.submit("s", {"input": (2, 2)}))
        await actor.call_started.wait()
        await asyncio.sleep(0)
        assert not waiter.done()
        actor.die("SIGKILL")
        # Which message depends on whether the waiter wakes while the release runs or after it (as it did in
        # the service); either way it is the close, never `UnknownSessionError`.
        with pytest.raises(SessionClosedError, match=r"was closed: .*died|is releasing"):
            await waiter
        assert (await orch.close_session("s")).failure is not None
        # A submit that comes after the release (the chunk loop waited for its lease grant meanwhile) says the same.
        with pytest.raises(SessionClosedError, match=r"session 's' was closed: .*died"):
            await orch.submit("s", {"input": (2, 2)})


async def test_thread_actors_never_run_two_calls_of_one_stage_at_once() -> None:
    active = 0
    overlap = False
    lock = threading.Lock()

    def stage(call: StageCall) -> Mapping[str, object]:
        nonlocal active, overlap
        with lock:
            active += 1
            overlap |= active > 1
        value = call.inputs["input"]
        with lock:
            active -= 1
        return {"out": value}

    actors = {"only": LocalStageActor("only", FunctionStage(stage))}
    async with StreamingPipelineOrchestrator(linear_spec("only", capacity=8, output_capacity=8), actors) as orch:
        streams = [orch.open_session(f"s{i}") for i in range(4)]
        for i in range(25):
            for s in range(4):
                await orch.submit(f"s{s}", {"input": (i, i)})
            for stream in streams:
                assert (await anext(stream)).payload == i
        assert not overlap


async def test_ten_thousand_buffered_items_with_instant_actors_arrive_in_order() -> None:
    n = 10_000
    actors = fake_actors("encode", "denoise", "decode")
    async with StreamingPipelineOrchestrator(linear_spec(capacity=n, output_capacity=n), actors) as orch:
        stream = orch.open_session("s")
        for i in range(n):
            assert orch.try_submit("s", {"input": (i, i)})
        received = [item.payload for item in await take(stream, n)]
        assert received == list(range(n))


async def test_join_of_condition_and_control_in_the_lingbot_shape() -> None:
    seen: list[tuple[int, object]] = []

    def denoise(call: StageCall) -> Mapping[str, object]:
        seen.append((call.sequence_id, call.inputs["control"]))
        return {"latent": (call.inputs["cond"], call.inputs["control"])}

    actors = {
        "encode": FakeActor("encode", lambda c: {"cond": c.inputs["condition"]}),
        "denoise": FakeActor("denoise", denoise),
        "decode": FakeActor("decode", lambda c: {"frames": c.inputs["latent"]}),
    }
    async with StreamingPipelineOrchestrator(join_spec(), actors) as orch:
        stream = orch.open_session("s")
        await orch.submit("s", {"condition": (0, "c0")})
        await orch.submit("s", {"condition": (1, "c1")})
        await settled(orch, lambda: len(actors["encode"].calls) == 2)
        assert seen == []  # encode ran both, and with no control yet denoise waits on the join
        await orch.submit("s", {"control": (0, "k0")})
        assert (await anext(stream)).payload == ("c0", "k0")
        await orch.submit("s", {"control": (1, "k1"), "condition": (2, "c2")})
        assert (await anext(stream)).payload == ("c1", "k1")
        assert orch.metrics("s").control_to_output.count == 2


async def test_stage_listeners_hear_each_delivered_result_and_may_submit() -> None:
    actors = fake_actors("encode", "denoise", "decode")
    async with StreamingPipelineOrchestrator(linear_spec(capacity=4), actors) as orch:
        heard: list[tuple[str, int]] = []

        def on_denoise(session_id: str, sequence_id: int) -> None:
            heard.append((session_id, sequence_id))
            if sequence_id == 0:
                orch.try_submit(session_id, {"input": (1, "refill")})

        orch.add_stage_listener("denoise", on_denoise)
        stream = orch.open_session("s")
        await orch.submit("s", {"input": (0, "first")})
        assert [i.payload for i in await take(stream, 2)] == ["first", "refill"]
        assert heard == [("s", 0), ("s", 1)]


async def test_thread_actor_calls_run_without_a_task_and_a_stage_error_fails_only_its_session() -> None:
    gate = threading.Event()
    started = threading.Event()

    def stage(call: StageCall) -> Mapping[str, object]:
        started.set()
        assert gate.wait(10)
        if call.session_id == "bad":
            raise ValueError("bad input")
        return {"out": call.inputs["input"]}

    actors = {"only": LocalStageActor("only", FunctionStage(stage))}
    async with StreamingPipelineOrchestrator(linear_spec("only"), actors) as orch:
        good, bad = orch.open_session("good"), orch.open_session("bad")
        await orch.submit("bad", {"input": (0, 0)})
        await orch.submit("good", {"input": (0, 0)})
        await asyncio.to_thread(started.wait, 10)
        running = orch.statistics()
        assert (running.tasks, running.calls_running) == (0, 1)  # the hop is a callback, not a task
        gate.set()
        with pytest.raises(SessionFailedError, match="ValueError: bad input"):
            await anext(bad)
        assert (await anext(good)).payload == 0
        await settled(orch, lambda: True)
        assert orch.statistics().actors["only"].in_flight == 0
        await orch.close_session("good")


async def test_a_thread_call_that_outlives_the_cancel_timeout_is_orphaned_when_it_returns() -> None:
    gate = threading.Event()
    started = threading.Event()

    def stage(call: StageCall) -> Mapping[str, object]:
        started.set()
        assert gate.wait(10)
        return {"out": 0}

    actors = {"only": LocalStageActor("only", FunctionStage(stage))}
    async with StreamingPipelineOrchestrator(linear_spec("only"), actors, cancel_timeout=0.05) as orch:
        orch.open_session("s")
        await orch.submit("s", {"input": (0, 0)})
        await asyncio.to_thread(started.wait, 10)
        closing = asyncio.create_task(orch.close_session("s", CloseMode.CANCEL))
        # The close abandons the call, then its release waits on the thread behind the call.
        await until(
            lambda: orch.session_state("s") is PipelineSessionState.RELEASING, "session s to be releasing", every=0
        )
        assert orch.statistics().calls_running == 1
        gate.set()
        report = await closing
        assert report.slot_leaks == 2  # the session's in-flight count and its reserved output slot
        stats = orch.statistics()
        assert (stats.calls_running, stats.core.orphaned_results, stats.core.in_flight_by_stage) == (0, 1, {"only": 0})
