"""The pure scheduling core, driven step by step with a fake clock and a static actor view."""

from __future__ import annotations

import pytest

from pipeline.core import CloseMode, Dispatch, NoticeKind, PipelineSessionState, ResultKind, SchedulerCore
from pipeline.errors import (
    SequenceError,
    SessionClosedError,
    SessionExistsError,
    SessionPoisonedError,
    UnknownArtifactError,
)
from pipeline.metrics import IdleReason
from pipeline.spec import StreamingPipelineSpec, validate_pipeline
from tests.support.fakes.actors import StaticActorView
from tests.support.fakes.clock import FakeClock
from tests.support.graphs import grouped_spec, join_spec, linear_spec, unordered_spec


def make(spec: StreamingPipelineSpec, capacity: int = 1) -> tuple[SchedulerCore, FakeClock, StaticActorView]:
    clock = FakeClock(100.0)
    view = StaticActorView(capacity)
    return SchedulerCore(validate_pipeline(spec), view, clock), clock, view


def finish(core: SchedulerCore, d: Dispatch, started: float | None = None) -> ResultKind:
    """Complete `d` with every produced artifact = (stage, sequence)."""
    produces = {"encode": ("a0",), "denoise": ("a1",), "decode": ("out",), "work": ("y",)}
    produced = produces.get(d.call.stage_id) or ("out",)
    return core.complete(d.invocation_id, dict.fromkeys(produced, (d.call.stage_id, d.call.sequence_id)), started or 0)


def read_all(core: SchedulerCore, session_id: str) -> list[int]:
    readable = core.readable(session_id)
    seqs = []
    while readable:
        item = readable.popleft()
        core.output_read(session_id, item.artifact)
        seqs.append(item.sequence_id)
    return seqs


def test_sequence_gap_and_replay_are_rejected_with_the_expected_id() -> None:
    core, _, _ = make(linear_spec())
    core.open_session("s")
    assert core.try_submit("s", {"input": (0, "x")})
    with pytest.raises(SequenceError, match="sequence 0 is a replay; the next accepted sequence is 1"):
        core.try_submit("s", {"input": (0, "x")})
    with pytest.raises(SequenceError, match="sequence 5 is a gap; the next accepted sequence is 1"):
        core.try_submit("s", {"input": (5, "x")})
    with pytest.raises(UnknownArtifactError, match="'a0' is not an external input"):
        core.try_submit("s", {"a0": (0, "x")})
    assert core.next_sequence("s", "input") == 1


def test_multi_artifact_submit_is_all_or_nothing() -> None:
    core, _, view = make(join_spec(capacity=1))
    view.down.add("encode")  # nothing runs: edges only fill
    core.open_session("s")
    assert core.try_submit("s", {"condition": (0, "c0")})
    # condition's edge is full, control's is empty: the pair must be refused whole
    assert not core.try_submit("s", {"condition": (1, "c1"), "control": (0, "k0")})
    assert core.next_sequence("s", "control") == 0
    assert core.next_sequence("s", "condition") == 1
    assert core.try_submit("s", {"control": (0, "k0")})


def test_join_waits_for_both_inputs_of_the_same_sequence() -> None:
    core, _, _ = make(join_spec())
    core.open_session("s")
    core.try_submit("s", {"control": (0, "k0")})
    assert core.pump() == []  # denoise lacks cond 0
    core.try_submit("s", {"condition": (0, "c0")})
    (encode,) = core.pump()
    assert encode.call.stage_id == "encode"
    core.complete(encode.invocation_id, {"cond": "C0"}, 0)
    (denoise,) = core.pump()
    assert denoise.call.stage_id == "denoise"
    assert denoise.call.inputs == {"cond": "C0", "control": "k0"}


def test_full_ingress_edge_refuses_and_a_dispatch_frees_room() -> None:
    core, _, _ = make(linear_spec(capacity=2))
    core.open_session("s")
    assert core.try_submit("s", {"input": (0, 0)})
    assert core.try_submit("s", {"input": (1, 1)})
    assert not core.try_submit("s", {"input": (2, 2)})
    (d,) = core.pump()
    assert Notice_kinds(core) >= {NoticeKind.ROOM}
    assert d.call.sequence_id == 0
    assert core.try_submit("s", {"input": (2, 2)})


