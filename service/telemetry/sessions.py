"""`SessionTelemetry`, the runtime's `SessionObserver`: one `session` span from the first admission decision to the
final state, a child of the request span that created the session; one `chunk` child span per emitted chunk, placed
in time from the chunk's timings, with a `stage` event per stage invocation of that chunk (read from the model
worker's orchestrator, when it has one); and the event-fed metrics of `service.telemetry.metrics`. Made and owned by
`service.telemetry.otel.Telemetry`."""

from __future__ import annotations

import logging
import math
import re
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from admission import AdmissionEvent, AdmissionEventKind
from pipeline.bidirectional import ChunkOutput
from pipeline.errors import PipelineError
from pipeline.metrics import StageTiming
from pipeline.orchestrator import StageListener, StreamingPipelineOrchestrator
from service.runtime.sessions import Session, SessionState
from service.telemetry.metrics import ServiceMetrics

__all__ = ["SessionTelemetry"]

logger = logging.getLogger(__name__)

_KEPT_SEQUENCES = 8  # stage timings kept per session for chunks not emitted yet (prefetch runs 2 ahead)
_TIMING_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


@dataclass(slots=True)
class _SessionTrace:
    span: Span
    chunks: int = 0
    stages: OrderedDict[int, list[StageTiming]] = field(default_factory=OrderedDict)


