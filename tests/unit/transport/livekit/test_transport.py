"""The LiveKit transport end to end without a server: real livekit-api against the fake Twirp RoomService, the
binding on scripted rooms, webhooks signed for real."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from livekit import api
from livekit.api.access_token import Claims

from pipeline.bidirectional import ControlState
from tests.support.fakes.livekit import FakeRoomFactory, FakeRoomService, TwirpCall, sign_webhook, webhook_body
from tests.support.fakes.transport_port import FakeSessionPort
from tests.support.fakes.transport_timers import FakeTimers
from transport.base import CallerRoom, ReconnectKind, ResumedRoom, WaitsForClient
from transport.errors import (
    RoomInUseError,
    RoomJoinError,
    RoomNotFoundError,
    RoomServiceError,
    SessionAlreadyAttachedError,
    SessionNotAttachedError,
    TransportClosedError,
    WebhookError,
)
from transport.livekit.binding import SUBSCRIBED_SETTLE_S, ControllerPresence
from transport.livekit.config import LiveKitConfig
from transport.livekit.events import ParticipantLeft, RoomFinished
from transport.livekit.rooms import RoomConfig
from transport.livekit.transport import LiveKitTransport, detach_deletes_room, holds_another_session
from transport.protocol import encode_control

KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"


@dataclass
class Setup:
    server: FakeRoomService
    factory: FakeRoomFactory
    timers: FakeTimers
    transport: LiveKitTransport


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    server = FakeRoomService(KEY, SECRET)
    url = await server.start()
    factory = FakeRoomFactory(KEY, SECRET)
    timers = FakeTimers()
    config = LiveKitConfig(
        url=url,
        client_url="wss://livekit.example",
        api_key=KEY,
        api_secret=SECRET,
        reconnect_grace=5.0,
        room=RoomConfig(empty_timeout=40, departure_timeout=25, max_participants=12),
    )
    transport = LiveKitTransport(config, room_factory=factory, timers=timers)
    await transport.start()
    yield Setup(server, factory, timers, transport)
    await transport.aclose()
    await server.close()


def _claims(token: object) -> Claims:
    assert isinstance(token, str)
    return api.TokenVerifier(KEY, SECRET).verify(token)


async def test_attach_creates_the_room_and_returns_controller_join_details(setup: Setup) -> None:
    details = await setup.transport.attach(FakeSessionPort("s1"))
    assert details["kind"] == "livekit"
    assert details["url"] == "wss://livekit.example"
    assert details["room"] == "lingstream-s1"
    assert details["control_topic"] == "lingstream.control"
    assert details["status_topic"] == "lingstream.status"
    claims = _claims(details["token"])
    assert claims.identity == details["identity"]
    assert str(details["identity"]).startswith("ctl-s1-")
    assert claims.video is not None
    assert claims.video.room == "lingstream-s1"
    assert claims.video.can_publish is False
    assert str(details["service_identity"]).startswith("svc-s1-")
    room = setup.server.rooms["lingstream-s1"]
    assert (room.empty_timeout, room.departure_timeout, room.max_participants) == (40, 25, 12)
    # The service participant joined that room with its own token.
    (_, token, _) = setup.factory.current.connects[0]
    assert _claims(token).identity == details["service_identity"]


async def test_an_adopted_session_joins_its_lost_replicas_room_again_as_the_same_participants(setup: Setup) -> None:
    lost = await setup.transport.attach(FakeSessionPort("s1"))
    # Another replica (its own transport, the same LiveKit server) adopts the session from its checkpoint.
    factory = FakeRoomFactory(KEY, SECRET)
    adopter = LiveKitTransport(setup.transport.config, room_factory=factory, timers=FakeTimers())
    await adopter.start()
    try:
        port = FakeSessionPort("s1")
        port.resumed_room_value = ResumedRoom(str(lost["room"]), str(lost["identity"]), str(lost["service_identity"]))
        details = await adopter.attach(port)
        assert (details["room"], details["identity"], details["service_identity"]) == (
            lost["room"],
            lost["identity"],
            lost["service_identity"],
        )
        assert _claims(details["token"]).identity == lost["identity"]  # the client's controller, unchanged
        assert list(setup.server.rooms) == ["lingstream-s1"]  # no second room
        (_, token, _) = factory.current.connects[0]
        assert _claims(token).identity == lost["service_identity"]  # the server drops the lost one for it
        # Its client is back once the controller, still in the room, subscribed to the adopter's new track: the
        # session's first chunks wait for that (`WaitsForClient`), not to be sent to nobody.
        assert isinstance(adopter, WaitsForClient)
        back = asyncio.create_task(adopter.client_connected("s1"))
        await asyncio.sleep(SUBSCRIBED_SETTLE_S + 0.05)
        assert not back.done()
        factory.current.participant_joins(str(lost["identity"]))
        await asyncio.wait_for(back, 5)
        with pytest.raises(SessionNotAttachedError):
            await adopter.client_connected("s2")
    finally:
        await adopter.aclose()


async def test_each_session_gets_its_own_room_and_identities(setup: Setup) -> None:
    first = await setup.transport.attach(FakeSessionPort("s1"))
    second = await setup.transport.attach(FakeSessionPort("s2"))
    assert first["room"] != second["room"]
    assert first["identity"] != second["identity"]
    assert set(setup.server.rooms) == {"lingstream-s1", "lingstream-s2"}
    assert setup.transport.statistics().sessions == 2


async def test_binding_statistics_report_the_livekit_binding_in_common_terms(setup: Setup) -> None:
    await setup.transport.attach(FakeSessionPort("s1"))
    rich = setup.transport.session_statistics("s1")
    common = setup.transport.binding_statistics("s1")
    assert common.pacer == rich.pacer
    assert common.frames_unsent == rich.frames_unsent
    assert common.track_dropped is None  # the SDK's video source has no queue of its own
    assert common.reconnects == {
        ReconnectKind.SDK_RESUME: rich.sdk_reconnects,
        ReconnectKind.REJOIN: rich.rejoins,
        ReconnectKind.CONTROLLER_RETURN: rich.controller_returns,
    }
    with pytest.raises(SessionNotAttachedError):
        setup.transport.binding_statistics("nope")


async def test_attach_twice_is_refused(setup: Setup) -> None:
    port = FakeSessionPort("s1")
    await setup.transport.attach(port)
    with pytest.raises(SessionAlreadyAttachedError):
        await setup.transport.attach(port)


async def test_failed_join_deletes_the_room_again(setup: Setup) -> None:
    setup.factory.fail_connects = 1
    with pytest.raises(RoomJoinError):
        await setup.transport.attach(FakeSessionPort("s1"))
    assert "lingstream-s1" not in setup.server.rooms
    assert len(setup.server.calls_of("DeleteRoom")) == 1
    assert setup.transport.statistics().attach_failures == 1
    with pytest.raises(SessionNotAttachedError):
        setup.transport.join_details("s1")


async def test_room_service_failure_fails_the_attach(setup: Setup) -> None:
    setup.server.fail_next["CreateRoom"] = ("internal", "database down")
    with pytest.raises(RoomServiceError, match="database down"):
        await setup.transport.attach(FakeSessionPort("s1"))
    assert setup.factory.rooms == []


async def test_join_details_reissue_the_same_controller_identity(setup: Setup) -> None:
    details = await setup.transport.attach(FakeSessionPort("s1"))
    again = setup.transport.join_details("s1")
    assert again["identity"] == details["identity"]
    assert _claims(again["token"]).identity == details["identity"]


async def test_another_replica_reissues_the_published_controller_identity(setup: Setup) -> None:
    details = await setup.transport.attach(FakeSessionPort("s1"))
    again = setup.transport.rejoin_details("s2-elsewhere", details)
    assert (again["room"], again["identity"]) == (details["room"], details["identity"])
    claims = _claims(again["token"])
    assert claims.identity == details["identity"]
    assert claims.video is not None
    assert claims.video.room == details["room"]
    assert not claims.video.can_publish
    with pytest.raises(SessionNotAttachedError):
        setup.transport.rejoin_details("s3", {"kind": "embedded", "offer_url": "/v1/sessions/s3/webrtc"})


async def test_viewer_details_mint_watch_only_identities(setup: Setup) -> None:
    await setup.transport.attach(FakeSessionPort("s1"))
    one = setup.transport.viewer_details("s1")
    two = setup.transport.viewer_details("s1")
    assert one["identity"] != two["identity"]
    video = _claims(one["token"]).video
    assert video is not None
    assert (video.can_subscribe, video.can_publish, video.can_publish_data) == (True, False, False)
    assert "control_topic" not in one
    with pytest.raises(SessionNotAttachedError):
        setup.transport.viewer_details("nope")


async def test_webhook_departure_reaches_the_session(setup: Setup) -> None:
    port = FakeSessionPort("s1")
    details = await setup.transport.attach(port)
    controller = str(details["identity"])
    setup.factory.current.participant_joins(controller)
    setup.factory.current.remote.discard(controller)  # the room no longer has it either
    body = webhook_body("participant_left", "lingstream-s1", controller)
    event = setup.transport.handle_webhook(body, sign_webhook(body, KEY, SECRET))
    assert event == ParticipantLeft("lingstream-s1", controller)
    assert setup.transport.session_statistics("s1").controller is ControllerPresence.AWAY
    setup.timers.advance(5.0)
    assert port.gone == ["the controller left"]


async def test_webhook_room_finished_ends_the_session(setup: Setup) -> None:
    port = FakeSessionPort("s1")
    await setup.transport.attach(port)
    body = webhook_body("room_finished", "lingstream-s1")
    assert setup.transport.handle_webhook(body, sign_webhook(body, KEY, SECRET)) == RoomFinished("lingstream-s1")
    assert port.gone == ["the room finished"]


async def test_bad_webhooks_are_rejected_and_counted(setup: Setup) -> None:
    body = webhook_body("room_finished", "lingstream-s1")
    with pytest.raises(WebhookError):
        setup.transport.handle_webhook(body, sign_webhook(body, KEY, "wrong-secret-that-is-long-enough-012345678"))
    with pytest.raises(WebhookError):
        setup.transport.handle_webhook(body + " ", sign_webhook(body, KEY, SECRET))
    stats = setup.transport.statistics()
    assert (stats.webhooks_received, stats.webhooks_rejected) == (2, 2)


async def test_webhook_for_an_unknown_room_is_counted(setup: Setup) -> None:
    body = webhook_body("room_finished", "lingstream-gone")
    assert setup.transport.handle_webhook(body, sign_webhook(body, KEY, SECRET)) == RoomFinished("lingstream-gone")
    assert setup.transport.statistics().webhooks_unmatched == 1


async def test_detach_leaves_and_deletes_the_room_once(setup: Setup) -> None:
    await setup.transport.attach(FakeSessionPort("s1"))
    room = setup.factory.current
    await setup.transport.detach("s1", "closed")
    await setup.transport.detach("s1", "closed")
    assert room.disconnects == 1
    assert "lingstream-s1" not in setup.server.rooms
    assert len(setup.server.calls_of("DeleteRoom")) == 1


@pytest.mark.parametrize(
    ("callers_room", "handed_off", "replaced", "deletes"),
    [
        (False, False, False, True),  # the service's own room, the session over: deleted, as always
        (False, True, False, False),  # handed off: the adopter joins it again, its clients are still in it
        (False, False, True, False),  # an adopter took this participant's identity: the room is its now
        (False, True, True, False),
        (True, False, False, False),  # the caller's room is the caller's
        (True, True, False, False),
        (True, False, True, False),
    ],
)
def test_only_the_services_own_room_of_a_session_that_ends_for_good_is_deleted_at_detach(
    callers_room: bool, handed_off: bool, replaced: bool, deletes: bool
) -> None:
    assert detach_deletes_room(callers_room=callers_room, handed_off=handed_off, replaced=replaced) is deletes


async def test_a_participant_replaced_by_its_adopter_leaves_the_room_standing(setup: Setup) -> None:
    # A replica stalled past its liveness: the session was adopted meanwhile, the adopter joined as the same
    # identity and the server dropped this participant. The session here ends (its client is gone for it)...
    port = FakeSessionPort("s1")
    await setup.transport.attach(port)
    room = setup.factory.current
    room.drop("DUPLICATE_IDENTITY")
    assert port.gone
    await setup.transport.detach("s1", "client_gone")
    # ...but the room is the adopter's now: not deleted under it.
    assert "lingstream-s1" in setup.server.rooms
    assert setup.server.calls_of("DeleteRoom") == []


async def test_a_handed_off_sessions_room_is_left_standing_for_its_adopter(setup: Setup) -> None:
    port = FakeSessionPort("s1")
    lost = await setup.transport.attach(port)
    room = setup.factory.current
    port.handed_off = True
    await setup.transport.detach("s1", "handed_off")
    assert room.disconnects == 1
    assert "lingstream-s1" in setup.server.rooms
    assert setup.server.calls_of("DeleteRoom") == []
    assert setup.transport.statistics().sessions == 0
    # The adopter goes on in it: no second room, the same participants.
    adopter = LiveKitTransport(setup.transport.config, room_factory=FakeRoomFactory(KEY, SECRET), timers=FakeTimers())
    await adopter.start()
    try:
        resumed = FakeSessionPort("s1")
        resumed.resumed_room_value = ResumedRoom(
            str(lost["room"]), str(lost["identity"]), str(lost["service_identity"])
        )
        details = await adopter.attach(resumed)
        assert (details["room"], details["service_identity"]) == (lost["room"], lost["service_identity"])
        assert list(setup.server.rooms) == ["lingstream-s1"]
    finally:
        await adopter.aclose()  # its session ends for good there: the room goes with it
    assert setup.server.rooms == {}


async def test_detach_survives_a_room_already_gone_or_a_failing_server(setup: Setup) -> None:
    await setup.transport.attach(FakeSessionPort("s1"))
    await setup.transport.attach(FakeSessionPort("s2"))
    del setup.server.rooms["lingstream-s1"]  # deleted elsewhere: not_found is fine
    await setup.transport.detach("s1", "closed")
    setup.server.fail_next["DeleteRoom"] = ("unavailable", "try later")
    await setup.transport.detach("s2", "closed")
    assert setup.transport.statistics().room_delete_failures == 1


async def test_stop_detaches_everything_and_refuses_new_sessions(setup: Setup) -> None:
    await setup.transport.attach(FakeSessionPort("s1"))
    await setup.transport.aclose()
    assert setup.server.rooms == {}
    with pytest.raises(TransportClosedError):
        await setup.transport.attach(FakeSessionPort("s2"))


# -- a caller's room ----------------------------------------------------------------------------------------------


async def _callers_room(setup: Setup, name: str = "lobby-7") -> None:
    """The caller made its room itself (a voice agent's, a lobby's), through the same RoomService."""
    setup.server.rooms[name] = api.Room(name=name, sid=f"RM_{name}")


async def test_a_callers_room_is_joined_not_created_and_left_not_deleted(setup: Setup) -> None:
    await _callers_room(setup)
    port = FakeSessionPort("s1", caller_room=CallerRoom("lobby-7"))
    details = await setup.transport.attach(port)
    assert setup.server.calls_of("CreateRoom") == []
    assert (details["room"], details["room_owner"]) == ("lobby-7", "caller")
    (_, token, _) = setup.factory.current.connects[0]
    assert _claims(token).video.room == "lobby-7"  # type: ignore[union-attr]
    # No identity named: the service mints a controller identity and a token for the caller's room.
    assert str(details["identity"]).startswith("ctl-s1-")
    claims = _claims(details["token"])
    assert claims.identity == details["identity"]
    assert claims.video is not None
    assert claims.video.room == "lobby-7"
    assert claims.video.can_publish is False
    room = setup.factory.current
    await setup.transport.detach("s1", "closed")
    assert room.disconnects == 1
    assert "lobby-7" in setup.server.rooms
    assert setup.server.calls_of("DeleteRoom") == []


async def test_control_comes_only_from_the_identity_the_caller_named_and_no_token_is_minted_for_it(
    setup: Setup,
) -> None:
    await _callers_room(setup)
    port = FakeSessionPort("s1", caller_room=CallerRoom("lobby-7", controller_identity="user-42"))
    details = await setup.transport.attach(port)
    assert (details["identity"], details["token"], details["expires_at"]) == ("user-42", None, None)
    again = setup.transport.join_details("s1")
    assert (again["identity"], again["token"]) == ("user-42", None)
    # Another replica answering a GET hands the published details on as they are (there is no token to refresh).
    elsewhere = setup.transport.rejoin_details("s1", details)
    assert (elsewhere["identity"], elsewhere["token"]) == ("user-42", None)
    room = setup.factory.current
    room.participant_joins("user-42")
    room.receive_data(encode_control(ControlState(7, frozenset({"l"}))), "agent-1")  # the agent, not the user
    room.receive_data(encode_control(ControlState(8, frozenset({"w"}))), "user-42")
    assert await port.wait_controls(1) == [ControlState(8, frozenset({"w"}))]
    assert setup.transport.session_statistics("s1").data_foreign == 1


async def _refused(setup: Setup, room: str, error: type[Exception], session_id: str = "s1") -> None:
    """The route's check and the attach both refuse `room` with `error`."""
    with pytest.raises(error):
        await setup.transport.check_caller_room(CallerRoom(room))
    with pytest.raises(error):
        await setup.transport.attach(FakeSessionPort(session_id, caller_room=CallerRoom(room)))


