"""The LiveKit session binding on a scripted room: joining, frames, control, status, reconnects and departures."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import jwt
import pytest
from livekit import api

from pipeline.bidirectional import ControlState, Pause, ResetPose, Resume, SetPrompt, Stop
from tests.support.fakes.livekit import FakeRoom, FakeRoomFactory, FakeVideo
from tests.support.fakes.transport_port import FakeSessionPort, make_chunk
from tests.support.fakes.transport_timers import FakeTimers
from transport.base import ChunkStatus, DoneStatus, StateStatus
from transport.errors import ControlRejectedError, RoomJoinError
from transport.livekit.binding import (
    LAST_FRAME_LINGER_S,
    SUBSCRIBED_SETTLE_S,
    BindingState,
    ControllerPresence,
    LiveKitSessionBinding,
)
from transport.livekit.config import LiveKitConfig
from transport.livekit.events import ParticipantJoined, ParticipantLeft, RoomFinished
from transport.livekit.room import RpcFailure
from transport.livekit.tokens import IssuedToken, ParticipantRole, TokenIssuer

KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"
ROOM = "lingstream-s1"
GRACE = 10.0
INITIAL = 30.0
CONTROL = "lingstream.control"
STATUS = "lingstream.status"


class RecordingIssuer(TokenIssuer):
    """Counts the service tokens minted (one per join)."""

    def __init__(self) -> None:
        super().__init__(KEY, SECRET)
        self.service_tokens: list[IssuedToken] = []

    def service(self, session_id: str, room: str, *, identity: str | None = None) -> IssuedToken:
        issued = super().service(session_id, room, identity=identity)
        self.service_tokens.append(issued)
        return issued


@dataclass
class Harness:
    port: FakeSessionPort
    factory: FakeRoomFactory
    timers: FakeTimers
    binding: LiveKitSessionBinding
    tokens: RecordingIssuer

    @property
    def room(self) -> FakeRoom:
        return self.factory.current

    @property
    def controller(self) -> str:
        return self.binding.controller_identity

    @property
    def video(self) -> FakeVideo:
        video = self.room.videos[-1]
        assert isinstance(video, FakeVideo)
        return video


def _config(**overrides: object) -> LiveKitConfig:
    settings: dict[str, object] = {
        "url": "ws://livekit.test",
        "api_key": KEY,
        "api_secret": SECRET,
        "reconnect_grace": GRACE,
        "initial_join_timeout": INITIAL,
        "rejoin_backoff": 0.0,
        "rejoin_attempts": 3,
        "max_bitrate": 800_000,
        "codec": "h264",
    }
    settings.update(overrides)
    return LiveKitConfig(**settings)  # type: ignore[arg-type]


def _make(port: FakeSessionPort | None = None, **overrides: object) -> Harness:
    port = port if port is not None else FakeSessionPort(fps=50.0)
    factory = FakeRoomFactory(KEY, SECRET)
    timers = FakeTimers()
    tokens = RecordingIssuer()
    binding = LiveKitSessionBinding(
        port,
        config=_config(**overrides),
        room_name=ROOM,
        controller_identity=TokenIssuer.new_identity(ParticipantRole.CONTROLLER, "s1"),
        service_identity=TokenIssuer.new_identity(ParticipantRole.SERVICE, "s1"),
        tokens=tokens,
        room_factory=factory,
        timers=timers,
    )
    return Harness(port, factory, timers, binding, tokens)


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = _make()
    await harness.binding.start()
    yield harness
    await harness.binding.aclose()


def _expiry(token: str) -> int:
    return int(jwt.decode(token, SECRET, algorithms=["HS256"])["exp"])


def _control(seq: int, *keys: str) -> str:
    return json.dumps({"v": 1, "type": "control_state", "seq": seq, "keys": list(keys)})


# -- joining and publishing ----------------------------------------------------------------------------------------


async def test_joins_without_auto_subscribe_with_a_service_token(h: Harness) -> None:
    ((url, token, options),) = h.room.connects
    assert url == "ws://livekit.test"
    assert options.auto_subscribe is False
    claims = api.TokenVerifier(KEY, SECRET).verify(token)
    assert claims.identity == h.binding.service_identity
    assert claims.video is not None
    assert claims.video.room == ROOM
    assert claims.video.can_publish_sources == ["camera"]
    assert claims.video.can_subscribe is False
    assert h.binding.state is BindingState.LIVE


async def test_publishes_one_single_layer_track_with_explicit_encoding(h: Harness) -> None:
    ((video, options),) = h.room.published
    assert isinstance(video, FakeVideo)
    assert (video.width, video.height) == (h.port.width, h.port.height)
    assert options.simulcast is False
    assert options.codec == "h264"
    assert options.max_framerate == h.port.fps
    assert options.max_bitrate == 800_000


async def test_frames_flow_from_chunks_to_the_video_source_in_order(h: Harness) -> None:
    port = h.port
    port.emit_chunk(make_chunk(0, first_frame_index=0, count=5, width=port.width, height=port.height))
    port.emit_chunk(make_chunk(1, first_frame_index=5, count=8, width=port.width, height=port.height))
    frames = await h.video.wait_frames(13)
    assert [f.frame_index for f in frames] == list(range(13))
    assert all(f.image.shape == (port.height, port.width, 3) for f in frames)
    assert port.chunks_opened == 1


async def test_join_failure_raises_and_leaves_nothing_behind() -> None:
    harness = _make()
    harness.factory.fail_connects = 1
    with pytest.raises(RoomJoinError, match=ROOM):
        await harness.binding.start()
    assert harness.binding.state is BindingState.CLOSED
    assert harness.room.published == []


async def test_publish_failure_raises_and_closes_the_video_source() -> None:
    harness = _make()
    original = harness.factory.__call__

    def failing() -> FakeRoom:
        room = original()
        room.fail_publish = True
        return room

    harness.binding._room_factory = failing
    with pytest.raises(RoomJoinError, match="publishing"):
        await harness.binding.start()
    assert harness.video.closed
    assert harness.room.disconnects == 1


# -- control in ----------------------------------------------------------------------------------------------------


async def test_control_from_the_controller_reaches_the_session(h: Harness) -> None:
    h.room.receive_data(_control(1, "w", "ArrowLeft"), h.controller)
    h.room.receive_data('{"v":1,"type":"reset_pose"}', h.controller)
    h.room.receive_data('{"v":1,"type":"stop"}', h.controller)
    assert h.port.controls == [ControlState(1, frozenset({"w", "j"})), ResetPose(), Stop()]


async def test_prompts_and_pause_travel_as_livekit_data_and_a_refusal_comes_back_as_an_error(h: Harness) -> None:
    h.room.receive_data('{"v":1,"type":"prompt","seq":2,"text":"a snowy night"}', h.controller)
    h.room.receive_data('{"v":1,"type":"pause"}', h.controller)
    h.room.receive_data('{"v":1,"type":"resume"}', h.controller)
    assert h.port.controls == [SetPrompt(2, "a snowy night"), Pause(), Resume()]
    h.port.reject_control = ControlRejectedError("session_not_running", "the session is closing")
    h.room.receive_data('{"v":1,"type":"pause"}', h.controller)
    h.room.receive_data('{"v":1,"type":"prompt","seq":3,"text":"' + "x" * 600 + '"}', h.controller)
    codes = []
    for _ in range(2):
        sent = await h.room.next_data()
        assert sent.reliable
        assert sent.destinations == (h.controller,)
        codes.append(json.loads(sent.payload)["code"])
    assert codes == ["session_not_running", "prompt_too_large"]


async def test_discrete_commands_are_rpc_methods_answered_to_the_controller_only(h: Harness) -> None:
    assert sorted(h.room.rpc_methods) == [
        "lingstream.pause",
        "lingstream.prompt",
        "lingstream.reset_pose",
        "lingstream.resume",
        "lingstream.stop",
    ]
    answer = h.room.call_rpc("lingstream.pause", h.controller)
    assert isinstance(answer, str)
    assert json.loads(answer) == {"v": 1, "ok": True, "state": "paused", "applied": True}
    refused = h.room.call_rpc("lingstream.resume", "agent-1")
    assert isinstance(refused, RpcFailure)
    assert refused.data == "not_controller"
    assert h.port.controls == [Pause()]
    stats = h.binding.statistics()
    assert (stats.rpc_foreign, stats.control.calls) == (1, 1)
    assert h.room.data.empty()  # an answer is the call's, never a status packet


async def test_rpc_methods_are_registered_again_on_a_rejoined_room(h: Harness) -> None:
    first = h.room
    h.room.participant_joins(h.controller)
    h.room.drop("SIGNAL_CLOSE")
    await h.factory.wait_publishes(2)
    assert h.room is not first
    answer = h.room.call_rpc("lingstream.stop", h.controller)
    assert isinstance(answer, str)
    assert json.loads(answer)["state"] == "draining"
    assert h.port.controls == [Stop()]


async def test_data_from_anyone_else_or_on_another_topic_is_ignored(h: Harness) -> None:
    h.room.receive_data(_control(1, "w"), "view-s1-abc")
    h.room.receive_data(_control(2, "w"), "ctl-s1-impostor")
    h.room.receive_data(_control(3, "w"), None)  # server-sent data has no participant
    h.room.receive_data(_control(4, "w"), h.controller, topic="lk.chat")
    h.room.receive_data(_control(5, "s"), h.controller)
    assert h.port.controls == [ControlState(5, frozenset({"s"}))]
    stats = h.binding.statistics()
    assert (stats.data_foreign, stats.data_other_topic) == (3, 1)


async def test_stale_snapshots_are_dropped(h: Harness) -> None:
    for seq in (3, 1, 3, 4):
        h.room.receive_data(_control(seq, "d"), h.controller)
    assert [m.seq for m in h.port.controls if isinstance(m, ControlState)] == [3, 4]
    inbox = h.binding.statistics().control.inbox
    assert (inbox.stale, inbox.duplicates) == (1, 1)


async def test_malformed_control_gets_an_error_back_and_a_counter(h: Harness) -> None:
    h.room.receive_data(b"\x00garbage", h.controller)
    h.room.receive_data('{"v":1,"type":"control_state","seq":1,"keys":["q"]}', h.controller)
    h.room.receive_data("x" * 5000, h.controller)
    codes = []
    for _ in range(3):
        sent = await h.room.next_data()
        assert sent.reliable
        assert sent.topic == STATUS
        assert sent.destinations == (h.controller,)
        body = json.loads(sent.payload)
        assert body["type"] == "error"
        codes.append(body["code"])
    assert codes == ["malformed_json", "invalid_keys", "message_too_large"]
    stats = h.binding.statistics().control
    assert stats.rejected == 3
    assert stats.rejected_by_code == {"malformed_json": 1, "invalid_keys": 1, "message_too_large": 1}
    assert h.port.controls == []
    assert h.binding.state is BindingState.LIVE


async def test_a_flood_of_garbage_gets_rate_limited_error_replies(h: Harness) -> None:
    for _ in range(50):
        h.room.receive_data(b"nope", h.controller)
    stats = h.binding.statistics().control
    assert stats.rejected == 50
    assert stats.error_replies <= 11
    assert stats.error_replies + stats.error_replies_suppressed == 50


async def test_a_session_refusing_control_is_counted_not_fatal(h: Harness) -> None:
    h.port.refuse_control = True
    h.room.receive_data(_control(1, "w"), h.controller)
    assert h.binding.statistics().control.push_failures == 1
    assert h.binding.state is BindingState.LIVE


# -- status out ----------------------------------------------------------------------------------------------------


async def test_status_goes_out_on_the_status_topic(h: Harness) -> None:
    h.port.emit_status(StateStatus("running"))
    h.port.emit_status(ChunkStatus(0, 3, ("w",), {"denoise": 0.1}))
    h.port.emit_status(ChunkStatus(1, 4, ("w",), {f"stage_{i}": 0.1 for i in range(200)}))
    state, small, big = [await h.room.next_data() for _ in range(3)]
    assert json.loads(state.payload) == {"v": 1, "type": "state", "state": "running", "detail": None}
    assert state.reliable
    assert state.topic == STATUS
    assert state.destinations == ()
    assert json.loads(small.payload)["applied_seq"] == 3
    assert small.reliable is False  # frequent chunk status: lossy, within one packet
    assert len(big.payload) > 1200
    assert big.reliable is True
    assert h.port.status_opened == 1


async def test_failed_status_sends_are_counted(h: Harness) -> None:
    h.room.fail_data = 1
    h.port.emit_status(StateStatus("running"))
    h.port.emit_status(StateStatus("draining"))
    sent = await h.room.next_data()
    assert json.loads(sent.payload)["state"] == "draining"
    assert h.binding.statistics().outbox.send_failures == 1


# -- reconnects ----------------------------------------------------------------------------------------------------


async def test_sdk_resume_keeps_generating_and_does_not_republish(h: Harness) -> None:
    port = h.port
    h.room.sdk_reconnecting()
    port.emit_chunk(make_chunk(0, first_frame_index=0, count=4, width=port.width, height=port.height))
    await h.video.wait_frames(4)
    h.room.sdk_reconnected()
    port.emit_chunk(make_chunk(1, first_frame_index=4, count=4, width=port.width, height=port.height))
    frames = await h.video.wait_frames(8)
    assert [f.frame_index for f in frames] == list(range(8))
    assert len(h.factory.rooms) == 1
    assert len(h.room.published) == 1
    stats = h.binding.statistics()
    assert (stats.sdk_reconnects, stats.rejoins, stats.state) == (1, 0, BindingState.LIVE)


async def test_participants_the_sdk_drops_and_readds_while_reconnecting_are_not_a_departure(h: Harness) -> None:
    # Found end to end (tests/e2e/test_livekit_browser.py): the SDK's full reconnect re-joins the room and reports
    # everyone leaving and joining again; the controller never left.
    h.room.participant_joins(h.controller)
    h.room.sdk_reconnecting()
    h.room.participant_leaves(h.controller)
    h.room.participant_joins(h.controller)
    h.room.sdk_reconnected()
    stats = h.binding.statistics()
    assert (stats.controller, stats.controller_departures, stats.controller_returns) == (
        ControllerPresence.PRESENT,
        0,
        0,
    )
    assert h.timers.live == []


async def test_a_controller_missing_once_the_sdk_reconnected_starts_the_grace(h: Harness) -> None:
    h.room.participant_joins(h.controller)
    h.room.sdk_reconnecting()
    h.room.participant_leaves(h.controller)
    assert h.timers.live == []
    h.room.sdk_reconnected()
    (timer,) = h.timers.live
    assert timer.due == pytest.approx(GRACE)
    assert h.binding.presence is ControllerPresence.AWAY


async def test_network_loss_rejoins_with_a_fresh_token_as_the_same_identity(h: Harness) -> None:
    port = h.port
    first_room, first_video = h.room, h.video
    h.room.participant_joins(h.controller)
    h.room.drop("SIGNAL_CLOSE")
    assert h.binding.statistics().state is BindingState.REJOINING
    await h.factory.wait_publishes(2)
    assert h.binding.state is BindingState.LIVE
    second = h.room
    assert second is not first_room
    assert first_video.closed
    (_, token, _), (_, new_token, _) = first_room.connects[0], second.connects[0]
    verifier = api.TokenVerifier(KEY, SECRET)
    assert verifier.verify(new_token).identity == verifier.verify(token).identity == h.binding.service_identity
    assert [t.token for t in h.tokens.service_tokens] == [token, new_token]  # one minted per join
    assert _expiry(new_token) >= _expiry(token)
    # Same session, same port: nothing reopened, frames go to the new track, control still flows.
    port.emit_chunk(make_chunk(0, first_frame_index=0, count=3, width=port.width, height=port.height))
    await h.video.wait_frames(3)
    second.receive_data(_control(9, "a"), h.controller)
    assert port.controls == [ControlState(9, frozenset({"a"}))]
    assert (port.chunks_opened, port.status_opened) == (1, 1)
    assert port.gone == []
    assert h.binding.presence is ControllerPresence.PRESENT  # the rejoined room still has the controller
    assert h.binding.statistics().rejoins == 1


async def test_events_from_the_abandoned_room_are_ignored(h: Harness) -> None:
    old = h.room
    old.participant_joins(h.controller)
    old.drop("CONNECTION_TIMEOUT")
    await h.factory.wait_publishes(2)
    old.participant_leaves(h.controller)
    old.receive_data(_control(1, "w"), h.controller)
    old.drop("ROOM_DELETED")
    assert h.timers.live == []
    assert h.port.controls == []
    assert h.port.gone == []
    assert h.binding.state is BindingState.LIVE


async def test_rejoin_that_keeps_failing_ends_the_session() -> None:
    harness = _make(rejoin_attempts=3)
    await harness.binding.start()
    try:
        harness.factory.fail_connects = 3
        harness.room.drop("SIGNAL_CLOSE")
        await harness.port.gone_event.wait()
        assert harness.port.gone == ["the service participant could not rejoin its LiveKit room"]
        assert harness.binding.state is BindingState.OVER
        assert harness.binding.statistics().rejoin_failures == 3
    finally:
        await harness.binding.aclose()


@pytest.mark.parametrize("reason", ["ROOM_DELETED", "ROOM_CLOSED", "PARTICIPANT_REMOVED", "DUPLICATE_IDENTITY"])
async def test_final_disconnect_reasons_end_the_session_without_rejoining(h: Harness, reason: str) -> None:
    h.room.drop(reason)
    assert h.port.gone == [f"the room connection ended: {reason}"]
    assert h.binding.state is BindingState.OVER
    assert len(h.factory.rooms) == 1
    h.room.drop("SIGNAL_CLOSE")  # nothing more happens once over
    assert len(h.factory.rooms) == 1
    assert len(h.port.gone) == 1


async def test_our_own_disconnect_is_not_a_loss(h: Harness) -> None:
    h.room.emit("disconnected", "CLIENT_INITIATED")
    assert h.binding.state is BindingState.LIVE
    assert len(h.factory.rooms) == 1


# -- controller presence -------------------------------------------------------------------------------------------


async def test_controller_that_never_joins_ends_the_session(h: Harness) -> None:
    (timer,) = h.timers.live
    assert timer.due == INITIAL
    h.timers.advance(INITIAL)
    assert h.port.gone == ["the controller never joined"]
    assert h.binding.presence is ControllerPresence.GONE


async def test_controller_return_within_the_grace_resumes(h: Harness) -> None:
    h.room.participant_joins(h.controller)
    assert h.timers.live == []
    h.room.participant_leaves(h.controller)
    (timer,) = h.timers.live
    assert timer.due == pytest.approx(GRACE)
    assert h.binding.presence is ControllerPresence.AWAY
    h.timers.advance(GRACE - 0.5)
    h.room.participant_joins(h.controller)
    h.timers.advance(100)
    assert h.port.gone == []
    stats = h.binding.statistics()
    assert (stats.controller, stats.controller_departures, stats.controller_returns) == (
        ControllerPresence.PRESENT,
        1,
        1,
    )


async def test_grace_expiry_ends_the_session(h: Harness) -> None:
    h.room.participant_joins(h.controller)
    h.room.participant_leaves(h.controller)
    h.timers.advance(GRACE)
    assert h.port.gone == ["the controller left"]
    assert h.binding.state is BindingState.OVER


async def test_other_participants_leaving_change_nothing(h: Harness) -> None:
    h.room.participant_joins(h.controller)
    h.room.participant_joins("view-s1-abc")
    h.room.participant_leaves("view-s1-abc")
    assert h.timers.live == []


async def test_departure_reported_twice_starts_one_timer(h: Harness) -> None:
    h.room.participant_joins(h.controller)
    h.room.participant_leaves(h.controller)
    h.binding.handle_room_event(ParticipantLeft(ROOM, h.controller))  # the webhook says it again
    assert len(h.timers.live) == 1
    h.timers.advance(GRACE)
    assert h.port.gone == ["the controller left"]


async def test_late_webhook_departure_is_checked_against_the_room(h: Harness) -> None:
    h.room.participant_joins(h.controller)
    # A stale "left" webhook arrives although the controller is in the room (it reconnected meanwhile).
    h.binding.handle_room_event(ParticipantLeft(ROOM, h.controller))
    h.timers.advance(GRACE)
    assert h.port.gone == []
    assert h.binding.presence is ControllerPresence.PRESENT


async def test_webhook_join_cancels_the_grace(h: Harness) -> None:
    h.binding.handle_room_event(ParticipantJoined(ROOM, h.controller))
    assert h.timers.live == []
    h.binding.handle_room_event(ParticipantLeft(ROOM, h.controller))
    h.binding.handle_room_event(ParticipantJoined(ROOM, h.controller))
    h.timers.advance(GRACE * 2)
    assert h.port.gone == []


async def test_room_finished_ends_the_session(h: Harness) -> None:
    h.binding.handle_room_event(RoomFinished(ROOM))
    assert h.port.gone == ["the room finished"]
    h.binding.handle_room_event(RoomFinished(ROOM))
    assert len(h.port.gone) == 1


async def test_controller_already_in_the_room_at_join_is_seen() -> None:
    harness = _make()
    harness.factory.present.add(harness.binding.controller_identity)
    await harness.binding.start()
    try:
        assert harness.binding.presence is ControllerPresence.PRESENT
        assert harness.timers.live == []
    finally:
        await harness.binding.aclose()


async def test_controller_gone_during_a_rejoin_starts_the_grace() -> None:
    harness = _make()
    await harness.binding.start()
    try:
        harness.room.participant_joins(harness.binding.controller_identity)
        harness.factory.present.clear()  # the controller leaves while we are out of the room
        harness.room.drop("SIGNAL_CLOSE")
        await harness.factory.wait_publishes(2)
        assert harness.binding.presence is ControllerPresence.AWAY
        harness.timers.advance(GRACE)
        assert harness.port.gone == ["the controller left"]
    finally:
        await harness.binding.aclose()


# -- an adopter's first frames -------------------------------------------------------------------------------------


async def test_waits_for_a_subscription_to_the_track_of_its_current_connection(h: Harness) -> None:
    """An adopted session's first frames wait for this (`client_connected`): frames captured before anyone
    subscribed to the new track go to nobody."""
    waiting = asyncio.create_task(h.binding.wait_subscribed())
    await asyncio.sleep(SUBSCRIBED_SETTLE_S + 0.05)
    assert not waiting.done()  # published, and nobody in the room to subscribe to it
    h.room.participant_joins(h.controller)  # the server: the controller subscribed (auto-subscribe)
    subscribed = time.monotonic()
    await asyncio.wait_for(waiting, 5)
    assert time.monotonic() - subscribed >= SUBSCRIBED_SETTLE_S * 0.9  # and the subscriber had time to be ready
    # A new connection publishes a new track: a subscription to the old one, late, says nothing of it.
    old = h.room
    old.participant_leaves(h.controller)
    old.drop("SIGNAL_CLOSE")
    await h.factory.wait_publishes(2)
    waiting = asyncio.create_task(h.binding.wait_subscribed())
    old.emit("local_track_subscribed", "TR_old")
    await asyncio.sleep(SUBSCRIBED_SETTLE_S + 0.05)
    assert not waiting.done()
    h.room.participant_joins(h.controller)
    await asyncio.wait_for(waiting, 5)


# -- closing -------------------------------------------------------------------------------------------------------


async def test_close_keeps_the_room_a_moment_after_the_last_frame_so_that_it_goes_out() -> None:
    """Left at once, the last frame given to the source came to the client black and without its frame id (the
    real server, a hand-off's last frame): the room is left `LAST_FRAME_LINGER_S` after it at the earliest."""
    harness = _make()
    await harness.binding.start()
    port = harness.port
    port.emit_chunk(make_chunk(0, first_frame_index=0, count=2, width=port.width, height=port.height))
    await harness.video.wait_frames(2)
    await harness.binding.aclose("handed_off")
    assert harness.room.disconnected_at is not None
    assert harness.room.disconnected_at - harness.video.captured_at[-1] >= LAST_FRAME_LINGER_S
    assert len(harness.video.frames) == 2  # nothing captured while it waited: the pacer had stopped


async def test_close_leaves_the_room_and_is_idempotent() -> None:
    harness = _make()
    await harness.binding.start()
    await harness.binding.aclose("test")
    await harness.binding.aclose("again")
    assert harness.binding.state is BindingState.CLOSED
    assert harness.room.disconnects == 1
    assert harness.video.closed
    assert harness.binding.statistics().tasks == 0
    harness.room.participant_leaves(harness.binding.controller_identity)
    harness.timers.advance(1000)
    assert harness.port.gone == []


async def test_close_lets_the_final_done_out_first() -> None:
    harness = _make()
    await harness.binding.start()
    harness.port.emit_status(DoneStatus("closed"))  # published by the session just before it detaches
    await harness.binding.aclose("closed")
    sent = await harness.room.next_data()
    assert json.loads(sent.payload) == {"v": 1, "type": "done", "reason": "closed"}
    assert sent.reliable


async def test_connection_lost_while_rejoining_is_retried() -> None:
    harness = _make()
    await harness.binding.start()
    try:
        harness.factory.drop_during_publish = 1  # the next room loses its connection while we publish
        harness.room.drop("SIGNAL_CLOSE")
        await harness.factory.wait_publishes(3)
        assert harness.binding.state is BindingState.LIVE
        assert harness.binding.statistics().rejoin_failures == 1
        assert len(harness.factory.rooms) == 3
        assert harness.factory.rooms[1].disconnects == 1  # the half-joined room was left
    finally:
        await harness.binding.aclose()


async def test_a_controller_a_webhook_reports_first_is_told_the_state_only_once_the_sdk_knows_it(h: Harness) -> None:
    """A webhook can report the join before the room's SDK does (0.74 s ahead on the real server); a packet the
    controller sends meanwhile arrives with no sender and is dropped. The client holds its first packet until this
    status (docs/livekit.md), so it comes only when the SDK knows the controller."""
    h.port.emit_status(StateStatus("running"))
    assert (await h.room.next_data()).destinations == ()
    h.binding.handle_room_event(ParticipantJoined(ROOM, h.controller))  # the webhook, ahead of the SDK
    assert h.room.data.empty()  # not yet: its packets would still be dropped here
    h.room.receive_data(b'{"v":1,"type":"control_state","seq":1,"keys":["w"]}', None, "lingstream.control")
    assert h.binding.statistics().data_foreign == 1  # what the client's wait avoids
    h.room.participant_joins(h.controller)  # the SDK's own join event
    direct = await h.room.next_data()
    assert direct.destinations == (h.controller,)
    assert json.loads(direct.payload)["state"] == "running"
    h.room.participant_joins(h.controller)
    assert h.room.data.empty()  # once


async def test_a_joining_controller_is_told_the_current_state(h: Harness) -> None:
    h.port.emit_status(StateStatus("running"))  # the port's first message, before anyone joined
    broadcast = await h.room.next_data()
    assert broadcast.destinations == ()
    h.room.participant_joins(h.controller)
    direct = await h.room.next_data()
    assert direct.destinations == (h.controller,)
    assert json.loads(direct.payload) == {"v": 1, "type": "state", "state": "running", "detail": None}
    h.room.participant_joins(h.controller)  # already present: not told again
    h.room.participant_leaves(h.controller)
    h.room.participant_joins(h.controller)  # back within the grace: told again
    again = await h.room.next_data()
    assert again.destinations == (h.controller,)
    assert h.room.data.empty()
