"""`ServiceRuntime`: the service's sessions, wired to admission, the model workers and the transport.

The HTTP layer (`service.http.routes`) only translates requests into calls on this object. It owns:

- the sessions' records, fed by its admission backend (`service.runtime.backend.AdmissionBackend`: this instance's
  own in memory by default, or one shared by every replica): every admission decision updates the matching
  `Session` (queue position, admitted, expired, cancelled) and is published to its SSE subscribers; a session it
  keeps no record of (queued in a shared queue, run by another replica) is answered by the backend;
- one *runner* task per admitted session (`service.runtime.runner.SessionRunner`): create it on its model worker,
  start its single output reader, attach the transport, wait for a close request, close it on the worker (drain,
  escalated to cancel on request), give the admission slot back exactly once, publish the final status, detach the
  transport;
- worker start-up and health (an unready worker admits nothing and makes the instance unready);
- the drain (SIGTERM or `POST /internal/drain`): not ready at once, no new admissions, queued sessions cancelled,
  running sessions get until `drain_timeout` to end (closed with drain shortly before it, cancelled at it);
- pause and resume (`service.runtime.pausing`: the REST routes and the client's control channel alike) and the
  deadlines of running sessions (`service.runtime.limits`: the time limit, the longest pause), on a `Timers` seam.

Everything runs on the event loop; model-side work happens inside the `BidirectionalService` implementation (its
threads or processes), never here. The only blocking call the runtime makes itself, `prepare` (plus the image
header check), runs in a worker thread. Every task is owned by a `TaskSet` and cancelled and awaited on `aclose()`.
Its tuning, the records it answers with and the protocols it is observed through are in `service.runtime.records`
(re-exported here).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import secrets
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence

from admission import AdmissionEvent, AdmissionEventKind, Clock
from pipeline.bidirectional import (
    BidirectionalService,
    ChunkOutput,
    CloseMode,
    PreparedSession,
)
from service.api_keys import key_id
from service.config_records import ServiceConfig
from service.errors import (
    AdmissionUnavailableError,
    DrainingError,
    InvalidConfigError,
    MaxSecondsTooLargeError,
    NotReadyError,
    RecordingFailedError,
    RecordingInProgressError,
    RecordingNotConfiguredError,
    RecordingNotFoundError,
    SessionNotFoundError,
    SessionStartError,
    SettingsError,
    lookup,
)
from service.logs import bind_session_id, session_context
from service.runtime.backend import AdmissionBackend
from service.runtime.config_view import config_view
from service.runtime.fanout import Subscription
from service.runtime.images import check_image
from service.runtime.limits import PAUSED_TOO_LONG, TIME_LIMIT, LimitsConfig, SessionDeadlines
from service.runtime.memory_backend import MemoryAdmissionBackend
from service.runtime.pausing import set_paused
from service.runtime.recordings import RecordingConfig, RecordingOutcome, RecordingState, RecordingStore, WriterFactory
from service.runtime.records import (
    DrainStatus,
    Readiness,
    RuntimeStatistics,
    RuntimeTuning,
    SessionObserver,
    SnapshotStream,
)
from service.runtime.runner import RunnerCallbacks, SessionRunner
from service.runtime.sessions import LIVE_STATES, Session, SessionSnapshot, SessionState
from service.runtime.tasks import TaskSet
from service.usage.ledger import UsageReport
from transport.base import CallerRoom, Transport
from transport.errors import RoomInUseError, RoomNotFoundError
from transport.session.timers import LoopTimers, Timers

__all__ = [
    "DrainStatus",
    "Readiness",
    "RuntimeStatistics",
    "RuntimeTuning",
    "ServiceRuntime",
    "SessionObserver",
    "SnapshotStream",
]

logger = logging.getLogger(__name__)

_UNAVAILABLE_REASON = "the shared admission backend (Redis) is unavailable"


class _NoObserver:
    def admission_event(self, session: Session, event: AdmissionEvent) -> None:
        pass

    def enter_session(self, session: Session) -> None:
        pass

    def chunk(self, session: Session, chunk: ChunkOutput) -> None:
        pass

    def session_ended(self, session: Session) -> None:
        pass


class ServiceRuntime:
    """Owns every session of the instance and the lifecycles of admission, model workers and transport.

    Life: `await start()` (returns at once; workers start in the background, `wait_ready()` waits for them),
    requests, optionally `start_drain()`, then `await aclose()`, which closes what is left (cancel), stops the
    workers and the transport, and awaits every task. Calls are made on one event loop.

    `backend` is the session admission (`service.runtime.backend`); by default this instance's own, in memory, on
    `clock` (tests inject a fake one). A backend given here brings its own clock, and the runtime owns it from now
    on: it starts and closes it. `timers` runs the sessions' deadlines (default: the event loop's).
    """

    def __init__(
        self,
        config: ServiceConfig,
        workers: Sequence[BidirectionalService],
        transport: Transport | None = None,
        *,
        backend: AdmissionBackend | None = None,
        clock: Clock | None = None,
        tuning: RuntimeTuning | None = None,
        observer: SessionObserver | None = None,
        recording_writer: WriterFactory | None = None,
        timers: Timers | None = None,
    ) -> None:
        if len(workers) != config.admission.num_workers:
            raise SettingsError(
                f"invalid configuration: LINGSTREAM_NUM_WORKERS is {config.admission.num_workers} but "
                f"{len(workers)} model worker(s) were built"
            )
        if backend is not None and clock is not None:
            raise TypeError("ServiceRuntime: `clock` is the in-memory admission's; give it to the backend instead")
        self._config = config
        self._workers = tuple(workers)
        self._transport = transport
        self._tuning = tuning or RuntimeTuning()
        self._observer: SessionObserver = observer or _NoObserver()
        self._backend: AdmissionBackend = (
            backend
            if backend is not None
            else MemoryAdmissionBackend(config.admission, clock=clock, tick_interval=self._tuning.admission_tick_s)
        )
        limits = config.recordings
        self._recordings = (
            None
            if limits is None
            else RecordingStore(
                RecordingConfig(
                    limits.directory,
                    max_bytes=limits.max_bytes,
                    max_count=limits.max_count,
                    queue_bytes=self._tuning.recording_queue_bytes,
                ),
                writer_factory=recording_writer,
            )
        )
        self._runner = SessionRunner(
            transport,
            self._tuning,
            self._observer,
            RunnerCallbacks(
                request_close=self._request_close,
                running=self._on_running,
                release_slot=self._backend.release,
                ended=self._after_end,
                set_paused=self._set_paused,
                generated=self._generated,
            ),
            recordings=self._recordings,
        )
        self._deadlines = SessionDeadlines(
            LimitsConfig(max_pause_s=config.max_pause),
            timers if timers is not None else LoopTimers(),
            on_warning=lambda session, status: session.warn(status),
            on_expired=self._expired,
        )
        self._sessions: dict[str, Session] = {}
        self._live: set[str] = set()
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._ended_total: Counter[str] = Counter()
        self._ended_by_limit: Counter[str] = Counter()
        self._tasks = TaskSet("runtime")
        self._runners: set[asyncio.Task[None]] = set()
        self._started = False
        self._closing = False
        self._draining = False
        self._drain_deadline: float | None = None
        self._drained = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._workers_ready = asyncio.Event()
        self._worker_started = [False] * len(self._workers)
        self._worker_errors: dict[int, str] = {}
        self._healthy = [False] * len(self._workers)

    # ------------------------------------------------------------------------------------------------ lifecycle

    @property
    def config(self) -> ServiceConfig:
        return self._config

    @property
    def tuning(self) -> RuntimeTuning:
        return self._tuning

    @property
    def backend(self) -> AdmissionBackend:
        """The admission backend (read-only use: statistics, tests)."""
        return self._backend

    @property
    def draining(self) -> bool:
        return self._draining

    async def start(self) -> None:
        """Start admission and the transport; start the model workers in the background."""
        for index in range(len(self._workers)):
            self._backend.set_worker_healthy(index, False)
        await self._backend.start(_Host(self))
        if self._recordings is not None:
            await self._recordings.start()
        if self._transport is not None:
            await self._transport.start()
        self._tasks.spawn(self._start_workers(), name="start-workers")
        self._tasks.spawn(self._monitor_health(), name="worker-health")
        self._started = True
        logger.info(
            "runtime started: %d model worker(s) x %d session(s), queue %d, transport %s",
            len(self._workers),
            self._config.admission.max_sessions_per_worker,
            self._config.admission.queue_size,
            "none" if self._transport is None else self._transport.kind,
        )

    async def wait_ready(self) -> None:
        """Wait until every model worker has started (or failed to: see `readiness()`)."""
        await self._workers_ready.wait()

    async def aclose(self) -> None:
        """Close every session (cancel), stop workers and transport, then the admission backend (once the sessions
        ended, so that their releases still reach it); await every task. Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._backend.stop_admitting()
        for session in self._admitted_sessions():
            self._request_close(session, CloseMode.CANCEL, "shutdown")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._tuning.shutdown_close_s
        if not await self._wait_idle(deadline):
            logger.error("shutdown: %d session(s) did not close in time; cancelling their runners", len(self._live))
        # An ended session's runner still detaches its transport (closing a peer connection takes a few turns of
        # the loop): let it finish within the same deadline, or the cancellation would leave that half-closed.
        runners = [task for task in self._runners if not task.done()]
        if runners:
            await asyncio.wait(runners, timeout=max(0.0, deadline - loop.time()))
        await self._tasks.aclose()
        if self._recordings is not None:
            await self._recordings.aclose()
        if self._transport is not None:
            try:
                await self._transport.stop()
            except Exception:
                logger.exception("shutdown: the transport failed to stop")
        for index, worker in enumerate(self._workers):
            try:
                await worker.stop()
            except Exception:
                logger.exception("shutdown: model worker %d failed to stop", index)
        await self._backend.aclose()
        self._drained.set()
        logger.info("runtime stopped")

    def readiness(self) -> Readiness:
        if not self._started or self._closing:
            return Readiness(False, "not_ready", "the service is starting or stopping")
        if self._draining:
            return Readiness(False, "draining", "the service is draining")
        self._refresh_health()
        if self._worker_errors:
            index, error = min(self._worker_errors.items())
            return Readiness(False, "not_ready", f"model worker {index} failed to start: {error}")
        if not all(self._worker_started):
            return Readiness(False, "not_ready", "model workers are starting")
        down = [str(index) for index, healthy in enumerate(self._healthy) if not healthy]
        if down:
            return Readiness(False, "not_ready", f"model worker(s) {', '.join(down)} not ready")
        if not self._backend.available:
            return Readiness(False, "admission_unavailable", _UNAVAILABLE_REASON)
        return Readiness(True)

    # ------------------------------------------------------------------------------------------------ sessions

    async def create(
        self,
        owner: str,
        config: Mapping[str, object],
        image: bytes | None,
        *,
        caller_room: CallerRoom | None = None,
        record: bool = False,
        max_seconds: float | None = None,
    ) -> tuple[SessionSnapshot, bool]:
        """Validate, then admit or queue a new session; returns its snapshot and whether it was admitted at once.
        `caller_room`: the caller's LiveKit room the transport publishes the session into (checked by the route).
        `max_seconds` limits its running time (at most the server's `max_session_seconds`, which applies when it is
        None).

        Raises `InvalidConfigError` (and the image errors) for bad input, `RecordingNotConfiguredError` for `record`
        without a recordings directory, `MaxSecondsTooLargeError`, `QueueFullError`, `QuotaExceededError` (the
        owner's quota, checked with the admission decision), `DrainingError`, `NotReadyError`,
        `AdmissionUnavailableError` (a shared backend cannot be reached), or `SessionStartError` when an immediately
        admitted session failed to start.
        """
        if record and self._recordings is None:
            raise RecordingNotConfiguredError(
                'this service does not record sessions: "record": true needs LINGSTREAM_RECORDINGS_DIR'
            )
        limit = self._time_limit(max_seconds)
        if self._started and not (self._draining or self._closing) and not self._backend.available:
            raise AdmissionUnavailableError("the shared admission backend is unavailable; retry shortly")
        session = await self._new_session(owner, config, image, limit)
        session.caller_room = caller_room
        session.record = record
        bind_session_id(session.id)  # the rest of this request is the session's: admission's lines name it too
        try:
            queued_at = await self._backend.create(session, config, image)
        except BaseException:
            self._forget_rejected(session.id)  # rejected, or an outcome the backend takes back itself
            raise
        return await self._created(session, queued_at)

    def _time_limit(self, requested: float | None) -> float | None:
        """The running-time limit of a new session: its own, which may not exceed the server's, or the server's."""
        server = self._config.max_session_seconds
        if requested is None:
            return server
        if server is not None and requested > server:
            raise MaxSecondsTooLargeError(
                f"max_seconds {requested:g} is over this service's limit of {server:g} s "
                "(LINGSTREAM_MAX_SESSION_SECONDS)"
            )
        return requested

    async def _new_session(
        self, owner: str, config: Mapping[str, object], image: bytes | None, max_seconds: float | None
    ) -> Session:
        """Check that creates are accepted, `prepare` off the loop, then register a new queued session."""
        self._check_accepting()
        prepared = await asyncio.to_thread(self._prepare, config, image)
        self._check_accepting()
        return self._register(secrets.token_urlsafe(16), owner, prepared, max_seconds)

    def _register(self, session_id: str, owner: str, prepared: PreparedSession, max_seconds: float | None) -> Session:
        session = Session(
            session_id,
            owner,
            prepared,
            config_view(prepared.config),
            self._tuning.buffers,
            max_seconds=max_seconds,
        )
        self._sessions[session_id] = session
        self._live.add(session_id)
        self._idle.clear()
        return session

    async def _created(self, session: Session, queued_at: int | None) -> tuple[SessionSnapshot, bool]:
        """After admission's answer to a create: a queued session answers at once (`queued_at`, its position);
        an admitted one once it runs (or `create_wait_s` passed). Raises `SessionStartError` if it failed."""
        if queued_at is not None:
            logger.info("session %s queued at position %s", session.id, queued_at)
            return session.snapshot(), False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._tuning.create_wait_s):
                await session.settled.wait()
        if session.state is SessionState.FAILED:
            code, message = session.failure if session.failure else ("failed", "it failed")
            room = session.caller_room
            # The caller's room went away or was taken between the route's check and the join (another replica's
            # session got there first): the caller's doing, answered as the route's check would have.
            if room is not None and code == "room_in_use":
                raise RoomInUseError(room.name)
            if room is not None and code == "room_not_found":
                raise RoomNotFoundError(room.name)
            raise SessionStartError(f"session {session.id} was admitted but could not be started: {message}")
        return session.snapshot(), True

    def get(self, owner: str, session_id: str) -> SessionSnapshot:
        """The live snapshot of a session with a record here; a GET of a queued session is a heartbeat."""
        session = self._visible(owner, session_id)
        self.heartbeat(session_id)
        return session.snapshot()

    def subscribe(self, owner: str, session_id: str) -> tuple[SessionSnapshot, Subscription[SessionSnapshot]]:
        """The current snapshot of a session with a record here and a subscription to every later one (ends after
        the terminal snapshot)."""
        session = self._visible(owner, session_id)
        subscription = session.snapshots.subscribe()
        self.heartbeat(session_id)
        return session.snapshot(), subscription

    def heartbeat(self, session_id: str) -> None:
        """A client of the session is still there (a GET, or an open event stream): a queued session (here, or in
        a queue shared with other replicas) keeps its place."""
        session = self._sessions.get(session_id)
        if session is not None and session.state is not SessionState.QUEUED:
            return
        self._backend.heartbeat(session_id)

    # What the HTTP routes call. A session with a record here is answered from it; any other (queued in a shared
    # queue, or run by another replica) by the backend, which, with one instance, knows no other (404).

    async def lookup(self, owner: str, session_id: str) -> SessionSnapshot:
        """The session's live snapshot (`get`, or the backend's record)."""
        if session_id in self._sessions:
            return self.get(owner, session_id)
        return await self._backend.lookup(owner, session_id)

    def runs_here(self, session_id: str) -> bool:
        """Whether this instance's transport holds (or held) the session's binding: it is past the queue here."""
        session = self._sessions.get(session_id)
        return session is not None and session.state is not SessionState.QUEUED

    async def lookup_here(self, owner: str, session_id: str) -> SessionSnapshot:
        """The session for a route bound to this instance's transport (the WebRTC offer, viewer tokens); one that
        another replica runs raises `SessionElsewhereError`."""
        if session_id in self._sessions:
            return self.get(owner, session_id)
        return await self._backend.lookup_here(owner, session_id)

    async def recording(self, owner: str, session_id: str) -> RecordingOutcome:
        """The finished recording of a session of `owner`. Raises `SessionNotFoundError`, `RecordingInProgressError`
        (the session has not ended, or the recording is being finalised), `RecordingFailedError`,
        `RecordingNotFoundError` (not recorded, removed by retention, or recorded by another replica: a recording
        stays on the replica that ran the session), or `SessionElsewhereError` while another replica runs it."""
        session = self._sessions.get(session_id)
        if session is None:
            snapshot = await self._backend.lookup_here(owner, session_id)  # SessionElsewhereError while it runs
            if not snapshot.terminal:
                raise RecordingInProgressError(f"session {session_id!r} has not ended yet")
            raise RecordingNotFoundError(
                f"no recording of session {session_id!r} on this replica: a recording stays on the replica that "
                "ran the session"
            )
        session = self._visible(owner, session_id)
        outcome = self._recordings.outcome(session_id) if self._recordings is not None else None
        if not session.record:
            raise RecordingNotFoundError(f'session {session_id!r} was not created with "record": true')
        if not session.terminal:
            raise RecordingInProgressError(
                f"session {session_id!r} is {session.state.value}; its recording is served once it has ended"
            )
        if outcome is None:
            raise RecordingNotFoundError(f"session {session_id!r} ended before anything was recorded")
        if outcome.state in (RecordingState.RECORDING, RecordingState.FINISHING):
            raise RecordingInProgressError(f"the recording of session {session_id!r} is being finalised; retry shortly")
        if outcome.state is RecordingState.FAILED:
            raise RecordingFailedError(f"the recording of session {session_id!r} stopped: {outcome.reason}")
        if outcome.state is RecordingState.REMOVED or outcome.video is None or not outcome.video.exists():
            # (A file gone while still READY: retention removed it a moment ago and has not said so yet.)
            reason = outcome.reason or "removed to keep the recordings' retention (oldest first)"
            raise RecordingNotFoundError(f"the recording of session {session_id!r} was {reason}")
        return outcome

    async def sessions_of(self, owner: str) -> list[SessionSnapshot]:
        """The owner's sessions, oldest first: the live ones admission knows of (every replica's, when it is
        shared) and the finished ones this instance remembers; a record here wins over the backend's."""
        known = await self._backend.sessions_of(owner)
        found = {session.id: session.snapshot() for session in self._sessions.values() if session.owner == owner}
        for snapshot in known:
            found.setdefault(snapshot.id, snapshot)
        return sorted(found.values(), key=lambda snapshot: snapshot.created_at)

    async def follow(self, owner: str, session_id: str) -> tuple[SessionSnapshot, SnapshotStream]:
        """The current snapshot and a stream of every later one (ends after the terminal one). A session queued in
        a shared queue is followed through the backend while it can be reached (it may start on another replica)."""
        session = self._sessions.get(session_id)
        shared = self._backend.shares_queue and self._backend.available
        if session is not None and (session.state is not SessionState.QUEUED or not shared):
            return self.subscribe(owner, session_id)
        return await self._backend.follow(owner, session_id)

    async def delete(self, owner: str, session_id: str, mode: CloseMode) -> SessionSnapshot:
        """End the session (idempotent): cancel it while queued, else close it with `mode` and wait a little."""
        session = self._sessions.get(session_id)
        if session is None or (session.state is SessionState.QUEUED and self._backend.shares_queue):
            return await self._backend.delete(owner, session_id, mode)
        session = self._visible(owner, session_id)
        self._request_close(session, mode, "client_deleted")
        if not session.terminal:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._tuning.delete_wait_s):
                    await session.ended.wait()
        return session.snapshot()

    async def pause(self, owner: str, session_id: str, paused: bool) -> SessionSnapshot:
        """Pause (`paused`) or resume the session (idempotent). A session run by another replica is asked through
        the backend. Raises `SessionNotFoundError`, `SessionQueuedError` or `SessionNotStreamingError`."""
        session = self._sessions.get(session_id)
        if session is None or (session.state is SessionState.QUEUED and self._backend.shares_queue):
            return await self._backend.set_paused(owner, session_id, paused)
        session = self._visible(owner, session_id)
        self._set_paused(session, paused)
        return session.snapshot()

    # ------------------------------------------------------------------------------------------------ drain

    def start_drain(self, reason: str) -> None:
        """Begin the drain (idempotent): not ready, no admissions, queued sessions cancelled (or, with a shared
        queue, left to the other replicas), a deadline for the rest."""
        if self._draining or self._closing:
            return
        self._draining = True
        loop = asyncio.get_running_loop()
        self._drain_deadline = loop.time() + self._config.drain_timeout
        running = self._admitted_sessions()
        logger.warning(
            "draining (%s): %d running session(s) get up to %g s; queued sessions are cancelled",
            reason,
            len(running),
            self._config.drain_timeout,
        )
        self._backend.stop_admitting()
        for session in running:
            self._mark_service_draining(session)
        self._tasks.spawn(self._drain(), name="drain")

    @property
    def drain_complete(self) -> bool:
        """A started drain has ended every session (or the runtime has closed)."""
        return self._drained.is_set()

    async def wait_drained(self) -> None:
        """Wait until a started drain has ended every session."""
        await self._drained.wait()

    def drain_status(self) -> DrainStatus:
        deadline_in = None
        if self._drain_deadline is not None:
            deadline_in = max(0.0, self._drain_deadline - asyncio.get_running_loop().time())
        return DrainStatus(
            draining=self._draining,
            complete=self._drained.is_set(),
            running=len(self._admitted_sessions()),
            queued=len(self._queued_sessions()),
            deadline_in_s=deadline_in,
        )

    async def usage(self, owner: str, since: float) -> UsageReport:
        """`owner`'s usage from the bucket that holds `since` (Unix seconds) up to now, from admission (this
        instance's, or the whole deployment's with a shared backend)."""
        return await self._backend.usage(owner, since)

    def statistics(self) -> RuntimeStatistics:
        report = self._backend.statistics()
        counts = Counter(self._sessions[sid].state.value for sid in self._live)
        held = sum(1 for sid in self._live if self._sessions[sid].holds_slot) + report.slots_in_flight
        return RuntimeStatistics(
            sessions={state.value: counts.get(state.value, 0) for state in _ordered(LIVE_STATES)},
            ended_total=dict(self._ended_total),
            admission=report.admission,
            ready=self.readiness().ready,
            draining=self._draining,
            slots_held=held,
            slot_mismatch=report.admission.retained_total - held,
            shared=report.shared,
            usage={key_id(owner): totals for owner, totals in self._backend.usage_totals().items()},
            ended_by_limit={reason: self._ended_by_limit.get(reason, 0) for reason in (TIME_LIMIT, PAUSED_TOO_LONG)},
            recordings=self._recordings.statistics() if self._recordings is not None else None,
        )

    # ------------------------------------------------------------------------------------------------ internals

    def _check_accepting(self) -> None:
        if self._draining:
            raise DrainingError("the service is draining and admits no new sessions; retry on another instance")
        if not self._started or self._closing:
            raise NotReadyError("the service is starting or stopping; retry shortly")
        self._refresh_health()
        if not any(self._healthy):
            raise NotReadyError("no model worker is ready; retry shortly")

    def _prepare(self, config: Mapping[str, object], image: bytes | None) -> PreparedSession:
        """Runs in a worker thread: image header bounds, then the model worker's own validation."""
        if image is not None:
            check_image(image, self._config.limits)
        try:
            return self._workers[0].prepare(config, image)
        except ValueError as exc:
            spec = lookup(exc)
            if spec is not None and spec.status < 500:
                raise
            raise InvalidConfigError(str(exc) or "invalid session config") from exc

    def _visible(self, owner: str, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None or not secrets.compare_digest(session.owner, owner):
            raise SessionNotFoundError(session_id)
        return session

    def _forget_rejected(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._live.discard(session_id)
        self._update_idle()

    def _admitted_sessions(self) -> list[Session]:
        return [self._sessions[sid] for sid in self._live if self._sessions[sid].admitted]

    def _queued_sessions(self) -> list[Session]:
        return [self._sessions[sid] for sid in self._live if self._sessions[sid].state is SessionState.QUEUED]

    def _update_idle(self) -> None:
        if self._live:
            self._idle.clear()
        else:
            self._idle.set()

    async def _wait_idle(self, deadline: float | None) -> bool:
        if self._idle.is_set():
            return True
        try:
            async with asyncio.timeout_at(deadline):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def _request_close(self, session: Session, mode: CloseMode, reason: str) -> None:
        if session.state is SessionState.QUEUED:
            self._backend.cancel_queued(session)
        else:
            session.request_close(mode, reason)

    def _generated(self, session: Session, chunk: ChunkOutput) -> None:
        frames = chunk.frames.shape[0] if chunk.frames.ndim == 4 else 1
        self._backend.record_chunk(session, int(frames))

    def _on_running(self, session: Session) -> None:
        """The runner moved the session to RUNNING: a service that drains (now, or since it was admitted) says so;
        its time limit starts."""
        self._deadlines.running(session)
        if session.service_draining or self._draining:
            self._mark_service_draining(session)

    def _set_paused(self, session: Session, paused: bool) -> None:
        """Pause or resume a session with a record here (the REST route and the client's control channel)."""
        worker = self._workers[session.worker if session.worker is not None else 0]
        if not set_paused(session, worker, paused, max_pause_s=self._config.max_pause):
            return
        logger.info("session %s %s", session.id, "paused" if paused else "resumed")
        if paused:
            self._deadlines.paused(session)
            return
        self._deadlines.resumed(session)
        if session.warning is not None and session.warning.code == PAUSED_TOO_LONG:
            session.warn(None)
        if session.service_draining or self._draining:
            self._mark_service_draining(session)

    def _expired(self, session: Session, reason: str) -> None:
        """A session reached its time limit, or stayed paused too long: it ends now, its slot goes back at once."""
        self._request_close(session, CloseMode.CANCEL, reason)

    def _mark_service_draining(self, session: Session) -> None:
        session.service_draining = True
        if session.state is SessionState.RUNNING and session.close_mode is None:
            session.move(
                SessionState.DRAINING,
                reason="service_draining",
                detail=f"the service is draining; the session ends within {self._config.drain_timeout:g} s",
            )

    def _admission_event(self, session: Session, event: AdmissionEvent) -> None:
        """An admission decision about a live session with a record here (synchronous, from the backend)."""
        with session_context(session.id):
            self._observer.admission_event(session, event)
            self._apply_admission_event(session, event)

    def _apply_admission_event(self, session: Session, event: AdmissionEvent) -> None:
        view = event.ticket
        kind = event.kind
        if kind in (AdmissionEventKind.QUEUED, AdmissionEventKind.POSITION_CHANGED):
            session.set_position(view.position)
        elif kind is AdmissionEventKind.ADMITTED:
            session.worker = view.worker
            session.holds_slot = True
            session.move(SessionState.ADMITTED)
            logger.info("session %s admitted on worker %s", session.id, view.worker)
            worker = self._workers[session.worker if session.worker is not None else 0]
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
            self._after_end(session)

    def _lose(self, session: Session, code: str, message: str) -> None:
        if session.state is SessionState.QUEUED:
            session.move(SessionState.CANCELLED, reason=code)
            self._after_end(session)
            return
        session.record_failure(code, message)
        self._request_close(session, CloseMode.CANCEL, code)

    def _forget(self, session: Session) -> None:
        self._sessions.pop(session.id, None)
        self._live.discard(session.id)
        self._observer.session_ended(session)
        self._update_idle()

    def _enter_session(self, session: Session) -> None:
        """Runs in the runner's own context: the session id for every log line, the observer's binding."""
        bind_session_id(session.id)
        self._observer.enter_session(session)

    def _after_end(self, session: Session) -> None:
        self._deadlines.ended(session)
        self._observer.session_ended(session)
        self._ended_total[session.state.value] += 1
        if session.reason in (TIME_LIMIT, PAUSED_TOO_LONG):
            self._ended_by_limit[session.reason] += 1
        self._live.discard(session.id)
        self._finished[session.id] = None
        while len(self._finished) > self._config.session_history:
            forgotten, _ = self._finished.popitem(last=False)
            self._sessions.pop(forgotten, None)
        self._update_idle()

    async def _drain(self) -> None:
        deadline = self._drain_deadline
        if deadline is None:  # pragma: no cover - start_drain sets it before spawning
            return
        grace = min(self._tuning.drain_close_grace_s, self._config.drain_timeout / 4)
        if not await self._wait_idle(deadline - grace):
            for session in self._admitted_sessions():
                self._request_close(session, CloseMode.DRAIN, "service_drain")
            if not await self._wait_idle(deadline):
                for session in self._admitted_sessions():
                    self._request_close(session, CloseMode.CANCEL, "drain_deadline")
                loop = asyncio.get_running_loop()
                if not await self._wait_idle(loop.time() + self._tuning.shutdown_close_s):
                    logger.error("drain: %d session(s) did not close after cancel", len(self._live))
        logger.warning("drain complete")
        self._drained.set()

    async def _start_workers(self) -> None:
        async def start_one(index: int, worker: BidirectionalService) -> None:
            try:
                await worker.start()
            except Exception as exc:
                logger.exception("model worker %d failed to start", index)
                self._worker_errors[index] = f"{type(exc).__name__}: {exc}"
                return
            self._worker_started[index] = True
            self._refresh_health()

        try:
            async with asyncio.TaskGroup() as group:
                for index, worker in enumerate(self._workers):
                    group.create_task(start_one(index, worker), name=f"start-worker-{index}")
        finally:
            self._workers_ready.set()
        logger.info("model workers started: %d of %d", sum(self._worker_started), len(self._workers))

    async def _monitor_health(self) -> None:
        while True:
            self._refresh_health()
            await asyncio.sleep(self._tuning.health_interval_s)

    def _refresh_health(self) -> None:
        for index, worker in enumerate(self._workers):
            try:
                healthy = self._worker_started[index] and bool(worker.ready)
            except Exception:
                logger.exception("model worker %d: reading readiness failed", index)
                healthy = False
            if healthy != self._healthy[index]:
                self._healthy[index] = healthy
                if not healthy and self._worker_started[index]:
                    logger.error("model worker %d is not ready; it admits no sessions", index)
                self._backend.set_worker_healthy(index, healthy)


def _ordered(states: frozenset[SessionState]) -> list[SessionState]:
    return [state for state in SessionState if state in states]


class _Host:
    """The runtime as its admission backend sees it (`service.runtime.backend.AdmissionHost`): a narrow view, so
    that what only backends may do (register an adopted session, forget a handed-over one) stays off the runtime's
    own interface."""

    def __init__(self, runtime: ServiceRuntime) -> None:
        self._runtime = runtime

    @property
    def tuning(self) -> RuntimeTuning:
        return self._runtime._tuning

    @property
    def closing(self) -> bool:
        return self._runtime._closing

    def session(self, session_id: str) -> Session | None:
        return self._runtime._sessions.get(session_id)

    def queued(self) -> list[Session]:
        return self._runtime._queued_sessions()

    def admission_event(self, session: Session, event: AdmissionEvent) -> None:
        self._runtime._admission_event(session, event)

    def request_close(self, session: Session, mode: CloseMode, reason: str) -> None:
        self._runtime._request_close(session, mode, reason)

    def lose(self, session: Session, code: str, message: str) -> None:
        self._runtime._lose(session, code, message)

    def set_paused(self, session: Session, paused: bool) -> None:
        self._runtime._set_paused(session, paused)

    def forget(self, session: Session) -> None:
        self._runtime._forget(session)

    async def prepare(self, config: Mapping[str, object], image: bytes | None) -> PreparedSession:
        return await asyncio.to_thread(self._runtime._prepare, config, image)

    def register(
        self,
        session_id: str,
        owner: str,
        prepared: PreparedSession,
        created_at: float,
        *,
        record: bool = False,
        max_seconds: float | None = None,
    ) -> Session:
        session = self._runtime._register(session_id, owner, prepared, max_seconds)
        session.created_at = created_at
        session.record = record and self._runtime._recordings is not None
        return session
