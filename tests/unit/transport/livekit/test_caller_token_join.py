"""Joining a caller's room with the caller's token (no project of the service's own), the service participant's
kind and attributes, on scripted rooms: what the transport joins with, when a room counts as taken, what a refused
token becomes, and how often the attributes change."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from livekit import api

from tests.support.fakes.livekit import FakeRoomFactory, FakeRoomService
from tests.support.fakes.transport_port import FakeSessionPort
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.waits import until
from transport.base import CallerRoom, StateStatus
from transport.errors import CallerTokenError, CallerTokenRefusedError, RoomInUseError, WebhookError
from transport.livekit.attributes import AttributeStatistics
from transport.livekit.config import LiveKitConfig
from transport.livekit.transport import LiveKitTransport

CALLER_URL = "wss://caller.livekit.example"
CALLER_KEY, CALLER_SECRET = "APIcaller", "caller-secret-long-enough-for-hs256-0123456789"
KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"


def caller_token(identity: str = "world-1", room: str = "lobby", secret: str = CALLER_SECRET) -> str:
    """What the caller's agent mints for the service: kind agent, one room, publish and own attributes."""
    return (
        api.AccessToken(CALLER_KEY, secret)
        .with_identity(identity)
        .with_kind("agent")
        .with_grants(api.VideoGrants(room_join=True, room=room, can_update_own_metadata=True))
        .with_ttl(datetime.timedelta(minutes=10))
        .to_jwt()
    )


class TimersClock:
    """The binding's clock read from the fake timers, so the attributes' rate bound moves with them."""

    def __init__(self, timers: FakeTimers) -> None:
        self._timers = timers

    def now(self) -> float:
        return self._timers.now


@dataclass
class Setup:
    factory: FakeRoomFactory
    timers: FakeTimers
    transport: LiveKitTransport


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    """A transport with no LiveKit project of its own: callers' tokens only, on the caller's server."""
    factory = FakeRoomFactory(CALLER_KEY, CALLER_SECRET)  # the caller's server verifies the caller's tokens
    timers = FakeTimers()
    config = LiveKitConfig(url="", api_key="", api_secret="", caller_urls=("wss://*.livekit.example",))
    transport = LiveKitTransport(config, room_factory=factory, timers=timers, clock=TimersClock(timers))
    await transport.start()
    yield Setup(factory, timers, transport)
    await transport.aclose()


def port(session_id: str = "s1", **room: str | None) -> FakeSessionPort:
    spec: dict[str, str | None] = {"controller_identity": "user-7", "agent_identity": "agent-7"}
    spec.update(room)
    caller = CallerRoom(
        "",
        spec["controller_identity"],
        url=spec.get("url", CALLER_URL),
        token=spec.get("token") or caller_token(),
        agent_identity=spec["agent_identity"],
    )
    return FakeSessionPort(session_id, caller_room=caller, ends_at=1_800_000_000.0)


async def test_the_service_joins_the_callers_room_with_the_callers_token(setup: Setup) -> None:
    token = caller_token()
    details = await setup.transport.attach(port(token=token))
    room = setup.factory.current
    assert room.connects[0][:2] == (CALLER_URL, token)
    assert room.kind == "agent"
    assert details["url"] == CALLER_URL
    assert details["room"] == "lobby"  # the token's room
    assert details["token"] is None  # the caller tokens its own controller
    assert details["identity"] == "user-7"
    assert details["service_identity"] == "world-1"  # the token's identity
    assert details["room_owner"] == "caller"
    # The attributes went out with the join: a late joiner, and any other replica, sees the session there.
    assert room.attributes == {
        "lingstream.session_id": "s1",
        "lingstream.controller": "user-7",
        "lingstream.ends_at": "1800000000",
        "lk.publish_on_behalf": "agent-7",
    }


async def test_a_room_where_someone_carries_a_session_is_in_use(setup: Setup) -> None:
    setup.factory.present.add("world-of-another-replica")
    setup.factory.remote_attributes["world-of-another-replica"] = {"lingstream.session_id": "s0"}
    with pytest.raises(RoomInUseError):
        await setup.transport.attach(port())
    assert setup.factory.current.disconnects == 1  # joined, looked, left
    assert setup.transport.statistics().sessions == 0
    # Anyone else in the room (the agent, the user) does not make it taken.
    setup.factory.present = {"agent-7", "user-7"}
    setup.factory.remote_attributes.clear()
    await setup.transport.attach(port())


async def test_the_same_room_is_not_joined_twice_from_one_replica(setup: Setup) -> None:
    await setup.transport.attach(port("s1"))
    with pytest.raises(RoomInUseError):
        await setup.transport.check_caller_room(port("s2").caller_room)


async def test_a_token_the_server_refuses_fails_with_its_own_error_and_never_quotes_it(setup: Setup) -> None:
    forged = caller_token(secret="not-the-callers-secret-but-long-enough-0123456789")
    with pytest.raises(CallerTokenRefusedError) as caught:
        await setup.transport.attach(port(token=forged))
    assert "401" in str(caught.value)
    assert forged not in str(caught.value)
    assert "[redacted]" in str(caught.value)