def Notice_kinds(core: SchedulerCore) -> set[NoticeKind]:
    return {n.kind for n in core.take_notices()}


def test_in_flight_work_reserves_downstream_room() -> None:
    core, _, _ = make(linear_spec("p", "q", capacity=1))
    core.open_session("s")
    core.try_submit("s", {"input": (0, 0)})
    (p0,) = core.pump()
    core.try_submit("s", {"input": (1, 1)})
    assert core.pump() == []  # p is busy with 0 (strict, capacity 1)
    core.complete(p0.invocation_id, {"a0": "p0"}, 0)
    dispatched = core.pump()
    # q takes a0[0]; p may take input 1 because q's dispatch freed the a0 edge; q reserved the output slot
    assert sorted(d.call.stage_id for d in dispatched) == ["p", "q"]
    p1 = next(d for d in dispatched if d.call.stage_id == "p")
    core.try_submit("s", {"input": (2, 2)})
    core.complete(p1.invocation_id, {"a0": "p1"}, 0)
    # a0 edge (capacity 1) now holds p1's result: p cannot start 2 although its input is there
    assert core.pump() == []
    stats = core.statistics()
    assert stats.in_flight_by_stage == {"p": 0, "q": 1}


def test_unread_outputs_hold_the_last_stage_back() -> None:
    core, clock, _ = make(linear_spec("only", output_capacity=1, capacity=4))
    core.open_session("s")
    for i in range(3):
        core.try_submit("s", {"input": (i, i)})
    (d0,) = core.pump()
    core.complete(d0.invocation_id, {"out": 0}, 0)
    assert core.pump() == []  # output buffer (capacity 1) holds item 0, unread
    clock.advance(2.0)
    assert read_all(core, "s") == [0]
    (d1,) = core.pump()
    assert d1.call.sequence_id == 1
    (blocked,) = [i for i in core.metrics("s").idle_intervals if i.reason is IdleReason.OUTPUT_FULL]
    assert (blocked.stage_id, blocked.detail, blocked.duration) == ("only", "out", 2.0)
    core.complete(d1.invocation_id, {"out": 1}, 0)
    assert read_all(core, "s") == [1]


def test_eight_sessions_on_a_one_slot_stage_get_equal_turns() -> None:
    core, _, _ = make(linear_spec("only", capacity=64, output_capacity=64))
    sessions = [f"s{i}" for i in range(8)]
    for sid in sessions:
        core.open_session(sid)
    turns = dict.fromkeys(sessions, 0)
    next_seq = dict.fromkeys(sessions, 0)
    for sid in sessions:
        for _ in range(10):
            core.try_submit(sid, {"input": (next_seq[sid], None)})
            next_seq[sid] += 1
    for _ in range(41):
        (d,) = core.pump()
        turns[d.call.session_id] += 1
        core.complete(d.invocation_id, {"out": None}, 0)
        read_all(core, d.call.session_id)
        # keep every session's input topped up so all stay eligible
        sid = d.call.session_id
        core.try_submit(sid, {"input": (next_seq[sid], None)})
        next_seq[sid] += 1
    assert max(turns.values()) - min(turns.values()) <= 1


def test_oldest_eligible_session_goes_first() -> None:
    core, clock, _ = make(linear_spec("only", capacity=4))
    for sid in ("a", "b", "c"):
        core.open_session(sid)
    core.try_submit("c", {"input": (0, None)})
    (first,) = core.pump()
    clock.advance(1)
    core.try_submit("b", {"input": (0, None)})
    clock.advance(1)
    core.try_submit("a", {"input": (0, None)})
    core.complete(first.invocation_id, {"out": None}, 0)
    order = []
    for _ in range(2):
        (d,) = core.pump()
        order.append(d.call.session_id)
        core.complete(d.invocation_id, {"out": None}, 0)
    assert order == ["b", "a"]


def test_resource_group_serialises_member_stages_only_when_named() -> None:
    core, _, _ = make(grouped_spec(group_size=1), capacity=4)
    core.open_session("s")
    core.try_submit("s", {"x": (0, 1), "y": (0, 2)})
    dispatched = core.pump()
    assert len(dispatched) == 1  # the group admits one of the two independent stages
    core.fail(dispatched[0].invocation_id, "boom")
    core.open_session("t")
    core.try_submit("t", {"x": (0, 1), "y": (0, 2)})
    # the failed call returned its permit: t gets exactly one permit again
    assert len(core.pump()) == 1

    free, _, _ = make(grouped_spec(group_size=2), capacity=4)
    free.open_session("s")
    free.try_submit("s", {"x": (0, 1), "y": (0, 2)})
    assert len(free.pump()) == 2


