"""Scheduling guarantees tested on their own, not only together with another that implies them.

Each test here isolates one promise of DESIGN 3.3 so that breaking exactly that promise fails a test:
strict per-session ordering when the actor could run more, edge capacity counting the reservations of in-flight
work (checked after every step of a random interleaving), and a stage's global `max_in_flight` below its actor's
capacity, with the blocker named in the metrics.
"""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from pipeline import (
    CloseMode,
    IdleReason,
    SchedulerCore,
    StageOrdering,
    StreamingEdgeSpec,
    StreamingPipelineOrchestrator,
    StreamingPipelineSpec,
    StreamingStageSpec,
    validate_pipeline,
)
from pipeline.core import Dispatch
from tests.support.fakes.actors import FakeActor, StaticActorView, passthrough
from tests.support.fakes.clock import FakeClock
from tests.support.graphs import linear_spec


def _core(spec: StreamingPipelineSpec, capacity: int) -> tuple[SchedulerCore, FakeClock, StaticActorView]:
    clock = FakeClock(100.0)
    view = StaticActorView(capacity)
    return SchedulerCore(validate_pipeline(spec), view, clock), clock, view


# -- strict ordering does not depend on the actor's capacity ---------------------------------------------------------


def test_a_strict_stage_on_a_four_slot_actor_runs_one_sequence_of_a_session_at_a_time_in_order() -> None:
    core, _, _ = _core(linear_spec("only", capacity=8, output_capacity=8), capacity=4)
    core.open_session("a")
    core.open_session("b")
    for i in range(4):
        assert core.try_submit("a", {"input": (i, i)})
    assert core.try_submit("b", {"input": (0, 0)})
    first = core.pump()
    # The actor has four slots and session a four joined sequences: a still gets one call, b gets its own.
    assert sorted((d.call.session_id, d.call.sequence_id) for d in first) == [("a", 0), ("b", 0)]
    a_calls = [d for d in first if d.call.session_id == "a"]
    order = []
    while a_calls:
        (current,) = a_calls
        order.append(current.call.sequence_id)
        assert core.pump() == []  # nothing more of a while its call is in flight, though slots are free
        core.complete(current.invocation_id, {"out": current.call.sequence_id}, 0)
        a_calls = [d for d in core.pump() if d.call.session_id == "a"]
        assert len(a_calls) <= 1
    assert order == [0, 1, 2, 3]


async def test_the_orchestrator_never_overlaps_a_sessions_calls_on_a_strict_stage_with_a_four_slot_actor() -> None:
    actor = FakeActor("only", passthrough(("out",)), capacity=4, gated=True)
    spec = linear_spec("only", capacity=8, output_capacity=8)
    # A short cancel timeout: if the check fails, closing does not wait 30 s for the gated calls left behind.
    async with StreamingPipelineOrchestrator(spec, {"only": actor}, cancel_timeout=0.5) as orch:
        stream = orch.open_session("s")
        for i in range(4):
            await orch.submit("s", {"input": (i, i)})
        for expected in range(4):
            await asyncio.wait_for(actor.call_started.wait(), timeout=5)
            actor.call_started.clear()
            # Exactly one call of the session is running; the other joined sequences wait although 3 slots are free.
            assert list(actor.pending) == [("s", expected)]
            actor.finish("s", expected)
            assert (await asyncio.wait_for(anext(stream), timeout=5)).sequence_id == expected
        assert [c.sequence_id for c in actor.calls] == [0, 1, 2, 3]


# -- edge capacity counts in-flight reservations, after every step ---------------------------------------------------

EDGE_CAPACITY = 2
PER_SESSION = 3


def _fan_spec() -> StreamingPipelineSpec:
    """input -> work (unordered, several in flight per session) -> mid (a small edge) -> sink (strict) -> out."""
    return StreamingPipelineSpec(
        stages=(
            StreamingStageSpec(
                "work",
                consumes=("input",),
                produces=("mid",),
                ordering=StageOrdering.NONE,
                max_in_flight_per_session=PER_SESSION,
            ),
            StreamingStageSpec("sink", consumes=("mid",), produces=("out",)),
        ),
        edges=(
            StreamingEdgeSpec("input", target="work", capacity=8),
            StreamingEdgeSpec("mid", target="sink", source="work", capacity=EDGE_CAPACITY),
        ),
        outputs=("out",),
        output_capacity=8,
    )


