"""OpenTelemetry for the service: the providers and exporters, and the `/metrics` exposition.

`Telemetry` owns one `MeterProvider` and one `TracerProvider` per app. It never installs them globally, so several
apps (tests) in one process share nothing:

- metrics: a `PrometheusMetricReader` on the app's own `CollectorRegistry`, rendered at `/metrics`, and, when
  `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` is set, a `PeriodicExportingMetricReader`
  with an OTLP/HTTP exporter. The instruments themselves live in `service.telemetry.metrics`.
- traces: a batched OTLP/HTTP span exporter when `OTEL_EXPORTER_OTLP_ENDPOINT` or `..._TRACES_ENDPOINT` is set;
  without one spans are made (their ids reach the logs) but go nowhere. Tests add an in-memory exporter.
- `TelemetryMiddleware` (`middleware.py`): per request `http.server.request.duration` and
  `http.server.active_requests`, and a SERVER span whose parent is the W3C `traceparent` the request carried.
- `SessionTelemetry` (`sessions.py`), the runtime's `SessionObserver`: the `session` and `chunk` spans and the
  event-fed metrics.

Configuration comes from the standard OTEL_* variables (`TelemetryConfig.from_environ` in `config.py`), checked at
start. Only OTLP over http/protobuf ships; asking for another protocol is a configuration error, not a silent
fallback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Mapping, Sequence

import requests
from fastapi.responses import Response
from opentelemetry import trace as trace_api
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import CollectorRegistry, generate_latest

from pipeline.bidirectional import BidirectionalService
from pipeline.orchestrator import StreamingPipelineOrchestrator
from service.runtime.runtime import ServiceRuntime
from service.telemetry.config import COMPRESSIONS, OtlpTarget, TelemetryConfig, display_endpoint
from service.telemetry.metrics import CONTENT_TYPE, HTTP_BUCKETS, ServiceMetrics
from service.telemetry.middleware import TelemetryMiddleware
from service.telemetry.sessions import SessionTelemetry
from transport.base import Transport

__all__ = ["OtlpTarget", "SessionTelemetry", "Telemetry", "TelemetryConfig", "TelemetryMiddleware"]

logger = logging.getLogger(__name__)


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
                compression=COMPRESSIONS[target.compression],
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
                compression=COMPRESSIONS[target.compression],
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
                display_endpoint(cfg.otlp_metrics.endpoint) if cfg.otlp_metrics else "off",
                display_endpoint(cfg.otlp_traces.endpoint) if cfg.otlp_traces else "off",
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
