"""A minimal Prometheus text exposition of the runtime's statistics, served at `/metrics`.

Written as one pure function from a `RuntimeStatistics` record to text, so the OpenTelemetry issue can replace it
with an exporter without touching anything else. Labels never carry session ids (unbounded cardinality): only
states, results and worker indices.
"""

from __future__ import annotations

from collections.abc import Iterable

from service.runtime import RuntimeStatistics

__all__ = ["CONTENT_TYPE", "render_metrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_FINAL_STATES = ("closed", "expired", "failed", "cancelled")


def _family(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)
    return lines


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render_metrics(stats: RuntimeStatistics) -> str:
    admission = stats.admission
    lines: list[str] = []
    lines += _family(
        "lingstream_sessions",
        "gauge",
        "Live sessions on this instance by state.",
        ((f'{{state="{state}"}}', count) for state, count in stats.sessions.items()),
    )
    lines += _family(
        "lingstream_sessions_ended_total",
        "counter",
        "Sessions that reached a final state, by that state.",
        ((f'{{state="{state}"}}', stats.ended_total.get(state, 0)) for state in _FINAL_STATES),
    )
    lines += _family(
        "lingstream_admission_queue_depth",
        "gauge",
        "Sessions waiting in the admission queue.",
        [("", admission.queue_depth)],
    )
    lines += _family(
        "lingstream_admission_queue_size", "gauge", "Capacity of the admission queue.", [("", admission.queue_size)]
    )
    lines += _family(
        "lingstream_admission_slots",
        "gauge",
        "Session slots of this instance (num_workers x max_sessions_per_worker).",
        [("", len(admission.retained) * admission.max_sessions_per_worker)],
    )
    lines += _family(
        "lingstream_admission_slots_retained",
        "gauge",
        "Slots held by admitted sessions, by model worker.",
        ((f'{{worker="{index}"}}', count) for index, count in enumerate(admission.retained)),
    )
    lines += _family(
        "lingstream_admission_slot_mismatch",
        "gauge",
        "Retained slots minus sessions holding one (non-zero means a leak or a double count).",
        [("", stats.slot_mismatch)],
    )
    lines += _family(
        "lingstream_admissions_total",
        "counter",
        "Admission decisions and queue exits by result.",
        [
            ('{result="admitted"}', admission.admitted_total),
            ('{result="queued"}', admission.queued_total),
            ('{result="rejected_queue_full"}', admission.rejected_total - admission.rejected_draining_total),
            ('{result="rejected_draining"}', admission.rejected_draining_total),
            ('{result="expired"}', admission.expired_total - admission.heartbeat_lost_total),
            ('{result="heartbeat_lost"}', admission.heartbeat_lost_total),
            ('{result="cancelled"}', admission.cancelled_total),
            ('{result="released"}', admission.released_total),
        ],
    )
    wait = admission.queue_wait
    lines += _family(
        "lingstream_admission_queue_wait_seconds",
        "gauge",
        "Recent create-to-admission waits (p50 and p95 over a bounded window).",
        [('{quantile="0.5"}', wait.p50), ('{quantile="0.95"}', wait.p95)],
    )
    lines += _family("lingstream_ready", "gauge", "1 when /readyz answers 200.", [("", 1 if stats.ready else 0)])
    lines += _family("lingstream_draining", "gauge", "1 while the instance drains.", [("", 1 if stats.draining else 0)])
    return "\n".join(lines) + "\n"
