"""Scheduler-observed session metrics with bounded memory.

`StreamingSessionMetrics` is fed by the scheduling core with monotonic timestamps and turns them into the
signals DESIGN 3.3 names: first-output latency, control-to-output latency (anchored on the latency anchor
artifact), chunk period, per-invocation stage timings, idle intervals with their reason, diagnostics and the
real-time factor. Samples live in fixed-size windows (`SampleWindow`), so memory per session does not grow with
the session's length; lifetime counts and maxima are kept as plain numbers. `percentile` is the project's one
helper (`admission.summary`, stdlib only), re-exported here.

Every window is a ring of plain doubles (`array('d')`), filled once and then overwritten in place: recording a sample
allocates no object, so a session's windows add nothing for the garbage collector to track or scan however many
sessions are open, and the memory a record touches is a few contiguous bytes. Records (`StageTiming`,
`IdleInterval`) are built only when read.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import overload

from admission.summary import percentile

__all__ = [
    "IdleInterval",
    "IdleReason",
    "SampleWindow",
    "SessionDiagnostics",
    "SessionMetricsSnapshot",
    "StageTiming",
    "StageTimings",
    "StreamingSessionMetrics",
    "Summary",
    "percentile",
]

DEFAULT_WINDOW = 256
# Anchors waiting for their output. Bounded by edge capacities in a healthy pipeline; the cap guards a caller that
# submits anchors whose outputs never come (they are dropped oldest-first and counted).
_MAX_PENDING_ANCHORS = 4096


class IdleReason(enum.Enum):
    MISSING_INPUT = "missing_input"  # an input of the next sequence had not arrived (detail: which artifact)
    EDGE_FULL = "edge_full"  # a downstream edge had no room (detail: artifact)
    OUTPUT_FULL = "output_full"  # the session's output buffer had no room: nobody read it (detail: artifact)
    STAGE_LIMIT = "stage_limit"  # the stage's global in-flight limit was taken by other sessions
    RESOURCE_GROUP = "resource_group"  # the stage's resource group had no permit (detail: group name)
    ACTOR_BUSY = "actor_busy"  # the actor was unavailable (restarting) or at its capacity

    # Identity hash (members are singletons): Enum's own hashes the name in Python, on every recorded interval.
    __hash__ = object.__hash__


_REASONS = tuple(IdleReason)
_REASON_INDEX = {reason: index for index, reason in enumerate(_REASONS)}


@dataclass(frozen=True, slots=True)
class StageTiming:
    """One stage invocation: when its inputs were joined, when the scheduler admitted it, when it ran."""

    stage_id: str
    sequence_id: int
    inputs_ready: float
    admitted: float
    started: float
    completed: float

    @property
    def queued(self) -> float:
        return self.admitted - self.inputs_ready

    @property
    def duration(self) -> float:
        return self.completed - self.started


@dataclass(frozen=True, slots=True)
class IdleInterval:
    """A gap in which a stage did not run for a session although the session was open, and why."""

    stage_id: str
    start: float
    end: float
    reason: IdleReason
    detail: str | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class Summary:
    """Statistics of a window of samples (`count` and `max` cover the whole lifetime)."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    max: float | None


class _Ring:
    """The last `size` rows of `width` doubles each, oldest first, in one `array('d')` that grows as rows come.

    Grows by appending until it holds `size` rows, then overwrites the oldest row in place: adding a row allocates no
    Python object (the collector never sees it) and reading row i copies `width` doubles out.
    """

    __slots__ = ("_data", "_head", "_size", "_width")

    def __init__(self, size: int, width: int) -> None:
        if size < 1:
            raise ValueError(f"window size {size} < 1")
        self._data = array("d")
        self._size = size
        self._width = width
        self._head = 0  # once full: the row that is oldest (and overwritten next)

    def add(self, *values: float) -> None:
        data = self._data
        if len(data) < self._size * self._width:
            data.extend(values)
            return
        at = self._head * self._width
        data[at : at + self._width] = array("d", values)
        self._head = (self._head + 1) % self._size

    def __len__(self) -> int:
        return len(self._data) // self._width

    def row(self, index: int) -> tuple[float, ...]:
        """Row `index` counted from the oldest (negative: from the newest)."""
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("window index out of range")
        at = ((self._head + index) % n) * self._width
        return tuple(self._data[at : at + self._width])


