"""The service's metrics read the packages' statistics records as types: every model-worker and transport series
comes from the record field it is named for.

Each record below is built with a distinct value in every counter field, so a series fed by the wrong field, or
by a placeholder 0 (what reading a renamed field by its old name used to give), fails; the last check says that no
such series is left unaccounted for. mypy catches a renamed field statically; this is the same guarantee at run
time, through the real instruments and the Prometheus exposition.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from admission import DurationSummary, LeaseStatistics
from pipeline import ActorStatistics, CoreStatistics, OrchestratorStatistics, ServiceStatistics
from service.telemetry.metrics import ServiceMetrics
from transport.base import BindingStatistics, ReconnectKind, ViewerFigures
from transport.session.pacing import PacerStatistics

_SCALARS = {"int": int, "float": float, "bool": bool}


def distinct(record: type[Any], values: Iterator[int], **given: object) -> Any:
    """`record` with every int, float and bool field not `given` set from `values` (all distinct, none 0)."""
    fields: dict[str, object] = {}
    for field in dataclasses.fields(record):
        if field.name in given:
            fields[field.name] = given.pop(field.name)
        else:
            assert field.type in _SCALARS, f"{record.__name__}.{field.name}: {field.type} needs a given value"
            fields[field.name] = _SCALARS[str(field.type)](next(values))
    assert not given, f"{record.__name__} has no fields {sorted(given)}"
    return record(**fields)


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.startswith("lingstream_process_")  # the process's own memory, read from /proc
    }


def _key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def test_every_worker_and_transport_series_reads_the_field_it_is_named_for() -> None:
    values = itertools.count(101)
    actor = distinct(ActorStatistics, values, name="render")
    core = distinct(
        CoreStatistics,
        values,
        sessions_by_state={},
        poisoned_sessions=("p1", "p2", "p3"),
        in_flight_by_stage={"render": next(values)},
        eligible_by_stage={},
    )
    orchestrator = distinct(OrchestratorStatistics, values, core=core, actors={"render": actor})
    wait = DurationSummary(total_count=0, window_count=0, mean=0.0, p50=0.0, p95=0.0, max=0.0)
    lease = distinct(
        LeaseStatistics,
        values,
        holder=None,
        holder_since=None,
        waiters=("w1", "w2"),
        grants_per_session={},
        wait_time=wait,
    )
    service = distinct(ServiceStatistics, values, orchestrator=orchestrator, lease=lease)
    pacer = distinct(PacerStatistics, values)
    viewers = distinct(ViewerFigures, values, frames_dropped=next(values), controls_refused=next(values))
    binding = distinct(
        BindingStatistics,
        values,
        pacer=pacer,
        track_dropped=next(values),
        reconnects={kind: next(values) for kind in ReconnectKind},
        viewers=viewers,
        controls={("packet", "control_state"): next(values), ("rpc", "stop"): next(values)},
    )
    sessions = next(values)
    worker = SimpleNamespace(statistics=lambda: service)
    transport = SimpleNamespace(
        kind="embedded",
        binding_statistics=lambda session_id: binding,
        statistics=lambda: SimpleNamespace(sessions=sessions),
    )

    registry = CollectorRegistry(auto_describe=False)
    reader = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=registry)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        # No runtime record, so no runtime series: only the worker and transport series are under test.
        metrics = ServiceMetrics(
            provider.get_meter("test"),
            runtime=lambda: None,
            workers=[worker],
            transport=transport,
        )
        metrics.session_started("s1")
        metrics.refresh()
        text = generate_latest(registry).decode()
    finally:
        provider.shutdown()

    w = {"worker": "0"}
    expected = {
        _key("lingstream_controls_stale_total", **w): service.stale_controls,
        _key("lingstream_lease_grants_total", **w): lease.total_grants,
        _key("lingstream_lease_waiters", **w): len(lease.waiters),
        _key("lingstream_pipeline_results_discarded_total", kind="stale", **w): core.stale_results,
        _key("lingstream_pipeline_results_discarded_total", kind="orphaned", **w): core.orphaned_results,
        _key("lingstream_pipeline_results_discarded_total", kind="duplicate", **w): core.duplicate_results,
        _key("lingstream_pipeline_results_discarded_total", kind="rejected", **w): core.rejected_results,
        _key("lingstream_pipeline_cleanup_failures_total", **w): core.cleanup_failures,
        _key("lingstream_pipeline_slot_leaks_total", **w): core.slot_leaks,
        _key("lingstream_pipeline_sessions_poisoned", **w): len(core.poisoned_sessions),
        _key("lingstream_pipeline_stage_in_flight", stage="render", **w): core.in_flight_by_stage["render"],
        _key("lingstream_pipeline_actor_restarts_total", stage="render", **w): actor.restarts,
        _key("lingstream_pipeline_actor_failures_total", stage="render", **w): actor.failures,
        _key("lingstream_transport_sessions"): sessions,
        _key("lingstream_transport_frames_sent_total"): pacer.frames_sent,
        _key("lingstream_transport_idle_frames_sent_total"): pacer.idle_frames_sent,
        _key("lingstream_transport_frames_dropped_total", reason="late"): pacer.dropped_late,
        _key("lingstream_transport_frames_dropped_total", reason="overflow"): pacer.dropped_overflow,
        _key("lingstream_transport_frames_dropped_total", reason="rejected"): pacer.rejected_size,
        _key("lingstream_transport_frames_dropped_total", reason="unsent"): binding.frames_unsent,
        _key("lingstream_transport_frames_dropped_total", reason="track"): binding.track_dropped,
        **{
            _key("lingstream_transport_reconnects_total", kind=kind.value): count
            for kind, count in binding.reconnects.items()
        },
        **{
            _key("lingstream_transport_controls_total", via=via, type=kind): count
            for (via, kind), count in binding.controls.items()
        },
        _key("lingstream_viewers", transport="embedded"): viewers.watching,
        _key("lingstream_viewers_frames_dropped_total", transport="embedded"): viewers.frames_dropped,
        _key("lingstream_viewers_controls_refused_total", transport="embedded"): viewers.controls_refused,
    }
    assert _samples(text) == expected
