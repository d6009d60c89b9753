"""The webhooks of a deployment, built once from its `Settings`: the endpoints by owner, the outbox (in memory, or
in Redis with the redis admission backend, so that another replica delivers what a lost one left pending), the
dispatcher and the emitter."""

from __future__ import annotations

import time
from collections.abc import Callable

from service.api_keys import ANONYMOUS, key_id
from service.settings import Settings, owners_of
from service.webhooks.dispatcher import DeliveryResult, WebhookDispatcher
from service.webhooks.emitter import WebhookEmitter
from service.webhooks.outbox import MemoryOutbox, Outbox
from service.webhooks.schedule import RetryPolicy
from service.webhooks.targets import WebhookTargets

__all__ = ["build_webhooks", "webhook_targets"]


def webhook_targets(settings: Settings) -> WebhookTargets:
    """Where each owner's sessions' events go, and which URLs a create may name."""
    owners = owners_of(settings.api_key_list) if settings.api_key_list else (ANONYMOUS,)
    by_owner: dict[str, tuple[str, ...]] = {}
    for owner in dict.fromkeys(owners):
        entry = settings.key_quotas.get(key_id(owner))
        if entry is not None and entry.webhook_urls is not None:
            by_owner[owner] = entry.webhook_urls
    return WebhookTargets(
        deployment=settings.webhook_urls,
        by_owner=by_owner,
        allowed_prefixes=settings.webhook_allowed_prefixes,
        allow_private=settings.webhook_allow_private,
    )


def build_webhooks(
    settings: Settings,
    *,
    replica_id: str | None,
    replica_ttl_s: float,
    on_result: DeliveryResult | None = None,
    clock: Callable[[], float] = time.time,
) -> WebhookEmitter | None:
    """The deployment's webhook emitter (None: no webhooks configured). With `replica_id` (the redis backend) the
    outbox is shared in Redis; a delivery claimed by a replica that vanished is taken by another once its lease
    ran out and the replica TTL passed."""
    if not settings.webhooks_configured or settings.webhook_secret is None:
        return None
    targets = webhook_targets(settings)
    outbox: Outbox
    if replica_id is not None and settings.redis_url is not None:
        from service.scaleout.webhook_outbox import RedisOutbox  # Redis only where it is used

        outbox = RedisOutbox(
            settings.redis_url.get_secret_value(),
            replica_id,
            capacity=settings.webhook_queue_size,
            lease_s=settings.webhook_timeout + 5.0,
            handover_s=replica_ttl_s,
        )
    else:
        outbox = MemoryOutbox(settings.webhook_queue_size, clock)
    dispatcher = WebhookDispatcher(
        outbox,
        secret=settings.webhook_secret.get_secret_value().encode(),
        policy=RetryPolicy(max_attempts=settings.webhook_max_attempts),
        timeout_s=settings.webhook_timeout,
        intake=settings.webhook_queue_size,
        allow_private=settings.webhook_allow_private,
        clock=clock,
        on_result=on_result,
    )
    return WebhookEmitter(targets, dispatcher, clock=clock)
