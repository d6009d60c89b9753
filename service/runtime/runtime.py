"""`ServiceRuntime`: the service's sessions, wired to admission, the model workers and the transport.

The HTTP layer (`service.http.routes`) only translates requests into calls on this object, a facade over parts that
each hold one idea:

- its own lifecycle (`service.runtime.state`: `RuntimeState`, new → serving → draining → closing → closed);
- the sessions' records (`service.runtime.session_table.SessionTable`), fed by its admission backend
  (`service.runtime.backend.AdmissionBackend`: this instance's own in memory by default, or one shared by every
  replica), which it sees through `service.runtime.host.RuntimeHost`;
- what happens to live sessions (`service.runtime.conductor.SessionConductor`): admission's decisions, one runner task
  per admitted session (`service.runtime.runner.SessionRunner`), close and pause requests (`service.runtime.pausing`),
  the deadlines of running sessions (`service.runtime.limits`);
- the answers about sessions, here or through the backend (`service.runtime.directory.SessionDirectory`);
- the model workers' start-up and health (`service.runtime.health.WorkerHealth`: an unready worker admits nothing and
  makes the instance unready);
- the drain (`service.runtime.drain.Drain`; SIGTERM or `POST /internal/drain`): not ready at once, no new
  admissions, queued sessions cancelled, running sessions get until `drain_timeout` to end (closed with drain
  shortly before it, cancelled at it).

Everything runs on the event loop; model-side work happens inside the `BidirectionalService` implementation (its
threads or processes), never here. The only blocking call the runtime makes itself, `prepare` (plus the image
header check), runs in a worker thread. Every task is owned by a `TaskSet` and cancelled and awaited on `aclose()`.
Its tuning, the records it answers with and the protocols it is observed through are in `service.runtime.records`
(re-exported here).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from admission import Clock
from pipeline.bidirectional import BidirectionalService, CloseMode, RecoveringService
from service.api_keys import key_id
from service.config_records import ServiceConfig
from service.errors import (
    SettingsError,
)
from service.runtime.backend import AdmissionBackend
from service.runtime.conductor import NoObserver, SessionConductor
from service.runtime.directory import SessionDirectory
from service.runtime.drain import Drain
from service.runtime.fanout import Subscription
from service.runtime.health import WorkerHealth
from service.runtime.host import RuntimeHost
from service.runtime.intake import SessionIntake
from service.runtime.memory_backend import MemoryAdmissionBackend
from service.runtime.recording_catalog import (
    RecordingCatalog,
    RecordingEntry,
    RecordingState,
    recording_event_data,
)
from service.runtime.recording_objects import RecordingObjects
from service.runtime.recordings import RecordingConfig, RecordingOutcome, RecordingStore, WriterFactory
from service.runtime.records import (
    DrainStatus,
    NoEvents,
    Readiness,
    RuntimeStatistics,
    RuntimeTuning,
    SessionEventKind,
    SessionEvents,
    SessionObserver,
    SnapshotStream,
)
from service.runtime.session_table import SessionTable
from service.runtime.sessions import SessionSnapshot
from service.runtime.state import RuntimeLifecycle, RuntimeState
from service.runtime.tasks import TaskSet
from service.usage.ledger import UsageReport
from transport.base import CallerRoom, Transport
from transport.session.timers import LoopTimers, Timers

__all__ = [
    "DrainStatus",
    "Readiness",
    "RuntimeStatistics",
    "RuntimeTuning",
    "ServiceRuntime",
    "SessionEventKind",
    "SessionEvents",
    "SessionObserver",
    "SnapshotStream",
]

logger = logging.getLogger(__name__)

_UNAVAILABLE_REASON = "the shared admission backend (Redis) is unavailable"


class ServiceRuntime:
    """Owns every session of the instance and the lifecycles of admission, model workers and transport.

    Life: `await start()` (returns at once; workers start in the background, `wait_ready()` waits for them),
    requests, optionally `start_drain()`, then `await aclose()`, which closes what is left (cancel), stops the
    workers and the transport, and awaits every task. Calls are made on one event loop.

    `backend` is the session admission (`service.runtime.backend`); by default this instance's own, in memory, on
    `clock` (tests inject a fake one). A backend given here brings its own clock, and the runtime owns it from now
    on: it starts and closes it. `timers` runs the sessions' deadlines (default: the event loop's). `events` is told
    of each session's webhook moments (`service.webhooks`; default: nowhere); the caller owns its life.
    `recording_objects` uploads finished recordings to an object store and `recording_catalog` tells every replica
    about them (default: in process); the recording store owns and closes both.
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
        recording_objects: RecordingObjects | None = None,
        recording_catalog: RecordingCatalog | None = None,
        timers: Timers | None = None,
        events: SessionEvents | None = None,
    ) -> None:
        if len(workers) != config.admission.num_workers:
            raise SettingsError(
                f"invalid configuration: LINGSTREAM_NUM_WORKERS is {config.admission.num_workers} but "
                f"{len(workers)} model worker(s) were built"
            )
        if backend is not None and clock is not None:
            raise TypeError("ServiceRuntime: `clock` is the in-memory admission's; give it to the backend instead")
        self._config = config
        self._transport = transport
        self._tuning = tuning = tuning or RuntimeTuning()
        self._backend: AdmissionBackend = (
            backend
            if backend is not None
            else MemoryAdmissionBackend(config.admission, clock=clock, tick_interval=tuning.admission_tick_s)
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
                    queue_bytes=tuning.recording_queue_bytes,
                ),
                writer_factory=recording_writer,
                objects=recording_objects,
                catalog=recording_catalog,
                on_outcome=self._recording_outcome,
            )
        )
        self._events: SessionEvents = events if events is not None else NoEvents()
        self._lifecycle = RuntimeLifecycle()
        self._tasks = TaskSet("runtime")
        self._table = SessionTable(config.session_history)
        self._health = WorkerHealth(workers, self._backend.set_worker_healthy, interval_s=tuning.health_interval_s)
        self._conductor = SessionConductor(
            table=self._table,
            backend=self._backend,
            workers=self._health,
            transport=transport,
            tuning=tuning,
            observer=observer or NoObserver(),
            recordings=self._recordings,
            timers=timers if timers is not None else LoopTimers(),
            tasks=self._tasks,
            drain_timeout_s=config.drain_timeout,
            max_pause_s=config.max_pause,
            events=events,
        )
        for worker in workers:
            if isinstance(worker, RecoveringService):
                worker.add_recovery_listener(self._conductor.recovery)
        self._directory = SessionDirectory(
            table=self._table,
            backend=self._backend,
            conductor=self._conductor,
            tuning=tuning,
            recordings=self._recordings,
        )
        self._drain = Drain(
            config.drain_timeout,
            tuning,
            self._table,
            self._conductor.request_close,
            hand_off=self._conductor.hand_off if config.drain_mode == "hand_off" else None,
            announce=self._conductor.drain_started,
        )
        self._intake = SessionIntake(
            config=config,
            tuning=tuning,
            lifecycle=self._lifecycle,
            drain=self._drain,
            workers=self._health,
            backend=self._backend,
            table=self._table,
            recording=self._recordings is not None,
        )

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
    def state(self) -> RuntimeState:
        return self._lifecycle.state

    @property
    def draining(self) -> bool:
        """A drain began (it stays begun while the runtime closes)."""
        return self._drain.started

    async def start(self) -> None:
        """Start admission and the transport; start the model workers in the background."""
        self._health.report_all_unhealthy()
        host = RuntimeHost(
            tuning=self._tuning,
            lifecycle=self._lifecycle,
            table=self._table,
            conductor=self._conductor,
            prepare=self._intake.prepare,
            register=self._intake.register,
            replica_lost=self._replica_lost,
        )
        await self._backend.start(host)
        if self._recordings is not None:
            await self._recordings.start()
        if self._transport is not None:
            await self._transport.start()
        self._tasks.spawn(self._health.start_all(), name="start-workers")
        self._tasks.spawn(self._health.monitor(), name="worker-health")
        if self._lifecycle.state is RuntimeState.NEW:  # (a drain that began while it started stays)
            self._lifecycle.move(RuntimeState.SERVING)
        logger.info(
            "runtime started: %d model worker(s) x %d session(s), queue %d, transport %s",
            len(self._health),
            self._config.admission.max_sessions_per_worker,
            self._config.admission.queue_size,
            "none" if self._transport is None else self._transport.kind,
        )

    async def wait_ready(self) -> None:
        """Wait until every model worker has started (or failed to: see `readiness()`)."""
        await self._health.wait_started()

    async def aclose(self) -> None:
        """Close every session (cancel), stop workers and transport, then the admission backend (once the sessions
        ended, so that their releases still reach it); await every task. Idempotent."""
        if self._lifecycle.closing:
            return
        self._lifecycle.move(RuntimeState.CLOSING)
        self._backend.stop_admitting()
        self._conductor.close_all(CloseMode.CANCEL, "shutdown")
        deadline = asyncio.get_running_loop().time() + self._tuning.shutdown_close_s
        if not await self._table.wait_idle(deadline):
            logger.error(
                "shutdown: %d session(s) did not close in time; cancelling their runners", self._table.live_count
            )
        # An ended session's runner still detaches its transport (closing a peer connection takes a few turns of
        # the loop): let it finish within the same deadline, or the cancellation would leave that half-closed.
        await self._conductor.wait_runners(deadline)
        await self._tasks.aclose()
        if self._recordings is not None:
            await self._recordings.aclose()
        if self._transport is not None:
            try:
                await self._transport.aclose()
            except Exception:
                logger.exception("shutdown: the transport failed to stop")
        await self._health.aclose()
        await self._backend.aclose()
        self._drain.mark_complete()
        self._lifecycle.move(RuntimeState.CLOSED)
        logger.info("runtime stopped")

    def readiness(self) -> Readiness:
        state = self._lifecycle.state
        if state is RuntimeState.NEW or self._lifecycle.closing:
            return Readiness(False, "not_ready", "the service is starting or stopping")
        if state is RuntimeState.DRAINING:
            return Readiness(False, "draining", "the service is draining")
        problem = self._health.problem()
        if problem is not None:
            return Readiness(False, "not_ready", problem)
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
        webhook_url: str | None = None,
    ) -> tuple[SessionSnapshot, bool]:
        """Validate, then admit or queue a new session; returns its snapshot and whether it was admitted at once.
        `caller_room`: the caller's LiveKit room the transport publishes the session into (checked by the route).
        `max_seconds` limits its running time (at most the server's `max_session_seconds`, which applies when it is
        None). `webhook_url`: the create's own webhook endpoint, already checked by the route.

        Raises `InvalidConfigError` (and the image errors) for bad input, `RecordingNotConfiguredError` for `record`
        without a recordings directory, `MaxSecondsTooLargeError`, `QueueFullError`, `QuotaExceededError` (the
        owner's quota, checked with the admission decision), `DrainingError`, `NotReadyError`,
        `AdmissionUnavailableError` (a shared backend cannot be reached), or `SessionStartError` when an immediately
        admitted session failed to start (the order of the checks: `service.runtime.intake`).
        """
        return await self._intake.create(
            owner,
            config,
            image,
            caller_room=caller_room,
            record=record,
            max_seconds=max_seconds,
            webhook_url=webhook_url,
        )

    def get(self, owner: str, session_id: str) -> SessionSnapshot:
        """The live snapshot of a session with a record here; a GET of a queued session is a heartbeat."""
        return self._directory.get(owner, session_id)

    def subscribe(self, owner: str, session_id: str) -> tuple[SessionSnapshot, Subscription[SessionSnapshot]]:
        """The snapshot of a session with a record here and a subscription to every later one."""
        return self._directory.subscribe(owner, session_id)

    def heartbeat(self, session_id: str) -> None:
        """A client of the session is still there: a queued session (here, or shared) keeps its place."""
        self._directory.heartbeat(session_id)

    async def lookup(self, owner: str, session_id: str) -> SessionSnapshot:
        """The session's live snapshot (from its record here, or the backend's)."""
        return await self._directory.lookup(owner, session_id)

    def runs_here(self, session_id: str) -> bool:
        """Whether this instance's transport holds (or held) the session's binding."""
        return self._directory.runs_here(session_id)

    async def lookup_here(self, owner: str, session_id: str) -> SessionSnapshot:
        """The session for a route bound to this instance's transport (`SessionElsewhereError` elsewhere)."""
        return await self._directory.lookup_here(owner, session_id)

    async def recording(self, owner: str, session_id: str) -> RecordingOutcome:
        """The finished recording of a session of `owner` (see `SessionDirectory.recording` for what it raises)."""
        return await self._directory.recording(owner, session_id)

    def _recording_outcome(self, entry: RecordingEntry) -> None:
        """A recording of this instance is ready or failed: `recording.ready|failed` for its session (one this
        instance no longer remembers is told to nobody: the webhook names the session)."""
        session = self._table.get(entry.session_id)
        if session is None:
            return
        ready = entry.state is RecordingState.READY
        kind = SessionEventKind.RECORDING_READY if ready else SessionEventKind.RECORDING_FAILED
        # nested: the session's own fields stay
        self._events.session_event(session, kind, {"recording": recording_event_data(entry)})

    def _replica_lost(self, replica_id: str) -> None:
        """Admission reaped `replica_id` here: the recordings it was making fail (`recording.failed` for each)."""
        if self._recordings is not None and not self._lifecycle.closing:
            self._tasks.spawn(self._fail_recordings_of(replica_id), name=f"recordings-of-{replica_id}")

    async def _fail_recordings_of(self, replica_id: str) -> None:
        if self._recordings is None:
            return
        for entry in await self._recordings.fail_replica(replica_id):
            self._events.recording_lost(entry)

    async def recordings_of(self, owner: str, since: float, after: str | None, limit: int) -> list[RecordingEntry]:
        """`owner`'s recordings (see `SessionDirectory.recordings_of`)."""
        return await self._directory.recordings_of(owner, since, after, limit)

    async def sessions_of(self, owner: str) -> list[SessionSnapshot]:
        """The owner's sessions, oldest first: live ones admission knows of and finished ones remembered here."""
        return await self._directory.sessions_of(owner)

    async def follow(self, owner: str, session_id: str) -> tuple[SessionSnapshot, SnapshotStream]:
        """The current snapshot and a stream of every later one (ends after the terminal one)."""
        return await self._directory.follow(owner, session_id)

    async def delete(self, owner: str, session_id: str, mode: CloseMode) -> SessionSnapshot:
        """End the session (idempotent): cancel it while queued, else close it with `mode` and wait a little."""
        return await self._directory.delete(owner, session_id, mode)

    async def pause(self, owner: str, session_id: str, paused: bool) -> SessionSnapshot:
        """Pause (`paused`) or resume the session (idempotent), here or through the backend."""
        return await self._directory.pause(owner, session_id, paused)

    # ------------------------------------------------------------------------------------------------ drain

    def start_drain(self, reason: str) -> None:
        """Begin the drain (idempotent): not ready, no admissions, queued sessions cancelled (or, with a shared
        queue, left to the other replicas), a deadline for the rest."""
        if not self._lifecycle.can_move(RuntimeState.DRAINING):
            return
        self._lifecycle.move(RuntimeState.DRAINING)
        self._drain.begin()
        logger.warning(
            "draining (%s): %d running session(s) %s up to %g s; queued sessions are cancelled",
            reason,
            len(self._table.admitted()),
            "are handed to other replicas with room, or get" if self._drain.hands_off else "get",
            self._config.drain_timeout,
        )
        self._backend.stop_admitting()
        if not self._drain.hands_off:
            self._conductor.drain_started()  # else once the hand-offs are over (`Drain.run`)
        self._tasks.spawn(self._drain.run(), name="drain")

    @property
    def drain_complete(self) -> bool:
        """A started drain has ended every session (or the runtime has closed)."""
        return self._drain.complete

    async def wait_drained(self) -> None:
        """Wait until a started drain has ended every session."""
        await self._drain.wait()

    def drain_status(self) -> DrainStatus:
        return self._drain.status()

    async def usage(self, owner: str, since: float) -> UsageReport:
        """`owner`'s usage from the bucket that holds `since` (Unix seconds) up to now, from admission (this
        instance's, or the whole deployment's with a shared backend)."""
        return await self._backend.usage(owner, since)

    def statistics(self) -> RuntimeStatistics:
        report = self._backend.statistics()
        held = self._table.slots_held() + report.slots_in_flight
        return RuntimeStatistics(
            sessions=self._table.by_state(),
            ended_total=self._table.ended_total(),
            admission=report.admission,
            ready=self.readiness().ready,
            draining=self.draining,
            slots_held=held,
            slot_mismatch=report.admission.retained_total - held,
            shared=report.shared,
            usage={key_id(owner): totals for owner, totals in self._backend.usage_totals().items()},
            ended_by_limit=self._table.ended_by_limit(),
            recordings=self._recordings.statistics() if self._recordings is not None else None,
        )

    # ------------------------------------------------------------------------------------------------ internals