class EdgeReservationMachine(RuleBasedStateMachine):
    """Random interleavings of submits, completions (in any order), consumer stalls and reads.

    The model, from the public API only: items buffered on the `mid` edge are `work` results delivered and not yet
    taken by a `sink` dispatch; items reserved are `work` calls in flight. Their sum never exceeds the edge's
    capacity, whatever the order of events.
    """

    def __init__(self) -> None:
        super().__init__()
        self.core: SchedulerCore | None = None
        self.view = StaticActorView(capacity=8)
        self.work: dict[str, list[Dispatch]] = {}
        self.sink: list[Dispatch] = []
        self.buffered: dict[str, int] = {}
        self.submitted: dict[str, int] = {}

    @initialize(sessions=st.integers(1, 2))
    def setup(self, sessions: int) -> None:
        self.core, _, self.view = _core(_fan_spec(), capacity=8)
        for i in range(sessions):
            sid = f"s{i}"
            self.core.open_session(sid)
            self.work[sid] = []
            self.buffered[sid] = 0
            self.submitted[sid] = 0
        self.view.down.add("sink")  # the consumer starts stalled

    @property
    def c(self) -> SchedulerCore:
        assert self.core is not None
        return self.core

    def _pump(self) -> None:
        for d in self.c.pump():
            sid = d.call.session_id
            if d.call.stage_id == "work":
                self.work[sid].append(d)
            else:
                self.buffered[sid] -= 1  # the sink's dispatch takes the item off the edge
                self.sink.append(d)

    @rule(data=st.data())
    def submit(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.work)))
        if self.c.try_submit(sid, {"input": (self.submitted[sid], None)}):
            self.submitted[sid] += 1
        self._pump()

    @rule(data=st.data())
    def complete_work(self, data: st.DataObject) -> None:
        running = [d for calls in self.work.values() for d in calls]
        if not running:
            return
        d = data.draw(st.sampled_from(running))
        self.work[d.call.session_id].remove(d)
        self.c.complete(d.invocation_id, {"mid": d.call.sequence_id}, 0)
        self.buffered[d.call.session_id] += 1
        self._pump()

    @rule(stalled=st.booleans())
    def stall_consumer(self, stalled: bool) -> None:
        if stalled:
            self.view.down.add("sink")
        else:
            self.view.down.discard("sink")
        self._pump()

    @rule()
    def complete_sink_and_read(self) -> None:
        for d in self.sink:
            self.c.complete(d.invocation_id, {"out": d.call.sequence_id}, 0)
        self.sink.clear()
        for sid in self.work:
            readable = self.c.readable(sid)
            while readable:
                item = readable.popleft()
                self.c.output_read(sid, item.artifact)
        self._pump()

    @invariant()
    def buffered_plus_reserved_never_exceeds_the_edge(self) -> None:
        if self.core is None:
            return
        for sid, calls in self.work.items():
            assert len(calls) <= PER_SESSION
            occupied = self.buffered[sid] + len(calls)
            assert self.buffered[sid] >= 0
            assert occupied <= EDGE_CAPACITY, f"{sid}: {self.buffered[sid]} buffered + {len(calls)} in flight"


EdgeReservationMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEdgeReservations = EdgeReservationMachine.TestCase


def test_unordered_work_fills_a_stalled_edge_exactly_to_its_capacity_counting_calls_in_flight() -> None:
    """The deterministic case of the machine above: three joined inputs, a stalled consumer, an edge of two."""
    core, _, view = _core(_fan_spec(), capacity=8)
    view.down.add("sink")
    core.open_session("s")
    for i in range(3):
        assert core.try_submit("s", {"input": (i, None)})
    in_flight = core.pump()
    assert [d.call.sequence_id for d in in_flight] == [0, 1]  # a third call would have no room on the edge
    core.complete(in_flight[0].invocation_id, {"mid": 0}, 0)
    assert core.pump() == []  # 1 buffered + 1 reserved = the capacity: sequence 2 still waits
    core.complete(in_flight[1].invocation_id, {"mid": 1}, 0)
    assert core.pump() == []
    view.down.discard("sink")
    # Only once the sink takes an item off the edge does the third call get a slot, and only one item's worth.
    resumed = core.pump()
    assert [(d.call.stage_id, d.call.sequence_id) for d in resumed] == [("sink", 0), ("work", 2)]


# -- a global max_in_flight below the actor's capacity ---------------------------------------------------------------


def _limited_spec(limit: int) -> StreamingPipelineSpec:
    return StreamingPipelineSpec(
        stages=(StreamingStageSpec("only", consumes=("input",), produces=("out",), max_in_flight=limit),),
        edges=(StreamingEdgeSpec("input", target="only", capacity=4),),
        outputs=("out",),
        output_capacity=4,
    )


def test_a_global_max_in_flight_below_the_actor_capacity_holds_and_reports_the_stage_limit() -> None:
    core, clock, _ = _core(_limited_spec(limit=2), capacity=4)
    for sid in ("a", "b", "c"):
        core.open_session(sid)
        assert core.try_submit(sid, {"input": (0, None)})
    first = core.pump()
    assert [d.call.session_id for d in first] == ["a", "b"]  # the actor has 4 slots; the stage allows 2
    assert core.statistics().in_flight_by_stage == {"only": 2}
    assert core.statistics().eligible_by_stage == {"only": 1}  # c is ready and waits for the stage, not input
    clock.advance(3.0)
    core.complete(first[0].invocation_id, {"out": None}, 0)
    (late,) = core.pump()
    assert late.call.session_id == "c"
    (blocked,) = [i for i in core.metrics("c").idle_intervals if i.reason is not IdleReason.MISSING_INPUT]
    assert (blocked.stage_id, blocked.reason, blocked.detail, blocked.duration) == (
        "only",
        IdleReason.STAGE_LIMIT,
        None,
        3.0,
    )


async def test_a_cancel_close_abandons_calls_that_outlive_the_cancel_timeout() -> None:
    """`cancel_timeout` bounds a CANCEL close too (not only a drain that fell back to cancel): a call that never
    returns is abandoned and its held room reported as leaked, instead of the close waiting forever."""
    actor = FakeActor("only", passthrough(("out",)), gated=True)
    async with StreamingPipelineOrchestrator(linear_spec("only"), {"only": actor}, cancel_timeout=0.2) as orch:
        orch.open_session("s")
        await orch.submit("s", {"input": (0, 0)})
        await asyncio.wait_for(actor.call_started.wait(), timeout=5)
        report = await asyncio.wait_for(orch.close_session("s", CloseMode.CANCEL), timeout=5)
        assert report.slot_leaks == 2  # the session's in-flight count and its reserved output slot
        assert orch.statistics().core.in_flight_by_stage == {"only": 1}  # the actor still holds the call
