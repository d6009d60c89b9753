"""Per-key quotas through the service on one process: the settings that configure them (and their start errors),
and `POST /v1/sessions` answering 429 `quota_exceeded` with the limit, without touching the queue or other keys."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from admission import KeyQuota
from service.api_keys import key_id
from service.config_records import ServiceConfig
from service.errors import SettingsError
from service.settings import load_settings
from tests.support.service_harness import metric, running_service

KEY_A, KEY_B = "alpha-key-0001", "beta-key-0002"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _id_of(key: str) -> str:
    settings = load_settings(api_keys=key)
    (only,) = settings.key_ids
    return only


async def test_a_key_over_max_running_gets_429_quota_exceeded_and_another_key_is_untouched() -> None:
    async with running_service(
        api_keys=f"{KEY_A},{KEY_B}", max_sessions_per_worker=2, queue_size=4, key_max_running=1
    ) as svc:
        first = await svc.create(headers=_bearer(KEY_A))
        assert first.status_code == 201, first.text
        refused = await svc.create(headers=_bearer(KEY_A))
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "quota_exceeded"
        assert "max_running=1" in error["message"]
        assert "Retry-After" not in refused.headers
        other = await svc.create(headers=_bearer(KEY_B))
        assert other.status_code == 201, other.text
        stats = svc.runtime.statistics().admission
        assert (stats.queue_depth, stats.quota_rejected_total) == (0, 1)
        svc.controller.check_invariants()
        # The key's session ends: it may create again.
        await svc.client.delete(f"/v1/sessions/{first.json()['id']}?mode=cancel", headers=_bearer(KEY_A))
        again = await svc.create(headers=_bearer(KEY_A))
        assert again.status_code == 201, again.text
        text = (await svc.client.get("/metrics")).text
        assert metric(text, 'lingstream_admissions_total{result="rejected_quota"}') == 1
        assert metric(text, 'lingstream_admissions_total{result="rejected_queue_full"}') == 0


async def test_concurrent_creates_of_one_key_are_bounded_exactly_in_memory() -> None:
    async with running_service(
        api_keys=f"{KEY_A},{KEY_B}", num_workers=2, max_sessions_per_worker=2, queue_size=8, key_max_running=3
    ) as svc:
        answers = await asyncio.gather(*(svc.create(headers=_bearer(KEY_A)) for _ in range(20)))
        others = await asyncio.gather(*(svc.create(headers=_bearer(KEY_B)) for _ in range(2)))
        codes = sorted(answer.status_code for answer in answers)
        assert codes.count(429) == 17
        assert len([code for code in codes if code in (201, 202)]) == 3
        assert all(answer.status_code in (201, 202) for answer in others)
        svc.controller.check_invariants()  # includes: no owner over its quota, per-owner counts exact


async def test_a_per_key_override_in_the_config_file_beats_the_default(tmp_path: Path) -> None:
    config = tmp_path / "lingstream.json"
    config.write_text(json.dumps({"key_quotas": {_id_of(KEY_B): {"max_queued": 0}}, "key_max_queued": 2}))
    async with running_service(
        api_keys=f"{KEY_A},{KEY_B}", max_sessions_per_worker=1, queue_size=4, config_file=config
    ) as svc:
        assert (await svc.create(headers=_bearer(KEY_A))).status_code == 201
        assert (await svc.create(headers=_bearer(KEY_A))).status_code == 202  # A may wait (default: 2)
        refused = await svc.create(headers=_bearer(KEY_B))  # B may not wait at all
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "quota_exceeded"
        assert "max_queued=0" in refused.json()["error"]["message"]
        assert svc.runtime.statistics().admission.queue_depth == 1


def test_settings_turn_into_each_owners_quota() -> None:
    settings = load_settings(
        api_keys=f"{KEY_A},{KEY_B}",
        key_max_running=3,
        key_quotas={_id_of(KEY_A).upper(): {"max_queued": 1}, _id_of(KEY_B): {"max_running": None}},
    )
    config = ServiceConfig.from_settings(settings).admission
    owners = dict(config.key_quotas)
    assert {key_id(owner) for owner in owners} == {_id_of(KEY_A), _id_of(KEY_B)}
    assert config.default_quota == KeyQuota(max_running=3)
    quotas = {key_id(owner): quota for owner, quota in owners.items()}
    assert quotas[_id_of(KEY_A)] == KeyQuota(max_running=3, max_queued=1)  # unnamed fields keep the default
    assert quotas[_id_of(KEY_B)] == KeyQuota()  # an explicit null lifts the bound


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"key_max_running": 0}, "LINGSTREAM_KEY_MAX_RUNNING: Input should be greater than or equal to 1"),
        ({"key_max_queued": -1}, "LINGSTREAM_KEY_MAX_QUEUED: Input should be greater than or equal to 0"),
        ({"key_quotas": {"key-000000000000": {"max_running": 1}}}, "names unknown key id(s) key-000000000000"),
        ({"key_quotas": {"@A": {"max_runing": 1}}}, "@A.max_runing: Extra inputs are not permitted"),
        ({"key_quotas": {"@A": {"max_queued": -2}}}, "@A.max_queued: Input should be greater than or equal to 0"),
        ({"key_quotas": "not json"}, "LINGSTREAM_KEY_QUOTAS: must be a JSON object"),
    ],
)
def test_quota_config_errors_are_clear_start_errors(overrides: dict[str, Any], expected: str) -> None:
    alpha = _id_of(KEY_A)
    quotas = overrides.get("key_quotas")
    if isinstance(quotas, dict):
        overrides["key_quotas"] = {name.replace("@A", alpha): entry for name, entry in quotas.items()}
    with pytest.raises(SettingsError) as caught:
        load_settings(api_keys=f"{KEY_A},{KEY_B}", **overrides)
    assert expected.replace("@A", alpha) in str(caught.value)
    assert KEY_A not in str(caught.value)


def test_without_api_keys_the_only_key_id_is_anonymous() -> None:
    with pytest.raises(SettingsError, match="the only key id is anonymous"):
        load_settings(key_quotas={"key-000000000000": {"max_running": 1}})
    settings = load_settings(key_quotas={"anonymous": {"max_running": 2}})
    (entry,) = ServiceConfig.from_settings(settings).admission.key_quotas
    assert entry == ("anonymous", KeyQuota(max_running=2))