def test_unordered_stage_runs_several_sequences_and_outputs_stay_in_order() -> None:
    core, _, _ = make(unordered_spec(per_session=3), capacity=8)
    core.open_session("s")
    for i in range(4):
        core.try_submit("s", {"x": (i, i)})
    dispatched = core.pump()
    assert [d.call.sequence_id for d in dispatched] == [0, 1, 2]
    for d in reversed(dispatched):
        finish(core, d)
    assert read_all(core, "s") == [0, 1, 2]


def test_late_results_are_classified() -> None:
    core, _, _ = make(linear_spec("only", capacity=4))
    core.open_session("s")
    core.try_submit("s", {"input": (0, None)})
    (d,) = core.pump()
    assert core.complete(d.invocation_id, {"out": 1}, 0) is ResultKind.DELIVERED
    assert core.complete(d.invocation_id, {"out": 1}, 0) is ResultKind.DUPLICATE
    assert core.complete(987654, {"out": 1}, 0) is ResultKind.ORPHANED
    core.try_submit("s", {"input": (1, None)})
    read_all(core, "s")
    (d1,) = core.pump()
    core.begin_close("s", CloseMode.CANCEL)
    assert core.complete(d1.invocation_id, {"out": 1}, 0) is ResultKind.STALE
    assert core.metrics("s").stale_results == 1
    stats = core.statistics()
    assert (stats.duplicate_results, stats.orphaned_results, stats.stale_results) == (1, 1, 1)


def test_wrong_artifacts_from_a_stage_fail_only_that_session() -> None:
    core, _, _ = make(linear_spec("only", capacity=4), capacity=2)
    for sid in ("bad", "good"):
        core.open_session(sid)
        core.try_submit(sid, {"input": (0, None)})
    bad, good = core.pump()
    assert core.complete(bad.invocation_id, {"nope": 1}, 0) is ResultKind.REJECTED
    assert core.state("bad") is PipelineSessionState.FAILED
    assert "declares ['out']" in (core.failure("bad") or "")
    assert core.complete(good.invocation_id, {"out": 1}, 0) is ResultKind.DELIVERED
    assert core.state("good") is PipelineSessionState.OPEN


def test_closed_sessions_refuse_input_and_ids_are_unique() -> None:
    core, _, _ = make(linear_spec())
    core.open_session("s")
    with pytest.raises(SessionExistsError):
        core.open_session("s")
    core.begin_close("s", CloseMode.DRAIN)
    with pytest.raises(SessionClosedError, match="draining"):
        core.try_submit("s", {"input": (0, None)})


def test_drain_runs_accepted_work_and_discards_unjoined_prefetch() -> None:
    core, _, _ = make(join_spec())
    core.open_session("s")
    core.try_submit("s", {"condition": (0, "c0"), "control": (0, "k0")})
    core.try_submit("s", {"condition": (1, "c1")})  # prefetched, never gets a control
    core.begin_close("s", CloseMode.DRAIN)
    steps = 0
    while not core.is_quiescent("s"):
        for d in core.pump():
            produced = {"encode": "cond", "denoise": "latent", "decode": "frames"}[d.call.stage_id]
            core.complete(d.invocation_id, {produced: d.call.sequence_id}, 0)
        read_all(core, "s")
        steps += 1
        assert steps < 20
    assert core.begin_release("s") == ("decode", "denoise", "encode")
    report = core.finish_release("s", ("decode", "denoise", "encode"), {})
    assert report.state is PipelineSessionState.CLOSED
    assert report.outputs_emitted == 1
    assert report.discarded_items == 1  # cond 1 waiting for control 1
    assert report.slot_leaks == 0


