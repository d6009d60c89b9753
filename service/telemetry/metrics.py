"""The service's metric instruments: the packages' statistics and events turned into OpenTelemetry metrics.

The libraries only expose frozen `statistics()` records and events; this module owns every instrument made from
them, on a `Meter` that `service.telemetry.otel` provides (and exports at `/metrics` and over OTLP):

- observable gauges and counters read one `StatisticsSnapshot` per collection: the runtime (sessions, admission,
  usage, limits, recordings: `service.telemetry.runtime_series`), the model workers (their orchestrators'
  diagnostics, their execution leases) and the transport's bindings (frames, reconnects, viewers), the last two
  in `service.telemetry.snapshot_series`;
- histograms and counters are fed by events: each chunk a session emits (its `timings`), each stage invocation
  an orchestrator completes, each admission and each session end.

Reading happens on the event loop, because none of those objects is thread-safe: a collection on another thread
(the OTLP exporter's) asks the loop for a snapshot and waits briefly for it (see `ServiceMetrics.current`).
Labels are bounded (states, results, reasons, stage names, worker indices, API key ids: a short hash of a
configured key, never the key); never a session id, key or token.
The process's own memory series are `service.telemetry.process_series`. docs/metrics.md lists every series with
its Prometheus name.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from opentelemetry.metrics import Histogram, Meter
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from admission import percentile
from pipeline.bidirectional import BidirectionalService, ChunkOutput, RecoveringService, RecoveryNotice
from pipeline.metrics import StageTiming
from service.runtime.records import RuntimeStatistics
from service.telemetry.heap import GlibcHeap
from service.telemetry.process_series import observe_process
from service.telemetry.runtime_series import observe_runtime, render_metrics
from service.telemetry.snapshot_series import (
    StatisticsSnapshot,
    TransportFigures,
    WorkerFigures,
    observe_sessions,
    observe_workers,
)
from transport.base import Transport

__all__ = [
    "CONTENT_TYPE",
    "ServiceMetrics",
    "StatisticsSnapshot",
    "TransportFigures",
    "WorkerFigures",
    "observe_process",
    "observe_runtime",
    "render_metrics",
]

logger = logging.getLogger(__name__)

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4
"""The Prometheus text format (0.0.4) that `/metrics` answers in."""

# Bucket boundaries (seconds). The SDK's defaults are milliseconds-shaped (0, 5, 10, ... 10000) and useless here.
HTTP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
CHUNK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
STAGE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
LEASE_BUCKETS = (0.0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
QUEUE_BUCKETS = (0.0, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
SESSION_BUCKETS = (1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 7200.0)
RECOVERY_BUCKETS = (0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0)

_FRESH_S = 1.0  # a snapshot younger than this is reused by the callbacks of one collection
_LOOP_WAIT_S = 2.0  # how long a collection on another thread waits for the loop to take a snapshot
_RTF_WINDOW = 64  # chunk periods kept per running session for the real-time factor


_EMPTY = StatisticsSnapshot(taken_at=-math.inf, runtime=None)


# --------------------------------------------------------------------------------------------- service metrics


@dataclass(slots=True)
class _SessionFigures:
    """Per running session, bounded: when it started, whether its first chunk came, recent period/media ratios,
    and its transport binding's last counters (folded into the totals when it ends)."""

    started_at: float
    first_output: bool = False
    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=_RTF_WINDOW))
    sent: int = 0
    idle_sent: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    reconnects: Counter[str] = field(default_factory=Counter)
    controls: Counter[tuple[str, str]] = field(default_factory=Counter)
    viewers: int = 0
    viewer_dropped: int | None = None
    viewer_refused: int | None = None


