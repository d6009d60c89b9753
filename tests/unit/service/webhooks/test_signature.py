"""The client's verification helper against the service's signature: the body as sent verifies; a changed body,
another secret, a stale or future timestamp and a malformed header do not."""

from __future__ import annotations

import json

import pytest

from transport.client import SIGNATURE_HEADER, WebhookSignatureError, verify_webhook
from transport.webhook_signature import sign

SECRET = "whsec-0123456789abcdef"
BODY = json.dumps({"id": "evt_1", "type": "session.ended", "created_at": 1.0, "data": {}}).encode()


def test_a_signed_body_verifies_and_parses() -> None:
    header = sign(SECRET, BODY, 1_000)
    assert header.startswith("t=1000,v1=")
    assert verify_webhook(SECRET, BODY, header, now=1_100)["id"] == "evt_1"
    assert SIGNATURE_HEADER == "Lingstream-Signature"


def test_one_matching_entry_among_several_is_enough() -> None:
    good = sign(SECRET, BODY, 1_000).split(",")[1]
    other = sign("another-secret-0000", BODY, 1_000).split(",")[1]
    assert verify_webhook(SECRET, BODY, f"t=1000,{other},{good}", now=1_000)["type"] == "session.ended"


@pytest.mark.parametrize(
    ("secret", "body", "now", "match"),
    [
        (SECRET, BODY + b" ", 1_000, "does not match"),
        ("wrong-secret-000000", BODY, 1_000, "does not match"),
        (SECRET, BODY, 1_301, "outside the 300 s window"),
        (SECRET, BODY, 699, "outside"),
    ],
)
def test_tampered_foreign_and_replayed_deliveries_are_refused(secret: str, body: bytes, now: int, match: str) -> None:
    header = sign(SECRET, BODY, 1_000)
    with pytest.raises(WebhookSignatureError, match=match):
        verify_webhook(secret, body, header, now=now)


@pytest.mark.parametrize("header", [None, "", "v1=abc", "t=1000", "t=soon,v1=abc", "garbage"])
def test_a_missing_or_malformed_header_is_refused(header: str | None) -> None:
    with pytest.raises(WebhookSignatureError):
        verify_webhook(SECRET, BODY, header, now=1_000)
