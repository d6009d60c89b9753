"""The scheduler's bookkeeping read back exactly: statistics, notices, late-result counters, returned room, and the
errors that name what was wrong. (Written against mutation survivors: each assertion pins a value a broken
scheduler would get wrong while every behaviour test still passed.)"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import pytest

from pipeline import (
    ActorUnavailableError,
    CloseMode,
    IdleReason,
    PipelineError,
    PipelineSpecError,
    SchedulerCore,
    SessionFailedError,
    StageCall,
    StreamingEdgeSpec,
    StreamingPipelineOrchestrator,
    StreamingPipelineSpec,
    StreamingStageSpec,
    UnknownArtifactError,
    UnknownSessionError,
    validate_pipeline,
)
from pipeline.core import NoticeKind, ResultKind
from tests.support.fakes.actors import FakeActor, StaticActorView
from tests.support.fakes.clock import FakeClock
from tests.support.graphs import linear_spec
from tests.support.waits import until


def _core(capacity: int = 4) -> SchedulerCore:
    return SchedulerCore(validate_pipeline(linear_spec("only", capacity=4)), StaticActorView(capacity), FakeClock())


def test_statistics_count_sessions_by_state_and_every_result() -> None:
    core = _core()
    for sid in ("a", "b", "c", "d"):
        core.open_session(sid)
        core.try_submit(sid, {"input": (0, None)})
    calls = {d.call.session_id: d for d in core.pump()}
    assert core.complete(calls["a"].invocation_id, {"out": 1}, 0) is ResultKind.DELIVERED
    assert core.complete(calls["b"].invocation_id, {"wrong": 1}, 0) is ResultKind.REJECTED
    core.begin_close("c", CloseMode.CANCEL)
    assert core.complete(calls["c"].invocation_id, {"out": 1}, 0) is ResultKind.STALE
    for _ in range(2):
        assert core.complete(calls["a"].invocation_id, {"out": 1}, 0) is ResultKind.DUPLICATE
        assert core.complete(99_999, {"out": 1}, 0) is ResultKind.ORPHANED
    core.begin_release("c")
    core.finish_release("c", ["only"], {"only": "RuntimeError: gpu"})  # c is poisoned
    stats = core.statistics()
    assert dict(stats.sessions_by_state) == {"open": 2, "failed": 1, "poisoned": 1}  # a and d; b; c
    assert stats.poisoned_sessions == ("c",)
    assert (stats.dispatched, stats.delivered, stats.rejected_results, stats.stale_results) == (4, 1, 1, 1)
    assert (stats.duplicate_results, stats.orphaned_results) == (2, 2)
    assert stats.in_flight_by_stage == {"only": 1}  # d's call
    assert stats.eligible_by_stage == {"only": 0}
    assert (stats.cleanup_failures, stats.slot_leaks) == (1, 0)


def test_a_failed_session_notifies_its_readers_submitters_and_closer() -> None:
    core = _core()
    core.open_session("s")
    core.try_submit("s", {"input": (0, None)})
    (d,) = core.pump()
    core.take_notices()
    core.fail(d.invocation_id, "boom")
    kinds = [n.kind for n in core.take_notices() if n.session_id == "s"]
    assert {NoticeKind.FAILED, NoticeKind.ROOM, NoticeKind.OUTPUT} <= set(kinds)
    assert all(isinstance(kind, NoticeKind) for kind in kinds)


@pytest.mark.parametrize("settle", ["stale", "fail"])
def test_room_reserved_by_a_call_whose_result_is_dropped_comes_back(settle: str) -> None:
    core = _core()
    core.open_session("s")
    core.try_submit("s", {"input": (0, None)})
    (d,) = core.pump()
    if settle == "stale":
        core.begin_close("s", CloseMode.CANCEL)
        assert core.complete(d.invocation_id, {"out": 1}, 0) is ResultKind.STALE
    else:
        core.fail(d.invocation_id, "boom")
    core.begin_release("s")
    report = core.finish_release("s", ["only"], {})
    assert report.slot_leaks == 0  # the output slot the call reserved was returned, not leaked


def test_a_call_abandoned_before_release_is_orphaned_when_it_returns() -> None:
    core = _core()
    core.open_session("s")
    core.try_submit("s", {"input": (0, None)})
    (d,) = core.pump()
    core.begin_close("s", CloseMode.CANCEL)
    assert core.abandon_in_flight("s") == 1
    assert core.is_quiescent("s")
    # The session still exists (not yet released), but it stopped waiting for the call: the result is orphaned.
    assert core.complete(d.invocation_id, {"out": 1}, 0) is ResultKind.ORPHANED
    assert core.statistics().orphaned_results == 1


def test_lookups_name_what_is_unknown() -> None:
    core = _core()
    with pytest.raises(UnknownSessionError, match="no session 'ghost'"):
        core.state("ghost")
    assert core.stream_ended("ghost") is True
    core.open_session("s")
    assert core.stream_ended("s") is False
    with pytest.raises(UnknownArtifactError, match="'nope' is not an external input of this pipeline"):
        core.next_sequence("s", "nope")
    assert core.has_room("s", ["nope"]) is True  # no edge of that name: nothing to be full
    core.begin_close("s", CloseMode.CANCEL)
    assert core.stream_ended("s") is True


async def test_orchestrator_errors_and_statistics_name_what_they_are_about() -> None:
    def fail(call: StageCall) -> dict[str, object]:
        raise ValueError("bad latent")

    actor = FakeActor("only", fail)
    async with StreamingPipelineOrchestrator(linear_spec("only"), {"only": actor}) as orch:
        with pytest.raises(UnknownSessionError, match="no open session 'ghost'"):
            orch.outputs("ghost")
        with pytest.raises(PipelineSpecError, match="no stage 'ghost'"):
            orch.add_stage_listener("ghost", lambda _sid, _seq: None)
        stream = orch.open_session("s")
        with pytest.raises(PipelineError, match="session 's' is not poisoned"):
            await orch.retry_release("s")
        stats = orch.statistics()
        assert stats.ready is True
        assert list(stats.actors) == ["only"]
        assert stats.actors["only"].name == "only"
        await orch.submit("s", {"input": (0, 0)})
        with pytest.raises(SessionFailedError) as failed:
            await asyncio.wait_for(anext(stream), timeout=5)
        assert failed.value.session_id == "s"
        assert "bad latent" in failed.value.reason


class _Unavailable(FakeActor):
    """Healthy when the scheduler looks, unavailable when the call arrives (it started restarting meanwhile)."""

    async def invoke(self, call: StageCall) -> Mapping[str, object]:
        raise ActorUnavailableError(f"{self.name} is restarting")


async def test_an_actor_unavailable_at_call_time_fails_the_session_naming_stage_and_error() -> None:
    actor = _Unavailable("only", lambda c: {"out": 0})
    async with StreamingPipelineOrchestrator(linear_spec("only"), {"only": actor}) as orch:
        stream = orch.open_session("s")
        await orch.submit("s", {"input": (0, 0)})
        with pytest.raises(SessionFailedError) as failed:
            await asyncio.wait_for(anext(stream), timeout=5)
        assert failed.value.reason == "stage 'only': ActorUnavailableError: only is restarting"


async def test_a_cancelled_submit_leaves_no_waiter_behind() -> None:
    actor = FakeActor("only", lambda c: {"out": 0}, gated=True)
    spec = linear_spec("only", capacity=1)
    async with StreamingPipelineOrchestrator(spec, {"only": actor}, cancel_timeout=0.1) as orch:
        orch.open_session("s")
        await orch.submit("s", {"input": (0, 0)})
        await orch.submit("s", {"input": (1, 1)})  # 0 in flight, 1 on the edge: the next submit waits
        waiter = asyncio.create_task(orch.submit("s", {"input": (2, 2)}))
        await asyncio.sleep(0)  # one loop turn: the waiter runs until it waits for room
        assert orch._waiters != {}
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert orch._waiters == {}  # the cancelled waiter's future is gone, and its key with it


def test_per_session_diagnostics_survive_a_retried_release() -> None:
    core = _core()
    core.open_session("s")
    core.try_submit("s", {"input": (0, None)})
    (d,) = core.pump()
    core.complete(d.invocation_id, {"out": 1}, 7.0)
    assert [(t.stage_id, t.sequence_id, t.started) for t in core.metrics("s").stage_timings] == [("only", 0, 7.0)]
    core.try_submit("s", {"input": (1, None)})
    core.readable("s").clear()
    core.output_read("s", "out")
    assert len(core.pump()) == 1
    core.begin_close("s", CloseMode.CANCEL)
    core.abandon_in_flight("s")
    metrics = core.metrics("s")
    core.begin_release("s")
    first = core.finish_release("s", [], {"only": "RuntimeError: gpu"})
    assert (first.slot_leaks, core.metrics("s").cleanup_failures) == (2, 1)
    core.begin_release("s")
    retry = core.finish_release("s", ["only"], {})
    assert retry.slot_leaks == 0  # nothing more leaked on the retry...
    assert core.statistics().slot_leaks == 2  # ...and the first release's leaks are still counted,
    assert metrics.slot_leaks == 2  # in the session's own diagnostics too


def test_a_second_rejected_result_is_counted_too() -> None:
    core = _core()
    for sid in ("a", "b"):
        core.open_session(sid)
        core.try_submit(sid, {"input": (0, None)})
    for d in core.pump():
        assert core.complete(d.invocation_id, {"wrong": 1}, 0) is ResultKind.REJECTED
    assert core.statistics().rejected_results == 2


def test_an_actor_restarted_behind_the_schedulers_back_fails_the_sessions_it_held() -> None:
    view = StaticActorView(4)
    core = SchedulerCore(validate_pipeline(linear_spec("only", capacity=4)), view, FakeClock())
    core.open_session("s")
    core.try_submit("s", {"input": (0, None)})
    (d,) = core.pump()
    core.complete(d.invocation_id, {"out": 1}, 0)
    view.incarnations["only"] = 2  # no death notice reached the scheduler
    core.try_submit("s", {"input": (1, None)})
    core.readable("s").clear()
    core.output_read("s", "out")
    assert core.pump() == []
    assert "actor 'only' restarted (incarnation 1 -> 2)" in (core.failure("s") or "")


def test_a_stage_limit_that_clears_at_once_records_no_idle_interval() -> None:
    spec = StreamingPipelineSpec(
        stages=(StreamingStageSpec("only", consumes=("input",), produces=("out",), max_in_flight=1),),
        edges=(StreamingEdgeSpec("input", target="only", capacity=4),),
        outputs=("out",),
    )
    clock = FakeClock(5.0)
    core = SchedulerCore(validate_pipeline(spec), StaticActorView(4), clock)
    for sid in ("a", "b"):
        core.open_session(sid)
        core.try_submit(sid, {"input": (0, None)})
    (first,) = core.pump()
    core.complete(first.invocation_id, {"out": 1}, 0)  # no time passes
    (second,) = core.pump()
    assert second.call.session_id == "b"
    assert [i for i in core.metrics("b").idle_intervals if i.reason is not IdleReason.MISSING_INPUT] == []


async def test_stop_cancels_open_sessions_instead_of_draining_them() -> None:
    actor = FakeActor("only", lambda c: {"out": c.inputs["input"]}, gated=True)
    orch = StreamingPipelineOrchestrator(linear_spec("only", capacity=4), {"only": actor})
    await orch.start()
    assert orch.ready
    orch.open_session("s")
    for i in range(3):
        await orch.submit("s", {"input": (i, i)})
    await asyncio.wait_for(actor.call_started.wait(), timeout=5)
    stopping = asyncio.create_task(orch.aclose())
    await asyncio.sleep(0)
    actor.finish("s", 0)
    await asyncio.wait_for(stopping, timeout=5)  # a drain would run sequences 1 and 2 on the gated actor: no end
    assert [c.sequence_id for c in actor.calls] == [0]
    assert orch.ready is False


async def test_a_cancel_upgrades_a_drain_in_progress_and_a_drain_timeout_falls_back_to_cancel() -> None:
    actor = FakeActor("only", lambda c: {"out": c.inputs["input"]}, gated=True)
    async with StreamingPipelineOrchestrator(linear_spec("only", capacity=4), {"only": actor}) as orch:
        for sid in ("up", "late"):
            orch.open_session(sid)
            for i in range(2):
                await orch.submit(sid, {"input": (i, i)})
        await asyncio.wait_for(actor.call_started.wait(), timeout=5)
        draining = asyncio.create_task(orch.close_session("up", CloseMode.DRAIN))
        await asyncio.sleep(0)
        cancelling = asyncio.create_task(orch.close_session("up", CloseMode.CANCEL))
        await asyncio.sleep(0)
        actor.finish("up", 0)
        report = await asyncio.wait_for(cancelling, timeout=5)
        assert report is await draining
        assert report.discarded_items == 1  # sequence 1 was discarded, not drained
        # A drain with a timeout that its in-flight call outlives falls back to cancel.
        await until(lambda: ("late", 0) in actor.pending, "the stage call of late", every=0)  # no per-call event
        timed = asyncio.create_task(orch.close_session("late", CloseMode.DRAIN, drain_timeout=0.05))
        await asyncio.sleep(0.2)  # past the drain timeout: now cancelling, still waiting for the call
        actor.finish("late", 0)
        late = await asyncio.wait_for(timed, timeout=5)
        assert (late.discarded_items, late.outputs_emitted) == (1, 0)


async def test_release_failures_are_reported_with_their_error_and_one_report_is_kept() -> None:
    actor = FakeActor("only", lambda c: {"out": 0})
    actor.release_failures["s"] = 1
    async with StreamingPipelineOrchestrator(linear_spec("only"), {"only": actor}, kept_reports=1) as orch:
        orch.open_session("s")
        report = await orch.close_session("s")
        assert dict(report.failed_stages) == {"only": "RuntimeError: only could not free s"}


async def test_a_failed_stream_read_after_its_release_still_raises_the_failure() -> None:
    def fragile(call: StageCall) -> Mapping[str, object]:
        if call.sequence_id == 1:
            raise ValueError("bad latent")
        return {"out": call.inputs["input"]}

    async with StreamingPipelineOrchestrator(
        linear_spec("only", capacity=4), {"only": FakeActor("only", fragile)}
    ) as orch:
        stream = orch.open_session("s")
        for i in range(2):
            await orch.submit("s", {"input": (i, i)})
        report = await asyncio.wait_for(orch.close_session("s"), timeout=5)  # released before anyone read
        assert report.failure is not None
        assert (await anext(stream)).payload == 0  # what was emitted stays readable
        with pytest.raises(SessionFailedError, match="bad latent"):
            await anext(stream)


async def test_the_metrics_window_and_a_death_reason_reach_the_session() -> None:
    actor = FakeActor("only", lambda c: {"out": c.inputs["input"]})
    async with StreamingPipelineOrchestrator(
        linear_spec("only", capacity=8, output_capacity=8), {"only": actor}, metrics_window=2
    ) as orch:
        stream = orch.open_session("s")
        for i in range(3):
            await orch.submit("s", {"input": (i, i)})
            await asyncio.wait_for(anext(stream), timeout=5)
        assert [t.sequence_id for t in orch.metrics("s").stage_timings] == [1, 2]  # the window keeps the newest 2
        actor.die("SIGKILL")
        with pytest.raises(SessionFailedError, match=r"actor 'only' died \(incarnation 1\): SIGKILL"):
            await asyncio.wait_for(anext(stream), timeout=5)
