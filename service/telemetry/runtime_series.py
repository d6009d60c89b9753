"""The runtime's series: sessions, admission, usage per key, readiness, the limits that ended sessions and the
recordings, all read from one `RuntimeStatistics` per collection (`observe_runtime`). `render_metrics` renders them
alone for one record. docs/metrics.md lists them.
"""

from __future__ import annotations

from collections.abc import Callable

from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Meter, Observation
from opentelemetry.sdk.metrics import MeterProvider
from prometheus_client import CollectorRegistry, generate_latest

from service.runtime.recordings import RecordingStatistics
from service.runtime.records import RuntimeStatistics
from service.telemetry._observing import Observe, callback
from service.usage.ledger import UsageTotals

__all__ = ["observe_runtime", "render_metrics"]

_FINAL_STATES = ("closed", "expired", "failed", "cancelled")


def observe_runtime(meter: Meter, read: Callable[[], RuntimeStatistics | None]) -> None:
    """Register the runtime's series (sessions, admission, readiness) on `meter`, reading `read()` per collection.

    These names predate OpenTelemetry here and the Helm chart's autoscaling queries use two of them
    (`lingstream_admission_queue_depth`, `lingstream_sessions{state="running"}`): keep them stable.
    """

    def gauge(name: str, unit: str, description: str, observe: Observe[RuntimeStatistics]) -> None:
        meter.create_observable_gauge(name, [callback(read, observe)], unit=unit, description=description)

    def counter(name: str, unit: str, description: str, observe: Observe[RuntimeStatistics]) -> None:
        meter.create_observable_counter(name, [callback(read, observe)], unit=unit, description=description)

    gauge(
        "lingstream.sessions",
        "{session}",
        "Live sessions on this instance by state (queued, admitted, running, paused, draining).",
        lambda s: (Observation(count, {"state": state}) for state, count in s.sessions.items()),
    )
    counter(
        "lingstream.sessions.ended",
        "{session}",
        "Sessions that reached a final state, by that state (closed, expired, failed, cancelled).",
        lambda s: (Observation(s.ended_total.get(state, 0), {"state": state}) for state in _FINAL_STATES),
    )
    gauge(
        "lingstream.admission.queue.depth",
        "{session}",
        "Sessions waiting in the admission queue.",
        lambda s: [Observation(s.admission.queue_depth)],
    )
    gauge(
        "lingstream.admission.queue.size",
        "{session}",
        "Capacity of the admission queue.",
        lambda s: [Observation(s.admission.queue_size)],
    )
    gauge(
        "lingstream.admission.slots",
        "{session}",
        "Session slots of this instance (num_workers x max_sessions_per_worker).",
        lambda s: [Observation(len(s.admission.retained) * s.admission.max_sessions_per_worker)],
    )
    gauge(
        "lingstream.admission.slots.retained",
        "{session}",
        "Slots held by admitted sessions, by model worker.",
        lambda s: (Observation(count, {"worker": str(i)}) for i, count in enumerate(s.admission.retained)),
    )
    gauge(
        "lingstream.admission.slot_mismatch",
        "{session}",
        "Retained slots minus sessions holding one (anything but 0 means a leak or a double count).",
        lambda s: [Observation(s.slot_mismatch)],
    )
    counter(
        "lingstream.admissions",
        "{session}",
        "Admission decisions and queue exits by result.",
        _admission_results,
    )
    gauge(
        "lingstream.worker.ready",
        "1",
        "1 while the model worker admits sessions (started and ready), by model worker.",
        lambda s: (Observation(int(ok), {"worker": str(i)}) for i, ok in enumerate(s.admission.healthy)),
    )
    gauge(
        "lingstream.admission.replicas",
        "{replica}",
        "Replicas registered in the shared admission, by liveness (redis backend only).",
        _replicas,
    )
    gauge(
        "lingstream.admission.deployment.slots",
        "{session}",
        "Session slots of every live, non-draining replica (redis backend only).",
        lambda s: [] if s.shared is None else [Observation(s.shared.capacity)],
    )
    gauge(
        "lingstream.admission.deployment.slots.retained",
        "{session}",
        "Slots held by admitted sessions on every replica (redis backend only).",
        lambda s: [] if s.shared is None else [Observation(s.shared.retained_total)],
    )
    for name, unit, what, pick in (
        ("running", "s", "Session-seconds holding a slot", _usage_running),
        ("queued", "s", "Session-seconds waiting in the queue", _usage_queued),
        ("sessions", "{session}", "Creates accepted (admitted or queued)", _usage_sessions),
        ("chunks", "{chunk}", "Chunks generated", _usage_chunks),
        ("frames", "{frame}", "Frames generated", _usage_frames),
    ):
        counter(
            f"lingstream.usage.{name}",
            unit,
            f"{what}, by API key id (all time; with the redis backend the deployment's, the same on every replica).",
            _usage_series(pick),
        )
    gauge("lingstream.ready", "1", "1 when /readyz answers 200.", lambda s: [Observation(int(s.ready))])
    gauge("lingstream.draining", "1", "1 while the instance drains.", lambda s: [Observation(int(s.draining))])
    counter(
        "lingstream.sessions.ended.limit",
        "{session}",
        "Sessions a limit ended (state closed), by reason (time_limit, paused_too_long).",
        lambda s: (Observation(count, {"reason": reason}) for reason, count in s.ended_by_limit.items()),
    )
    _observe_recordings(meter, lambda: None if (stats := read()) is None else stats.recordings)


