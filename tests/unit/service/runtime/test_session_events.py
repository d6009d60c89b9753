"""The runtime tells its `SessionEvents` of each webhook moment of a session's life, in order, once each: queued,
running, paused, resumed, warning, ended; and the frames it generated. Fake workers, fake timers."""

from __future__ import annotations

from collections.abc import Mapping

from service.runtime.records import SessionEventKind
from service.runtime.sessions import Session
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