async def test_a_callers_room_that_does_not_exist_or_holds_a_session_is_refused(setup: Setup) -> None:
    await _refused(setup, "lobby-404", RoomNotFoundError)
    assert setup.factory.rooms == []  # nobody joined anything
    assert setup.transport.statistics().sessions == 0
    await _callers_room(setup)
    await setup.transport.attach(FakeSessionPort("s1", caller_room=CallerRoom("lobby-7")))
    await _refused(setup, "lobby-7", RoomInUseError, session_id="s2")
    await setup.transport.detach("s1", "closed")
    await setup.transport.check_caller_room(CallerRoom("lobby-7"))  # free again


async def test_a_session_of_another_replica_in_the_callers_room_makes_it_in_use(setup: Setup) -> None:
    # Each replica knows only its own sessions: the server's participant list says another one is there.
    await _callers_room(setup)
    setup.server.participants["lobby-7"] = ["user-42", "ctl-x-1", "view-x-2"]  # people only: free
    await setup.transport.check_caller_room(CallerRoom("lobby-7"))
    setup.server.participants["lobby-7"].append("svc-elsewhere-3")
    await _refused(setup, "lobby-7", RoomInUseError)
    assert setup.factory.rooms == []  # refused before joining
    assert setup.transport.statistics().sessions == 0