class SampleWindow:
    """The last `size` samples of one signal plus lifetime count and max. O(1) memory in the signal's length."""

    __slots__ = ("_head", "_max", "_samples", "_size", "count")

    def __init__(self, size: int = DEFAULT_WINDOW) -> None:
        if size < 1:
            raise ValueError(f"window size {size} < 1")
        self._samples = array("d")  # a ring once full: `_head` is the slot overwritten next
        self._size = size
        self._head = 0
        self._max: float | None = None
        self.count = 0

    def add(self, value: float) -> None:
        samples = self._samples
        if len(samples) < self._size:
            samples.append(value)
        else:
            samples[self._head] = value
            self._head = (self._head + 1) % self._size
        self.count += 1
        if self._max is None or value > self._max:
            self._max = value

    def summary(self) -> Summary:
        if not self._samples:
            return Summary(self.count, None, None, None, self._max)
        samples = self._samples.tolist()  # in no particular order: the mean and percentiles do not need one
        return Summary(
            count=self.count,
            mean=sum(samples) / len(samples),
            p50=percentile(samples, 50),
            p95=percentile(samples, 95),
            max=self._max,
        )


class StageTimings(Sequence[StageTiming]):
    """A session's last `window` stage invocations, oldest first; each `StageTiming` is built when read.

    Indexing from the end (`timings[-1]`, the newest) costs O(1), which is what a per-result listener reads.
    """

    __slots__ = ("_names", "_ring")

    def __init__(self, window: int, names: _Names) -> None:
        self._ring = _Ring(window, 6)
        self._names = names

    def add(
        self, stage_id: str, sequence_id: int, inputs_ready: float, admitted: float, started: float, completed: float
    ) -> None:
        self._ring.add(self._names[stage_id], sequence_id, inputs_ready, admitted, started, completed)

    def __len__(self) -> int:
        return len(self._ring)

    @overload
    def __getitem__(self, index: int) -> StageTiming: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[StageTiming]: ...

    def __getitem__(self, index: int | slice) -> StageTiming | Sequence[StageTiming]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        stage, sequence_id, inputs_ready, admitted, started, completed = self._ring.row(index)
        return StageTiming(self._names.name(stage), int(sequence_id), inputs_ready, admitted, started, completed)

    def __iter__(self) -> Iterator[StageTiming]:
        return (self[i] for i in range(len(self)))


class _Names(dict[str, int]):
    """Strings (stage ids, idle details) as small numbers, so a ring of doubles can hold them; -1 stands for None.

    `names[name]` is the name's number (a new name gets the next one): a plain dict lookup once the name is known.
    """

    __slots__ = ("_names",)

    def __init__(self) -> None:
        super().__init__()
        self._names: list[str] = []

    def __missing__(self, name: str) -> int:
        index = self[name] = len(self._names)
        self._names.append(name)
        return index

    def name(self, index: float) -> str:
        return self._names[int(index)]

    def optional(self, index: float) -> str | None:
        return None if index < 0 else self._names[int(index)]


@dataclass(frozen=True, slots=True)
class SessionDiagnostics:
    stale_results: int
    orphaned_results: int
    duplicate_results: int
    cleanup_failures: int
    slot_leaks: int
    dropped_anchors: int
    discarded_items: int


@dataclass(frozen=True, slots=True)
class SessionMetricsSnapshot:
    session_id: str
    first_output_latency: float | None
    control_to_output: Summary
    chunk_period: Summary
    stage_durations: Mapping[str, Summary]
    stage_queued: Mapping[str, Summary]
    idle_by_reason: Mapping[str, float]
    outputs: int
    diagnostics: SessionDiagnostics


