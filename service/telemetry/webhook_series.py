"""The webhook deliveries' series: `lingstream_webhook_deliveries_total{result}` (delivered, retried, failed,
dropped: one per attempt's outcome) and `lingstream_webhook_delivery_duration_seconds`, from an event to its
delivery (retries included). No endpoint, URL or secret is ever a label."""

from __future__ import annotations

from opentelemetry.metrics import Meter

from service.webhooks.dispatcher import DeliveryResult

__all__ = ["WEBHOOK_BUCKETS", "webhook_results"]

WEBHOOK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


def webhook_results(meter: Meter) -> DeliveryResult:
    """The dispatcher's `on_result`, counting on `meter`."""
    deliveries = meter.create_counter(
        "lingstream.webhook.deliveries",
        unit="{delivery}",
        description="Webhook delivery attempts by result: delivered, retried (failed, tried again later), failed "
        "(given up), dropped (the queue was full).",
    )
    duration = meter.create_histogram(
        "lingstream.webhook.delivery.duration",
        unit="s",
        description="From a session's event to its webhook's delivery (2xx), retries included.",
        explicit_bucket_boundaries_advisory=WEBHOOK_BUCKETS,
    )

    def count(result: str, seconds: float | None) -> None:
        deliveries.add(1, {"result": result})
        if seconds is not None:
            duration.record(seconds)

    return count