def test_a_room_holds_another_session_when_a_service_participant_other_than_its_own_is_in_it() -> None:
    people = ["user-42", "ctl-s1-abc", "view-s1-2", "agent-7"]
    assert not holds_another_session(people)
    assert holds_another_session([*people, "svc-s2-x"])
    # An adopted session's old participant (a dead or draining replica's, not yet dropped) is its own.
    assert not holds_another_session([*people, "svc-s1-def"], own="svc-s1-def")
    assert holds_another_session([*people, "svc-s1-def", "svc-s2-x"], own="svc-s1-def")
    assert holds_another_session(["svc-s2-x"], own="svc-s1-def")


async def test_an_adopted_session_goes_on_in_the_callers_room_as_the_same_participants(setup: Setup) -> None:
    await _callers_room(setup)
    lost = await setup.transport.attach(FakeSessionPort("s1", caller_room=CallerRoom("lobby-7")))
    # The lost replica's participant is still listed (the server drops a dead one only after its timeout).
    setup.server.participants["lobby-7"] = [str(lost["identity"]), str(lost["service_identity"]), "user-42"]
    factory = FakeRoomFactory(KEY, SECRET)
    adopter = LiveKitTransport(setup.transport.config, room_factory=factory, timers=FakeTimers())
    await adopter.start()
    try:
        # Another session of this service into that room is still refused.
        with pytest.raises(RoomInUseError):
            await adopter.check_caller_room(CallerRoom("lobby-7"))
        port = FakeSessionPort("s1", caller_room=CallerRoom("lobby-7"))
        port.resumed_room_value = ResumedRoom("lobby-7", str(lost["identity"]), str(lost["service_identity"]))
        details = await adopter.attach(port)
        assert (details["room"], details["identity"], details["service_identity"], details["room_owner"]) == (
            "lobby-7",
            lost["identity"],
            lost["service_identity"],
            "caller",
        )
        assert _claims(details["token"]).identity == lost["identity"]  # the client's controller, unchanged
        (_, token, _) = factory.current.connects[0]
        assert _claims(token).identity == lost["service_identity"]  # the server drops the lost one for it
        assert adopter.statistics().sessions == 1
        await adopter.detach("s1", "client_stop")
    finally:
        await adopter.aclose()
    assert "lobby-7" in setup.server.rooms  # left standing at the end, as always
    assert setup.server.calls_of("DeleteRoom") == []
    assert setup.server.calls_of("CreateRoom") == []