class SessionTelemetry:
    """Implements `service.runtime.records.SessionObserver`: the session and chunk spans and the event-fed metrics.

    Every method runs on the event loop, is cheap and never raises (a failure is logged: telemetry must not end a
    session). State is kept only for sessions between their first admission decision and their final state.
    """

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer
        self._metrics: ServiceMetrics | None = None
        self._traces: dict[str, _SessionTrace] = {}

    def bind_metrics(self, metrics: ServiceMetrics | None) -> None:
        self._metrics = metrics

    # -- SessionObserver ---------------------------------------------------------------------------------------

    def admission_event(self, session: Session, event: AdmissionEvent) -> None:
        try:
            self._on_admission(session, event)
        except Exception:
            logger.exception("telemetry: the %s admission event failed", event.kind.value)

    def enter_session(self, session: Session) -> None:
        try:
            trace = self._traces.get(session.id)
            if trace is not None:
                # The runner's own context: its tasks (output reader, the worker's chunk loop) see the session span.
                otel_context.attach(trace_api.set_span_in_context(trace.span))
            if self._metrics is not None:
                self._metrics.session_started(session.id)
        except Exception:
            logger.exception("telemetry: binding the session failed")

    def chunk(self, session: Session, chunk: ChunkOutput) -> None:
        try:
            if self._metrics is not None:
                self._metrics.chunk(session.id, chunk)
            trace = self._traces.get(session.id)
            if trace is not None:
                trace.chunks += 1
                self._chunk_span(trace, chunk)
        except Exception:
            logger.exception("telemetry: recording chunk %d failed", chunk.index)

    def session_ended(self, session: Session) -> None:
        try:
            self._on_end(session)
        except Exception:
            logger.exception("telemetry: ending the session failed")

    # -- stage completions (orchestrator listeners, event loop) -------------------------------------------------

    def stage_listener(self, orchestrator: StreamingPipelineOrchestrator, stage_id: str) -> StageListener:
        """A listener for `orchestrator.add_stage_listener(stage_id, ...)` that reads the invocation's timing."""

        def on_result(session_id: str, sequence_id: int) -> None:
            try:
                timings = orchestrator.metrics(session_id).stage_timings
            except PipelineError:
                return
            if timings and timings[-1].stage_id == stage_id and timings[-1].sequence_id == sequence_id:
                self.stage_completed(session_id, timings[-1])

        return on_result

    def stage_completed(self, session_id: str, timing: StageTiming) -> None:
        try:
            if self._metrics is not None:
                self._metrics.stage(timing)
            trace = self._traces.get(session_id)
            if trace is not None:
                trace.stages.setdefault(timing.sequence_id, []).append(timing)
                while len(trace.stages) > _KEPT_SEQUENCES:
                    trace.stages.popitem(last=False)
        except Exception:
            logger.exception("telemetry: recording a %s invocation failed", timing.stage_id)

    # -- internals -----------------------------------------------------------------------------------------------

    def _on_admission(self, session: Session, event: AdmissionEvent) -> None:
        kind = event.kind
        view = event.ticket
        trace = self._traces.get(session.id)
        if trace is None:
            if kind not in (AdmissionEventKind.QUEUED, AdmissionEventKind.ADMITTED):
                return  # a rejected create never becomes a session
            # The current context is the request that created the session: its span becomes the parent.
            span = self._tracer.start_span(
                "session",
                kind=SpanKind.INTERNAL,
                attributes={"lingstream.session.queued": kind is not AdmissionEventKind.ADMITTED},
            )
            trace = self._traces[session.id] = _SessionTrace(span)
        span = trace.span
        if kind is AdmissionEventKind.QUEUED:
            span.add_event("queued", {"lingstream.queue.position": view.position or 0})
        elif kind is AdmissionEventKind.ADMITTED:
            worker = view.worker if view.worker is not None else -1
            span.set_attribute("lingstream.worker", worker)
            span.add_event("admitted", {"lingstream.worker": worker})
            if self._metrics is not None and view.admitted_at is not None:
                self._metrics.admitted(view.admitted_at - view.created_at)
        elif kind in (AdmissionEventKind.EXPIRED, AdmissionEventKind.CANCELLED):
            reason = view.reason.value if view.reason is not None else kind.value
            span.add_event(kind.value, {"lingstream.session.reason": reason})

    def _on_end(self, session: Session) -> None:
        if self._metrics is not None:
            self._metrics.session_ended(session.id, session.state.value)
        trace = self._traces.pop(session.id, None)
        if trace is None:
            return
        span = trace.span
        span.set_attributes(
            {
                "lingstream.session.state": session.state.value,
                "lingstream.session.reason": session.reason or session.state.value,
                "lingstream.session.chunks": trace.chunks,
            }
        )
        if session.state is SessionState.FAILED:
            code = session.failure[0] if session.failure is not None else "failed"
            span.set_status(Status(StatusCode.ERROR, code))
        span.end()

    def _chunk_span(self, trace: _SessionTrace, chunk: ChunkOutput) -> None:
        """A `chunk` span from the moment the session wanted the chunk (lease wait + control to output before its
        arrival) to its arrival here; the chunk's stage invocations become events at their start times."""
        now_ns = time.time_ns()
        now_mono = time.monotonic()
        attributes: dict[str, Any] = {
            "lingstream.chunk.index": chunk.index,
            "lingstream.chunk.frames": int(chunk.frames.shape[0]) if chunk.frames.ndim > 0 else 0,
            "lingstream.chunk.applied_seq": chunk.applied_seq,
        }
        for name, value in chunk.timings.items():
            seconds = _finite(value)
            if seconds is not None and _TIMING_NAME.fullmatch(name):
                attributes[f"lingstream.chunk.{name}_s"] = seconds
        control_to_output = _finite(chunk.timings.get("control_to_output"))
        lease_wait = _finite(chunk.timings.get("lease_wait")) or 0.0
        start_ns = now_ns
        if control_to_output is not None:
            start_ns = now_ns - _ns(control_to_output + lease_wait)
        span = self._tracer.start_span(
            "chunk",
            context=trace_api.set_span_in_context(trace.span),
            kind=SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start_ns,
        )
        if control_to_output is not None and lease_wait > 0:
            span.add_event("lease.granted", timestamp=start_ns + _ns(lease_wait))
        for timing in trace.stages.pop(chunk.index, ()):
            span.add_event(
                "stage",
                {
                    "lingstream.stage": timing.stage_id,
                    "lingstream.stage.duration_s": max(0.0, timing.duration),
                    "lingstream.stage.queued_s": max(0.0, timing.queued),
                },
                timestamp=now_ns - _ns(now_mono - timing.started),
            )
        span.end(end_time=now_ns)


def _finite(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return max(0.0, float(value))


def _ns(seconds: float) -> int:
    return round(max(0.0, seconds) * 1e9)