def _observe_recordings(meter: Meter, read: Callable[[], RecordingStatistics | None]) -> None:
    """The recording store's series (absent while recording is not configured)."""

    def series(kind: str, name: str, unit: str, description: str, observe: Observe[RecordingStatistics]) -> None:
        make = meter.create_observable_counter if kind == "counter" else meter.create_observable_gauge
        make(f"lingstream.recordings.{name}", [callback(read, observe)], unit=unit, description=description)

    series("gauge", "active", "{recording}", "Recordings being written now.", lambda r: [Observation(r.recording)])
    series("counter", "started", "{recording}", "Recordings started.", lambda r: [Observation(r.started_total)])
    series(
        "counter",
        "completed",
        "{recording}",
        "Recordings finalised complete (served by GET .../recording).",
        lambda r: [Observation(r.ready_total)],
    )
    series(
        "counter",
        "stopped",
        "{recording}",
        "Recordings stopped before the session ended, by reason (failed: a write error; overrun: fell behind).",
        lambda r: [
            Observation(r.failed_total, {"reason": "failed"}),
            Observation(r.overruns_total, {"reason": "overrun"}),
        ],
    )
    series(
        "counter",
        "written",
        "By",
        "Bytes written to recording files (MP4 and control trace; a stopped recording's included).",
        lambda r: [Observation(r.bytes_total)],
    )
    series(
        "counter",
        "removed",
        "{recording}",
        "Complete recordings removed by retention (oldest first).",
        lambda r: [Observation(r.removed_total)],
    )
    series("gauge", "kept", "{recording}", "Complete recordings on disk.", lambda r: [Observation(r.kept)])
    series(
        "gauge",
        "kept.size",
        "By",
        "Bytes of the complete recordings on disk (what LINGSTREAM_RECORDINGS_MAX_BYTES bounds).",
        lambda r: [Observation(r.kept_bytes)],
    )
    series(
        "counter",
        "uploads",
        "{recording}",
        "Recordings uploaded to the object store, by result (ok; failed: refused or unreachable).",
        lambda r: [
            Observation(r.uploads_total, {"result": "ok"}),
            Observation(r.upload_failures_total, {"result": "failed"}),
        ],
    )
    series(
        "counter",
        "uploaded",
        "By",
        "Bytes of recordings uploaded to the object store (MP4 and trace).",
        lambda r: [Observation(r.uploaded_bytes_total)],
    )
    series(
        "counter",
        "upload.time",
        "s",
        "Seconds spent uploading recordings (completed uploads).",
        lambda r: [Observation(r.upload_seconds_total)],
    )


def _replicas(stats: RuntimeStatistics) -> list[Observation]:
    if stats.shared is None:
        return []
    alive = sum(1 for replica in stats.shared.replicas if replica.alive)
    return [Observation(alive, {"alive": "true"}), Observation(len(stats.shared.replicas) - alive, {"alive": "false"})]


def _admission_results(stats: RuntimeStatistics) -> list[Observation]:
    a = stats.admission
    results = {
        "admitted": a.admitted_total,
        "queued": a.queued_total,
        "rejected_queue_full": a.rejected_total - a.rejected_draining_total - a.quota_rejected_total,
        "rejected_draining": a.rejected_draining_total,
        "rejected_quota": a.quota_rejected_total,
        "expired": a.expired_total - a.heartbeat_lost_total,
        "heartbeat_lost": a.heartbeat_lost_total,
        "cancelled": a.cancelled_total,
        "released": a.released_total,
    }
    return [Observation(value, {"result": result}) for result, value in results.items()]


def _usage_running(totals: UsageTotals) -> float:
    return totals.running_s


def _usage_queued(totals: UsageTotals) -> float:
    return totals.queued_s


def _usage_sessions(totals: UsageTotals) -> float:
    return totals.sessions


def _usage_chunks(totals: UsageTotals) -> float:
    return totals.chunks


def _usage_frames(totals: UsageTotals) -> float:
    return totals.frames


def _usage_series(pick: Callable[[UsageTotals], float]) -> Observe[RuntimeStatistics]:
    def observe(stats: RuntimeStatistics) -> list[Observation]:
        return [Observation(pick(totals), {"key": key}) for key, totals in sorted(stats.usage.items())]

    return observe


def render_metrics(stats: RuntimeStatistics) -> str:
    """The runtime's series alone, for one statistics record, through the same instruments as `/metrics`.

    The served `/metrics` comes from `service.telemetry.otel.Telemetry` (every series); this is for callers that hold
    only a `RuntimeStatistics`.
    """
    registry = CollectorRegistry(auto_describe=False)
    reader = PrometheusMetricReader(disable_target_info=True, scope_info_enabled=False, registry=registry)
    provider = MeterProvider(metric_readers=[reader], shutdown_on_exit=False)
    try:
        observe_runtime(provider.get_meter("lingstream"), lambda: stats)
        return generate_latest(registry).decode()
    finally:
        provider.shutdown()