async def test_an_old_room_that_is_not_the_callers_is_not_joined_again(setup: Setup) -> None:
    await _callers_room(setup)
    setup.server.participants["lobby-7"] = ["svc-s1-def"]
    port = FakeSessionPort("s1", caller_room=CallerRoom("lobby-7"))
    port.resumed_room_value = ResumedRoom("lobby-8", "ctl-s1-abc", "svc-s1-def")
    with pytest.raises(RoomInUseError):  # that participant is not this session's in this room
        await setup.transport.attach(port)


def _rival_joins_with_us(setup: Setup, ours_ms: int, rival: str, rival_ms: int, *, list_ours: bool = True) -> None:
    """Another replica's service participant joins the caller's room while we join it: the listing before our join
    shows no one, the one after it shows the rival (and us, unless `list_ours` is False: the server lags)."""
    listings = 0

    def before(call: TwirpCall) -> None:
        nonlocal listings
        if call.method != "ListParticipants":
            return
        listings += 1
        if listings == 2:
            ours = setup.factory.current.identity
            setup.server.participants["lobby-7"] = [rival, *([ours] if list_ours else [])]
            setup.server.joined_at_ms.update({rival: rival_ms, ours: ours_ms})

    setup.server.before = before


@pytest.mark.parametrize(
    ("ours_ms", "rival", "rival_ms", "keeps"),
    [
        (2_000, "svc-r1-aa", 1_000, False),  # the rival joined first
        (1_000, "svc-r1-aa", 2_000, True),  # we did
        (1_000, "svc-r1-aa", 1_000, False),  # the same millisecond: the rival may have kept it already
    ],
)
async def test_two_replicas_joining_one_callers_room_at_once_leave_it_to_the_first(
    setup: Setup, ours_ms: int, rival: str, rival_ms: int, keeps: bool
) -> None:
    await _callers_room(setup)
    _rival_joins_with_us(setup, ours_ms, rival, rival_ms)
    port = FakeSessionPort("s1", caller_room=CallerRoom("lobby-7"))
    if keeps:
        details = await setup.transport.attach(port)
        assert details["room"] == "lobby-7"
        assert setup.transport.statistics().sessions == 1
        assert setup.factory.current.disconnects == 0
        return
    with pytest.raises(RoomInUseError):
        await setup.transport.attach(port)
    room = setup.factory.current
    assert room.disconnects == 1  # it joined, saw the earlier one, and left
    stats = setup.transport.statistics()
    assert (stats.sessions, stats.attach_failures) == (0, 1)
    assert "lobby-7" in setup.server.rooms  # the caller's room is never deleted
    assert setup.server.calls_of("DeleteRoom") == []
    with pytest.raises(SessionNotAttachedError):
        setup.transport.join_details("s1")


