"""The redis backend's settings and the registry formats (the replicas themselves: tests/e2e/test_scaleout.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

import pytest

from admission import TicketReason, TicketState
from service.config_records import ServiceConfig
from service.errors import SettingsError
from service.runtime.recordings import RecordingReport, RecordingState
from service.runtime.sessions import SessionSnapshot, SessionState
from service.scaleout.redis_side.records import SharedTicketView
from service.scaleout.registry import (
    CreatePayload,
    RegistryStream,
    body_resumed_room,
    decode_payload,
    encode_body,
    encode_payload,
    failed_body,
    payload_caller_room,
    payload_records,
    remote_snapshot,
)
from service.settings import load_settings
from transport.base import CallerRoom, ResumedRoom

URL = "redis://:secret-password@127.0.0.1:6379/0"


def test_the_redis_backend_without_a_url_stops_the_start_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_ADMISSION_BACKEND", "redis")
    with pytest.raises(SettingsError, match="LINGSTREAM_REDIS_URL"):
        load_settings()


def test_a_redis_url_of_another_scheme_is_refused_without_echoing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_ADMISSION_BACKEND", "redis")
    monkeypatch.setenv("LINGSTREAM_REDIS_URL", "http://user:secret-password@redis:6379")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "LINGSTREAM_REDIS_URL" in str(caught.value)
    assert "secret-password" not in str(caught.value)


def test_each_process_gets_its_own_replica_id_unless_one_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_ADMISSION_BACKEND", "redis")
    monkeypatch.setenv("LINGSTREAM_REDIS_URL", URL)
    monkeypatch.setenv("LINGSTREAM_REPLICA_TTL", "4.5")
    first = ServiceConfig.from_settings(load_settings()).shared_admission
    second = ServiceConfig.from_settings(load_settings()).shared_admission
    assert first is not None
    assert second is not None
    assert first.replica_id != second.replica_id
    assert first.replica_ttl_s == 4.5
    assert "secret-password" not in repr(ServiceConfig.from_settings(load_settings()))
    monkeypatch.setenv("LINGSTREAM_REPLICA_ID", "pod-a")
    named = ServiceConfig.from_settings(load_settings()).shared_admission
    assert named is not None
    assert named.replica_id == "pod-a"


def test_memory_stays_the_default_backend() -> None:
    assert ServiceConfig.from_settings(load_settings()).shared_admission is None


@pytest.mark.parametrize("value", ["has space", "slash/name", "x" * 201])
def test_an_unusable_replica_id_is_refused(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("LINGSTREAM_REPLICA_ID", value)
    with pytest.raises(SettingsError, match="LINGSTREAM_REPLICA_ID"):
        load_settings()


def test_the_create_payload_round_trips_config_image_bytes_and_time_limit() -> None:
    image = b"\x89PNG\r\n\x1a\n\nbinary\n"
    request = decode_payload(encode_payload({"fps": 12, "note": "two\nlines"}, image, max_seconds=90.0))
    assert request == CreatePayload({"fps": 12, "note": "two\nlines"}, image, 90.0)
    assert decode_payload(encode_payload({}, None)) == CreatePayload({}, None, None)
    with pytest.raises(ValueError, match="payload"):
        decode_payload(b'{"other": 1}\n')
    # A recorded session's request says so, so that the replica that admits it records it.
    recorded = encode_payload({"fps": 12}, image, record=True)
    assert payload_records(recorded)
    assert decode_payload(recorded) == CreatePayload({"fps": 12}, image)
    assert not payload_records(encode_payload({"fps": 12}, image))
    with pytest.raises(ValueError, match="max_seconds"):
        decode_payload(b'{"config": {}, "max_seconds": -1}\n')


def test_the_create_payload_carries_the_callers_livekit_room_to_the_replica_that_admits_it() -> None:
    image = b"\x89PNG\r\n"
    with_token = CallerRoom("lobby", "user-42", url="wss://caller.example", token="eyJ.a.b", agent_identity="agent-1")
    for room in (CallerRoom("lobby-7"), CallerRoom("lobby 7 ✓", controller_identity="user-42"), with_token):
        payload = encode_payload({"fps": 12}, image, room)
        assert payload_caller_room(payload) == room
        assert decode_payload(payload) == CreatePayload({"fps": 12}, image)
    assert payload_caller_room(encode_payload({}, None)) is None
    with pytest.raises(ValueError, match="payload"):
        payload_caller_room(b'{"config": {}, "livekit": {"room": 7}}\n')


def _snapshot(state: SessionState, **changes: object) -> SessionSnapshot:
    fields: dict[str, object] = {
        "id": "s1",
        "state": state,
        "reason": None,
        "queue_position": None,
        "created_at": 100.0,
        "updated_at": 101.0,
        "transport": {"kind": "embedded", "offer_url": "/v1/sessions/s1/webrtc"},
        "config": {"fps": 12},
        "width": 416,
        "height": 240,
        "fps": 12.0,
        "error": None,
        "sequence": 3,
    }
    fields.update(changes)
    return SessionSnapshot(**fields)  # type: ignore[arg-type]


def _view(state: TicketState, **changes: object) -> SharedTicketView:
    fields: dict[str, object] = {
        "ticket_id": "s1",
        "owner": "anonymous",
        "state": state,
        "reason": None,
        "position": None,
        "worker": 0,
        "retry_after_s": None,
        "created_at": 99.0,
        "admitted_at": 99.5,
        "ended_at": None,
        "queue_deadline": None,
        "heartbeat_deadline": None,
        "replica": "r1",
        "origin": "r2",
        "version": 7,
    }
    fields.update(changes)
    return SharedTicketView(**fields)  # type: ignore[arg-type]


def test_a_remote_snapshot_is_the_owners_body_with_admissions_state() -> None:
    body = encode_body(_snapshot(SessionState.RUNNING))
    snapshot = remote_snapshot(_view(TicketState.ADMITTED, status="running", body=body))
    assert snapshot.state is SessionState.RUNNING
    assert (snapshot.width, snapshot.height, snapshot.fps) == (416, 240, 12.0)
    assert dict(snapshot.config) == {"fps": 12}
    assert snapshot.transport is not None
    assert snapshot.transport["offer_url"] == "/v1/sessions/s1/webrtc"
    assert snapshot.sequence == 7
    assert (snapshot.record, snapshot.recording) == (False, None)


def test_a_remote_snapshot_says_the_session_records_but_not_how_its_recording_stands() -> None:
    report = RecordingReport(RecordingState.RECORDING, None, frames=12, bytes=3456)
    body = encode_body(_snapshot(SessionState.RUNNING, record=True, recording=report))
    snapshot = remote_snapshot(_view(TicketState.ADMITTED, status="running", body=body))
    # The recording is the owning replica's (served there only); its figures would be stale from the registry.
    assert (snapshot.record, snapshot.recording) == (True, None)


def test_a_queued_ticket_reads_its_live_global_position_and_the_body_from_its_create() -> None:
    body = encode_body(_snapshot(SessionState.QUEUED, transport=None))
    snapshot = remote_snapshot(_view(TicketState.QUEUED, position=4, worker=None, replica=None, body=body))
    assert (snapshot.state, snapshot.queue_position) == (SessionState.QUEUED, 4)
    assert snapshot.width == 416


def test_a_session_of_a_dead_replica_reads_failed_with_the_replica_named() -> None:
    body = encode_body(_snapshot(SessionState.RUNNING))
    view = _view(
        TicketState.RELEASED,
        reason=TicketReason.SESSION_ENDED,
        ended_at=120.0,
        failure="replica_lost: r1",
        status="failed",
        status_reason="replica_lost: r1",
        body=body,
    )
    snapshot = remote_snapshot(view)
    assert snapshot.state is SessionState.FAILED
    assert snapshot.reason == "replica_lost: r1"
    assert snapshot.error is not None
    assert snapshot.error[0] == "replica_lost"
    assert "r1" in snapshot.error[1]


def test_a_record_recreated_bare_after_redis_lost_its_data_still_reads() -> None:
    snapshot = remote_snapshot(_view(TicketState.ADMITTED, status="admitted"))
    assert snapshot.state is SessionState.ADMITTED
    assert (snapshot.width, dict(snapshot.config)) == (0, {})


def test_a_released_session_without_a_final_status_reads_closed_and_queue_exits_keep_their_reason() -> None:
    assert remote_snapshot(_view(TicketState.RELEASED, status="running")).state is SessionState.CLOSED
    expired = remote_snapshot(_view(TicketState.EXPIRED, reason=TicketReason.HEARTBEAT_LOST, worker=None))
    assert (expired.state, expired.reason) == (SessionState.EXPIRED, "heartbeat_lost")


def test_a_session_not_started_by_its_replica_reads_failed_with_the_message() -> None:
    body = failed_body(encode_body(_snapshot(SessionState.QUEUED)), SessionState.FAILED, "create_failed", "expired")
    assert json.loads(body)["config"] == {"fps": 12}
    snapshot = remote_snapshot(_view(TicketState.RELEASED, status="failed", status_reason="create_failed", body=body))
    assert snapshot.state is SessionState.FAILED
    assert snapshot.error == ("create_failed", "expired")


def test_an_adopter_reads_the_room_and_identities_to_join_again_from_the_old_replicas_published_details() -> None:
    details = {
        "kind": "livekit",
        "room": "lingstream-s1",
        "identity": "ctl-s1-abc",
        "service_identity": "svc-s1-def",
        "token": "t",
        "room_owner": "service",
    }
    body = json.dumps({"state": "running", "transport": details})
    assert body_resumed_room(body) == ResumedRoom("lingstream-s1", "ctl-s1-abc", "svc-s1-def")
    # A caller's room is joined again too: the adopter goes on in the caller's room, as the same participants.
    caller = json.dumps({"transport": {**details, "room": "lobby-7", "token": None, "room_owner": "caller"}})
    assert body_resumed_room(caller) == ResumedRoom("lobby-7", "ctl-s1-abc", "svc-s1-def")
    embedded = json.dumps({"transport": {"kind": "embedded", "offer_url": "/v1/sessions/s1/webrtc"}})
    partial = json.dumps({"transport": {**details, "service_identity": None}})
    for other in (embedded, partial, json.dumps({"transport": None}), None, "not json"):
        assert body_resumed_room(other) is None, other


async def test_a_registry_stream_closed_while_it_waits_ends_without_reading_again() -> None:
    """A draining replica closes the event streams it serves of sessions elsewhere (`RedisBackend.stop_admitting`):
    the one waiting for a change ends at once, the SSE response with it, and its client follows the session through
    another replica (issue #33: left open, the replica's shutdown waited 10 s for it and logged a traceback)."""
    reads: list[str] = []
    unfollowed: list[str] = []

    async def read(ticket_id: str) -> SharedTicketView:
        reads.append(ticket_id)
        return _view(TicketState.ADMITTED, status="paused")

    def follow(ticket_id: str, wake: asyncio.Event) -> Callable[[], None]:
        return lambda: unfollowed.append(ticket_id)

    stream = RegistryStream(read, _view(TicketState.ADMITTED, status="running"), follow=follow)
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)  # it waits for a wake
    assert not waiting.done()
    stream.close()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(waiting, 1.0)
    assert reads == []  # nothing read after the close
    assert unfollowed == ["s1"]  # and the ticket no longer followed
