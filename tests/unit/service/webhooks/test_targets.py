"""Which endpoints a session's events go to, and which URLs a create may name: the allow-list and the refusal of
internal addresses (no SSRF), unless the operator allows them explicitly."""

from __future__ import annotations

import pytest

from service.errors import WebhookUrlRefusedError
from service.webhooks.targets import WebhookTargets, redact_url

PUBLIC = "http://93.184.216.34/hooks/abc"  # an address literal: no name lookup needed


async def test_a_url_under_an_allowed_prefix_that_resolves_publicly_is_taken() -> None:
    targets = WebhookTargets(allowed_prefixes=("http://93.184.216.34/hooks/",))
    assert await targets.check_own(PUBLIC) == PUBLIC


@pytest.mark.parametrize(
    ("prefixes", "url", "match"),
    [
        ((), PUBLIC, "takes no per-session webhook URL"),
        (("https://hooks.example.com/",), PUBLIC, "under none of the allowed prefixes"),
        (("http://",), "ftp://example.com/x", "http or https"),
        (("http://",), "http://user:pw@93.184.216.34/x", "credentials"),
        (("http://",), "http://127.0.0.1:9/x", "internal address"),
        (("http://",), "http://localhost:9/x", "internal address"),
        (("http://",), "http://169.254.169.254/latest/meta-data", "internal address"),
        (("http://",), "http://10.0.0.7/x", "internal address"),
        (("http://",), "http://[::1]:9/x", "internal address"),
        (("http://",), "http://[::ffff:127.0.0.1]:9/x", "internal address"),
        (("http://",), "http://0.0.0.0:9/x", "internal address"),
    ],
)
async def test_refused_urls_say_why(prefixes: tuple[str, ...], url: str, match: str) -> None:
    with pytest.raises(WebhookUrlRefusedError, match=match) as caught:
        await WebhookTargets(allowed_prefixes=prefixes).check_own(url)
    assert "pw@" not in str(caught.value)


async def test_internal_addresses_are_taken_only_when_allowed_explicitly() -> None:
    targets = WebhookTargets(allowed_prefixes=("http://127.0.0.1:",), allow_private=True)
    assert await targets.check_own("http://127.0.0.1:9/x") == "http://127.0.0.1:9/x"


def test_a_keys_own_list_replaces_the_deployments_and_a_creates_url_is_added() -> None:
    targets = WebhookTargets(deployment=("http://a/",), by_owner={"k1": ("http://k1/",), "k2": ()})
    assert targets.of("other", None) == ("http://a/",)
    assert targets.of("k1", "http://own/") == ("http://k1/", "http://own/")
    assert targets.of("k2", None) == ()
    assert targets.of("other", "http://a/") == ("http://a/",)


def test_logs_show_scheme_host_and_port_only() -> None:
    assert redact_url("https://hooks.example.com:8443/t/secret-token?sig=1") == "https://hooks.example.com:8443/…"
