"""A create with the caller's LiveKit token over HTTP: stable codes for a token that cannot work (before the session
takes a place) and for one the server refuses (the session fails), the join details, and the transport chosen from
the settings when the replica has no LiveKit project of its own."""

from __future__ import annotations

import contextlib
import datetime
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from livekit import api

from service.errors import SettingsError
from service.logs import TokenRedactionFilter
from service.settings import load_settings
from service.transports import build_transport
from tests.support.fakes.livekit import FakeRoomFactory
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.service_harness import Harness, running_service, wait_status
from transport.livekit.config import LiveKitConfig
from transport.livekit.transport import LiveKitTransport

CALLER_URL = "wss://caller.livekit.example"
CALLER_KEY, CALLER_SECRET = "APIcaller", "caller-secret-long-enough-for-hs256-0123456789"
PACED = {"pace_s": 0.05, "frame_size": 32}


def caller_token(secret: str = CALLER_SECRET, **grants: Any) -> str:
    spelled: dict[str, Any] = {"room_join": True, "room": "lobby", "can_update_own_metadata": True} | grants
    return (
        api.AccessToken(CALLER_KEY, secret)
        .with_identity("world-1")
        .with_kind("agent")
        .with_grants(api.VideoGrants(**spelled))
        .with_ttl(datetime.timedelta(minutes=10))
        .to_jwt()
    )


@contextlib.asynccontextmanager
async def callers_only_service() -> AsyncIterator[tuple[Harness, FakeRoomFactory]]:
    """The service on a LiveKit transport with no project: callers' tokens only (the caller's server is scripted)."""
    factory = FakeRoomFactory(CALLER_KEY, CALLER_SECRET)
    config = LiveKitConfig(url="", api_key="", api_secret="", caller_urls=("wss://*.livekit.example",))
    transport = LiveKitTransport(config, room_factory=factory, timers=FakeTimers())
    async with running_service(transport=transport, world=PACED) as svc:  # type: ignore[arg-type]
        yield svc, factory


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def _create(token: str, **extra: str) -> dict[str, Any]:
    return {"livekit": {"url": CALLER_URL, "token": token, "controller_identity": "user-7", **extra}}


async def test_a_create_with_the_callers_token_joins_the_callers_room() -> None:
    async with callers_only_service() as (svc, factory):
        token = caller_token()
        created = await svc.create(_create(token, agent_identity="agent-7"))
        assert created.status_code == 201, created.text
        details = created.json()["transport"]
        assert (details["url"], details["room"], details["token"]) == (CALLER_URL, "lobby", None)
        assert (details["identity"], details["service_identity"]) == ("user-7", "world-1")
        assert factory.current.connects[0][1] == token
        assert factory.current.attributes["lk.publish_on_behalf"] == "agent-7"
        session = (await svc.client.get(f"/v1/sessions/{created.json()['id']}")).json()
        assert token not in str(session)  # the caller's credential is never echoed
        assert session["transport"]["url"] == CALLER_URL
        cancelled = await svc.client.delete(f"/v1/sessions/{session['id']}", params={"mode": "cancel"})
        assert cancelled.status_code in (200, 202)
        await wait_status(svc, session["id"], "closed")
        assert factory.current.disconnects == 1  # left the caller's room


async def test_tokens_that_cannot_work_are_refused_before_the_session_takes_a_place() -> None:
    async with callers_only_service() as (svc, factory):
        no_attributes = caller_token(can_update_own_metadata=False)
        refused = await svc.create(_create(no_attributes))
        assert _error(refused) == (422, "livekit_token_invalid")
        assert "canUpdateOwnMetadata" in refused.json()["error"]["message"]
        assert no_attributes not in refused.text
        elsewhere = {"livekit": {"url": "wss://evil.example", "token": caller_token(), "controller_identity": "u"}}
        assert _error(await svc.create(elsewhere)) == (422, "livekit_token_invalid")
        no_controller = {"livekit": {"url": CALLER_URL, "token": caller_token()}}
        assert _error(await svc.create(no_controller)) == (422, "invalid_request")
        # This replica has no project: a create must bring a token.
        assert _error(await svc.create({})) == (422, "livekit_token_invalid")
        assert _error(await svc.create({"livekit": {"room": "lobby"}})) == (422, "livekit_token_invalid")
        assert (await svc.client.get("/v1/sessions")).json()["sessions"] == []
        assert factory.rooms == []


async def test_a_token_the_server_refuses_fails_the_session_with_a_stable_code() -> None:
    async with callers_only_service() as (svc, _factory):
        forged = caller_token(secret="not-the-callers-secret-but-long-enough-0123456789")
        refused = await svc.create(_create(forged))
        assert _error(refused) == (422, "livekit_token_refused")
        assert forged not in refused.text
        (session,) = (await svc.client.get("/v1/sessions")).json()["sessions"]
        assert (session["status"], session["error"]["code"]) == ("failed", "livekit_token_refused")
        assert forged not in str(session)
        await wait_status(svc, session["id"], "failed")


def test_the_transport_is_livekit_for_callers_tokens_only_when_only_caller_urls_are_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LINGSTREAM_LIVEKIT_CALLER_URLS", "wss://*.livekit.cloud, ws://10.0.0.5:7880")
    transport = build_transport(load_settings())
    assert isinstance(transport, LiveKitTransport)
    assert not transport.config.has_project
    assert transport.config.caller_urls == ("wss://*.livekit.cloud", "ws://10.0.0.5:7880")
    monkeypatch.setenv("LINGSTREAM_LIVEKIT_CALLER_URLS", "livekit.cloud")
    with pytest.raises(SettingsError, match="not a LiveKit server pattern"):
        load_settings()


def test_the_log_handler_redacts_tokens_from_messages_and_tracebacks() -> None:
    token = caller_token()
    record = logging.LogRecord(
        "livekit", logging.ERROR, __file__, 1, "401 Unauthorized - invalid token: %s", (token,), None
    )
    try:
        raise RuntimeError(f"invalid token: {token}")
    except RuntimeError as exc:
        record.exc_info = (type(exc), exc, exc.__traceback__)
    assert TokenRedactionFilter().filter(record)
    assert record.getMessage() == "401 Unauthorized - invalid token: [redacted]"
    assert record.exc_text is not None
    assert token not in record.exc_text
    assert token not in logging.Formatter().format(record)