async def test_a_join_the_server_does_not_list_yet_yields_to_a_listed_rival(setup: Setup) -> None:
    await _callers_room(setup)
    _rival_joins_with_us(setup, 1_000, "svc-r1-aa", 2_000, list_ours=False)
    with pytest.raises(RoomInUseError):
        await setup.transport.attach(FakeSessionPort("s1", caller_room=CallerRoom("lobby-7")))
    assert setup.factory.current.disconnects == 1


async def test_a_listing_that_fails_after_the_join_keeps_the_room(setup: Setup) -> None:
    await _callers_room(setup)
    listings = 0

    def before(call: TwirpCall) -> None:
        nonlocal listings
        if call.method == "ListParticipants":
            listings += 1
            if listings == 2:
                setup.server.fail_next["ListParticipants"] = ("unavailable", "try later")

    setup.server.before = before
    details = await setup.transport.attach(FakeSessionPort("s1", caller_room=CallerRoom("lobby-7")))
    assert details["room"] == "lobby-7"
    assert listings == 2
    assert setup.factory.current.disconnects == 0


def test_a_caller_room_is_checked_on_construction() -> None:
    with pytest.raises(ValueError, match="name the room"):
        CallerRoom("")
    for bad in ("x" * 257, "tab\there"):
        with pytest.raises(ValueError, match="room name"):
            CallerRoom(bad)
    with pytest.raises(ValueError, match="controller identity"):
        CallerRoom("lobby", controller_identity="")
    with pytest.raises(ValueError, match="must not start with svc-"):
        CallerRoom("lobby", controller_identity="svc-agent")  # would read as a session of this service
    assert CallerRoom("lobby", controller_identity="agent-svc-1").controller_identity == "agent-svc-1"
