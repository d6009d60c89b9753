"""The signature of lingstream's outgoing webhooks: how the service signs a delivery and how a receiver checks it.

Every delivery carries the header `Lingstream-Signature: t=<unix seconds>,v1=<hex>`, where `v1` is
HMAC-SHA256(secret, f"{t}.".encode() + body) over the exact body bytes. A receiver recomputes it with the shared
secret, compares in constant time, and refuses a `t` further than the replay window (`tolerance_s`, 300 s by
default) from its own clock, so a captured delivery cannot be replayed later. Several `v1=` entries may appear
(a secret being rotated); one match is enough. The event's `id` stays the same across retries of one delivery: a
receiver that has seen an id already has handled it (at-least-once delivery).

Standard library only: the service signs with `sign`, and integrators verify with `verify_webhook` (re-exported by
`transport.client`)::

    from transport.client import WebhookSignatureError, verify_webhook

    try:
        event = verify_webhook(secret, request_body, request.headers["Lingstream-Signature"])
    except WebhookSignatureError:
        return 400
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Mapping

__all__ = [
    "DEFAULT_TOLERANCE_S",
    "SIGNATURE_HEADER",
    "WebhookSignatureError",
    "sign",
    "verify_webhook",
]

SIGNATURE_HEADER = "Lingstream-Signature"
DEFAULT_TOLERANCE_S = 300.0
"""The replay window: a delivery signed longer ago (or further ahead) than this is refused."""


class WebhookSignatureError(ValueError):
    """The delivery is not signed by a holder of the secret, its header is malformed, or it is outside the window."""


def _digest(secret: str | bytes, timestamp: int, body: bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def sign(secret: str | bytes, body: bytes, timestamp: int) -> str:
    """The `Lingstream-Signature` header value of `body` sent at Unix second `timestamp`."""
    return f"t={timestamp},v1={_digest(secret, timestamp, body)}"


def verify_webhook(
    secret: str | bytes,
    body: bytes,
    header: str | None,
    *,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
    now: float | None = None,
) -> Mapping[str, object]:
    """Check a delivery's signature header against `body` (the raw bytes received) and return the parsed event.

    Raises `WebhookSignatureError` when the header is missing or malformed, no `v1` matches, or `t` is more than
    `tolerance_s` from `now` (default: this machine's clock).
    """
    if not header:
        raise WebhookSignatureError(f"no {SIGNATURE_HEADER} header")
    timestamp: int | None = None
    candidates: list[str] = []
    for part in header.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise WebhookSignatureError(f"malformed {SIGNATURE_HEADER} header")
        if name == "t":
            try:
                timestamp = int(value)
            except ValueError:
                raise WebhookSignatureError(f"malformed timestamp in the {SIGNATURE_HEADER} header") from None
        elif name == "v1":
            candidates.append(value)
    if timestamp is None or not candidates:
        raise WebhookSignatureError(f"the {SIGNATURE_HEADER} header needs t= and v1=")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        raise WebhookSignatureError(
            f"the delivery was signed {current - timestamp:.0f} s from now, outside the {tolerance_s:g} s window"
        )
    expected = _digest(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, candidate) for candidate in candidates):
        raise WebhookSignatureError("the signature does not match")
    try:
        event = json.loads(body)
    except ValueError:
        raise WebhookSignatureError("the signed body is not JSON") from None
    if not isinstance(event, dict):
        raise WebhookSignatureError("the signed body is not a JSON object")
    return event