class StreamingSessionMetrics:
    """Timings of one session as the scheduler saw them (monotonic clock, seconds).

    - first-output latency: first accepted ingress → first output emitted;
    - control-to-output latency: acceptance of the latency anchor artifact of sequence n → output n emitted;
    - chunk period: time between consecutive emitted outputs (of the first output artifact);
    - stage timings and idle intervals: the last `window` of each, per stage;
    - real-time factor: p95 chunk period / media duration of one chunk.
    """

    def __init__(self, session_id: str, *, window: int = DEFAULT_WINDOW, stage_ids: tuple[str, ...] = ()) -> None:
        """`stage_ids`: the stages known up front, whose windows are made now rather than at their first record."""
        self.session_id = session_id
        self._window = window
        self.first_ingress_at: float | None = None
        self.first_output_at: float | None = None
        self._last_output_at: float | None = None
        self._anchors: dict[int, float] = {}
        self._control_to_output = SampleWindow(window)
        self._chunk_period = SampleWindow(window)
        self._stage_durations = {stage_id: SampleWindow(window) for stage_id in stage_ids}
        self._stage_queued = {stage_id: SampleWindow(window) for stage_id in stage_ids}
        self._names = _Names()
        self.stage_timings = StageTimings(window, self._names)
        # (stage, start, end, reason, detail) as numbers: an `IdleInterval` is built only when read
        # (`idle_intervals`), since a busy stage records one for most dispatches and hardly anybody reads them.
        self._idle = _Ring(window, 5)
        self._idle_totals: dict[IdleReason, float] = {}
        self.outputs = 0
        self.stale_results = 0
        self.orphaned_results = 0
        self.duplicate_results = 0
        self.cleanup_failures = 0
        self.slot_leaks = 0
        self.dropped_anchors = 0
        self.discarded_items = 0

    # -- feeding (called by the scheduling core) ------------------------------------------------------------

    def on_ingress(self, now: float) -> None:
        if self.first_ingress_at is None:
            self.first_ingress_at = now

    def on_anchor(self, sequence_id: int, now: float) -> None:
        if len(self._anchors) >= _MAX_PENDING_ANCHORS:
            del self._anchors[next(iter(self._anchors))]
            self.dropped_anchors += 1
        self._anchors[sequence_id] = now

    def on_output(self, sequence_id: int, now: float) -> None:
        self.outputs += 1
        if self.first_output_at is None:
            self.first_output_at = now
        if self._last_output_at is not None:
            self._chunk_period.add(now - self._last_output_at)
        self._last_output_at = now
        anchored = self._anchors.pop(sequence_id, None)
        if anchored is not None:
            self._control_to_output.add(now - anchored)

    def on_stage(
        self, stage_id: str, sequence_id: int, inputs_ready: float, admitted: float, started: float, completed: float
    ) -> None:
        """One invocation of `stage_id` (the fields of `StageTiming`; the record is built only when read)."""
        self.stage_timings.add(stage_id, sequence_id, inputs_ready, admitted, started, completed)
        durations = self._stage_durations.get(stage_id)
        if durations is None:
            durations = self._stage_durations[stage_id] = SampleWindow(self._window)
            self._stage_queued[stage_id] = SampleWindow(self._window)
        durations.add(completed - started)
        self._stage_queued[stage_id].add(admitted - inputs_ready)

    def on_idle(self, stage_id: str, start: float, end: float, reason: IdleReason, detail: str | None) -> None:
        """The stage did not run for the session from `start` to `end`, because of `reason` (see `IdleInterval`)."""
        if end <= start:
            return
        names = self._names
        self._idle.add(names[stage_id], start, end, _REASON_INDEX[reason], -1 if detail is None else names[detail])
        self._idle_totals[reason] = self._idle_totals.get(reason, 0.0) + (end - start)

    def forget_anchors(self) -> None:
        """Drop anchors whose outputs will never come (the session's queued work was discarded)."""
        self._anchors.clear()

    # -- reading ---------------------------------------------------------------------------------------------

    @property
    def idle_intervals(self) -> tuple[IdleInterval, ...]:
        """The last `window` idle intervals, oldest first."""
        names = self._names
        rows = (self._idle.row(i) for i in range(len(self._idle)))
        return tuple(
            IdleInterval(names.name(stage), start, end, _REASONS[int(reason)], names.optional(detail))
            for stage, start, end, reason, detail in rows
        )

    @property
    def first_output_latency(self) -> float | None:
        if self.first_ingress_at is None or self.first_output_at is None:
            return None
        return self.first_output_at - self.first_ingress_at

    @property
    def control_to_output(self) -> Summary:
        return self._control_to_output.summary()

    @property
    def chunk_period(self) -> Summary:
        return self._chunk_period.summary()

    def real_time_factor(self, media_seconds_per_chunk: float) -> float | None:
        """p95 chunk period ÷ media duration of one chunk; below 1 generation outruns playback."""
        if media_seconds_per_chunk <= 0:
            raise ValueError(f"media_seconds_per_chunk must be > 0, got {media_seconds_per_chunk}")
        p95 = self._chunk_period.summary().p95
        return None if p95 is None else p95 / media_seconds_per_chunk

    def diagnostics(self) -> SessionDiagnostics:
        return SessionDiagnostics(
            stale_results=self.stale_results,
            orphaned_results=self.orphaned_results,
            duplicate_results=self.duplicate_results,
            cleanup_failures=self.cleanup_failures,
            slot_leaks=self.slot_leaks,
            dropped_anchors=self.dropped_anchors,
            discarded_items=self.discarded_items,
        )

    def snapshot(self) -> SessionMetricsSnapshot:
        return SessionMetricsSnapshot(
            session_id=self.session_id,
            first_output_latency=self.first_output_latency,
            control_to_output=self.control_to_output,
            chunk_period=self.chunk_period,
            stage_durations={k: w.summary() for k, w in self._stage_durations.items() if w.count},
            stage_queued={k: w.summary() for k, w in self._stage_queued.items() if w.count},
            idle_by_reason={reason.value: total for reason, total in self._idle_totals.items()},
            outputs=self.outputs,
            diagnostics=self.diagnostics(),
        )