async def test_bad_tokens_and_urls_are_refused_before_anything_is_joined(setup: Setup) -> None:
    check = setup.transport.check_caller_room
    with pytest.raises(CallerTokenError, match="LINGSTREAM_LIVEKIT_CALLER_URLS"):
        await check(port(url="wss://elsewhere.example").caller_room)
    with pytest.raises(CallerTokenError, match="not the room the token grants"):
        await check(CallerRoom("other", "user-7", url=CALLER_URL, token=caller_token()))
    with pytest.raises(CallerTokenError, match="controller's"):
        await check(port(token=caller_token(identity="user-7")).caller_room)
    with pytest.raises(CallerTokenError, match="not a JWT"):
        await check(port(token="nonsense").caller_room)
    assert setup.factory.rooms == []
    resolved = await check(port().caller_room)
    assert resolved is not None
    assert resolved.name == "lobby"


async def test_without_a_project_only_callers_tokens_are_taken(setup: Setup) -> None:
    with pytest.raises(CallerTokenError, match="no LiveKit project"):
        await setup.transport.check_caller_room(None)  # a create that names no room
    with pytest.raises(CallerTokenError, match="no LiveKit project"):
        await setup.transport.check_caller_room(CallerRoom("lobby"))  # by name: needs RoomService and a secret
    with pytest.raises(WebhookError):
        setup.transport.handle_webhook("{}", "Bearer x")
    await setup.transport.attach(port())
    with pytest.raises(CallerTokenError, match="tokens the caller mints"):
        setup.transport.viewer_details("s1")


def test_a_config_needs_a_project_or_caller_urls() -> None:
    from transport.errors import TransportConfigError

    with pytest.raises(TransportConfigError, match="caller_urls"):
        LiveKitConfig(url="", api_key="", api_secret="")
    with pytest.raises(TransportConfigError, match="api_key and api_secret"):
        LiveKitConfig(url="ws://x", api_key="", api_secret="", caller_urls=("*",))


async def test_state_changes_reach_the_attributes_rate_bounded(setup: Setup) -> None:
    fake_port = port()
    await setup.transport.attach(fake_port)
    room = setup.factory.current

    def stats() -> AttributeStatistics:
        return setup.transport.session_statistics("s1").attributes

    fake_port.emit_status(StateStatus("admitted"))  # attached while admitted: not worth an update
    for count, state in enumerate(("running", "paused", "running"), start=2):  # the burst: each at once
        fake_port.emit_status(StateStatus(state))
        await until(lambda: len(room.attribute_updates) == count, "the update went out")  # noqa: B023
    assert [u.get("lingstream.state") for u in room.attribute_updates[1:]] == ["running", "paused", "running"]
    fake_port.emit_status(StateStatus("paused"))
    fake_port.emit_status(StateStatus("running"))
    fake_port.emit_status(StateStatus("paused"))
    await until(lambda: stats().offered == 6, "the changes were offered")  # admitted was not
    assert len(room.attribute_updates) == 4  # the bucket is empty: these wait, merged
    assert next(t.due for t in setup.timers.live) == 20.0  # the next token (the other: the controller's join timer)
    setup.timers.advance(20.0)
    await until(lambda: len(room.attribute_updates) == 5, "the merged update went out")
    assert room.attribute_updates[-1] == {"lingstream.state": "paused"}  # the latest, once
    assert room.attributes["lingstream.state"] == "paused"


async def test_a_rejoin_sets_every_attribute_again(setup: Setup) -> None:
    fake_port = port()
    await setup.transport.attach(fake_port)
    fake_port.emit_status(StateStatus("paused"))
    first = setup.factory.current
    await until(lambda: first.attributes.get("lingstream.state") == "paused", "the state reached the attributes")
    first.drop("SIGNAL_CLOSE")  # lost: the binding rejoins with the same token
    await setup.factory.wait_publishes(2)
    second = setup.factory.current
    assert second is not first
    assert second.connects[0][1] == first.connects[0][1]
    assert second.attribute_updates[0]["lingstream.state"] == "paused"
    assert second.attribute_updates[0]["lingstream.session_id"] == "s1"


async def test_the_services_own_participant_joins_as_an_agent_on_behalf_of_the_named_agent() -> None:
    server = FakeRoomService(KEY, SECRET)
    url = await server.start()
    factory = FakeRoomFactory(KEY, SECRET)
    transport = LiveKitTransport(
        LiveKitConfig(url=url, api_key=KEY, api_secret=SECRET), room_factory=factory, timers=FakeTimers()
    )
    await transport.start()
    try:
        await transport.attach(FakeSessionPort("own"))
        assert factory.current.kind == "agent"
        assert "lk.publish_on_behalf" not in factory.current.attributes
        # A caller's room by name, for an agent: the video is the agent's.
        server.rooms["lobby"] = api.Room(name="lobby", sid="RM_lobby")
        await transport.attach(FakeSessionPort("theirs", caller_room=CallerRoom("lobby", agent_identity="agent-7")))
        assert factory.current.kind == "agent"
        assert factory.current.attributes["lk.publish_on_behalf"] == "agent-7"
        assert factory.current.attributes["lingstream.session_id"] == "theirs"
    finally:
        await transport.aclose()
        await server.close()
