"""OpenTelemetry for the service: providers and exporters, the HTTP server middleware, and the session traces.

`Telemetry` owns one `MeterProvider` and one `TracerProvider` per app. It never installs them globally, so several
apps (tests) in one process share nothing:

- metrics: a `PrometheusMetricReader` on the app's own `CollectorRegistry`, rendered at `/metrics`, and, when
  `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set, a `PeriodicExportingMetricReader`
  with an OTLP/HTTP exporter. The instruments themselves live in `service.telemetry.metrics`.
- traces: a batched OTLP/HTTP span exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` or `..._TRACES_ENDPOINT` is set;
  without one spans are made (their ids reach the logs) but go nowhere. Tests add an in-memory exporter.
- `TelemetryMiddleware`: per request `http.server.request.duration` and `http.server.active_requests`, and a SERVER
  span whose parent is the W3C `traceparent` the request carried. Labels and span names use the route template
  (`/v1/sessions/{session_id}`), never the path, so no session id leaks.
- `SessionTelemetry`, the runtime's `SessionObserver`: one `session` span from the first admission decision to the
  final state, a child of the request span that created the session; one `chunk` child span per emitted chunk,
  placed in time from the chunk's timings, with a `stage` event per stage invocation of that chunk (read from the
  model worker's orchestrator, when it has one); and the event-fed metrics of `service.telemetry.metrics`.

Configuration comes from the standard OTEL_* variables (`TelemetryConfig.from_environ`), checked at start. Only
OTLP over http/protobuf ships; asking for another protocol is a configuration error, not a silent fallback.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

import requests
from fastapi.responses import Response
from opentelemetry import context as otel_context
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.re import parse_env_headers
from prometheus_client import CollectorRegistry, generate_latest

from admission import AdmissionEvent, AdmissionEventKind
from pipeline.bidirectional import BidirectionalService, ChunkOutput
from pipeline.errors import PipelineError
from pipeline.metrics import StageTiming
from pipeline.orchestrator import StageListener, StreamingPipelineOrchestrator
from service.errors import SettingsError
from service.runtime.runtime import ServiceRuntime
from service.runtime.sessions import Session, SessionState
from service.telemetry.metrics import CONTENT_TYPE, HTTP_BUCKETS, ServiceMetrics
from transport.base import Transport

__all__ = ["OtlpTarget", "SessionTelemetry", "Telemetry", "TelemetryConfig", "TelemetryMiddleware"]

logger = logging.getLogger(__name__)

OTLP_PROTOCOL = "http/protobuf"
_SIGNAL_PATHS = {"metrics": "v1/metrics", "traces": "v1/traces"}
_COMPRESSIONS = {"none": Compression.NoCompression, "gzip": Compression.Gzip, "deflate": Compression.Deflate}
_UNTRACED_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})  # probes and scrapes: metrics only, no spans
_HTTP_METHODS = frozenset({"CONNECT", "DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT", "TRACE"})
_KEPT_SEQUENCES = 8  # stage timings kept per session for chunks not emitted yet (prefetch runs 2 ahead)
_TIMING_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


# --------------------------------------------------------------------------------------------- configuration


@dataclass(frozen=True, slots=True)
class OtlpTarget:
    """Where and how one signal is exported over OTLP/HTTP. `headers` may hold credentials: never logged."""

    endpoint: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = 10.0
    compression: str = "none"


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """What `Telemetry` is built from. `otlp_metrics`/`otlp_traces` None: that signal is not exported over OTLP
    (metrics are always served at `/metrics`)."""

    service_name: str = "lingstream"
    service_version: str = "0.0.0"
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    otlp_metrics: OtlpTarget | None = None
    otlp_traces: OtlpTarget | None = None
    metric_export_interval_s: float = 60.0
    metric_export_timeout_s: float = 30.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, service_version: str = "0.0.0") -> TelemetryConfig:
        """Read the standard variables: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_{METRICS,TRACES}_
        EXPORTER` (otlp or none), `OTEL_EXPORTER_OTLP_[{METRICS,TRACES}_]{ENDPOINT,PROTOCOL,HEADERS,TIMEOUT,
        COMPRESSION}` (timeouts in seconds, as the Python SDK reads them) and `OTEL_METRIC_EXPORT_{INTERVAL,TIMEOUT}`
        (milliseconds). Raises `SettingsError` naming the variable for a value that cannot work."""
        resource = _resource_attributes(_get(environ, "OTEL_RESOURCE_ATTRIBUTES") or "")
        service_name = _get(environ, "OTEL_SERVICE_NAME") or resource.pop("service.name", "") or "lingstream"
        resource.pop("service.name", None)
        return cls(
            service_name=service_name,
            service_version=service_version,
            resource_attributes=resource,
            otlp_metrics=_otlp_target(environ, "metrics"),
            otlp_traces=_otlp_target(environ, "traces"),
            metric_export_interval_s=_number(environ, "OTEL_METRIC_EXPORT_INTERVAL", 60_000.0) / 1000.0,
            metric_export_timeout_s=_number(environ, "OTEL_METRIC_EXPORT_TIMEOUT", 30_000.0) / 1000.0,
        )


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = _get(environ, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(f"invalid configuration: {name} must be a positive number, got {raw!r}")
    return value


def _resource_attributes(raw: str) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for item in raw.split(","):
        key, separator, value = item.partition("=")
        if not item.strip():
            continue
        if not separator or not key.strip():
            logger.warning("OTEL_RESOURCE_ATTRIBUTES: ignoring %r (expected key=value)", item.strip())
            continue
        attributes[unquote(key.strip())] = unquote(value.strip())
    return attributes


def _otlp_target(environ: Mapping[str, str], signal: str) -> OtlpTarget | None:
    upper = signal.upper()
    selector = f"OTEL_{upper}_EXPORTER"
    names = {name.strip().lower() for name in (_get(environ, selector) or "otlp").split(",") if name.strip()}
    allowed = {"otlp", "none"} | ({"prometheus"} if signal == "metrics" else set())
    if names - allowed:
        raise SettingsError(
            f"invalid configuration: {selector}={_get(environ, selector)!r}: this service supports "
            f"{', '.join(sorted(allowed))}"
        )
    if "none" in names or "otlp" not in names:
        return None
    specific = _get(environ, f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
    generic = _get(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if specific is not None:
        endpoint, source = specific, f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"
    elif generic is not None:
        endpoint, source = f"{generic.rstrip('/')}/{_SIGNAL_PATHS[signal]}", "OTEL_EXPORTER_OTLP_ENDPOINT"
    else:
        return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(f"invalid configuration: {source} must be an http:// or https:// URL, got {endpoint!r}")

    def pick(suffix: str) -> tuple[str, str | None]:
        name = f"OTEL_EXPORTER_OTLP_{upper}_{suffix}"
        value = _get(environ, name)
        if value is None:
            name = f"OTEL_EXPORTER_OTLP_{suffix}"
            value = _get(environ, name)
        return name, value

    name, protocol = pick("PROTOCOL")
    if protocol is not None and protocol.lower() != OTLP_PROTOCOL:
        raise SettingsError(
            f"invalid configuration: {name}={protocol!r}: this service exports OTLP over {OTLP_PROTOCOL} only "
            f"(a collector's OTLP/HTTP port, usually 4318); set {name}={OTLP_PROTOCOL}"
        )
    _, headers = pick("HEADERS")
    name, _ = pick("TIMEOUT")
    timeout_s = _number(environ, name, 10.0)
    name, compression = pick("COMPRESSION")
    compression = (compression or "none").lower()
    if compression not in _COMPRESSIONS:
        raise SettingsError(f"invalid configuration: {name} must be none, gzip or deflate, got {compression!r}")
    return OtlpTarget(
        endpoint=endpoint,
        headers=dict(parse_env_headers(headers or "", liberal=True)),
        timeout_s=timeout_s,
        compression=compression,
    )


def _display(url: str) -> str:
    """An endpoint for the logs: without user info (it could hold a password) or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


# --------------------------------------------------------------------------------------------- telemetry


class Telemetry:
    """The app's metric and trace providers, its exporters and its `/metrics` exposition.

    Life: construct, `instrument(runtime, workers, transport)` once the runtime exists (the runtime is built with
    `sessions` as its observer), `start()` on the event loop (the app's lifespan), then `await aclose()`, which
    flushes and stops the exporters. `span_exporter` is added with a synchronous processor (tests pass an
    `InMemorySpanExporter`); `http_session` is the `requests.Session` the OTLP exporters post with (tests pass one
    that records instead of sending).
    """

    def __init__(
        self,
        config: TelemetryConfig | None = None,
        *,
        span_exporter: SpanExporter | None = None,
        http_session: requests.Session | None = None,
    ) -> None:
        self.config = config if config is not None else TelemetryConfig()
        cfg = self.config
        resource = Resource.create(
            {**cfg.resource_attributes, "service.name": cfg.service_name, "service.version": cfg.service_version}
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.prometheus_reader = PrometheusMetricReader(scope_info_enabled=False, registry=self.registry)
        readers: list[MetricReader] = [self.prometheus_reader]
        self.otlp_metric_exporter: OTLPMetricExporter | None = None
        self.otlp_metric_reader: PeriodicExportingMetricReader | None = None
        if cfg.otlp_metrics is not None:
            target = cfg.otlp_metrics
            self.otlp_metric_exporter = OTLPMetricExporter(
                endpoint=target.endpoint,
                headers=dict(target.headers),
                timeout=target.timeout_s,
                compression=_COMPRESSIONS[target.compression],
                session=http_session,
            )
            self.otlp_metric_reader = PeriodicExportingMetricReader(
                self.otlp_metric_exporter,
                export_interval_millis=cfg.metric_export_interval_s * 1000.0,
                export_timeout_millis=cfg.metric_export_timeout_s * 1000.0,
            )
            readers.append(self.otlp_metric_reader)
        self.meter_provider = MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False)
        self.tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False, id_generator=_OwnIdGenerator())
        self.otlp_span_exporter: OTLPSpanExporter | None = None
        if cfg.otlp_traces is not None:
            target = cfg.otlp_traces
            self.otlp_span_exporter = OTLPSpanExporter(
                endpoint=target.endpoint,
                headers=dict(target.headers),
                timeout=target.timeout_s,
                compression=_COMPRESSIONS[target.compression],
                session=http_session,
            )
            self.tracer_provider.add_span_processor(BatchSpanProcessor(self.otlp_span_exporter))
        if span_exporter is not None:
            self.tracer_provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        self.meter = self.meter_provider.get_meter("lingstream", cfg.service_version)
        self.tracer = self.tracer_provider.get_tracer("lingstream", cfg.service_version)
        self.propagator = TraceContextTextMapPropagator()
        self.http_duration = self.meter.create_histogram(
            "http.server.request.duration",
            unit="s",
            description="Duration of HTTP server requests, by method, route template and status code.",
            explicit_bucket_boundaries_advisory=HTTP_BUCKETS,
        )
        self.http_active = self.meter.create_up_down_counter(
            "http.server.active_requests", unit="{request}", description="HTTP server requests in progress."
        )
        self.sessions = SessionTelemetry(self.tracer)
        self.metrics: ServiceMetrics | None = None
        self._closed = False
        if cfg.otlp_metrics is not None or cfg.otlp_traces is not None:
            logger.info(
                "OTLP export: metrics %s, traces %s",
                _display(cfg.otlp_metrics.endpoint) if cfg.otlp_metrics else "off",
                _display(cfg.otlp_traces.endpoint) if cfg.otlp_traces else "off",
            )

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, service_version: str = "0.0.0") -> Telemetry:
        return cls(TelemetryConfig.from_environ(environ, service_version=service_version))

    def instrument(
        self,
        runtime: ServiceRuntime,
        workers: Sequence[BidirectionalService],
        transport: Transport | None = None,
    ) -> None:
        """Create the service's instruments over these sources and listen to the workers' stage completions."""
        if self.metrics is not None:
            raise RuntimeError("telemetry is already instrumenting a runtime")
        self.metrics = ServiceMetrics(self.meter, runtime=runtime.statistics, workers=workers, transport=transport)
        self.sessions.bind_metrics(self.metrics)
        for worker in workers:
            orchestrator = getattr(worker, "orchestrator", None)
            if isinstance(orchestrator, StreamingPipelineOrchestrator):
                for stage_id in orchestrator.statistics().actors:
                    orchestrator.add_stage_listener(stage_id, self.sessions.stage_listener(orchestrator, stage_id))

    def start(self) -> None:
        """Call on the app's event loop: statistics are read there from now on."""
        if self.metrics is not None:
            self.metrics.bind_loop(asyncio.get_running_loop())

    def render(self) -> bytes:
        """The Prometheus text exposition of every instrument, read now (call it on the event loop)."""
        if self.metrics is not None and not self._closed:
            self.metrics.refresh()
        return generate_latest(self.registry)

    async def metrics_endpoint(self) -> Response:
        """`GET /metrics`."""
        return Response(self.render(), media_type=CONTENT_TYPE)

    def shutdown(self) -> None:
        """Flush and stop the exporters and readers (blocking: OTLP may send a last batch). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.metrics is not None:
            self.metrics.close()
        self.meter_provider.shutdown()
        self.tracer_provider.shutdown()

    async def aclose(self) -> None:
        """`shutdown()` off the event loop."""
        await asyncio.to_thread(self.shutdown)


# --------------------------------------------------------------------------------------------- sessions


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


# --------------------------------------------------------------------------------------------- HTTP middleware

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class TelemetryMiddleware:
    """ASGI middleware: HTTP server metrics and a SERVER span for every request.

    Install it outermost, so that answers from inner middleware (413 from the body bound, CORS preflights) are
    measured too. The span is current while the app handles the request, so what the handler starts (a session's
    span) is its child. Probes and scrapes (`/healthz`, `/readyz`, `/metrics`) are measured but not traced.
    Attributes follow the HTTP semantic conventions: `http.request.method`, `http.route` (the template, absent
    when nothing matched), `http.response.status_code`, `url.scheme`, `error.type` (5xx or an exception).
    """

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self._telemetry = telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        telemetry = self._telemetry
        started = time.perf_counter()
        method = str(scope.get("method", "")).upper()
        method = method if method in _HTTP_METHODS else "_OTHER"
        base: dict[str, Any] = {"http.request.method": method, "url.scheme": str(scope.get("scheme", "http"))}
        span: Span | None = None
        if scope.get("path") not in _UNTRACED_PATHS:
            carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope.get("headers", ())}
            span = telemetry.tracer.start_span(
                method if method != "_OTHER" else "HTTP",
                context=telemetry.propagator.extract(carrier),
                kind=SpanKind.SERVER,
                attributes={**base, "network.protocol.version": str(scope.get("http_version", "1.1"))},
            )
        status: int | None = None

        async def send_and_watch(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        telemetry.http_active.add(1, base)
        error: BaseException | None = None
        try:
            if span is None:
                await self.app(scope, receive, send_and_watch)
            else:
                with trace_api.use_span(span, record_exception=False, set_status_on_exception=False):
                    await self.app(scope, receive, send_and_watch)
        except BaseException as exc:
            error = exc
            if status is None and not isinstance(exc, asyncio.CancelledError):
                status = 500  # what the server's outermost error handler answers for it
            raise
        finally:
            telemetry.http_active.add(-1, base)
            self._finish(scope, span, base, status, error, time.perf_counter() - started)

    def _finish(
        self,
        scope: Scope,
        span: Span | None,
        base: Mapping[str, Any],
        status: int | None,
        error: BaseException | None,
        duration: float,
    ) -> None:
        attributes = dict(base)
        route = getattr(scope.get("route"), "path", None)
        if isinstance(route, str) and route:
            attributes["http.route"] = route
        else:
            route = None
        if status is not None:
            attributes["http.response.status_code"] = status
        error_type = type(error).__qualname__ if error is not None else None
        if error_type is None and status is not None and status >= 500:
            error_type = str(status)
        if error_type is not None:
            attributes["error.type"] = error_type
        self._telemetry.http_duration.record(duration, attributes)
        if span is None:
            return
        method = str(base["http.request.method"])
        name = method if method != "_OTHER" else "HTTP"
        span.update_name(f"{name} {route}" if route else name)
        span.set_attributes(attributes)
        if error_type is not None:
            span.set_status(Status(StatusCode.ERROR, error_type))
        span.end()


class _OwnIdGenerator(IdGenerator):
    """Trace and span ids from this process's own generator, seeded from the OS.

    OpenTelemetry's default draws from the `random` module's shared state: a caller that seeds it (a reproducible
    test, a library) would make our ids repeat, and every id drawn would move that caller's sequence (Hypothesis
    reports exactly that when a test generates data while the service traces on another thread).
    """

    def __init__(self) -> None:
        self._random = random.Random(int.from_bytes(os.urandom(16), "big"))

    def generate_span_id(self) -> int:
        span_id = self._random.getrandbits(64)
        while span_id == trace_api.INVALID_SPAN_ID:
            span_id = self._random.getrandbits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = self._random.getrandbits(128)
        while trace_id == trace_api.INVALID_TRACE_ID:
            trace_id = self._random.getrandbits(128)
        return trace_id
