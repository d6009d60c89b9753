"""The scheduling core's ready structures: their invariants, and work per event that does not grow with the number
of open sessions (DESIGN 3.3, issue #17).

The cost is measured without a clock: the Python lines the core executes (a `sys.settrace` counter over
`pipeline/core/`), and the ready-heap entries it examines (`sessions_examined`), per event of the same steady
workload with few and with many sessions open and waiting. A scan of the eligible sessions on every event (what
picking the oldest one with room used to cost) multiplies both by the number of sessions; the heap's own O(log n)
runs in C and is not counted. Timing figures belong to `bench/orchestrator.py`, not here."""

from __future__ import annotations

import sys
from collections import deque
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pipeline import CloseMode, SchedulerCore, StageOrdering, StreamingPipelineSpec, validate_pipeline
from pipeline.core import Dispatch, PipelineSessionState
from tests.support.fakes.actors import StaticActorView
from tests.support.fakes.clock import FakeClock
from tests.support.graphs import linear_spec

CORE = str(Path(__file__).resolve().parents[3] / "pipeline" / "core")
PRODUCES = {"encode": "a0", "denoise": "a1", "decode": "out"}


class _LineCounter:
    """Counts the lines executed in `pipeline/core/` while installed (`sys.settrace`)."""

    def __init__(self) -> None:
        self.lines = 0

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line":
            self.lines += 1
        return self._local

    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        return self._local if frame.f_code.co_filename.startswith(CORE) else None

    def __enter__(self) -> _LineCounter:
        sys.settrace(self._global)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.settrace(None)


class _Workload:
    """Every session keeps its input edge full; one call finishes per event, the oldest first; readers keep up.

    With a one-slot actor per stage, every open session is eligible at some stage and waits: the case where a
    per-event scan would visit them all."""

    def __init__(self, sessions: int, spec: StreamingPipelineSpec) -> None:
        self.core = SchedulerCore(validate_pipeline(spec), StaticActorView(capacity=1), FakeClock(100.0))
        self.ids = [f"s{i}" for i in range(sessions)]
        self.next = dict.fromkeys(self.ids, 0)
        self.running: deque[Dispatch] = deque()
        for sid in self.ids:
            self.core.open_session(sid)
            self._fill(sid)
        self.running.extend(self.core.pump())

    def _fill(self, sid: str) -> None:
        while self.core.try_submit(sid, {"input": (self.next[sid], None)}):
            self.next[sid] += 1

    def event(self) -> None:
        """One result: complete the oldest call, read what became readable, refill its session, pump."""
        done = self.running.popleft()
        sid = done.call.session_id
        self.core.complete(done.invocation_id, {PRODUCES[done.call.stage_id]: None}, 0.0)
        readable = self.core.readable(sid)
        while readable:
            self.core.output_read(sid, readable.popleft().artifact)
        self._fill(sid)
        self.running.extend(self.core.pump())


def _per_event(sessions: int, spec: StreamingPipelineSpec, events: int = 300) -> tuple[float, float]:
    """(lines executed in the core, ready entries examined) per event, after a warm-up of every session."""
    load = _Workload(sessions, spec)
    for _ in range(6 * sessions):  # every session has run through the pipeline: the steady state
        load.event()
    examined = load.core.statistics().sessions_examined
    with _LineCounter() as counter:
        for _ in range(events):
            load.event()
    return counter.lines / events, (load.core.statistics().sessions_examined - examined) / events


@pytest.mark.parametrize(
    "spec",
    [
        pytest.param(linear_spec(), id="strict"),
        pytest.param(
            StreamingPipelineSpec(
                stages=linear_spec().stages[:1]
                + tuple(
                    type(stage)(
                        stage.stage_id,
                        consumes=stage.consumes,
                        produces=stage.produces,
                        ordering=StageOrdering.NONE,
                        max_in_flight_per_session=2,
                    )
                    for stage in linear_spec().stages[1:]
                ),
                edges=linear_spec().edges,
                outputs=("out",),
                output_capacity=2,
            ),
            id="unordered",
        ),
    ],
)
def test_work_per_event_is_the_same_with_8_and_512_sessions_waiting(spec: StreamingPipelineSpec) -> None:
    if sys.gettrace() is not None:
        pytest.skip("another tracer (coverage, a debugger) is installed; this test needs sys.settrace")
    few_lines, few_examined = _per_event(8, spec)
    many_lines, many_examined = _per_event(512, spec)
    # A scan of the waiting sessions would make the 512-session figure about 64 times the 8-session one.
    assert many_lines <= 1.1 * few_lines, (few_lines, many_lines)
    assert many_examined <= 1.1 * few_examined + 0.05, (few_examined, many_examined)
    assert many_examined <= 2.0  # about one entry per dispatch (one dispatch per event here), plus stale ones


