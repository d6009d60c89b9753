"""Webhooks out: each moment of a session's life (`session.queued|running|paused|resumed|warning|ended`,
`recording.ready|failed`) posted, signed, to the endpoints configured for it, at least once, with bounded retries.

`WebhookEmitter` (`emitter.py`) is the runtime's `SessionEvents`; it builds each `WebhookEvent` (`events.py`) for the
session's endpoints (`targets.py`: deployment, per key, per create under an allow-list, no internal addresses) and
hands the deliveries to the `WebhookDispatcher` (`dispatcher.py`), which keeps them in an `Outbox` (`outbox.py` in
memory, `redis_outbox.py` shared by replicas) and sends them on the pure retry schedule of `schedule.py`. The
signature is `transport.webhook_signature` (receivers verify with `transport.client.verify_webhook`).
docs/webhooks.md is the integrator's page.
"""

from __future__ import annotations

from service.webhooks.dispatcher import DispatcherStatistics, WebhookDispatcher
from service.webhooks.emitter import WebhookEmitter, event_data
from service.webhooks.events import SessionTally, WebhookEvent
from service.webhooks.outbox import Delivery, MemoryOutbox, Outbox, OutboxStatistics
from service.webhooks.schedule import Decision, RetryPolicy, Verdict
from service.webhooks.targets import WebhookTargets, check_public, redact_url, url_problem

__all__ = [
    "Decision",
    "Delivery",
    "DispatcherStatistics",
    "MemoryOutbox",
    "Outbox",
    "OutboxStatistics",
    "RetryPolicy",
    "SessionTally",
    "Verdict",
    "WebhookDispatcher",
    "WebhookEmitter",
    "WebhookEvent",
    "WebhookTargets",
    "check_public",
    "event_data",
    "redact_url",
    "url_problem",
]
