"""The series read from one `StatisticsSnapshot` per collection: the model workers (their statistics, their
orchestrators' diagnostics, their execution leases: `observe_workers`) and the running sessions and the transport
(the real-time factor, frames, reconnects, controls, viewers: `observe_sessions`). `ServiceMetrics` takes the
snapshots on the event loop and hands these a reader; the records are defined here. docs/metrics.md lists the series.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry.metrics import Meter, Observation

from admission import LeaseStatistics
from pipeline.actor import ActorStatistics
from pipeline.orchestrator import OrchestratorStatistics
from service.runtime.records import RuntimeStatistics
from service.telemetry._observing import Observe, callback

__all__ = ["StatisticsSnapshot", "TransportFigures", "WorkerFigures", "observe_sessions", "observe_workers"]


@dataclass(frozen=True, slots=True)
class WorkerFigures:
    """One model worker as of a snapshot: what its statistics, orchestrator and lease said (None: not exposed)."""

    index: int
    stale_controls: int | None
    orchestrator: OrchestratorStatistics | None
    lease: LeaseStatistics | None


@dataclass(frozen=True, slots=True)
class TransportFigures:
    """The transport summed over every session it ever carried (finished bindings' last figures included).
    `kind`: the transport's; `viewers`: watching now; the viewer counters are None where the kind has none."""

    sessions: int | None
    frames_sent: int
    frames_dropped: Mapping[str, int]
    reconnects: Mapping[str, int]
    kind: str = "unknown"
    viewers: int = 0
    viewer_frames_dropped: int | None = None
    viewer_controls_refused: int | None = None
    idle_frames_sent: int = 0
    controls: Mapping[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StatisticsSnapshot:
    """Everything the observable instruments read, taken at once on the event loop (`taken_at`: monotonic)."""

    taken_at: float
    runtime: RuntimeStatistics | None
    workers: tuple[WorkerFigures, ...] = ()
    transport: TransportFigures | None = None
    realtime_factors: tuple[float, ...] = ()


def observe_workers(meter: Meter, read: Callable[[], StatisticsSnapshot]) -> None:
    """Register the model workers' series (stale controls, the execution lease, the orchestrators' diagnostics) on
    `meter`, reading `read()` per collection."""

    def gauge(name: str, unit: str, description: str, observe: Observe[StatisticsSnapshot]) -> None:
        meter.create_observable_gauge(name, [callback(read, observe)], unit=unit, description=description)

    def counter(name: str, unit: str, description: str, observe: Observe[StatisticsSnapshot]) -> None:
        meter.create_observable_counter(name, [callback(read, observe)], unit=unit, description=description)

    counter(
        "lingstream.controls.stale",
        "{message}",
        "Control snapshots the model workers dropped as stale or duplicate, by model worker.",
        lambda s: (
            Observation(w.stale_controls, {"worker": str(w.index)}) for w in s.workers if w.stale_controls is not None
        ),
    )
    counter(
        "lingstream.lease.grants",
        "{grant}",
        "Execution lease grants (one per chunk), by model worker.",
        lambda s: (Observation(w.lease.total_grants, {"worker": str(w.index)}) for w in s.workers if w.lease),
    )
    gauge(
        "lingstream.lease.waiters",
        "{session}",
        "Sessions waiting for the execution lease, by model worker.",
        lambda s: (Observation(len(w.lease.waiters), {"worker": str(w.index)}) for w in s.workers if w.lease),
    )
    counter(
        "lingstream.pipeline.results.discarded",
        "{result}",
        "Stage results the orchestrator discarded, by model worker and kind (stale, orphaned, duplicate, rejected).",
        _discarded_results,
    )
    counter(
        "lingstream.pipeline.cleanup.failures",
        "{failure}",
        "Stage state releases that failed at session close (the session id stays poisoned), by model worker.",
        lambda s: (
            Observation(w.orchestrator.core.cleanup_failures, {"worker": str(w.index)})
            for w in s.workers
            if w.orchestrator
        ),
    )
    counter(
        "lingstream.pipeline.slot.leaks",
        "{slot}",
        "Capacity slots found still held after a session closed, by model worker.",
        lambda s: (
            Observation(w.orchestrator.core.slot_leaks, {"worker": str(w.index)}) for w in s.workers if w.orchestrator
        ),
    )
    gauge(
        "lingstream.pipeline.sessions.poisoned",
        "{session}",
        "Sessions whose stage state could not be released, by model worker.",
        lambda s: (
            Observation(len(w.orchestrator.core.poisoned_sessions), {"worker": str(w.index)})
            for w in s.workers
            if w.orchestrator
        ),
    )
    gauge(
        "lingstream.pipeline.stage.in_flight",
        "{invocation}",
        "Stage invocations running now, by model worker and stage.",
        lambda s: (
            Observation(count, {"worker": str(w.index), "stage": stage})
            for w in s.workers
            if w.orchestrator
            for stage, count in w.orchestrator.core.in_flight_by_stage.items()
        ),
    )
    counter(
        "lingstream.pipeline.actor.restarts",
        "{restart}",
        "Stage actor restarts after their runtime died, by model worker and stage.",
        lambda s: _actor_figures(s, lambda actor: actor.restarts),
    )
    counter(
        "lingstream.pipeline.actor.failures",
        "{invocation}",
        "Stage invocations that raised, by model worker and stage.",
        lambda s: _actor_figures(s, lambda actor: actor.failures),
    )


def observe_sessions(meter: Meter, read: Callable[[], StatisticsSnapshot]) -> None:
    """Register the running sessions' real-time factor and the transport's series (frames, reconnects, viewers) on
    `meter`, reading `read()` per collection."""
    meter.create_observable_gauge(
        "lingstream.realtime_factor",
        [callback(read, _realtime_factor)],
        unit="1",
        description="p95 chunk period / media seconds per chunk over running sessions (max and mean); "
        "below 1 generation outruns playback.",
    )

    def transport() -> TransportFigures | None:
        return read().transport

    meter.create_observable_gauge(
        "lingstream.transport.sessions",
        [callback(transport, lambda t: [] if t.sessions is None else [Observation(t.sessions)])],
        unit="{session}",
        description="Sessions bound to the transport.",
    )
    meter.create_observable_counter(
        "lingstream.transport.frames.sent",
        [callback(transport, lambda t: [Observation(t.frames_sent)])],
        unit="{frame}",
        description="Video frames the transport's pacers released to the video track.",
    )
    meter.create_observable_counter(
        "lingstream.transport.idle_frames.sent",
        [callback(transport, lambda t: [Observation(t.idle_frames_sent)])],
        unit="{frame}",
        description="Keep-warm repeats: the last frame sent again while a stream had nothing new (not generated "
        "frames, not in frames.sent).",
    )
    meter.create_observable_counter(
        "lingstream.transport.frames.dropped",
        [callback(transport, lambda t: (Observation(n, {"reason": r}) for r, n in t.frames_dropped.items()))],
        unit="{frame}",
        description="Video frames the transport dropped, by reason (late, overflow, rejected, unsent, track).",
    )
    meter.create_observable_counter(
        "lingstream.transport.reconnects",
        [callback(transport, lambda t: (Observation(n, {"kind": k}) for k, n in t.reconnects.items()))],
        unit="{reconnect}",
        description="Transport reconnects by kind (sdk_resume, rejoin, controller_return, peer_return).",
    )
    meter.create_observable_counter(
        "lingstream.transport.controls",
        [callback(transport, lambda t: (Observation(n, {"via": v, "type": k}) for (v, k), n in t.controls.items()))],
        unit="{message}",
        description="Controllers' messages handed to their sessions, by how they came (packet: a data packet or "
        "data channel message; rpc: a LiveKit RPC call) and wire type (control_state, prompt, stop, ...).",
    )
    meter.create_observable_gauge(
        "lingstream.viewers",
        [callback(transport, lambda t: _viewer_series(t, lambda f: f.viewers))],
        unit="{viewer}",
        description="Viewers watching sessions now (connected, never controlling), by transport.",
    )
    meter.create_observable_counter(
        "lingstream.viewers.frames.dropped",
        [callback(transport, lambda t: _viewer_series(t, lambda f: f.viewer_frames_dropped))],
        unit="{frame}",
        description="Frames dropped to slow viewers (their own track was behind; nobody else waited), by "
        "transport (embedded: LiveKit's SFU forwards to viewers itself).",
    )
    meter.create_observable_counter(
        "lingstream.viewers.controls.refused",
        [callback(transport, lambda t: _viewer_series(t, lambda f: f.viewer_controls_refused))],
        unit="{message}",
        description="Messages viewers sent, never applied (answered viewer_cannot_control), by transport "
        "(embedded: a LiveKit viewer's token cannot publish data).",
    )


def _discarded_results(snapshot: StatisticsSnapshot) -> Iterable[Observation]:
    for w in snapshot.workers:
        if w.orchestrator is None:
            continue
        core = w.orchestrator.core
        kinds = {
            "stale": core.stale_results,
            "orphaned": core.orphaned_results,
            "duplicate": core.duplicate_results,
            "rejected": core.rejected_results,
        }
        for kind, count in kinds.items():
            yield Observation(count, {"worker": str(w.index), "kind": kind})


def _actor_figures(snapshot: StatisticsSnapshot, pick: Callable[[ActorStatistics], int]) -> Iterable[Observation]:
    for w in snapshot.workers:
        if w.orchestrator is None:
            continue
        for stage, actor in w.orchestrator.actors.items():
            yield Observation(pick(actor), {"worker": str(w.index), "stage": stage})


def _realtime_factor(snapshot: StatisticsSnapshot) -> list[Observation]:
    factors = snapshot.realtime_factors
    if not factors:
        return []
    return [
        Observation(max(factors), {"statistic": "max"}),
        Observation(sum(factors) / len(factors), {"statistic": "mean"}),
    ]


def _viewer_series(transport: TransportFigures, pick: Callable[[TransportFigures], int | None]) -> list[Observation]:
    value = pick(transport)
    return [] if value is None else [Observation(value, {"transport": transport.kind})]
