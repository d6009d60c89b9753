"""`ServiceRuntime`: the service's sessions, wired to admission, the model workers and the transport.

The HTTP layer (`service.http.routes`) only translates requests into calls on this object. It owns:

- session admission (`AdmissionController` + `AdmissionDriver`): every admission event updates the matching
  `Session` (queue position, admitted, expired, cancelled) and is published to its SSE subscribers;
- one *runner* task per admitted session (`service.runtime.runner.SessionRunner`, a base of this class): create it on
  its model worker, start its single output reader, attach the transport, wait for a close request, close it on the
  worker (drain, escalated to cancel on request), give the admission slot back exactly once, publish the final
  status, detach the transport;
- worker start-up and health (an unready worker admits nothing and makes the instance unready);
- the drain (SIGTERM or `POST /internal/drain`): not ready at once, no new admissions, queued sessions cancelled,
  running sessions get until `drain_timeout` to end (closed with drain shortly before it, cancelled at it).

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

from admission import (
    AdmissionController,
    AdmissionDriver,
    AdmissionEvent,
    AdmissionEventKind,
    AdmissionStatistics,
    Clock,
    TicketReason,
    TicketState,
)
from pipeline.bidirectional import (
    BidirectionalService,
    ChunkOutput,
    PreparedSession,
    SessionCloseMode,
)
from service.errors import (
    DrainingError,
    InvalidConfigError,
    NotReadyError,
    QueueFullError,
    SessionNotFoundError,
    SessionStartError,
    SettingsError,
    lookup,
)
from service.logs import bind_session_id, session_context
from service.runtime.config_view import config_view
from service.runtime.fanout import Subscription
from service.runtime.images import check_image
from service.runtime.records import (
    DrainStatus,
    Readiness,
    RuntimeStatistics,
    RuntimeTuning,
    SessionObserver,
    SnapshotStream,
)
from service.runtime.runner import SessionRunner
from service.runtime.sessions import LIVE_STATES, Session, SessionSnapshot, SessionState
from service.runtime.tasks import TaskSet
from service.settings import ServiceConfig
from transport.base import Transport

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


class _NoObserver:
    def admission_event(self, session: Session, event: AdmissionEvent) -> None:
        pass

    def enter_session(self, session: Session) -> None:
        pass

    def chunk(self, session: Session, chunk: ChunkOutput) -> None:
        pass

    def session_ended(self, session: Session) -> None:
        pass


class ServiceRuntime(SessionRunner):
    """Owns every session of the instance and the lifecycles of admission, model workers and transport.

    Life: `await start()` (returns at once; workers start in the background, `wait_ready()` waits for them),
    requests, optionally `start_drain()`, then `await aclose()`, which closes what is left (cancel), stops the
    workers and the transport, and awaits every task. Calls are made on one event loop.
    """

    def __init__(
        self,
        config: ServiceConfig,
        workers: Sequence[BidirectionalService],
        transport: Transport | None = None,
        *,
        clock: Clock | None = None,
        tuning: RuntimeTuning | None = None,
        observer: SessionObserver | None = None,
    ) -> None:
        if len(workers) != config.admission.num_workers:
            raise SettingsError(
                f"invalid configuration: LINGSTREAM_NUM_WORKERS is {config.admission.num_workers} but "
                f"{len(workers)} model worker(s) were built"
            )
        self._config = config
        self._workers = tuple(workers)
        self._transport = transport
        self._tuning = tuning or RuntimeTuning()
        self._observer: SessionObserver = observer or _NoObserver()
        self._setup_admission(clock)
        self._sessions: dict[str, Session] = {}
        self._live: set[str] = set()
        self._finished: OrderedDict[str, None] = OrderedDict()
        self._ended_total: Counter[str] = Counter()
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
    def controller(self) -> AdmissionController:
        """The admission controller (read-only use: statistics and invariant checks)."""
        return self._controller

    @property
    def draining(self) -> bool:
        return self._draining

    async def start(self) -> None:
        """Start admission and the transport; start the model workers in the background."""
        await self._start_admission()
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
        """Close every session (cancel), stop workers and transport, await every task. Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._stop_admitting()
        for session in self._admitted_sessions():
            self._request_close(session, SessionCloseMode.CANCEL, "shutdown")
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
        await self._close_admission()
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
        return Readiness(True)

    # ------------------------------------------------------------------------------------------------ sessions

    async def create(
        self, owner: str, config: Mapping[str, object], image: bytes | None
    ) -> tuple[SessionSnapshot, bool]:
        """Validate, then admit or queue a new session; returns its snapshot and whether it was admitted at once.

        Raises `InvalidConfigError` (and the image errors) for bad input, `QueueFullError`, `DrainingError`,
        `NotReadyError`, or `SessionStartError` when an immediately admitted session failed to start.
        """
        session = await self._new_session(owner, config, image)
        bind_session_id(session.id)  # the rest of this request is the session's: admission's lines name it too
        try:
            view = self._controller.create(owner=owner, ticket_id=session.id)
        except BaseException:
            self._forget_rejected(session.id)
            raise
        if view.state is TicketState.REJECTED:
            self._forget_rejected(session.id)
            if view.reason is TicketReason.QUEUE_FULL:
                raise QueueFullError(view.retry_after_s or self._controller.retry_after_s())
            raise DrainingError("the service is draining and admits no new sessions; retry on another instance")
        return await self._created(session, view.position if view.state is TicketState.QUEUED else None)

    async def _new_session(self, owner: str, config: Mapping[str, object], image: bytes | None) -> Session:
        """Check that creates are accepted, `prepare` off the loop, then register a new queued session."""
        self._check_accepting()
        prepared = await asyncio.to_thread(self._prepare, config, image)
        self._check_accepting()
        return self._register(secrets.token_urlsafe(16), owner, prepared)

    def _register(self, session_id: str, owner: str, prepared: PreparedSession) -> Session:
        session = Session(session_id, owner, prepared, config_view(prepared.config), self._tuning.buffers)
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
            message = session.failure[1] if session.failure else "it failed"
            raise SessionStartError(f"session {session.id} was admitted but could not be started: {message}")
        return session.snapshot(), True

    def get(self, owner: str, session_id: str) -> SessionSnapshot:
        """The session's live snapshot; a GET of a queued session is a heartbeat."""
        session = self._visible(owner, session_id)
        self.heartbeat(session_id)
        return session.snapshot()

    def list_sessions(self, owner: str) -> list[SessionSnapshot]:
        """The owner's sessions (live and remembered finished ones), oldest first."""
        self._controller.tick()
        return [session.snapshot() for session in self._sessions.values() if session.owner == owner]

    def subscribe(self, owner: str, session_id: str) -> tuple[SessionSnapshot, Subscription[SessionSnapshot]]:
        """The current snapshot and a subscription to every later one (ends after the terminal snapshot)."""
        session = self._visible(owner, session_id)
        subscription = session.snapshots.subscribe()
        self.heartbeat(session_id)
        return session.snapshot(), subscription

    def heartbeat(self, session_id: str) -> None:
        """The client of a queued session is still there (a GET, or an open event stream)."""
        session = self._sessions.get(session_id)
        if session is not None and session.state is SessionState.QUEUED:
            self._controller.heartbeat(session_id)

    async def delete(self, owner: str, session_id: str, mode: SessionCloseMode) -> SessionSnapshot:
        """End the session (idempotent): cancel it while queued, else close it with `mode` and wait a little."""
        session = self._visible(owner, session_id)
        self._request_close(session, mode, "client_deleted")
        if not session.terminal:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._tuning.delete_wait_s):
                    await session.ended.wait()
        return session.snapshot()

    # What the HTTP routes call. Here they answer from this instance's sessions; a runtime whose sessions live on
    # several replicas (`service.scaleout.runtime`) answers for sessions run elsewhere too.

    async def lookup(self, owner: str, session_id: str) -> SessionSnapshot:
        """`get` for the routes."""
        return self.get(owner, session_id)

    def runs_here(self, session_id: str) -> bool:
        """Whether this instance's transport holds (or held) the session's binding; always, with one instance."""
        return True

    async def lookup_here(self, owner: str, session_id: str) -> SessionSnapshot:
        """The session for a route bound to this instance's transport (the WebRTC offer, viewer tokens)."""
        return self.get(owner, session_id)

    async def sessions_of(self, owner: str) -> list[SessionSnapshot]:
        """`list_sessions` for the routes."""
        return self.list_sessions(owner)

    async def follow(self, owner: str, session_id: str) -> tuple[SessionSnapshot, SnapshotStream]:
        """`subscribe` for the routes."""
        return self.subscribe(owner, session_id)

    # ------------------------------------------------------------------------------------------------ drain

    def start_drain(self, reason: str) -> None:
        """Begin the drain (idempotent): not ready, no admissions, queued sessions cancelled, a deadline for the
        rest."""
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
        self._stop_admitting()
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
            queued=sum(1 for sid in self._live if self._sessions[sid].state is SessionState.QUEUED),
            deadline_in_s=deadline_in,
        )

    def statistics(self) -> RuntimeStatistics:
        admission = self._admission_statistics()
        counts = Counter(self._sessions[sid].state.value for sid in self._live)
        held = sum(1 for sid in self._live if self._sessions[sid].holds_slot)
        return RuntimeStatistics(
            sessions={state.value: counts.get(state.value, 0) for state in _ordered(LIVE_STATES)},
            ended_total=dict(self._ended_total),
            admission=admission,
            ready=self.readiness().ready,
            draining=self._draining,
            slots_held=held,
            slot_mismatch=admission.retained_total - held,
        )

    # ------------------------------------------------------------------------------------------------ admission
    # The in-memory admission of one instance. `service.scaleout.runtime.SharedServiceRuntime` overrides these (and
    # the routes' calls above) with the admission that every replica shares through Redis.

    def _setup_admission(self, clock: Clock | None) -> None:
        self._controller = AdmissionController(self._config.admission, clock=clock)
        self._driver = AdmissionDriver(self._controller, tick_interval=self._tuning.admission_tick_s)
        self._unsubscribe = self._controller.subscribe(self._on_admission_event)

    async def _start_admission(self) -> None:
        for index in range(len(self._workers)):
            self._set_worker_healthy(index, False)
        self._driver.start()

    async def _close_admission(self) -> None:
        self._unsubscribe()
        await self._driver.aclose()

    def _set_worker_healthy(self, index: int, healthy: bool) -> None:
        self._controller.set_worker_healthy(index, healthy)

    def _stop_admitting(self) -> None:
        """Drain or shutdown: admit nothing more, cancel the queued sessions."""
        self._controller.drain()

    def _cancel_queued(self, session: Session) -> None:
        self._controller.release(session.id)  # -> CANCELLED (client_cancelled), through the admission event

    def _release_slot(self, session: Session) -> None:
        """The admitted session has ended (`_finish`): its slot goes back, exactly once."""
        self._controller.release(session.id)

    def _admission_statistics(self) -> AdmissionStatistics:
        return self._controller.statistics()

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

    def _request_close(self, session: Session, mode: SessionCloseMode, reason: str) -> None:
        if session.state is SessionState.QUEUED:
            self._cancel_queued(session)
        else:
            session.request_close(mode, reason)

    def _mark_service_draining(self, session: Session) -> None:
        session.service_draining = True
        if session.state is SessionState.RUNNING and session.close_mode is None:
            session.move(
                SessionState.DRAINING,
                reason="service_draining",
                detail=f"the service is draining; the session ends within {self._config.drain_timeout:g} s",
            )

    def _on_admission_event(self, event: AdmissionEvent) -> None:
        """Admission listener (synchronous, after the controller's state is consistent)."""
        view = event.ticket
        session = self._sessions.get(view.ticket_id)
        if session is None or session.terminal:
            return
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
            context = contextvars.copy_context()
            context.run(self._enter_session, session)
            runner = self._tasks.spawn(self._run_session(session), name=f"session-{session.id}", context=context)
            self._runners.add(runner)
            runner.add_done_callback(self._runners.discard)
        elif kind in (AdmissionEventKind.EXPIRED, AdmissionEventKind.CANCELLED):
            state = SessionState.EXPIRED if kind is AdmissionEventKind.EXPIRED else SessionState.CANCELLED
            reason = view.reason.value if view.reason is not None else state.value
            logger.info("session %s left the queue: %s (%s)", session.id, state.value, reason)
            session.move(state, reason=reason)
            self._after_end(session)

    def _enter_session(self, session: Session) -> None:
        """Runs in the runner's own context: the session id for every log line, the observer's binding."""
        bind_session_id(session.id)
        self._observer.enter_session(session)

    def _after_end(self, session: Session) -> None:
        self._observer.session_ended(session)
        self._ended_total[session.state.value] += 1
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
                self._request_close(session, SessionCloseMode.DRAIN, "service_drain")
            if not await self._wait_idle(deadline):
                for session in self._admitted_sessions():
                    self._request_close(session, SessionCloseMode.CANCEL, "drain_deadline")
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
                self._set_worker_healthy(index, healthy)


def _ordered(states: frozenset[SessionState]) -> list[SessionState]:
    return [state for state in SessionState if state in states]
