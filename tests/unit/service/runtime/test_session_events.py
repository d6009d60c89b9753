"""The runtime tells its `SessionEvents` of each webhook moment of a session's life, in order, once each: queued,
running, paused, resumed, warning, ended; recording.ready or recording.failed once a recording is done; and the frames
it generated. Fake workers, fake timers."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path

from service.runtime.recording_catalog import RecordingEntry
from service.runtime.records import LostSession, SessionEventKind
from service.runtime.sessions import Session
from tests.support.fakes.recording_writers import failing_writer
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.service_harness import RecordingTransport, running_service
from tests.support.waits import until


class EventLog:
    """A `SessionEvents` that keeps what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, SessionEventKind, dict[str, object]]] = []
        self.frames: dict[str, int] = {}

    def session_event(
        self, session: Session, kind: SessionEventKind, details: Mapping[str, object] | None = None
    ) -> None:
        self.events.append((session.id, kind, dict(details or {})))

    def generated(self, session: Session, frames: int) -> None:
        self.frames[session.id] = self.frames.get(session.id, 0) + frames

    def session_lost(self, lost: LostSession) -> None:
        self.events.append((lost.snapshot.id, SessionEventKind.ENDED, {"lost": True}))

    def recording_lost(self, entry: RecordingEntry) -> None:
        self.events.append((entry.session_id, SessionEventKind.RECORDING_FAILED, {"lost": True}))

    def kinds(self, session_id: str) -> list[SessionEventKind]:
        return [kind for sid, kind, _ in self.events if sid == session_id]


async def test_each_moment_of_a_session_is_told_once_in_order() -> None:
    log = EventLog()
    timers = FakeTimers()
    async with running_service(transport=RecordingTransport(), timers=timers, events=log) as svc:
        first = (await svc.create({"max_seconds": 100})).json()["id"]
        second = (await svc.create()).json()["id"]  # one slot: it waits
        await until(lambda: SessionEventKind.RUNNING in log.kinds(first), "the first session to run", every=0)
        assert log.kinds(second) == [SessionEventKind.QUEUED]
        svc.world.emit(first, 3)
        await until(lambda: log.frames.get(first, 0) == 3, "three one-frame chunks counted", every=0)
        await svc.client.post(f"/v1/sessions/{first}/pause")
        await svc.client.post(f"/v1/sessions/{first}/pause")  # idempotent: told once
        await svc.client.post(f"/v1/sessions/{first}/resume")
        timers.advance(70.0)  # 30 s before its time limit
        await until(lambda: SessionEventKind.WARNING in log.kinds(first), "the time-limit warning", every=0)
        await svc.client.delete(f"/v1/sessions/{first}", params={"mode": "cancel"})
        await until(lambda: SessionEventKind.RUNNING in log.kinds(second), "the second session to run", every=0)
        assert log.kinds(first) == [
            SessionEventKind.RUNNING,
            SessionEventKind.PAUSED,
            SessionEventKind.RESUMED,
            SessionEventKind.WARNING,
            SessionEventKind.ENDED,
        ]
        warning = next(details for sid, kind, details in log.events if kind is SessionEventKind.WARNING)
        assert (warning["code"], warning["ends_in_s"]) == ("time_limit", 30.0)


_OUTCOMES = (SessionEventKind.RECORDING_READY, SessionEventKind.RECORDING_FAILED)


def _told(log: EventLog, session_id: str, *kinds: SessionEventKind) -> bool:
    return any(kind in log.kinds(session_id) for kind in kinds)


def _recording(details: dict[str, object]) -> dict[str, object]:
    recording = details["recording"]  # nested, so the session's own fields (status, reason) stay
    assert isinstance(recording, dict)
    return recording


def _counted(log: EventLog, session_id: str, frames: int) -> bool:
    return log.frames.get(session_id, 0) == frames


async def test_a_recordings_outcome_is_told_as_recording_ready_or_failed_and_listed(tmp_path: Path) -> None:
    log = EventLog()
    async with running_service(
        transport=RecordingTransport(), recordings_dir=tmp_path, recording_writer=failing_writer(2), events=log
    ) as svc:
        outcomes: dict[int, str] = {}
        for chunks in (2, 4):  # the writer fails on the third chunk of a recording
            sid: str = (await svc.create({"record": True})).json()["id"]
            await until(functools.partial(_told, log, sid, SessionEventKind.RUNNING), "the session to run", every=0)
            svc.world.emit(sid, chunks)
            await until(functools.partial(_counted, log, sid, chunks), "its chunks counted", every=0)
            await svc.client.delete(f"/v1/sessions/{sid}")
            await until(functools.partial(_told, log, sid, *_OUTCOMES), "the recording's outcome", within=10)
            outcomes[chunks] = sid
        ready = [_recording(d) for sid, kind, d in log.events if kind is SessionEventKind.RECORDING_READY]
        failed = [_recording(d) for sid, kind, d in log.events if kind is SessionEventKind.RECORDING_FAILED]
        assert [(d["state"], d["frames"], d["video_url"]) for d in ready] == [
            ("ready", 2, f"/v1/sessions/{outcomes[2]}/recording")
        ]
        assert [(d["state"], d["code"]) for d in failed] == [("failed", "recording_failed")]
        assert "No space left on device" in str(failed[0]["reason"])
        listed = (await svc.client.get("/v1/recordings")).json()
        assert [(item["session_id"], item["state"], item["code"]) for item in listed["recordings"]] == [
            (outcomes[2], "ready", None),
            (outcomes[4], "failed", "recording_failed"),
        ]
        assert listed["next_cursor"] is None
        first = (await svc.client.get("/v1/recordings", params={"limit": 1})).json()
        assert [item["session_id"] for item in first["recordings"]] == [outcomes[2]]
        rest = (await svc.client.get("/v1/recordings", params={"limit": 1, "cursor": first["next_cursor"]})).json()
        assert [item["session_id"] for item in rest["recordings"]] == [outcomes[4]]
        bad = await svc.client.get("/v1/recordings", params={"cursor": "nonsense"})
        assert (bad.status_code, bad.json()["error"]["code"]) == (422, "invalid_request")