def test_release_failure_poisons_the_id_until_a_retry_of_only_the_failed_stages_succeeds() -> None:
    core, _, _ = make(linear_spec())
    core.open_session("s")
    core.begin_close("s", CloseMode.CANCEL)
    stages = core.begin_release("s")
    report = core.finish_release("s", [s for s in stages if s != "denoise"], {"denoise": "RuntimeError: gpu"})
    assert report.state is PipelineSessionState.POISONED
    with pytest.raises(SessionPoisonedError, match=r"releasing stages \['denoise'\] failed"):
        core.open_session("s")
    assert core.begin_release("s") == ("denoise",)
    report = core.finish_release("s", ["denoise"], {})
    assert report.state is PipelineSessionState.CLOSED
    assert report.released_stages == ("decode", "encode", "denoise")
    core.open_session("s")  # the id is usable again


def test_abandoned_calls_are_reported_as_slot_leaks() -> None:
    core, _, _ = make(linear_spec("only", capacity=4))
    core.open_session("s")
    core.try_submit("s", {"input": (0, None)})
    (d,) = core.pump()
    core.begin_close("s", CloseMode.CANCEL)
    assert not core.is_quiescent("s")
    assert core.abandon_in_flight("s") == 1
    core.begin_release("s")
    report = core.finish_release("s", ["only"], {})
    assert report.slot_leaks == 2  # the session's in-flight count and its reserved output slot
    assert core.statistics().in_flight_by_stage["only"] == 1  # the actor is still busy with the call
    assert core.complete(d.invocation_id, {"out": 1}, 0) is ResultKind.ORPHANED
    assert core.statistics().in_flight_by_stage["only"] == 0


def test_actor_death_fails_only_sessions_whose_state_it_held() -> None:
    core, _, view = make(linear_spec("only", capacity=4), capacity=2)
    core.open_session("touched")
    core.open_session("fresh")
    core.try_submit("touched", {"input": (0, None)})
    (d,) = core.pump()
    core.complete(d.invocation_id, {"out": 1}, 0)
    assert core.actor_died("only", 1, "SIGKILL") == ["touched"]
    assert core.state("fresh") is PipelineSessionState.OPEN
    view.incarnations["only"] = 2
    core.try_submit("fresh", {"input": (0, None)})
    (d2,) = core.pump()
    assert d2.call.session_id == "fresh"


def test_metric_formulas_on_a_hand_built_timeline() -> None:
    core, clock, _ = make(join_spec())
    core.open_session("s")
    core.try_submit("s", {"condition": (0, "c0")})  # t=100: first ingress (prefetch, not an anchor)
    clock.advance(0.5)
    core.try_submit("s", {"control": (0, "k0")})  # t=100.5: anchor 0
    produced = {"encode": "cond", "denoise": "latent", "decode": "frames"}

    def run_all() -> None:
        for _ in range(3):
            for d in core.pump():
                clock.advance(0.1)
                core.complete(d.invocation_id, {produced[d.call.stage_id]: 0}, clock.now() - 0.1)

    run_all()  # encode 100.6, denoise 100.7, decode 100.8 -> output 0 at 100.8
    clock.advance(0.2)
    core.try_submit("s", {"condition": (1, "c1"), "control": (1, "k1")})  # t=101.0
    run_all()  # output 1 at 101.3
    read_all(core, "s")
    m = core.metrics("s")
    assert m.first_output_latency == pytest.approx(0.8)
    c2o = m.control_to_output
    assert c2o.count == 2
    assert c2o.max == pytest.approx(0.3)
    assert c2o.p50 == pytest.approx(0.3)
    assert m.chunk_period.p95 == pytest.approx(0.5)
    assert m.real_time_factor(0.25) == pytest.approx(2.0)
    durations = m.snapshot().stage_durations
    assert durations["denoise"].mean == pytest.approx(0.1)
    missing = [i for i in m.idle_intervals if i.reason is IdleReason.MISSING_INPUT and i.stage_id == "denoise"]
    # denoise of sequence 0 waited from session start (t=100) until encode delivered cond at t=100.6
    assert missing[0].detail == "cond"
    assert missing[0].start == 100.0
    assert missing[0].end == pytest.approx(100.6)


def test_ten_thousand_buffered_items_run_in_order_without_recursion() -> None:
    n = 10_000
    core, _, _ = make(linear_spec(capacity=n, output_capacity=n))
    core.open_session("s")
    for i in range(n):
        assert core.try_submit("s", {"input": (i, i)})
    pending = core.pump()
    while pending:
        d = pending.pop()
        finish(core, d)
        pending.extend(core.pump())
    assert read_all(core, "s") == list(range(n))
