"""Usage metering through the service on one process: `GET /v1/usage` for the caller's key, the same counters at
`/metrics` labelled by key id (never the key), and `since` errors with their stable code."""

from __future__ import annotations

import time
from datetime import datetime

import httpx

from service.settings import load_settings
from tests.support.fakes.clock import FakeClock
from tests.support.service_harness import metric, running_service
from tests.support.waits import until

KEY_A, KEY_B = "alpha-key-0001", "beta-key-0002"


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _id_of(key: str) -> str:
    (only,) = load_settings(api_keys=key).key_ids
    return only


async def _usage(client: httpx.AsyncClient, key: str, **params: str) -> dict[str, object]:
    response = await client.get("/v1/usage", headers=_bearer(key), params=params)
    assert response.status_code == 200, response.text
    body: dict[str, object] = response.json()
    return body


async def test_usage_counts_each_keys_sessions_waits_running_time_chunks_and_frames() -> None:
    clock = FakeClock()
    async with running_service(
        api_keys=f"{KEY_A},{KEY_B}", clock=clock, max_sessions_per_worker=1, key_max_running=3
    ) as svc:
        started = time.time()
        first = (await svc.create(headers=_bearer(KEY_A))).json()["id"]
        queued = await svc.create(headers=_bearer(KEY_B))
        assert queued.status_code == 202
        svc.world.emit(first, 3)
        await until(
            lambda: svc.runtime.statistics().usage.get(_id_of(KEY_A), None) is not None, "key A's usage record", every=0
        )
        await until(
            lambda: svc.runtime.statistics().usage[_id_of(KEY_A)].chunks == 3, "key A's three chunks counted", every=0
        )
        clock.advance(12.5)  # A runs, B waits
        body = await _usage(svc.client, KEY_A)
        assert body["key"] == _id_of(KEY_A)
        assert (body["sessions"], body["chunks"], body["frames"]) == (1, 3, 3)
        assert body["running_seconds"] == 12.5  # up to now: a read counts the running time so far
        assert body["queued_seconds"] == 0.0
        assert body["quota"] == {"max_running": 3, "max_queued": None}
        deleted = await svc.client.delete(f"/v1/sessions/{first}?mode=cancel", headers=_bearer(KEY_A))
        assert deleted.status_code == 200, deleted.text
        await until(lambda: svc.runtime.statistics().admission.retained_total == 1, "B admitted", every=0)  # B admitted
        b_body = await _usage(svc.client, KEY_B)
        assert (b_body["sessions"], b_body["queued_seconds"], b_body["chunks"]) == (1, 12.5, 0)
        a_body = await _usage(svc.client, KEY_A)
        assert a_body["running_seconds"] == 12.5  # ended: nothing more
        # The counted window: from the start of the hour asked for, to now.
        assert str(a_body["since"]).endswith(("Z", "+00:00"))
        assert time.time() + 1 >= _epoch(str(a_body["until"])) >= started - 1
        recent = await _usage(svc.client, KEY_A, since=str(int(time.time()) - 60))
        assert recent["sessions"] == 1
        text = (await svc.client.get("/metrics")).text
        key_a = _id_of(KEY_A)
        assert metric(text, f'lingstream_usage_running_seconds_total{{key="{key_a}"}}') == 12.5
        assert metric(text, f'lingstream_usage_chunks_total{{key="{key_a}"}}') == 3
        assert metric(text, f'lingstream_usage_frames_total{{key="{key_a}"}}') == 3
        assert metric(text, f'lingstream_usage_sessions_total{{key="{_id_of(KEY_B)}"}}') == 1
        assert metric(text, f'lingstream_usage_queued_seconds_total{{key="{_id_of(KEY_B)}"}}') == 12.5
        assert KEY_A not in text
        assert KEY_B not in text


async def test_usage_needs_the_key_and_a_valid_since() -> None:
    async with running_service(api_keys=KEY_A) as svc:
        assert (await svc.client.get("/v1/usage")).status_code == 401
        assert (await svc.client.get("/v1/usage", headers=_bearer("wrong"))).status_code == 401
        for since in ("yesterday", "2026-12-01T18:00:00", "nan", str(time.time() + 3600)):
            response = await svc.client.get("/v1/usage", headers=_bearer(KEY_A), params={"since": since})
            assert response.status_code == 422, since
            assert response.json()["error"]["code"] == "invalid_since"
        empty = await _usage(svc.client, KEY_A, since="2020-01-01T00:00:00Z")  # clamped to what is kept
        assert (empty["sessions"], empty["running_seconds"]) == (0, 0.0)


async def test_without_api_keys_the_anonymous_caller_has_usage() -> None:
    async with running_service() as svc:
        session = (await svc.create()).json()["id"]
        svc.world.emit(session, 2)
        await until(
            lambda: svc.runtime.statistics().usage.get("anonymous", None) is not None,
            "the anonymous usage record",
            every=0,
        )
        await until(
            lambda: svc.runtime.statistics().usage["anonymous"].chunks == 2, "the anonymous two chunks counted", every=0
        )
        body = (await svc.client.get("/v1/usage")).json()
        assert (body["key"], body["sessions"], body["chunks"]) == ("anonymous", 1, 2)


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
