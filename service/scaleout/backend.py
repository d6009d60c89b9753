"""`RedisAdmissionBackend`: the `AdmissionBackend` that every replica shares through Redis (issue #10).

`ServiceRuntime` runs one instance's sessions; given this backend (`ServiceRuntime(..., backend=
RedisAdmissionBackend(...))`) it acts with the other replicas behind a load balancer as one service. A session this
replica runs lives exactly as with the in-memory admission (model worker create, transport attach, close, one
release); this backend swaps the admission for `service.scaleout.admission.RedisAdmission` and answers for every
session the runtime keeps no record of:

- **create**: the ticket is created in Redis with the request as its payload and the session's first registry body;
  one global FIFO in order of arrival, exact slots per (replica, worker);
- **owner**: the replica whose slot a ticket gets runs the session. When it did not take the create itself it first
  *adopts* it: reads the payload, has the runtime `prepare` it again and `register` the `Session`. Every status
  change it publishes (`publish_status`, one writer task per session, always the newest snapshot), then it releases
  the slot;
- **any replica** answers GET, DELETE, pause/resume, the event stream and the list for every session: the runtime
  from its own `Session` when it runs (or waits for) it here, else this backend from the registry
  (`service.scaleout.registry`), checking the owner fingerprint in constant time. DELETE elsewhere becomes
  `request_close`, and pause/resume `request_pause`, which reach the owner's listeners;
- **transport routes** (the WebRTC offer, viewer tokens) need the replica that runs the session: elsewhere they
  raise `SessionElsewhereError` naming it, which the routes forward to that replica's advertised address
  (`service.scaleout.forwarding`; this backend is its `ReplicaDirectory`) or answer with 409
  `session_on_other_replica` (with LiveKit, browsers talk to LiveKit, not to a replica);
- a session created here but admitted elsewhere, and every session still queued here when the replica drains,
  is *handed over*: forgotten by the runtime, it lives on in the registry and the global queue;
- **outages**: while Redis is unreachable the backend is not `available` (the runtime is then not ready and
  refuses creates with 503 `admission_unavailable`), running sessions go on; once it is back every running session's
  status is published again;
- **usage**: admission's scripts count sessions, waits and running time at each transition (the owner's heartbeat
  moves the running time forward; a reaper counts a dead replica's sessions up to its last heartbeat); chunks and
  frames are counted here per owner and flushed at chunk boundaries by one background writer (coalesced, one
  script call in flight; kept and retried through outages; a last flush at shutdown). `/v1/usage` reads Redis;
  `/metrics` serves every key's all-time totals from the background refresh (the deployment's, on every replica);
- **metrics**: the queue depth is the global queue's (every reply from Redis carries it, and the maintenance pass
  runs every heartbeat interval); the deployment's statistics (every replica's slots) are read in the background
  every heartbeat interval and served from that cache, so `/metrics` never waits for Redis.

Background work (publishers, adoptions, heartbeats, the statistics refresh, the drain call) is owned by one
`TaskSet`, closed in `aclose`, which the runtime calls after its sessions' runners ended, so that final statuses and
releases still reach Redis at shutdown. This module is the facade (life, events, registry reads, usage);
`service.scaleout.ownership` holds the sessions owned here: adoption, the status writers, the releases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import weakref
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

from redis.asyncio import Redis

from admission import (
    AdmissionClosedError,
    AdmissionConfig,
    AdmissionEvent,
    AdmissionEventKind,
    Clock,
    TicketReason,
    TicketState,
    UnknownTicketError,
)
from pipeline.bidirectional import CloseMode, PortableCheckpoint
from service.config_records import SharedAdmissionConfig
from service.errors import (
    AdmissionUnavailableError,
    DrainingError,
    QueueFullError,
    QuotaExceededError,
    ServiceError,
    SessionElsewhereError,
    SessionNotFoundError,
    SessionNotStreamingError,
    SessionQueuedError,
)
from service.logs import session_context
from service.runtime.backend import AdmissionHost
from service.runtime.records import (
    AdmissionReport,
    HandOffRoom,
    LostSession,
    SharedAdmissionStatistics,
    SnapshotStream,
)
from service.runtime.sessions import Session, SessionSnapshot, SessionState
from service.runtime.tasks import TaskSet
from service.scaleout.admission import (
    CloseRequest,
    PauseRequest,
    RedisAdmission,
    SharedAdmissionEvent,
    SharedEventKind,
    SharedTicketView,
)
from service.scaleout.checkpoints import (
    CheckpointStoreError,
    CheckpointWriter,
    CheckpointWriterStatistics,
    RedisCheckpointStore,
)
from service.scaleout.ownership import CALL_ERRORS, Ownership, spawn_unless_closed
from service.scaleout.registry import (
    RegistryStream,
    body_webhook_url,
    encode_body,
    encode_payload,
    remote_snapshot,
)
from service.usage.ledger import UsageReport, UsageTotals

__all__ = ["DEFAULT_PREFIX", "RedisAdmissionBackend"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_PREFIX = "lingstream:admission:"
DEFAULT_ADOPTION_WAIT_S = 30.0
"""How long a session whose replica was lost waits for a replica to adopt it before it fails `replica_lost`."""
CHECKPOINT_TTL_REPLICA_TTLS = 3
"""A session's checkpoint outlives its last write by this many replica TTLs: long enough for the reaper to notice a
dead replica (one TTL) and an adopter to read it, short enough that a lost delete leaves little behind."""
_UNAVAILABLE_MESSAGE = "the shared admission backend is unavailable; retry shortly"
# Kinds that change a session waiting here exactly as the in-memory admission's events do.
_LOCAL_KINDS = frozenset(
    {
        SharedEventKind.QUEUED,
        SharedEventKind.POSITION_CHANGED,
        SharedEventKind.ADMITTED,
        SharedEventKind.EXPIRED,
        SharedEventKind.CANCELLED,
    }
)


class RedisAdmissionBackend:
    """`AdmissionBackend` on the Redis admission shared by every replica; see the module docstring.

    `redis` is the Redis URL (the backend makes and owns its client) or a client (`decode_responses=False`, the
    caller owns it). `shared` names this replica and its liveness TTL; `config` is the admission configuration (the
    same on every replica). `clock` measures outages only. `prefix` namespaces the keys (every replica of one
    deployment must use the same).
    """

    def __init__(
        self,
        redis: Redis | str,
        shared: SharedAdmissionConfig,
        config: AdmissionConfig,
        *,
        clock: Clock | None = None,
        prefix: str = DEFAULT_PREFIX,
        adoption_wait_s: float = DEFAULT_ADOPTION_WAIT_S,
    ) -> None:
        self._replica = shared.replica_id
        self._admission = RedisAdmission(
            redis,
            shared.replica_id,
            config,
            clock=clock,
            prefix=prefix,
            replica_ttl_s=shared.replica_ttl_s,
            replica_url=shared.replica_url,
        )
        self._refresh_s = shared.replica_ttl_s / 3
        self._host: AdmissionHost | None = None
        self._unsubscribe: list[Callable[[], None]] = []
        self._tasks = TaskSet("shared-admission")
        self._followers: dict[str, set[asyncio.Event]] = {}
        # The open event streams of sessions followed through the registry; a draining replica ends them (weak: a
        # stream closed by its response goes with it).
        self._streams: weakref.WeakSet[RegistryStream] = weakref.WeakSet()
        self._beating: set[str] = set()
        self._stopped_admitting = False
        self._shared_statistics: SharedAdmissionStatistics | None = None
        self._usage_totals: Mapping[str, UsageTotals] = {}
        self._generated: dict[str, tuple[int, int]] = {}  # owner -> chunks, frames not yet flushed
        self._flush = asyncio.Event()
        self._checkpoints = RedisCheckpointStore(
            self._admission.redis,
            ttl_s=CHECKPOINT_TTL_REPLICA_TTLS * shared.replica_ttl_s,
            prefix=f"{self._admission.prefix}ckpt:",
        )
        self._checkpoint_writer = CheckpointWriter(self._checkpoints, on_written=self._checkpoint_written)
        self._ownership = Ownership(self._admission, self._tasks, self._checkpoint_writer)
        self._resumable: set[str] = set()  # sessions run here whose worker goes on from checkpoints
        self._marked: set[str] = set()  # ... that admission knows another replica may adopt
        self._adoption_wait_s = adoption_wait_s
        self._orphans_seen = asyncio.Event()

    @property
    def admission(self) -> RedisAdmission:
        """The shared admission (read-only use: statistics, tests)."""
        return self._admission

    @property
    def replica_id(self) -> str:
        return self._replica

    # ---------------------------------------------------------------------------------------------- life

    async def start(self, host: AdmissionHost) -> None:
        self._host = host
        self._unsubscribe = [
            self._admission.subscribe(self._on_shared_event),
            self._admission.on_close_requested(self._on_close_request),
            self._admission.on_pause_requested(self._on_pause_request),
            self._admission.on_sessions_reaped(self._on_reaped),
            self._admission.on_replicas_reaped(self._on_replica_reaped),
        ]
        await self._admission.start()
        self._tasks.spawn(self._refresh_forever(), name="shared-statistics")
        self._tasks.spawn(self._flush_usage_forever(), name="usage-flush")
        self._tasks.spawn(self._checkpoint_writer.run(), name="checkpoint-writer")
        self._tasks.spawn(self._adopt_forever(), name="adoption")
        self._tasks.spawn(self._keep_checkpoints_forever(), name="checkpoint-keep-alive")
        logger.info("shared admission: replica %s (liveness TTL %g s)", self._replica, self._refresh_s * 3)

    def stop_admitting(self) -> None:
        """This replica admits nothing more; its queued sessions stay in the global queue for the other replicas
        (the last replica to drain cancels the queue) and are handed over."""
        if not self._stopped_admitting:
            self._stopped_admitting = True
            self._spawn(self._admission.drain(), name="shared-admission-drain")
            self._end_streams()
        if self._host is not None:
            for session in self._host.queued():
                self._hand_over(self._host, session, "this replica stops admitting")

    def _end_streams(self) -> None:
        """End the event streams of sessions queued anywhere or run by another replica: their clients follow them
        again through a replica that stays (a page after the stream's `retry`). Left open, the stream of a session
        that goes on elsewhere never ends, and the server's shutdown waited for it (`timeout_graceful_shutdown`,
        10 s) and then cancelled it with a traceback: a page's stream, opened here while its session was orphaned,
        outlived the session's adoption here and its hand-off on (issue #33)."""
        streams = list(self._streams)
        for stream in streams:
            stream.close()
        if streams:
            logger.info("draining: ended %d event stream(s) of sessions followed through the registry", len(streams))

    async def aclose(self) -> None:
        """Every runner has ended: let the writers publish the final statuses and give the slots back (bounded),
        then stop the background work and leave the registry."""
        writers = self._ownership.writers()
        if writers:
            _, pending = await asyncio.wait(writers, timeout=self._started_host().tuning.shutdown_close_s)
            if pending:
                logger.error("shutdown: %d session status writer(s) did not finish in time", len(pending))
        if self._generated:
            with contextlib.suppress(TimeoutError, *CALL_ERRORS):
                async with asyncio.timeout(self._started_host().tuning.shutdown_close_s):
                    await self._flush_usage()
            if self._generated:
                logger.error("shutdown: usage of %d key(s) was not flushed to Redis", len(self._generated))
        try:
            async with asyncio.timeout(self._started_host().tuning.shutdown_close_s):
                await self._checkpoint_writer.flushed()  # the ended sessions' deletes
        except TimeoutError:
            logger.warning("shutdown: checkpoints of ended sessions not deleted (they expire with their TTL)")
        await self._tasks.aclose()
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        await self._admission.aclose()

    # ---------------------------------------------------------------------------------------------- state

    @property
    def available(self) -> bool:
        return self._admission.available

    @property
    def shares_queue(self) -> bool:
        return True

    def statistics(self) -> AdmissionReport:
        """This replica's slots and counters (`queue_depth` is the global queue's, as of this replica's last reply
        from Redis); the slots still counted for sessions being adopted or ended but not yet given back; the
        deployment as of the last background refresh."""
        return AdmissionReport(self._admission.statistics(), self._ownership.in_flight(), self._shared_statistics)

    def set_worker_healthy(self, index: int, healthy: bool) -> None:
        self._admission.set_worker_healthy(index, healthy)

    # ---------------------------------------------------------------------------------------------- tickets

    async def create(self, session: Session, config: Mapping[str, object], image: bytes | None) -> int | None:
        view = await self._admission.create(
            session.owner,
            ticket_id=session.id,
            payload=encode_payload(
                config,
                image,
                session.caller_room,
                record=session.record,
                max_seconds=session.max_seconds,
                webhook_url=session.webhook_url,
            ),
            body=encode_body(session.snapshot(), webhook_url=session.webhook_url),
        )
        if view.state is TicketState.REJECTED:
            if view.reason is TicketReason.QUEUE_FULL:
                raise QueueFullError(view.retry_after_s or 1)
            if view.reason in (TicketReason.RUNNING_QUOTA, TicketReason.QUEUED_QUOTA):
                raise QuotaExceededError(*self._admission.config.quota_of(session.owner).limit_of(view.reason))
            raise DrainingError("the service is draining and admits no new sessions; retry on another instance")
        return view.position if view.state is TicketState.QUEUED else None

    def heartbeat(self, session_id: str) -> None:
        """For a session queued here or anywhere else, the queue learns it in the background (Redis ignores it for
        admitted tickets)."""
        closing = self._host is not None and self._host.closing
        if session_id in self._beating or closing or not self._admission.available:
            return
        self._beating.add(session_id)
        if self._spawn(self._beat(session_id), name=f"heartbeat-{session_id}") is None:
            self._beating.discard(session_id)

    def cancel_queued(self, session: Session) -> None:
        self._spawn(self._cancel(session.id), name=f"cancel-{session.id}")

    def release(self, session: Session) -> None:
        self._ownership.release(session)  # or, handed off, its hand-off (which keeps the checkpoint for the adopter)
        if not session.handing_off:
            self._checkpoint_writer.discard(session.id)
        self._resumable.discard(session.id)
        self._marked.discard(session.id)

    async def hand_off_room(self, session: Session) -> HandOffRoom:
        """Only a session whose worker goes on from checkpoints and that admission marked adoptable can go; then
        room is a free healthy slot on another live replica that is not draining, beyond the orphans already
        waiting (one script call that writes nothing)."""
        if session.id not in self._marked or not self._admission.available:
            return HandOffRoom.NOT_YET if session.id in self._resumable else HandOffRoom.NEVER
        try:
            code = await self._admission.hand_off_room(session.id)
        except CALL_ERRORS as exc:
            logger.info("session %s: cannot ask for room to hand it off: %r", session.id, exc)
            return HandOffRoom.NOT_YET
        if code == "ok":
            return HandOffRoom.READY
        return HandOffRoom.NOT_YET if code in ("nowhere", "no_checkpoint") else HandOffRoom.NEVER

    # ---------------------------------------------------------------------------------------------- usage

    def record_chunk(self, session: Session, frames: int) -> None:
        chunks, total = self._generated.get(session.owner, (0, 0))
        self._generated[session.owner] = (chunks + 1, total + frames)
        self._flush.set()

    def save_checkpoint(self, session: Session, checkpoint: PortableCheckpoint, *, resumable: bool) -> None:
        """Written to Redis in the background (`CheckpointWriter`: newest wins, one write in flight per session, a
        bounded rate), where another replica can rebuild the session from it; deleted after its release. Once the
        first one of a `resumable` session is written, admission marks the session adoptable."""
        if not session.terminal:
            if resumable:
                self._resumable.add(session.id)
            self._checkpoint_writer.offer(checkpoint)

    def _checkpoint_written(self, session_id: str) -> None:
        if session_id in self._resumable and session_id not in self._marked:
            self._marked.add(session_id)
            self._spawn(self._mark_adoptable(session_id), name=f"adoptable-{session_id}")

    async def _mark_adoptable(self, session_id: str) -> None:
        try:
            if not await self._admission.mark_adoptable(session_id):
                logger.info("session %s: not adoptable (no longer held here, or its request is gone)", session_id)
        except CALL_ERRORS as exc:
            logger.debug("session %s: marking it adoptable failed (next checkpoint): %r", session_id, exc)
            self._marked.discard(session_id)

    async def _keep_checkpoints_forever(self) -> None:
        """Every heartbeat interval: the checkpoints of the sessions held here live another TTL. A session writes one
        per chunk; a paused one writes none, and without this its checkpoint lapsed after three replica TTLs, so a
        drain could not hand it off (`no_checkpoint`, measured: a rolling restart's paused session waited out the
        drain) nor another replica adopt it after this one died."""
        while True:
            await asyncio.sleep(self._refresh_s)
            held = set(self._resumable)
            if not held or not self._admission.available:
                continue
            try:
                await self._checkpoints.touch(held)
            except CheckpointStoreError as exc:
                logger.debug("keeping checkpoints alive failed (next beat): %s", exc)

    async def _adopt_forever(self) -> None:
        """Every heartbeat interval, and at once when a session is orphaned: adopt what this replica has room for
        (ahead of the queue), failing orphans that waited too long (docs/continuity.md). The sessions adopted here
        are started from their `adopted` events, whichever call's reply or stream read brings them."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._refresh_s):
                    await self._orphans_seen.wait()
            self._orphans_seen.clear()
            host = self._host
            if self._stopped_admitting or host is None or host.closing or not self._admission.available:
                continue
            try:
                await self._admission.adopt(self._adoption_wait_s, 8)
            except CALL_ERRORS as exc:
                logger.debug("adopting orphaned sessions failed: %r", exc)

    def checkpoint_statistics(self) -> CheckpointWriterStatistics:
        """What this replica's checkpoint writer did (bytes and seconds per write: docs/continuity.md)."""
        return self._checkpoint_writer.statistics()

    @property
    def checkpoints(self) -> RedisCheckpointStore:
        """The deployment's checkpoint store (read-only use: adoption, tests)."""
        return self._checkpoints

    async def usage(self, owner: str, since: float) -> UsageReport:
        return await self._admission.usage(owner, since)

    def usage_totals(self) -> Mapping[str, UsageTotals]:
        """As of the last background refresh (every heartbeat interval): the deployment's, not this replica's."""
        return self._usage_totals

    async def _flush_usage(self) -> None:
        """Send what was generated since the last flush; on failure it stays to be sent with the next one."""
        sending = dict(self._generated)
        await self._admission.flush_usage(sending)
        for owner, (chunks, frames) in sending.items():
            left_chunks, left_frames = self._generated.pop(owner, (0, 0))
            if (left_chunks, left_frames) != (chunks, frames):  # more came while the call was in flight
                self._generated[owner] = (left_chunks - chunks, left_frames - frames)

    async def _flush_usage_forever(self) -> None:
        """At every chunk boundary (coalesced: one call in flight, what arrives meanwhile goes with the next)."""
        while True:
            await self._flush.wait()
            self._flush.clear()
            if not self._generated:
                continue
            if not self._admission.available:
                await self._admission.wait_available()
            try:
                await self._flush_usage()
            except CALL_ERRORS as exc:
                logger.debug("flushing usage failed (kept for the next flush): %r", exc)
                self._flush.set()
                await asyncio.sleep(self._refresh_s)

    # ---------------------------------------------------------------------------------------------- registry

    async def lookup(self, owner: str, session_id: str) -> SessionSnapshot:
        """One script call whatever the state: the record with its live position, read at one instant, and the
        heartbeat of a queued session, pushed only when it is the caller's (another key's session is a 404 here,
        as an unknown id, and keeps its deadline)."""
        return remote_snapshot(await self._visible_view(owner, session_id, heartbeat=True))

    async def lookup_here(self, owner: str, session_id: str) -> SessionSnapshot:
        view = await self._visible_view(owner, session_id)
        if view.state is TicketState.ADMITTED and view.replica is not None and view.replica != self._replica:
            raise SessionElsewhereError(session_id, view.replica)
        return remote_snapshot(view)

    async def replica_url(self, replica_id: str) -> str | None:
        """The address `replica_id` advertises to the other replicas while it is alive (`ReplicaDirectory`);
        `AdmissionUnavailableError` while Redis is unreachable."""
        if not self._admission.available:
            raise AdmissionUnavailableError(_UNAVAILABLE_MESSAGE)
        return await self._admission.replica_url(replica_id)

    async def runs_on(self, session_id: str) -> str | None:
        """The other replica that runs `session_id` now, whoever owns it (`ReplicaDirectory`: a viewer's offer has no
        key to look it up with); None when this replica runs it, nobody does, it is unknown, or Redis is unreachable."""
        if not self._admission.available:
            return None
        try:
            view = await self._admission.get(session_id)
        except (UnknownTicketError, AdmissionUnavailableError, AdmissionClosedError):
            return None
        if view.state is TicketState.ADMITTED and view.replica is not None and view.replica != self._replica:
            return view.replica
        return None

    async def sessions_of(self, owner: str) -> Sequence[SessionSnapshot]:
        """The owner's live sessions on every replica (none while Redis is unreachable)."""
        if not self._admission.available:
            return ()
        try:
            views = await self._admission.list_tickets(owner=owner)
        except AdmissionUnavailableError:
            return ()
        return [remote_snapshot(view) for view in views]

    async def follow(self, owner: str, session_id: str) -> tuple[SessionSnapshot, SnapshotStream]:
        """Queued (wherever it may be admitted) or run elsewhere: follow the registry."""
        view = await self._visible_view(owner, session_id)
        stream = RegistryStream(self._admission.get, view, follow=self._follow_ticket)
        self.heartbeat(session_id)
        if self._stopped_admitting:
            stream.close()  # draining: the first snapshot, then the client follows through a replica that stays
        else:
            self._streams.add(stream)
        return remote_snapshot(view), stream

    async def delete(self, owner: str, session_id: str, mode: CloseMode) -> SessionSnapshot:
        host = self._started_host()
        local = host.session(session_id)
        view = await self._visible_view(owner, session_id)
        if remote_snapshot(view).terminal:
            return local.snapshot() if local is not None else remote_snapshot(view)
        wake = asyncio.Event()
        stop_following = self._follow_ticket(session_id, wake, positions=False)  # waiting for the end, not a place
        try:
            view = await self._admission.request_close(session_id, mode.value)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(host.tuning.delete_wait_s):
                    while not remote_snapshot(view).terminal:
                        await wake.wait()
                        wake.clear()
                        view = await self._admission.get(session_id)
        except UnknownTicketError:
            raise SessionNotFoundError(session_id) from None
        finally:
            stop_following()
        local = host.session(session_id)
        return local.snapshot() if local is not None and local.terminal else remote_snapshot(view)

    async def set_paused(self, owner: str, session_id: str, paused: bool) -> SessionSnapshot:
        """Run elsewhere (or queued anywhere): ask its owner through Redis and wait a little for the change."""
        host = self._started_host()
        view = await self._visible_view(owner, session_id)
        snapshot = remote_snapshot(view)
        verb = "paused" if paused else "resumed"
        if snapshot.state is SessionState.QUEUED:
            raise SessionQueuedError(f"session {session_id!r} is still queued; it can be {verb} once it runs")
        wanted, current = (
            (SessionState.PAUSED, SessionState.RUNNING) if paused else (SessionState.RUNNING, SessionState.PAUSED)
        )
        if snapshot.state is wanted:
            return snapshot
        if snapshot.state is not current:
            state = "ended" if snapshot.terminal else snapshot.state.value
            raise SessionNotStreamingError(
                f"session {session_id!r} is {state}; only a {current.value} session can be {verb}"
            )
        wake = asyncio.Event()
        stop_following = self._follow_ticket(session_id, wake, positions=False)
        try:
            code, view = await self._admission.request_pause(session_id, paused)
            if code == "queued":
                raise SessionQueuedError(f"session {session_id!r} is still queued; it can be {verb} once it runs")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(host.tuning.delete_wait_s):
                    while not (remote_snapshot(view).state is wanted or remote_snapshot(view).terminal):
                        await wake.wait()
                        wake.clear()
                        view = await self._admission.get(session_id)
        except UnknownTicketError:
            raise SessionNotFoundError(session_id) from None
        finally:
            stop_following()
        snapshot = remote_snapshot(view)
        if snapshot.state is not wanted:
            raise SessionNotStreamingError(
                f"session {session_id!r} is {snapshot.state.value}; its replica did not let it be {verb}"
            )
        return snapshot

    # ---------------------------------------------------------------------------------------------- events

    def _on_shared_event(self, event: SharedAdmissionEvent) -> None:
        """Admission listener (synchronous, for every ticket of every replica)."""
        view = event.ticket
        tid = view.ticket_id
        for wake in self._followers.get(tid, ()):
            wake.set()
        host = self._started_host()
        session = host.session(tid)
        kind = event.kind
        if kind is SharedEventKind.ORPHANED:
            self._orphans_seen.set()  # a session lost its replica: adopt it if there is room here
        elif kind is SharedEventKind.ADOPTED and view.replica == self._replica:
            if session is None and not self._ownership.knows(tid):
                self._ownership.adopt(host, view, resume=self._checkpoints)
            elif session is not None and session.terminal:  # this replica ran it once and still remembers it
                logger.error("session %s adopted here, where its old record remains: it is not started", tid)
            return
        if kind is SharedEventKind.ADMITTED:
            if view.replica != self._replica:
                if session is not None and session.state is SessionState.QUEUED:
                    self._hand_over(host, session, f"admitted on replica {view.replica}")
                return
            if session is None:
                if not self._ownership.knows(tid):
                    self._ownership.adopt(host, view)
                return
            if session.state is not SessionState.QUEUED:
                return  # already running here (a repeated delivery after a lost reply)
        if session is None or session.terminal:
            return
        with session_context(tid):
            if kind is SharedEventKind.LOST:
                self._on_lost(host, session, view)
            elif kind in _LOCAL_KINDS:
                if kind is SharedEventKind.ADMITTED:
                    self._ownership.own(session)
                host.admission_event(session, AdmissionEvent(AdmissionEventKind(kind.value), view.as_ticket_view()))

    def _on_close_request(self, request: CloseRequest) -> None:
        """A DELETE on some replica for a session this replica owns."""
        try:
            mode = CloseMode(request.mode)
        except ValueError:
            mode = CloseMode.DRAIN
        host = self._started_host()
        session = host.session(request.ticket_id)
        if session is None:
            self._ownership.close_when_adopted(request.ticket_id, mode)
            return
        with session_context(session.id):
            logger.info("session %s: close (%s) requested on replica %s", session.id, mode.value, request.requested_by)
            host.request_close(session, mode, "client_deleted")

    def _on_pause_request(self, request: PauseRequest) -> None:
        """A pause or resume on some replica for a session this replica owns. One it cannot apply (the session is
        closing) changes nothing; the asking replica answers with the state it then reads."""
        session = self._started_host().session(request.ticket_id)
        if session is None:
            return
        with session_context(session.id):
            verb = "pause" if request.paused else "resume"
            logger.info("session %s: %s requested on replica %s", session.id, verb, request.requested_by)
            try:
                self._started_host().set_paused(session, request.paused)
            except ServiceError as exc:
                logger.info("session %s: %s refused: %s", session.id, verb, exc)

    def _on_reaped(self, view: SharedTicketView) -> None:
        """This replica's maintenance declared a session lost with its replica (once in the deployment)."""
        snapshot = remote_snapshot(view)
        lost_at = view.last_seen_at if view.last_seen_at is not None else (view.ended_at or snapshot.updated_at)
        with session_context(view.ticket_id):
            logger.warning("session %s was lost with replica %s", view.ticket_id, view.replica)
        self._started_host().lost_elsewhere(
            LostSession(
                snapshot=snapshot,
                owner=view.owner,
                webhook_url=body_webhook_url(view.body),
                running_from=view.admitted_at,
                lost_at=lost_at,
            )
        )

    def _on_replica_reaped(self, replica_id: str) -> None:
        """This replica's maintenance reaped `replica_id` (once in the deployment): its unfinished recordings fail."""
        self._started_host().replica_lost(replica_id)

    def _on_lost(self, host: AdmissionHost, session: Session, view: SharedTicketView) -> None:
        """Admission took the session away: its replica was reaped while stalled, or Redis lost its record."""
        code = (view.failure or "admission_record_lost").split(":", 1)[0].strip()
        logger.error("session %s was lost by the shared admission (%s)", session.id, view.failure)
        error = remote_snapshot(view).error
        host.lose(session, code, error[1] if error is not None else "the shared admission lost the session")

    def _hand_over(self, host: AdmissionHost, session: Session, why: str) -> None:
        """A queued session created here goes on without a local record (the registry answers for it)."""
        logger.info("session %s handed over: %s", session.id, why)
        host.forget(session)

    def _follow_ticket(self, ticket_id: str, wake: asyncio.Event, *, positions: bool = True) -> Callable[[], None]:
        """Wake `wake` on every change of the ticket (and, with `positions`, on its queue position's: reading them
        costs a Redis call per change ahead of it); returns the unfollow."""
        self._followers.setdefault(ticket_id, set()).add(wake)
        unwatch = self._admission.watch(ticket_id) if positions else None

        def stop() -> None:
            if unwatch is not None:
                unwatch()
            wakes = self._followers.get(ticket_id)
            if wakes is not None:
                wakes.discard(wake)
                if not wakes:
                    del self._followers[ticket_id]

        return stop

    # ---------------------------------------------------------------------------------------------- background

    async def _refresh_forever(self) -> None:
        """Every heartbeat interval: the deployment's statistics (for /metrics). Each time contact with Redis came
        back (Redis may have lost its data: the records of running sessions are re-created bare), every running
        session's status is written again and every followed stream reads again."""
        reconnections = self._admission.reconnections
        while True:
            if self._admission.reconnections != reconnections and self._admission.available:
                reconnections = self._admission.reconnections
                self._after_reconnect()
            if self._admission.available:
                try:
                    self._shared_statistics = await self._admission.shared_statistics()
                    self._usage_totals = await self._admission.usage_totals()
                except CALL_ERRORS as exc:
                    logger.debug("reading the shared admission statistics failed: %r", exc)
            await asyncio.sleep(self._refresh_s)

    def _after_reconnect(self) -> None:
        self._ownership.republish()
        for wakes in self._followers.values():
            for wake in wakes:
                wake.set()

    async def _beat(self, session_id: str) -> None:
        try:
            await self._admission.heartbeat(session_id)
        except CALL_ERRORS as exc:
            logger.debug("session %s: heartbeat failed: %r", session_id, exc)
        finally:
            self._beating.discard(session_id)

    async def _cancel(self, session_id: str) -> None:
        try:
            await self._admission.request_close(session_id, CloseMode.CANCEL.value)
        except CALL_ERRORS as exc:
            logger.warning("session %s: cancelling it in the queue failed: %r", session_id, exc)

    def _spawn(self, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T] | None:
        return spawn_unless_closed(self._tasks, coro, name=name)

    # ---------------------------------------------------------------------------------------------- reading

    def _started_host(self) -> AdmissionHost:
        """The runtime this backend admits for (events and registry calls come only after `start`)."""
        if self._host is None:
            raise AdmissionClosedError("the shared admission backend has not been started")
        return self._host

    async def _visible_view(self, owner: str, session_id: str, *, heartbeat: bool = False) -> SharedTicketView:
        """The registry record of a session of `owner` (404 for unknown ids and other owners alike); with
        `heartbeat`, in the same call, a queued one of `owner` keeps its place."""
        if not self._admission.available:
            raise AdmissionUnavailableError(_UNAVAILABLE_MESSAGE)
        try:
            if heartbeat:
                view = await self._admission.heartbeat(session_id, owner=owner)
            else:
                view = await self._admission.get(session_id)
        except UnknownTicketError:
            raise SessionNotFoundError(session_id) from None
        if not secrets.compare_digest(view.owner.encode(), owner.encode()):
            raise SessionNotFoundError(session_id)
        return view