def test_a_session_parked_by_its_full_output_keeps_its_turn_when_a_read_frees_room() -> None:
    """A session whose downstream is full waits aside (no heap entry) and comes back with its place: once its
    reader frees room it goes before sessions that became eligible after it."""
    core = SchedulerCore(
        validate_pipeline(linear_spec("only", capacity=4, output_capacity=1)), StaticActorView(1), FakeClock(0.0)
    )
    for sid in ("a", "b", "c"):
        core.open_session(sid)
    assert core.try_submit("a", {"input": (0, None)})
    assert core.try_submit("a", {"input": (1, None)})
    (first,) = core.pump()
    core.complete(first.invocation_id, {"out": None}, 0.0)  # a's output is unread: its next call has no room
    assert core.try_submit("b", {"input": (0, None)})
    assert core.try_submit("c", {"input": (0, None)})
    (second,) = core.pump()
    assert second.call.session_id == "b"  # a is parked: b goes although a became eligible first
    assert core.statistics().eligible_by_stage == {"only": 2}  # a (parked) and c (ready)
    readable = core.readable("a")
    core.output_read("a", readable.popleft().artifact)  # room again: a is back with its old place
    core.complete(second.invocation_id, {"out": None}, 0.0)
    (third,) = core.pump()
    assert (third.call.session_id, third.call.sequence_id) == ("a", 1)  # before c, which became eligible later


# -- the ready structures' invariants under random interleavings -----------------------------------------------------


def _mixed_spec() -> StreamingPipelineSpec:
    """input -> encode (strict) -> a0 -> work (unordered, 2 per session) -> a1 -> decode (strict) -> out, small
    edges and outputs so that sessions park often."""
    base = linear_spec("encode", "work", "decode", capacity=1, output_capacity=1)
    encode, work, decode = base.stages
    unordered = type(work)(
        work.stage_id,
        consumes=work.consumes,
        produces=work.produces,
        ordering=StageOrdering.NONE,
        max_in_flight_per_session=2,
    )
    edges = tuple(type(e)(e.artifact, target=e.target, source=e.source, capacity=2) for e in base.edges)
    return StreamingPipelineSpec(stages=(encode, unordered, decode), edges=edges, outputs=("out",), output_capacity=1)


MIXED_PRODUCES = {"encode": "a0", "work": "a1", "decode": "out"}
SESSIONS = ("s0", "s1", "s2")


class ReadyStructureMachine(RuleBasedStateMachine):
    """Submits, results in any order, failures, reads, actors going down and up, closes and reopened ids; after
    every step the core's own check of its ready structures finds nothing, and a second pump dispatches nothing
    (the first one dispatched everything that could run)."""

    def __init__(self) -> None:
        super().__init__()
        self.view = StaticActorView(capacity=1)
        self.core = SchedulerCore(validate_pipeline(_mixed_spec()), self.view, FakeClock(0.0))
        self.running: list[Dispatch] = []
        self.next: dict[str, int] = {}
        self.closing: set[str] = set()
        for sid in SESSIONS:
            self._open(sid)

    def _open(self, sid: str) -> None:
        self.core.open_session(sid)
        self.next[sid] = 0

    def _pump(self) -> None:
        self.running.extend(self.core.pump())
        assert self.core.pump() == []

    @rule(sid=st.sampled_from(SESSIONS))
    def submit(self, sid: str) -> None:
        if self.core.state(sid) is not PipelineSessionState.OPEN:
            return
        if self.core.try_submit(sid, {"input": (self.next[sid], None)}):
            self.next[sid] += 1
        self._pump()

    @rule(data=st.data(), fail=st.booleans())
    def finish_one(self, data: st.DataObject, fail: bool) -> None:
        if not self.running:
            return
        d = data.draw(st.sampled_from(self.running))
        self.running.remove(d)
        if fail and d.call.session_id == "s2":  # one session only, so the others keep running
            self.core.fail(d.invocation_id, "boom")
            self.closing.add("s2")
        else:
            self.core.complete(d.invocation_id, {MIXED_PRODUCES[d.call.stage_id]: None}, 0.0)
        self._pump()

    @rule(sid=st.sampled_from(SESSIONS))
    def read(self, sid: str) -> None:
        if self.core.has_session(sid):
            readable = self.core.readable(sid)
            while readable:
                self.core.output_read(sid, readable.popleft().artifact)
        self._pump()

    @rule(stage=st.sampled_from(tuple(MIXED_PRODUCES)), down=st.booleans(), capacity=st.integers(1, 2))
    def actor(self, stage: str, down: bool, capacity: int) -> None:
        (self.view.down.add if down else self.view.down.discard)(stage)
        self.view.capacities[stage] = capacity
        self._pump()

    @rule(sid=st.sampled_from(SESSIONS), cancel=st.booleans())
    def close(self, sid: str, cancel: bool) -> None:
        if self.core.state(sid) not in (PipelineSessionState.OPEN, PipelineSessionState.DRAINING):
            return
        self.core.begin_close(sid, CloseMode.CANCEL if cancel else CloseMode.DRAIN)
        self.closing.add(sid)
        self._pump()

    @rule()
    def release_and_reopen(self) -> None:
        for sid in sorted(self.closing):
            if self.core.is_quiescent(sid):
                self.core.begin_release(sid)
                report = self.core.finish_release(sid, [], {})
                assert report.slot_leaks == 0
                self.closing.discard(sid)
                self._open(sid)
        self._pump()

    @invariant()
    def ready_structures_hold(self) -> None:
        assert self.core.invariant_violations() == []


ReadyStructureMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestReadyStructures = ReadyStructureMachine.TestCase
