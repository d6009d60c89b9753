"""Scheduler-observed session metrics with bounded memory.

`StreamingSessionMetrics` is fed by the scheduling core with monotonic timestamps and turns them into the
signals DESIGN 3.3 names: first-output latency, control-to-output latency (anchored on the latency anchor
artifact), chunk period, per-invocation stage timings, idle intervals with their reason, diagnostics and the
real-time factor. Samples live in fixed-size windows (`SampleWindow`), so memory per session does not grow with
the session's length; lifetime counts and maxima are kept as plain numbers. `percentile` is the project's one
helper (`admission.summary`, stdlib only), re-exported here.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from admission.summary import percentile

__all__ = [
    "IdleInterval",
    "IdleReason",
    "SampleWindow",
    "SessionDiagnostics",
    "SessionMetricsSnapshot",
    "StageTiming",
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


class SampleWindow:
    """The last `size` samples of one signal plus lifetime count and max. O(1) memory in the signal's length."""

    __slots__ = ("_max", "_samples", "count")

    def __init__(self, size: int = DEFAULT_WINDOW) -> None:
        if size < 1:
            raise ValueError(f"window size {size} < 1")
        self._samples: deque[float] = deque(maxlen=size)
        self._max: float | None = None
        self.count = 0

    def add(self, value: float) -> None:
        self._samples.append(value)
        self.count += 1
        if self._max is None or value > self._max:
            self._max = value

    def summary(self) -> Summary:
        if not self._samples:
            return Summary(self.count, None, None, None, self._max)
        samples = list(self._samples)
        return Summary(
            count=self.count,
            mean=sum(samples) / len(samples),
            p50=percentile(samples, 50),
            p95=percentile(samples, 95),
            max=self._max,
        )


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

    def __init__(self, session_id: str, *, window: int = DEFAULT_WINDOW) -> None:
        self.session_id = session_id
        self._window = window
        self.first_ingress_at: float | None = None
        self.first_output_at: float | None = None
        self._last_output_at: float | None = None
        self._anchors: dict[int, float] = {}
        self._control_to_output = SampleWindow(window)
        self._chunk_period = SampleWindow(window)
        self._stage_durations: dict[str, SampleWindow] = {}
        self._stage_queued: dict[str, SampleWindow] = {}
        self.stage_timings: deque[StageTiming] = deque(maxlen=window)
        # (stage_id, start, end, reason index, detail): an `IdleInterval` is built only when read (`idle_intervals`),
        # since a busy stage records one for most dispatches and hardly anybody reads them; a tuple of plain values
        # is also one the garbage collector stops scanning after its first pass.
        self._idle: deque[tuple[str, float, float, int, str | None]] = deque(maxlen=window)
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

    def on_stage(self, timing: StageTiming) -> None:
        self.stage_timings.append(timing)
        self._stage_durations.setdefault(timing.stage_id, SampleWindow(self._window)).add(timing.duration)
        self._stage_queued.setdefault(timing.stage_id, SampleWindow(self._window)).add(timing.queued)

    def on_idle(self, stage_id: str, start: float, end: float, reason: IdleReason, detail: str | None) -> None:
        """The stage did not run for the session from `start` to `end`, because of `reason` (see `IdleInterval`)."""
        if end <= start:
            return
        self._idle.append((stage_id, start, end, _REASON_INDEX[reason], detail))
        self._idle_totals[reason] = self._idle_totals.get(reason, 0.0) + (end - start)

    def forget_anchors(self) -> None:
        """Drop anchors whose outputs will never come (the session's queued work was discarded)."""
        self._anchors.clear()

    # -- reading ---------------------------------------------------------------------------------------------

    @property
    def idle_intervals(self) -> tuple[IdleInterval, ...]:
        """The last `window` idle intervals, oldest first."""
        return tuple(
            IdleInterval(stage, start, end, _REASONS[reason], detail)
            for stage, start, end, reason, detail in self._idle
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
            stage_durations={k: w.summary() for k, w in self._stage_durations.items()},
            stage_queued={k: w.summary() for k, w in self._stage_queued.items()},
            idle_by_reason={reason.value: total for reason, total in self._idle_totals.items()},
            outputs=self.outputs,
            diagnostics=self.diagnostics(),
        )
