"""Webhook settings: any endpoint needs the signing secret, endpoints are http(s) without credentials, a key's own
list (KEY_QUOTAS webhook_urls) replaces the deployment's for its sessions, and the secret never shows."""

from __future__ import annotations

import json
from typing import Any

import pytest

from service.api_keys import key_id
from service.errors import SettingsError
from service.settings import load_settings, owners_of
from service.webhooks.setup import webhook_targets

SECRET = "whsec-settings-0123456789"


@pytest.mark.parametrize(
    "overrides",
    [
        {"webhook_urls": "https://a.example.com/h"},
        {"webhook_allowed_prefixes": "https://hooks.example.com/"},
        {"webhook_urls": "https://a.example.com/h", "webhook_secret": "short"},
    ],
)
def test_any_endpoint_needs_a_signing_secret(overrides: dict[str, Any]) -> None:
    with pytest.raises(SettingsError, match="LINGSTREAM_WEBHOOK_SECRET"):
        load_settings(**overrides)


@pytest.mark.parametrize(
    ("url", "why"),
    [("ftp://a.example.com/h", "http or https"), ("https://u:p@a.example.com/h", "credentials"), ("https://", "host")],
)
def test_endpoints_are_http_urls_without_credentials(url: str, why: str) -> None:
    with pytest.raises(SettingsError, match=why) as caught:
        load_settings(webhook_urls=url, webhook_secret=SECRET)
    assert "u:p" not in str(caught.value)


def test_a_keys_own_list_replaces_the_deployments_and_the_secret_never_shows() -> None:
    keys = "key-one-0123456789abcdef,key-two-0123456789abcdef"
    one, two = owners_of(tuple(keys.split(",")))
    quotas = json.dumps(
        {key_id(one): {"webhook_urls": ["https://one.example.com/h"]}, key_id(two): {"webhook_urls": []}}
    )
    settings = load_settings(
        api_keys=keys, webhook_urls="https://all.example.com/h", webhook_secret=SECRET, key_quotas=quotas
    )
    targets = webhook_targets(settings)
    assert targets.of(one, None) == ("https://one.example.com/h",)
    assert targets.of(two, None) == ()
    assert SECRET not in repr(settings)
    with pytest.raises(SettingsError, match="webhook URL is refused"):
        load_settings(
            api_keys=keys, webhook_secret=SECRET, key_quotas=json.dumps({key_id(one): {"webhook_urls": ["x"]}})
        )