class ServiceMetrics:
    """Every service instrument beyond the runtime's own series, and the per-session state they need.

    Sources are read on collection (`refresh()` on the event loop); events come from `service.telemetry.otel`
    (`admitted`, `session_started`, `chunk`, `stage`, `session_ended`), always on the event loop. Memory is
    bounded: per-session state exists only between `session_started` and `session_ended` (sessions are bounded by
    admission) and each holds a fixed-size window.

    Collections on other threads (the OTLP exporter's) call `current()`, which asks the loop for a snapshot and
    waits at most `_LOOP_WAIT_S` for it, falling back to the last one; after `close()` it only uses the last one
    (the loop may be the thread waiting for that collection, at shutdown).
    """

    def __init__(
        self,
        meter: Meter,
        *,
        runtime: Callable[[], RuntimeStatistics | None],
        workers: Sequence[BidirectionalService] = (),
        transport: Transport | None = None,
    ) -> None:
        self._read_runtime = runtime
        self._workers = tuple(workers)
        self._transport = transport
        self._sessions: dict[str, _SessionFigures] = {}
        self._retired_sent = 0
        self._retired_idle_sent = 0
        self._retired_dropped: Counter[str] = Counter()
        self._retired_reconnects: Counter[str] = Counter()
        self._retired_controls: Counter[tuple[str, str]] = Counter()
        self._retired_viewer_dropped: int | None = None
        self._retired_viewer_refused: int | None = None
        self._last = _EMPTY
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._closing = False
        self._define_histograms(meter)
        for worker in self._workers:
            if isinstance(worker, RecoveringService):
                worker.add_recovery_listener(self.recovery)
        observe_runtime(meter, lambda: self.current().runtime)
        observe_process(meter, GlibcHeap.load())
        observe_workers(meter, self.current)
        observe_sessions(meter, self.current)

    # -- reading -------------------------------------------------------------------------------------------

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Sources are read on `loop` from now on (call it on that loop)."""
        self._loop = loop
        self._loop_thread = threading.get_ident()
        self._closing = False

    def close(self) -> None:
        """No more reads from other threads: they get the last snapshot."""
        self._closing = True

    def refresh(self) -> StatisticsSnapshot:
        """Read every source now (on the event loop) and keep the result for this collection."""
        snapshot = StatisticsSnapshot(
            taken_at=time.monotonic(),
            runtime=self._read_runtime(),
            workers=tuple(self._worker_figures(index, worker) for index, worker in enumerate(self._workers)),
            transport=self._transport_figures(),
            realtime_factors=tuple(
                factor
                for figures in self._sessions.values()
                if (factor := percentile(figures.ratios, 95, method="nearest_rank")) is not None
            ),
        )
        self._last = snapshot
        return snapshot

    def current(self) -> StatisticsSnapshot:
        """A snapshot at most `_FRESH_S` old, taken on the event loop whatever thread asks."""
        last = self._last
        if time.monotonic() - last.taken_at < _FRESH_S:
            return last
        loop = self._loop
        if loop is None or threading.get_ident() == self._loop_thread:
            return self.refresh()
        if self._closing:
            return last
        future: concurrent.futures.Future[StatisticsSnapshot] = concurrent.futures.Future()

        def take() -> None:
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(self.refresh())
                except BaseException as exc:
                    future.set_exception(exc)

        try:
            loop.call_soon_threadsafe(take)
            return future.result(timeout=_LOOP_WAIT_S)
        except RuntimeError:  # the loop is closed
            return last
        except concurrent.futures.TimeoutError:
            future.cancel()
            logger.warning("metrics: the event loop did not answer in %.1f s; exporting older figures", _LOOP_WAIT_S)
            return last

    # -- events (event loop) -----------------------------------------------------------------------------------

    def admitted(self, queue_wait_s: float) -> None:
        self._queue_wait.record(max(0.0, queue_wait_s))

    def session_started(self, session_id: str) -> None:
        self._sessions.setdefault(session_id, _SessionFigures(time.monotonic()))

    def chunk(self, session_id: str, chunk: ChunkOutput) -> None:
        self._chunks.add(1)
        frames = int(chunk.frames.shape[0]) if chunk.frames.ndim > 0 else 0
        self._frames.add(frames)
        timings = chunk.timings
        figures = self._sessions.get(session_id)
        if figures is not None and not figures.first_output:
            figures.first_output = True
            self._first_output.record(max(0.0, time.monotonic() - figures.started_at))
        control_to_output = _seconds(timings.get("control_to_output"))
        if control_to_output is not None:
            self._control_to_output.record(control_to_output)
        control_to_first_frame = _seconds(timings.get("control_to_first_frame"))
        if control_to_first_frame is not None:
            self._control_to_first_frame.record(control_to_first_frame)
        lease_wait = _seconds(timings.get("lease_wait"))
        if lease_wait is not None:
            self._lease_wait.record(lease_wait)
        lead = _seconds(timings.get("playout_lead"))
        if lead is not None:
            self._playout_lead.record(lead)
        underrun = _seconds(timings.get("underrun"))
        if underrun is not None and underrun > 0:
            self._underruns.add(1)
            self._underrun_duration.add(underrun)
        period = _seconds(timings.get("chunk_period"))
        if period is not None:
            self._chunk_period.record(period)
            media_s = frames / chunk.fps if chunk.fps > 0 else 0.0
            if figures is not None and media_s > 0:
                figures.ratios.append(period / media_s)

    def recovery(self, notice: RecoveryNotice) -> None:
        """A model worker's recovery notice: a completed recovery counts, by cause, with its duration."""
        if notice.recovering or notice.recovery_s is None:
            return
        attributes = {"cause": notice.cause}
        self._recovered.add(1, attributes)
        self._recovery.record(max(0.0, notice.recovery_s), attributes)

    def stage(self, timing: StageTiming) -> None:
        attributes = {"stage": timing.stage_id}
        self._stage_duration.record(max(0.0, timing.duration), attributes)
        self._stage_queued.record(max(0.0, timing.queued), attributes)

    def session_ended(self, session_id: str, state: str) -> None:
        figures = self._sessions.pop(session_id, None)
        if figures is None:
            return
        self._session_duration.record(max(0.0, time.monotonic() - figures.started_at), {"state": state})
        self._read_binding(session_id, figures)
        self._retired_sent += figures.sent
        self._retired_idle_sent += figures.idle_sent
        self._retired_dropped.update(figures.dropped)
        self._retired_reconnects.update(figures.reconnects)
        self._retired_controls.update(figures.controls)
        self._retired_viewer_dropped = _add(self._retired_viewer_dropped, figures.viewer_dropped)
        self._retired_viewer_refused = _add(self._retired_viewer_refused, figures.viewer_refused)

    # -- instruments ---------------------------------------------------------------------------------------------

    def _define_histograms(self, meter: Meter) -> None:
        def histogram(name: str, description: str, buckets: Sequence[float]) -> Histogram:
            return meter.create_histogram(
                name, unit="s", description=description, explicit_bucket_boundaries_advisory=buckets
            )

        self._queue_wait = histogram(
            "lingstream.admission.queue.duration",
            "Create to admission, per admitted session (0 for sessions admitted at once).",
            QUEUE_BUCKETS,
        )
        self._lease_wait = histogram(
            "lingstream.lease.wait.duration",
            "Execution lease wait before each emitted chunk (from the chunk's timings).",
            LEASE_BUCKETS,
        )
        self._stage_duration = histogram(
            "lingstream.pipeline.stage.duration",
            "Stage invocation run time (started to completed), by stage.",
            STAGE_BUCKETS,
        )
        self._stage_queued = histogram(
            "lingstream.pipeline.stage.queue.duration",
            "Stage invocation wait (inputs joined to admitted by the scheduler), by stage.",
            STAGE_BUCKETS,
        )
        self._chunk_period = histogram(
            "lingstream.chunk.period",
            "Time between consecutive chunks of a session, as its model worker measured it.",
            CHUNK_BUCKETS,
        )
        self._control_to_output = histogram(
            "lingstream.chunk.control_to_output",
            "Accepted control to the chunk generated from it, as the model worker measured it.",
            CHUNK_BUCKETS,
        )
        self._control_to_first_frame = histogram(
            "lingstream.chunk.control_to_first_frame",
            "Accepted control to the first frames of the chunk generated from it (its first part with progressive "
            "decode; the whole chunk without), as the model worker measured it.",
            CHUNK_BUCKETS,
        )
        self._playout_lead = histogram(
            "lingstream.chunk.playout_lead",
            "How long before its playback was due each real-time chunk was ready (`timings.playout_lead`): "
            "the video generated ahead, which a key change waits behind.",
            CHUNK_BUCKETS,
        )
        self._underruns = meter.create_counter(
            "lingstream.playout.underruns",
            unit="{chunk}",
            description="Real-time chunks that came after the previous chunk's playback had ended (the picture "
            "stood still).",
        )
        self._underrun_duration = meter.create_counter(
            "lingstream.playout.underrun.duration",
            unit="s",
            description="How long the picture stood still waiting for late chunks (`timings.underrun`, summed).",
        )
        self._first_output = histogram(
            "lingstream.session.first_output",
            "Admission (the session's start on its model worker) to its first chunk reaching the service.",
            CHUNK_BUCKETS,
        )
        self._session_duration = histogram(
            "lingstream.session.duration",
            "Admission to the final state, per admitted session, by final state.",
            SESSION_BUCKETS,
        )
        self._recovery = histogram(
            "lingstream.session.recovery",
            "A model worker's failure under a session to the first chunk after the session was rebuilt from its "
            "checkpoint (docs/continuity.md), by cause; replica_lost: from the lost replica's last heartbeat to the "
            "adopter's first chunk.",
            RECOVERY_BUCKETS,
        )
        self._recovered = meter.create_counter(
            "lingstream.sessions.recovered",
            unit="{session}",
            description="Sessions rebuilt from their checkpoint after their model worker failed under them, or "
            "adopted after their replica was lost or handed them off, by cause (worker_lost, stage_failed, "
            "replica_lost, replica_draining).",
        )
        self._chunks = meter.create_counter(
            "lingstream.chunks", unit="{chunk}", description="Chunks the service received from its model workers."
        )
        self._frames = meter.create_counter(
            "lingstream.frames.generated", unit="{frame}", description="Video frames in those chunks."
        )

    # -- sources ------------------------------------------------------------------------------------------------

    def _worker_figures(self, index: int, worker: BidirectionalService) -> WorkerFigures:
        try:
            stats = worker.statistics()
        except Exception:
            logger.exception("metrics: model worker %d statistics failed", index)
            return WorkerFigures(index=index, stale_controls=None, orchestrator=None, lease=None)
        return WorkerFigures(
            index=index, stale_controls=stats.stale_controls, orchestrator=stats.orchestrator, lease=stats.lease
        )

    def _transport_figures(self) -> TransportFigures | None:
        transport = self._transport
        if transport is None:
            return None
        for session_id, figures in self._sessions.items():
            self._read_binding(session_id, figures)
        sessions: int | None = None
        try:
            sessions = transport.statistics().sessions
        except Exception:
            logger.exception("metrics: transport statistics failed")
        sent = self._retired_sent
        idle_sent = self._retired_idle_sent
        dropped = Counter(self._retired_dropped)
        reconnects = Counter(self._retired_reconnects)
        controls = Counter(self._retired_controls)
        viewers = 0
        viewer_dropped, viewer_refused = self._retired_viewer_dropped, self._retired_viewer_refused
        for figures in self._sessions.values():
            sent += figures.sent
            idle_sent += figures.idle_sent
            dropped.update(figures.dropped)
            reconnects.update(figures.reconnects)
            controls.update(figures.controls)
            viewers += figures.viewers
            viewer_dropped = _add(viewer_dropped, figures.viewer_dropped)
            viewer_refused = _add(viewer_refused, figures.viewer_refused)
        return TransportFigures(
            sessions,
            sent,
            dict(dropped),
            dict(reconnects),
            kind=transport.kind,
            viewers=viewers,
            viewer_frames_dropped=viewer_dropped,
            viewer_controls_refused=viewer_refused,
            idle_frames_sent=idle_sent,
            controls=dict(controls),
        )

    def _read_binding(self, session_id: str, figures: _SessionFigures) -> None:
        """Refresh one session's binding counters. A session that is not (or no longer) attached keeps its last
        figures."""
        if self._transport is None:
            return
        try:
            stats = self._transport.binding_statistics(session_id)
        except Exception:
            return
        pacer = stats.pacer
        figures.sent = pacer.frames_sent
        figures.idle_sent = pacer.idle_frames_sent
        figures.dropped["late"] = pacer.dropped_late
        figures.dropped["overflow"] = pacer.dropped_overflow
        figures.dropped["rejected"] = pacer.rejected_size
        figures.dropped["unsent"] = stats.frames_unsent
        if stats.track_dropped is not None:
            figures.dropped["track"] = stats.track_dropped
        for kind, count in stats.reconnects.items():
            figures.reconnects[kind.value] = count
        figures.controls = Counter(stats.controls)
        figures.viewers = stats.viewers.watching
        figures.viewer_dropped = stats.viewers.frames_dropped
        figures.viewer_refused = stats.viewers.controls_refused


def _add(total: int | None, more: int | None) -> int | None:
    """A sum over bindings where None means "this kind does not count it" (None only while every part is None)."""
    if more is None:
        return total
    return more if total is None else total + more


def _seconds(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return max(0.0, float(value))
