"""`SessionConductor`: what happens to the runtime's live sessions, whoever makes it happen.

Admission decides (`admission_event`: a new queue position, admitted, expired, cancelled; `lose`: it took a session
away), clients ask (close, pause, resume), deadlines expire (`service.runtime.limits`), the service drains
(`drain_started`), a model worker rebuilds a session after it failed (`recovery`: RUNNING -> RECOVERING -> RUNNING,
docs/continuity.md), and each admitted session's runner reports (`service.runtime.runner`: running, generated, ended).
The conductor turns each of these into the session's own transitions (`Session.admitted`, `move`,
`request_close`, ...), starts one runner task per admitted session (in a copy of the context, where the session id is
bound for every log line and the observer binds its span), and tells the `SessionTable` when a session ended. It
holds the runner and the deadlines; `ServiceRuntime` holds it and answers the routes.

Everything runs on the event loop and is synchronous, so a decision and its publication are atomic; the runner tasks
are spawned into the runtime's `TaskSet`, which cancels and awaits them at `aclose()` (after `wait_runners`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging

from admission import AdmissionEvent, AdmissionEventKind
from pipeline.bidirectional import ChunkOutput, CloseMode, PortableCheckpoint, RecoveryNotice
from service.logs import bind_session_id, session_context
from service.runtime.backend import AdmissionBackend
from service.runtime.health import WorkerHealth
from service.runtime.limits import PAUSED_TOO_LONG, LimitsConfig, SessionDeadlines
from service.runtime.pausing import set_paused
from service.runtime.recordings import RecordingStore
from service.runtime.records import (
    HandOffRoom,
    LostSession,
    NoEvents,
    RuntimeTuning,
    SessionEventKind,
    SessionEvents,
    SessionObserver,
)
from service.runtime.runner import RunnerCallbacks, SessionRunner
from service.runtime.session_table import SessionTable
from service.runtime.sessions import Session, SessionState
from service.runtime.tasks import TaskSet
from transport.base import Transport, WarningStatus
from transport.session.timers import Timers

__all__ = ["NoObserver", "SessionConductor"]

logger = logging.getLogger(__name__)


class NoObserver:
    """A `SessionObserver` that observes nothing (the runtime's default)."""

    def admission_event(self, session: Session, event: AdmissionEvent) -> None:
        pass

    def enter_session(self, session: Session) -> None:
        pass

    def chunk(self, session: Session, chunk: ChunkOutput) -> None:
        pass

    def session_ended(self, session: Session) -> None:
        pass


class SessionConductor:
    """Carries out every change to the live sessions of one runtime (see the module docstring).

    `drain_timeout_s` is what a draining session is told it has left; `max_pause_s` the longest pause.
    """

    def __init__(
        self,
        *,
        table: SessionTable,
        backend: AdmissionBackend,
        workers: WorkerHealth,
        transport: Transport | None,
        tuning: RuntimeTuning,
        observer: SessionObserver,
        recordings: RecordingStore | None,
        timers: Timers,
        tasks: TaskSet,
        drain_timeout_s: float,
        max_pause_s: float,
        events: SessionEvents | None = None,
    ) -> None:
        self._table = table
        self._events: SessionEvents = events if events is not None else NoEvents()
        self._backend = backend
        self._workers = workers
        self._observer = observer
        self._tasks = tasks
        self._drain_timeout_s = drain_timeout_s
        self._max_pause_s = max_pause_s
        self._draining = False
        self._runners: set[asyncio.Task[None]] = set()
        self._runner = SessionRunner(
            transport,
            tuning,
            observer,
            RunnerCallbacks(
                request_close=self.request_close,
                running=self._running,
                release_slot=backend.release,
                ended=self.ended,
                set_paused=self.set_paused,
                generated=self._generated,
                save_checkpoint=self._save_checkpoint,
            ),
            recordings=recordings,
        )
        self._deadlines = SessionDeadlines(
            LimitsConfig(max_pause_s=max_pause_s),
            timers,
            on_warning=self._warn,
            on_expired=self._expired,
        )

    # -- from admission

    def admission_event(self, session: Session, event: AdmissionEvent) -> None:
        """An admission decision about a live session with a record here (synchronous, from the backend)."""
        with session_context(session.id):
            self._observer.admission_event(session, event)
            self._apply(session, event)

    def _apply(self, session: Session, event: AdmissionEvent) -> None:
        view = event.ticket
        kind = event.kind
        if kind in (AdmissionEventKind.QUEUED, AdmissionEventKind.POSITION_CHANGED):
            session.set_position(view.position)
            if kind is AdmissionEventKind.QUEUED:
                self._events.session_event(session, SessionEventKind.QUEUED)
        elif kind is AdmissionEventKind.ADMITTED:
            session.admitted(view.worker)
            logger.info("session %s admitted on worker %s", session.id, view.worker)
            worker = self._workers[view.worker if view.worker is not None else 0]
            context = contextvars.copy_context()
            context.run(self._enter_session, session)
            runner = self._tasks.spawn(self._runner.run(session, worker), name=f"session-{session.id}", context=context)
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)
        elif kind in (AdmissionEventKind.EXPIRED, AdmissionEventKind.CANCELLED):
            state = SessionState.EXPIRED if kind is AdmissionEventKind.EXPIRED else SessionState.CANCELLED
            reason = view.reason.value if view.reason is not None else state.value
            logger.info("session %s left the queue: %s (%s)", session.id, state.value, reason)
            session.move(state, reason=reason)
            self.ended(session)

    def lose(self, session: Session, code: str, message: str) -> None:
        """Admission took the session away: a queued one ends cancelled, an admitted one fails and is cancelled."""
        if session.state is SessionState.QUEUED:
            session.move(SessionState.CANCELLED, reason=code)
            self.ended(session)
            return
        session.record_failure(code, message)
        self.request_close(session, CloseMode.CANCEL, code)

    def lost_elsewhere(self, lost: LostSession) -> None:
        """A session lost with another replica, declared ended here: its `session.ended`."""
        with session_context(lost.snapshot.id):
            logger.info("session %s: lost with its replica; its end is reported from here", lost.snapshot.id)
            self._events.session_lost(lost)

    def forget(self, session: Session) -> None:
        """A queued session lives on elsewhere: drop its record here, uncounted."""
        self._table.drop(session.id)
        self._observer.session_ended(session)

    # -- from clients, deadlines and the drain

    def request_close(self, session: Session, mode: CloseMode, reason: str) -> None:
        """Close the session with `mode`: cancelled while queued (by admission), else its runner closes it."""
        if session.state is SessionState.QUEUED:
            self._backend.cancel_queued(session)
        else:
            session.request_close(mode, reason)

    def close_all(self, mode: CloseMode, reason: str) -> None:
        """Ask every admitted session to close with `mode`."""
        for session in self._table.admitted():
            self.request_close(session, mode, reason)

    def set_paused(self, session: Session, paused: bool) -> None:
        """Pause or resume a session with a record here (the REST route and the client's control channel)."""
        worker = self._workers[session.worker if session.worker is not None else 0]
        if not set_paused(session, worker, paused, max_pause_s=self._max_pause_s):
            return
        logger.info("session %s %s", session.id, "paused" if paused else "resumed")
        self._events.session_event(session, SessionEventKind.PAUSED if paused else SessionEventKind.RESUMED)
        if paused:
            self._deadlines.paused(session)
            return
        self._deadlines.resumed(session)
        if session.warning is not None and session.warning.code == PAUSED_TOO_LONG:
            session.warn(None)
        if session.service_draining or self._draining:
            self._mark_service_draining(session)

    def recovery(self, notice: RecoveryNotice) -> None:
        """A model worker is rebuilding a session from its checkpoint (a running session moves to RECOVERING, its
        slot, transport and id kept), or has rebuilt it (back to RUNNING). A session that is paused, closing or
        draining keeps its state: it goes on (or ends) as it was going to."""
        session = self._table.get(notice.session_id)
        if session is None or session.terminal or session.close_mode is not None:
            return
        if notice.recovering:
            if session.state is SessionState.RUNNING:
                session.move(
                    SessionState.RECOVERING,
                    detail=f"the model worker failed ({notice.cause}); rebuilding the session (attempt "
                    f"{notice.attempt})",
                )
            return
        if session.state is SessionState.RECOVERING:
            seconds = notice.recovery_s if notice.recovery_s is not None else 0.0
            session.move(SessionState.RUNNING, detail=f"rebuilt after {seconds:.1f} s")
            if session.service_draining or self._draining:
                self._mark_service_draining(session)

    def drain_started(self) -> None:
        """The service drains: every admitted session is told (a running one moves to DRAINING), and so is every
        session that starts running or resumes from now on."""
        self._draining = True
        for session in self._table.admitted():
            self._mark_service_draining(session)

    async def hand_off(self, session: Session) -> bool | None:
        """The service drains with hand-off: if another replica has room for the running or paused `session` now,
        stop it here to be adopted there (True; a paused one goes on paused there); False: no room yet, ask again;
        None: it cannot be handed off from here. The runner stops it (cancel), then its release gives it to admission
        (docs/continuity.md). On either transport: the embedded client joins the adopter through the service; on
        LiveKit the detach leaves the session's room standing (`SessionPort.handed_off`) and the adopter joins it
        again as the same participant."""
        room = await self._backend.hand_off_room(session)
        if room is HandOffRoom.NEVER:
            return None
        if room is HandOffRoom.NOT_YET:
            return False
        paused = session.state is SessionState.PAUSED
        detail = "the service is draining; the session moves to another replica" + (" (paused)" if paused else "")
        if not session.hand_off(detail):
            return None  # it closed meanwhile
        logger.info("session %s: handed off (another replica has room for it)", session.id)
        return True

    def _expired(self, session: Session, reason: str) -> None:
        """A session reached its time limit, or stayed paused too long: it ends now, its slot goes back at once."""
        self.request_close(session, CloseMode.CANCEL, reason)

    def _warn(self, session: Session, status: WarningStatus) -> None:
        session.warn(status)
        details = {"code": status.code, "message": status.message, "ends_in_s": status.ends_in_s}
        self._events.session_event(session, SessionEventKind.WARNING, details)

    def _mark_service_draining(self, session: Session) -> None:
        session.mark_service_draining(
            f"the service is draining; the session ends within {self._drain_timeout_s:g} s",
        )

    # -- from the runners

    def _enter_session(self, session: Session) -> None:
        """Runs in the runner's own context: the session id for every log line, the observer's binding."""
        bind_session_id(session.id)
        self._observer.enter_session(session)

    def _running(self, session: Session) -> None:
        """The runner moved the session to RUNNING: a session handed over paused (handed off paused, or its replica
        lost while it was paused) goes on paused (its worker created it paused; its pause's deadline counts from its
        first pause); a service that drains (now, or since it was admitted) says so; its time limit starts."""
        self._deadlines.running(session)
        self._events.session_event(session, SessionEventKind.RUNNING)
        paused_for = session.paused_for_s
        if paused_for is not None and session.state is SessionState.RUNNING:
            left = max(0.0, self._max_pause_s - paused_for)
            session.move(
                SessionState.PAUSED,
                detail=f"paused (it goes on from another replica); it closes unless resumed within {left:.0f} s",
            )
            logger.info("session %s goes on paused (paused %.1f s ago, on the replica it left)", session.id, paused_for)
            self._events.session_event(session, SessionEventKind.PAUSED)
            self._deadlines.paused(session, elapsed_s=paused_for)
        if session.service_draining or self._draining:
            self._mark_service_draining(session)

    def _generated(self, session: Session, chunk: ChunkOutput) -> None:
        frames = chunk.frames.shape[0] if chunk.frames.ndim == 4 else 1
        self._backend.record_chunk(session, int(frames))
        self._events.generated(session, int(frames))

    def _save_checkpoint(self, session: Session, checkpoint: PortableCheckpoint, resumable: bool) -> None:
        """What a successor goes on from: the session after the last chunk its client was sent (the runner holds
        each chunk's checkpoint until the transport delivered it, `service.runtime.delivery`)."""
        self._backend.save_checkpoint(session, checkpoint, resumable=resumable)

    def ended(self, session: Session) -> None:
        """The session reached its final state (its runner finished it, or it left the queue). One handed off
        ended only here: it leaves the table uncounted (the registry answers for it) and no `session.ended` goes
        out (the adopter's end is the session's)."""
        self._deadlines.ended(session)
        self._observer.session_ended(session)
        if session.handing_off:
            self._table.drop(session.id)
            return
        self._events.session_event(session, SessionEventKind.ENDED)
        self._table.ended(session)

    async def wait_runners(self, deadline: float) -> None:
        """Let the runners still running finish (an ended session's runner still detaches its transport) until
        `deadline` (loop time)."""
        runners = [task for task in self._runners if not task.done()]
        if runners:
            await asyncio.wait(runners, timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
