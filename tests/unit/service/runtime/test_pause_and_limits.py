"""Pause and resume, time limits and prompts through the real service (REST, the session's control port), on fake
workers and fake timers: no test waits real seconds for a deadline."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipeline.bidirectional import ControlState, Pause, Resume, SetPrompt
from service.runtime.sessions import SessionState
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.service_harness import Harness, RecordingTransport, metric, running_service
from tests.support.waits import until
from transport.base import ChunkStatus, DoneStatus, StateStatus, WarningStatus
from transport.errors import ControlRejectedError


async def _status(svc: Harness, session_id: str, **kwargs: Any) -> dict[str, Any]:
    body: dict[str, Any] = (await svc.client.get(f"/v1/sessions/{session_id}", **kwargs)).json()
    return body


async def _scrape(svc: Harness) -> str:
    response = await svc.client.get("/metrics")
    assert response.status_code == 200
    return response.text


def _ended_by(text: str, reason: str) -> float:
    return metric(text, f'lingstream_sessions_ended_limit_total{{reason="{reason}"}}')


async def _ended(svc: Harness, session_id: str) -> dict[str, Any]:
    session = svc.runtime._table[session_id]
    await until(lambda: session.terminal, "the session to end", every=0)
    return await _status(svc, session_id)


def _statuses(svc: Harness, session_id: str, kind: type[Any]) -> list[Any]:
    assert svc.transport is not None
    return [message for message in svc.transport.statuses[session_id] if isinstance(message, kind)]


# --- pause and resume -----------------------------------------------------------------------------------------------


async def test_pause_and_resume_over_rest_keep_the_session_and_are_idempotent() -> None:
    async with running_service(transport=RecordingTransport(), timers=FakeTimers()) as svc:
        sid = (await svc.create()).json()["id"]
        paused = await svc.client.post(f"/v1/sessions/{sid}/pause")
        assert paused.status_code == 200
        assert paused.json()["status"] == "paused"
        assert (await _status(svc, sid))["status"] == "paused"
        again = await svc.client.post(f"/v1/sessions/{sid}/pause")
        assert (again.status_code, again.json()["status"]) == (200, "paused")
        assert svc.world.controls[sid] == [Pause()]  # the second pause changed nothing
        resumed = await svc.client.post(f"/v1/sessions/{sid}/resume")
        assert (resumed.status_code, resumed.json()["status"]) == (200, "running")
        assert (await svc.client.post(f"/v1/sessions/{sid}/resume")).json()["status"] == "running"
        assert svc.world.controls[sid] == [Pause(), Resume()]
        await until(lambda: len(_statuses(svc, sid, StateStatus)) >= 3, "three state statuses", every=0)
        states = [status.state for status in _statuses(svc, sid, StateStatus)]
        assert states[-2:] == ["paused", "running"]
        assert svc.world.session_ids() == [sid]  # the same session throughout: nothing was rebuilt


async def test_a_session_paused_past_the_longest_pause_is_warned_then_closed_and_its_slot_freed() -> None:
    timers = FakeTimers()
    async with running_service(transport=RecordingTransport(), timers=timers, max_pause=60) as svc:
        sid = (await svc.create()).json()["id"]
        waiting = (await svc.create()).json()["id"]  # queued behind it: one slot
        await svc.client.post(f"/v1/sessions/{sid}/pause")
        assert metric(await _scrape(svc), 'lingstream_sessions{state="paused"}') == 1
        timers.advance(29.0)
        assert _statuses(svc, sid, WarningStatus) == []
        timers.advance(1.0)
        await until(lambda: len(_statuses(svc, sid, WarningStatus)) == 1, "one warning status", every=0)
        warning = _statuses(svc, sid, WarningStatus)[0]
        assert (warning.code, warning.ends_in_s) == ("paused_too_long", 30.0)
        timers.advance(30.0)
        body = await _ended(svc, sid)
        assert (body["status"], body["reason"]) == ("closed", "paused_too_long")
        await until(
            lambda: svc.runtime._table[waiting].state is SessionState.RUNNING, "the waiting session to run", every=0
        )
        text = await _scrape(svc)
        assert (_ended_by(text, "paused_too_long"), _ended_by(text, "time_limit")) == (1, 0)
        assert metric(text, 'lingstream_sessions{state="paused"}') == 0


async def test_a_session_handed_over_paused_goes_on_paused_its_pause_counted_from_its_first_pause() -> None:
    """What the adopter's runtime does with a session a draining replica handed off paused (docs/continuity.md):
    once it runs here it moves to paused at once, and its pause deadline is what is left of the longest pause."""
    timers = FakeTimers()
    async with running_service(transport=RecordingTransport(), timers=timers, max_pause=60) as svc:
        first = (await svc.create()).json()["id"]
        sid = (await svc.create()).json()["id"]  # queued behind it: one slot
        session = svc.runtime._table[sid]
        session.handed_over_paused(40.0)  # as `Ownership._adopt` does: 40 s into its pause on the replica it left
        # A listener from before it runs (a LiveKit binding that joined its room early): never told `running` on
        # its way to paused, which a page would show as playing for a moment.
        with session.statuses.subscribe() as early:
            await svc.client.delete(f"/v1/sessions/{first}")
            await until(lambda: session.state is SessionState.PAUSED, "the session paused once it runs", every=0)
            told: list[str] = []
            while told[-1:] != ["paused"]:
                status = await anext(early)
                if isinstance(status, StateStatus):
                    told.append(status.state)
            assert told == ["admitted", "paused"], told
        assert (await _status(svc, sid))["status"] == "paused"
        await until(lambda: [m.state for m in _statuses(svc, sid, StateStatus)][-1:] == ["paused"], "told", every=0)
        assert "running" not in [m.state for m in _statuses(svc, sid, StateStatus)]
        # 20 s left of the longest pause, under the 30 s warning lead: warned at once, closed 20 s on.
        await until(lambda: len(_statuses(svc, sid, WarningStatus)) == 1, "one warning status", every=0)
        assert _statuses(svc, sid, WarningStatus)[0].code == "paused_too_long"
        timers.advance(19.0)
        assert not session.terminal
        timers.advance(1.5)
        body = await _ended(svc, sid)
        assert (body["status"], body["reason"]) == ("closed", "paused_too_long")


async def test_a_session_handed_over_paused_past_the_longest_pause_ends_paused_too_long_at_once() -> None:
    """Adopted 70 s into its pause (its replica lost while it was paused: the reaper kept the pause in its ticket,
    `test_redis_adoption.py::test_a_pause_older_than_the_longest_pause_reaches_the_adopter_whole`), past the longest
    pause of 60 s: its deadline is due at once (0 s left): warned, then closed `paused_too_long`."""
    timers = FakeTimers()
    async with running_service(transport=RecordingTransport(), timers=timers, max_pause=60) as svc:
        first = (await svc.create()).json()["id"]
        sid = (await svc.create()).json()["id"]  # queued behind it: one slot
        session = svc.runtime._table[sid]
        session.handed_over_paused(70.0)
        await svc.client.delete(f"/v1/sessions/{first}")
        await until(lambda: session.state is SessionState.PAUSED, "the session paused once it runs", every=0)
        timers.advance(0.0)  # what is left of its pause: nothing
        body = await _ended(svc, sid)
        assert (body["status"], body["reason"]) == ("closed", "paused_too_long")
        assert _statuses(svc, sid, WarningStatus)[0].code == "paused_too_long"
        assert _ended_by(await _scrape(svc), "paused_too_long") == 1


async def test_resuming_in_time_cancels_the_pause_deadline() -> None:
    timers = FakeTimers()
    async with running_service(transport=RecordingTransport(), timers=timers, max_pause=60) as svc:
        sid = (await svc.create()).json()["id"]
        await svc.client.post(f"/v1/sessions/{sid}/pause")
        timers.advance(59.0)
        await svc.client.post(f"/v1/sessions/{sid}/resume")
        assert timers.live == []
        timers.advance(3600.0)
        assert (await _status(svc, sid))["status"] == "running"


async def test_pause_of_a_queued_session_is_409_session_queued() -> None:
    async with running_service(timers=FakeTimers()) as svc:
        await svc.create()
        queued = (await svc.create()).json()["id"]
        for action in ("pause", "resume"):
            answer = await svc.client.post(f"/v1/sessions/{queued}/{action}")
            assert answer.status_code == 409
            assert answer.json()["error"]["code"] == "session_queued"
        assert (await _status(svc, queued))["status"] == "queued"


async def test_pause_of_an_ended_session_and_resume_of_a_running_one_get_their_codes() -> None:
    async with running_service(timers=FakeTimers()) as svc:
        sid = (await svc.create()).json()["id"]
        await svc.client.delete(f"/v1/sessions/{sid}", params={"mode": "cancel"})
        await _ended(svc, sid)
        answer = await svc.client.post(f"/v1/sessions/{sid}/pause")
        assert (answer.status_code, answer.json()["error"]["code"]) == (409, "session_not_running")
        unknown = await svc.client.post("/v1/sessions/no-such-session/pause")
        assert (unknown.status_code, unknown.json()["error"]["code"]) == (404, "session_not_found")


async def test_pause_is_owner_only() -> None:
    async with running_service(api_keys="key-a,key-b", timers=FakeTimers()) as svc:
        mine = {"Authorization": "Bearer key-a"}
        sid = (await svc.create(headers=mine)).json()["id"]
        other = await svc.client.post(f"/v1/sessions/{sid}/pause", headers={"Authorization": "Bearer key-b"})
        assert (other.status_code, other.json()["error"]["code"]) == (404, "session_not_found")
        anonymous = await svc.client.post(f"/v1/sessions/{sid}/resume")
        assert (anonymous.status_code, anonymous.json()["error"]["code"]) == (401, "unauthorized")
        assert (await _status(svc, sid, headers=mine))["status"] == "running"


async def test_pause_and_resume_through_the_control_channel_and_a_refusal_while_closing() -> None:
    transport = RecordingTransport()
    async with running_service(transport=transport, timers=FakeTimers()) as svc:
        svc.world.hold_drain_closes = True  # keep the session closing while the client asks
        sid = (await svc.create()).json()["id"]
        port = transport.ports[sid]
        port.push_control(Pause())
        assert (await _status(svc, sid))["status"] == "paused"
        port.push_control(ControlState(3, frozenset({"w"})))  # kept for after the resume
        port.push_control(Resume())
        assert (await _status(svc, sid))["status"] == "running"
        assert svc.world.controls[sid] == [Pause(), ControlState(3, frozenset({"w"})), Resume()]
        await svc.client.delete(f"/v1/sessions/{sid}")  # drain, held: the session is closing
        with pytest.raises(ControlRejectedError) as refused:
            port.push_control(Pause())
        assert refused.value.code == "session_not_running"
        svc.world.release_closes()


# --- time limits ----------------------------------------------------------------------------------------------------


async def test_max_seconds_over_the_servers_limit_is_422_and_the_servers_limit_is_the_default() -> None:
    async with running_service(timers=FakeTimers(), max_session_seconds=120) as svc:
        over = await svc.create({"max_seconds": 121})
        assert (over.status_code, over.json()["error"]["code"]) == (422, "max_seconds_over_limit")
        assert svc.world.created == []  # refused before anything was built
        for bad in (0, -5, "soon", "60", True, 1e308):
            answer = await svc.create({"max_seconds": bad})
            assert (answer.status_code, answer.json()["error"]["code"]) == (422, "invalid_request")
        default = (await svc.create()).json()
        assert default["max_seconds"] == 120
        assert default["ends_at"] is not None


async def test_a_session_is_warned_30_s_before_its_time_limit_then_closed_and_its_slot_freed() -> None:
    timers = FakeTimers()
    async with running_service(transport=RecordingTransport(), timers=timers) as svc:
        created = (await svc.create({"max_seconds": 90})).json()
        sid = created["id"]
        assert created["max_seconds"] == 90
        waiting = (await svc.create()).json()["id"]
        assert (await _status(svc, waiting))["status"] == "queued"
        timers.advance(59.9)
        assert _statuses(svc, sid, WarningStatus) == []
        timers.advance(0.1)
        await until(lambda: len(_statuses(svc, sid, WarningStatus)) == 1, "one warning status", every=0)
        warning = _statuses(svc, sid, WarningStatus)[0]
        assert (warning.code, warning.ends_in_s) == ("time_limit", 30.0)
        timers.advance(30.0)
        body = await _ended(svc, sid)
        assert (body["status"], body["reason"]) == ("closed", "time_limit")
        assert svc.world.close_calls[0][0] == sid
        text = await _scrape(svc)
        assert (_ended_by(text, "time_limit"), _ended_by(text, "paused_too_long")) == (1, 0)
        assert metric(text, 'lingstream_sessions_ended_total{state="closed"}') == 1
        await until(
            lambda: svc.runtime._table[waiting].state is SessionState.RUNNING, "the waiting session to run", every=0
        )
        transport = svc.transport
        assert transport is not None
        await until(lambda: any(isinstance(m, DoneStatus) for m in transport.statuses[sid]), "the done status", every=0)


async def test_a_limit_shorter_than_the_warning_lead_warns_at_once_and_the_limit_runs_on_while_paused() -> None:
    timers = FakeTimers()
    async with running_service(transport=RecordingTransport(), timers=timers, max_pause=300) as svc:
        sid = (await svc.create({"max_seconds": 10})).json()["id"]
        await until(lambda: len(_statuses(svc, sid, WarningStatus)) == 1, "one warning status", every=0)
        assert _statuses(svc, sid, WarningStatus)[0].ends_in_s == 10.0
        await svc.client.post(f"/v1/sessions/{sid}/pause")
        timers.advance(10.0)
        body = await _ended(svc, sid)
        assert body["reason"] == "time_limit"  # paused, but its time ran out first
        assert timers.live == []


# --- prompts --------------------------------------------------------------------------------------------------------


async def test_the_create_prompt_reaches_the_worker_and_each_chunk_status_reports_its_prompt() -> None:
    transport = RecordingTransport()
    async with running_service(transport=transport, timers=FakeTimers()) as svc:
        created = (await svc.create({"prompt": "a snowy night"})).json()
        sid = created["id"]
        assert created["config"]["prompt"] == "a snowy night"
        svc.world.emit(sid)
        transport.ports[sid].push_control(SetPrompt(5, "golden dusk"))
        svc.world.emit(sid)
        await until(lambda: len(_statuses(svc, sid, ChunkStatus)) == 2, "two chunk statuses", every=0)
        chunks = _statuses(svc, sid, ChunkStatus)
        assert [(c.prompt, c.prompt_seq) for c in chunks] == [("a snowy night", -1), ("golden dusk", 5)]


async def test_bad_prompts_at_create_get_stable_codes() -> None:
    async with running_service(timers=FakeTimers()) as svc:
        long = await svc.create({"prompt": "é" * 257})  # 514 UTF-8 bytes
        assert (long.status_code, long.json()["error"]["code"]) == (422, "prompt_too_large")
        twice = await svc.create({"prompt": "a", "config": {"prompt": "b"}})
        assert (twice.status_code, twice.json()["error"]["code"]) == (422, "invalid_request")
        surrogate = await svc.client.post(
            "/v1/sessions",
            content=json.dumps({"prompt": "\ud800"}).encode(),
            headers={"content-type": "application/json"},
        )
        assert (surrogate.status_code, surrogate.json()["error"]["code"]) == (422, "invalid_request")
        assert svc.world.created == []
        exact = await svc.create({"prompt": "é" * 256})  # 512 bytes: the limit itself is fine
        assert exact.status_code == 201
