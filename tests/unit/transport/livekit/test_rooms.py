"""Room management with the real livekit-api client against an in-process Twirp RoomService, and webhooks."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from livekit import api

from tests.support.fakes.livekit import FakeRoomService, sign_webhook, webhook_body
from transport.errors import (
    RoomServiceAuthError,
    RoomServiceError,
    RoomServiceUnavailableError,
    TransportClosedError,
    TransportConfigError,
    WebhookError,
)
from transport.livekit.config import LiveKitConfig
from transport.livekit.events import ParticipantJoined, ParticipantLeft, RoomFinished
from transport.livekit.rooms import ParticipantEntry, RoomConfig, RoomManager, room_capacity
from transport.livekit.webhooks import WebhookHandler
from transport.session.viewers import DEFAULT_MAX_VIEWERS

KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"


@pytest.fixture
async def server() -> AsyncIterator[FakeRoomService]:
    fake = FakeRoomService(KEY, SECRET)
    await fake.start()
    yield fake
    await fake.close()


@pytest.fixture
async def manager(server: FakeRoomService) -> AsyncIterator[RoomManager]:
    rooms = RoomManager(server.url, KEY, SECRET, RoomConfig(empty_timeout=30, departure_timeout=15, max_participants=5))
    await rooms.start()
    yield rooms
    await rooms.aclose()


async def test_create_room_sends_timeouts_and_limits(server: FakeRoomService, manager: RoomManager) -> None:
    info = await manager.create_room("lingstream-s1", metadata='{"session_id":"s1"}')
    assert (info.name, info.empty_timeout, info.departure_timeout, info.max_participants) == (
        "lingstream-s1",
        30,
        15,
        5,
    )
    (call,) = server.calls_of("CreateRoom")
    request = call.request
    assert isinstance(request, api.CreateRoomRequest)
    assert (request.name, request.empty_timeout, request.departure_timeout, request.max_participants) == (
        "lingstream-s1",
        30,
        15,
        5,
    )
    assert request.metadata == '{"session_id":"s1"}'
    assert call.grants.room_create


async def test_delete_room_is_idempotent(server: FakeRoomService, manager: RoomManager) -> None:
    await manager.create_room("r1")
    assert await manager.delete_room("r1") is True
    assert await manager.delete_room("r1") is False  # not_found is fine
    assert "r1" not in server.rooms
    assert len(server.calls_of("DeleteRoom")) == 2


async def test_list_and_participant_calls_use_room_admin_grants(server: FakeRoomService, manager: RoomManager) -> None:
    await manager.create_room("r1")
    await manager.create_room("r2")
    server.participants["r1"] = ["ctl-s1-aa", "svc-s1-bb", "svc-s2-cc"]
    server.joined_at_ms["svc-s1-bb"] = 1_700_000_000_123
    server.joined_at_s["svc-s2-cc"] = 1_700_000_001  # a server that gives whole seconds only
    assert {room.name for room in await manager.list_rooms()} == {"r1", "r2"}
    assert [room.name for room in await manager.list_rooms(["r2"])] == ["r2"]
    assert await manager.list_participants("r1") == (
        ParticipantEntry("ctl-s1-aa", 0),
        ParticipantEntry("svc-s1-bb", 1_700_000_000_123),
        ParticipantEntry("svc-s2-cc", 1_700_000_001_000),
    )
    assert await manager.remove_participant("r1", "ctl-s1-aa") is True
    assert await manager.remove_participant("r1", "ctl-s1-aa") is False
    (listing,) = server.calls_of("ListParticipants")
    assert listing.grants.room_admin
    assert listing.grants.room == "r1"


async def test_wrong_secret_is_an_auth_error(server: FakeRoomService) -> None:
    rooms = RoomManager(server.url, KEY, "not-the-secret-but-long-enough-0123456789")
    await rooms.start()
    try:
        with pytest.raises(RoomServiceAuthError) as caught:
            await rooms.create_room("r1")
    finally:
        await rooms.aclose()
    assert caught.value.code == "unauthenticated"
    assert caught.value.status == 401
    assert isinstance(caught.value.__cause__, api.ServerError)


async def test_server_failures_are_translated(server: FakeRoomService, manager: RoomManager) -> None:
    server.fail_next["CreateRoom"] = ("internal", "boom")
    with pytest.raises(RoomServiceUnavailableError, match="boom"):
        await manager.create_room("r1")
    server.fail_next["CreateRoom"] = ("invalid_argument", "bad name")
    with pytest.raises(RoomServiceError, match="bad name") as caught:
        await manager.create_room("r1")
    assert type(caught.value) is RoomServiceError
    server.fail_next["DeleteRoom"] = ("permission_denied", "nope")
    with pytest.raises(RoomServiceAuthError):
        await manager.delete_room("r1")


async def test_unreachable_server_is_unavailable() -> None:
    fake = FakeRoomService(KEY, SECRET)
    url = await fake.start()
    await fake.close()  # nothing listens there any more
    rooms = RoomManager(url, KEY, SECRET, RoomConfig(request_timeout=2.0))
    await rooms.start()
    try:
        with pytest.raises(RoomServiceUnavailableError):
            await rooms.create_room("r1")
    finally:
        await rooms.aclose()


async def test_calls_before_start_are_refused() -> None:
    rooms = RoomManager("http://127.0.0.1:9", KEY, SECRET)
    with pytest.raises(TransportClosedError):
        await rooms.create_room("r1")


@pytest.mark.parametrize(
    "settings",
    [{"empty_timeout": 0}, {"departure_timeout": 0}, {"max_participants": -1}, {"request_timeout": 0}],
)
def test_invalid_room_config_is_refused(settings: dict[str, float]) -> None:
    with pytest.raises(TransportConfigError):
        RoomConfig(**settings)  # type: ignore[arg-type]


# -- webhooks ------------------------------------------------------------------------------------------------------


def test_signed_webhook_of_the_controller_maps_to_room_events() -> None:
    handler = WebhookHandler(KEY, SECRET)
    joined = webhook_body("participant_joined", "lingstream-s1", "ctl-s1-abc")
    assert handler.receive(joined, sign_webhook(joined, KEY, SECRET)) == ParticipantJoined(
        "lingstream-s1", "ctl-s1-abc"
    )
    left = webhook_body("participant_left", "lingstream-s1", "ctl-s1-abc")
    assert handler.receive(left.encode(), "Bearer " + sign_webhook(left, KEY, SECRET)) == ParticipantLeft(
        "lingstream-s1", "ctl-s1-abc"
    )
    finished = webhook_body("room_finished", "lingstream-s1")
    assert handler.receive(finished, sign_webhook(finished, KEY, SECRET)) == RoomFinished("lingstream-s1")


def test_a_viewer_leaving_maps_to_participant_left_so_its_place_is_freed() -> None:
    handler = WebhookHandler(KEY, SECRET)
    left = webhook_body("participant_left", "lingstream-s1", "view-s1-abc")
    assert handler.receive(left, sign_webhook(left, KEY, SECRET)) == ParticipantLeft("lingstream-s1", "view-s1-abc")


def test_verified_events_nobody_acts_on_map_to_none() -> None:
    handler = WebhookHandler(KEY, SECRET)
    for body in (
        webhook_body("participant_left", "lingstream-s1", "guest-s1-abc"),  # nobody the service issued
        webhook_body("participant_joined", "lingstream-s1", "svc-s1-abc"),
        webhook_body("track_published", "lingstream-s1", "svc-s1-abc"),
        webhook_body("room_started", "lingstream-s1"),
    ):
        assert handler.receive(body, sign_webhook(body, KEY, SECRET)) is None


def test_tampered_webhook_is_rejected() -> None:
    handler = WebhookHandler(KEY, SECRET)
    body = webhook_body("participant_left", "lingstream-s1", "ctl-s1-abc")
    auth = sign_webhook(body, KEY, SECRET)
    tampered = body.replace("ctl-s1-abc", "ctl-s2-abc")
    with pytest.raises(WebhookError, match="verification"):
        handler.receive(tampered, auth)


def test_webhook_signed_with_another_key_is_rejected() -> None:
    handler = WebhookHandler(KEY, SECRET)
    body = webhook_body("room_finished", "lingstream-s1")
    with pytest.raises(WebhookError):
        handler.receive(body, sign_webhook(body, KEY, "another-secret-that-is-long-enough-0123456789"))
    with pytest.raises(WebhookError):
        handler.receive(body, sign_webhook(body, "other-key", SECRET))


def test_webhook_without_authorization_or_with_garbage_is_rejected() -> None:
    handler = WebhookHandler(KEY, SECRET)
    body = webhook_body("room_finished", "lingstream-s1")
    with pytest.raises(WebhookError, match="Authorization"):
        handler.receive(body, None)
    with pytest.raises(WebhookError):
        handler.receive(body, "not-a-jwt")
    with pytest.raises(WebhookError, match="UTF-8"):
        handler.receive(b"\xff" + body.encode(), sign_webhook(body, KEY, SECRET))
    not_json = "{not json"
    with pytest.raises(WebhookError):
        handler.receive(not_json, sign_webhook(not_json, KEY, SECRET))
    with pytest.raises(WebhookError, match="over"):
        WebhookHandler(KEY, SECRET, max_body_bytes=10).receive(body, sign_webhook(body, KEY, SECRET))


def test_a_rooms_capacity_is_the_controller_the_service_and_every_viewer_place() -> None:
    assert room_capacity(8) == 9  # the service participant (kind agent) is not counted by the server
    assert room_capacity(0) == 1  # no viewers: the controller
    assert room_capacity(None) == 0  # viewers unbounded: so is the room
    assert RoomConfig().max_participants == room_capacity(DEFAULT_MAX_VIEWERS)


def test_a_room_smaller_than_the_viewer_places_is_refused_at_start() -> None:
    """A real server refuses a join past the room's max_participants: a room of 6 with 8 viewer places would give
    viewers 5 to 8 a 201 and a join the server refuses."""
    with pytest.raises(TransportConfigError, match="below what 8 viewers need"):
        LiveKitConfig(url="ws://lk", api_key="k", api_secret="s", max_viewers=8, room=RoomConfig(max_participants=6))
    assert LiveKitConfig(url="ws://lk", api_key="k", api_secret="s", max_viewers=8).room.max_participants == 9
    unbounded = RoomConfig(max_participants=0)
    assert LiveKitConfig(url="ws://lk", api_key="k", api_secret="s", max_viewers=8, room=unbounded).room == unbounded
