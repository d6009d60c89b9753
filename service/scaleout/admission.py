"""Shared session admission in Redis: one global FIFO and per-(replica, worker) slots across every service replica.

`RedisAdmission` is the multi-replica counterpart of `admission.AdmissionController` (issue #10): each replica
runs one, all of them share one Redis. Every decision (create, admit, expire, release, reap a dead replica) is one
Lua script in `service.scaleout.redis_side`, so nothing is double-granted or leaked however replicas race. The ticket
hashes
double as the session registry every replica can read, and a Redis stream carries every change and the close
requests for owners. Deadlines use Redis server time. This module is the asyncio shell around those scripts: it
keeps the replica alive (heartbeat, reaper, anti-entropy), delivers events, follows queue positions, and rides out
Redis outages. The key schema and every script's contract are in `service.scaleout.redis_side`; the design in
`docs/scale-out.md`. This class is the facade: the ticket calls are `service.scaleout.tickets`, the script plumbing
and contact state `service.scaleout.link`, the background loops `service.scaleout.maintenance`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Self

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from admission import (
    AdmissionClosedError,
    AdmissionConfig,
    AdmissionConfigError,
    AdmissionStatistics,
    Clock,
    MonotonicClock,
    TicketState,
    UnknownWorkerError,
)
from service.errors import AdmissionUnavailableError
from service.runtime.tasks import TaskSet
from service.scaleout.link import UNAVAILABLE, UNAVAILABLE_MESSAGE, RedisLink
from service.scaleout.maintenance import Maintenance
from service.scaleout.redis_side.mirror import ReplicaMirror
from service.scaleout.redis_side.records import (
    CloseRequest,
    NotTicketOwnerError,
    PauseRequest,
    ReplicaStatistics,
    SharedAdmissionEvent,
    SharedAdmissionStatistics,
    SharedEventKind,
    SharedTicketView,
    decode_fields,
    decode_replica,
    decode_text,
    decode_view,
)
from service.scaleout.tickets import TicketCalls
from service.usage.ledger import UsageReport, UsageTotals

__all__ = [
    "CloseRequest",
    "NotTicketOwnerError",
    "PauseRequest",
    "RedisAdmission",
    "ReplicaStatistics",
    "SharedAdmissionEvent",
    "SharedAdmissionStatistics",
    "SharedEventKind",
    "SharedTicketView",
]

logger = logging.getLogger(__name__)


class RedisAdmission:
    """Admits sessions onto this replica's workers from one FIFO shared by every replica, through Redis.

    Problem: several replicas behind a load balancer must behave like one admission controller: one global FIFO
    (order of arrival over all replicas, live global positions), exact slots per (replica, worker), a registry
    every replica can read, and no slot double-granted or leaked when creates, deletes, timeouts and replica
    deaths race. Slots belong to the replica whose workers run the sessions; only it admits onto them.

    Example (what the service does; every call but `subscribe`/`watch`/`set_worker_healthy`/`statistics` awaits)::

        admission = RedisAdmission("redis://redis:6379/0", "pod-a", config)
        admission.subscribe(on_event)                  # ADMITTED with replica == "pod-a": start the session
        admission.on_close_requested(on_close)         # a DELETE for one of our sessions landed elsewhere
        await admission.start()
        view = await admission.create(owner, ticket_id=session_id, payload=request_bytes)
        await admission.heartbeat(session_id)          # GET / SSE of a queued session, on any replica
        await admission.request_close(session_id)      # DELETE on any replica: cancels, or asks the owner
        await admission.release(session_id)            # the owner, once its model session closed
        await admission.aclose()

    Ordering: strict global FIFO. A create is admitted at once only onto this replica, only when nobody waits;
    else it queues and the first replica with a free healthy slot admits the head onto itself (a release admits
    onto the freed slot in the same script; a replica with room reacts to every new ticket; every replica re-checks
    every `heartbeat_interval_s`). Least-loaded healthy worker first, ties to the lowest index.

    Events: one stream, read by every replica; listeners get every ticket's changes (all replicas'), each at most
    once and never older than one already delivered (versions). A call's own changes are delivered before the call
    returns. POSITION_CHANGED comes for queued tickets created here or `watch()`ed. Listeners run synchronously on
    the event loop; one that raises is logged and skipped.

    Backpressure: the queue holds `queue_size` tickets beyond those that free slots on live replicas will take at
    once (so `queue_size = 0` still lets a create on a full replica wait for another replica's free slot);
    overflow: reject with Retry-After. Waiting is bounded by `queue_timeout` and `queue_heartbeat_timeout`.

    Liveness: the replica refreshes `replica:<id>` (TTL `replica_ttl_s`) every `heartbeat_interval_s`. Any
    replica's maintenance reaps a replica whose key expired: its slots return, its sessions become LOST (failed,
    "replica_lost: <id>"). A replica that comes back learns which of its sessions were lost (LOST events); their
    slots stay reserved until the service `release()`s them, so nothing is double-granted on its GPUs.

    Outages: a Redis error makes the backend unavailable (`available` False): creates raise
    `AdmissionUnavailableError`, running sessions keep running, releases are kept and replayed. A background task
    reconnects with back-off, re-registers, replays, re-asserts the slots it holds (re-creating them if Redis lost
    its data), and reports sessions that were reaped meanwhile as LOST.

    Cancellation: cancelling a call cancels only the wait for Redis; a cancelled `create` is aborted later
    (cancelled or released) and a cancelled `release` is replayed. `aclose()` cancels and awaits the background
    tasks, deregisters (unless told not to), fails pending `wait_until_admitted` calls, and closes a client it made.

    Arguments: `redis` is a URL (the backend makes and owns a client without retries or socket timeout) or a
    `redis.asyncio.Redis` with `decode_responses=False` (the caller owns it). `replica_id` must be unique and stable
    for the process's life (a pod name). `config` must be the same on every replica (queue bounds and timeouts are
    global). Deadlines are Redis server time (`TIME` in the scripts), so replicas' clocks never matter; `clock` only
    measures this replica's outage (`unavailable_for_s`). `prefix` namespaces every key. `replica_ttl_s` is how
    long a silent replica keeps its slots; `heartbeat_interval_s` (default a third of it) paces the maintenance
    pass. `finished_ttl_s` is how long finished tickets stay readable; `payload_ttl_s` how long a payload outlives
    admission; `events_maxlen` bounds the event stream (overflow: trim the oldest); `backoff_s` is the reconnect
    back-off (first, max); `call_timeout_s` bounds every Redis call; `connect_timeout_s` bounds opening a connection of
    the client made from a URL (a caller's own client keeps its own). `replica_url` is this replica's address for the
    other replicas (`replica_url(...)` reads it there), kept in Redis with its liveness key.
    """

    def __init__(
        self,
        redis: Redis | str,
        replica_id: str,
        config: AdmissionConfig,
        *,
        clock: Clock | None = None,
        prefix: str = "lingstream:admission:",
        replica_ttl_s: float = 10.0,
        heartbeat_interval_s: float | None = None,
        finished_ttl_s: float = 3600.0,
        payload_ttl_s: float = 120.0,
        events_maxlen: int = 10_000,
        backoff_s: tuple[float, float] = (0.05, 2.0),
        call_timeout_s: float = 5.0,
        connect_timeout_s: float = 2.0,
        replica_url: str | None = None,
    ) -> None:
        interval = replica_ttl_s / 3 if heartbeat_interval_s is None else heartbeat_interval_s
        if not replica_id or any(ch.isspace() for ch in replica_id):
            raise AdmissionConfigError(f"replica_id must be a non-empty word, got {replica_id!r}")
        if not 0 < interval < replica_ttl_s:
            raise AdmissionConfigError(f"need 0 < heartbeat_interval_s ({interval}) < replica_ttl_s ({replica_ttl_s})")
        valid = finished_ttl_s > 0 and payload_ttl_s > 0 and call_timeout_s > 0 and events_maxlen >= 100
        if not (valid and connect_timeout_s > 0 and 0 < backoff_s[0] <= backoff_s[1]):
            raise AdmissionConfigError(
                "a TTL, call_timeout_s, events_maxlen (>= 100), backoff_s or connect_timeout_s is invalid"
            )
        self._owns_client = isinstance(redis, str)
        if isinstance(redis, str):
            # No client retries: an outage must surface at once (the maintenance task retries with back-off). No
            # socket timeout: redis-py then bounds writes with asyncio.wait_for, which on Python 3.11 can swallow a
            # cancellation; every call here is bounded by `call_timeout_s` instead.
            redis = Redis.from_url(
                redis, socket_timeout=None, socket_connect_timeout=connect_timeout_s, retry=Retry(NoBackoff(), 0)
            )
        kwargs = redis.connection_pool.connection_kwargs
        if kwargs.get("decode_responses"):
            raise AdmissionConfigError("the Redis client must not decode responses (payloads are bytes)")
        socket_timeout = kwargs.get("socket_timeout")
        if socket_timeout is not None and sys.version_info < (3, 12):
            logger.warning("redis admission: a client with socket_timeout may swallow task cancellation on Python 3.11")
        block_ms = 1000 if socket_timeout is None else max(10, min(1000, int(float(socket_timeout) * 500)))
        self._replica_id = replica_id
        self._config = config
        kick, positions_dirty = asyncio.Event(), asyncio.Event()
        self._mirror = ReplicaMirror(replica_id, config, wake_maintenance=kick.set, wake_positions=positions_dirty.set)
        self._link = RedisLink(
            redis,
            replica_id,
            self._mirror,
            kick,
            clock=clock if clock is not None else MonotonicClock(),
            prefix=prefix,
            finished_ttl_ms=round(finished_ttl_s * 1000),
            payload_ttl_ms=round(payload_ttl_s * 1000),
            events_maxlen=events_maxlen,
            call_timeout_s=call_timeout_s,
        )
        self._tickets = TicketCalls(self._link, self._mirror, config)
        self._maintenance = Maintenance(
            self._link,
            self._mirror,
            config,
            positions_dirty,
            replica_ttl_ms=round(replica_ttl_s * 1000),
            interval_s=interval,
            backoff_s=backoff_s,
            block_ms=block_ms,
            replica_url=replica_url,
        )
        self._tasks = TaskSet(f"redis-admission-{replica_id}")

    # ------------------------------------------------------------------------------------------------ lifecycle

    @property
    def replica_id(self) -> str:
        return self._replica_id

    @property
    def config(self) -> AdmissionConfig:
        return self._config

    @property
    def redis(self) -> Redis:
        """The client every call goes through (a store that shares this admission's connection pool uses it)."""
        return self._link.redis

    @property
    def prefix(self) -> str:
        """The key prefix of this admission's keys."""
        return self._link.prefix

    @property
    def clock(self) -> Clock:
        return self._link.clock

    @property
    def draining(self) -> bool:
        return self._mirror.draining

    @property
    def available(self) -> bool:
        """Registered and in contact with Redis (readiness). False from start until the first registration."""
        return self._link.available and not self._link.closed

    @property
    def reconnections(self) -> int:
        """How often contact with Redis (or this replica's registration) came back after it was lost. Each time,
        this replica's slots were re-asserted, re-created if Redis lost its data (then without what the owner had
        published: a caller that keeps state in the registry writes it again when this grows)."""
        return self._link.reconnections

    @property
    def unavailable_for_s(self) -> float | None:
        """Seconds (on `clock`) since contact with Redis was lost, or None while available."""
        link = self._link
        if link.available or link.unavailable_since is None:
            return None
        return link.clock.now() - link.unavailable_since

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Register this replica (if Redis answers; else it keeps trying) and start the background tasks."""
        link = self._link
        if link.closed:
            raise AdmissionClosedError("the redis admission backend is closed")
        if link.started:
            return
        link.started = True
        link.unavailable_since = link.clock.now()
        try:
            await self._maintenance.once()
        except UNAVAILABLE as exc:
            logger.warning("redis admission %s: Redis is not reachable at start (%s); retrying", self._replica_id, exc)
        self._tasks.spawn(self._maintenance.forever(), name=f"admission-maintain-{self._replica_id}")
        self._tasks.spawn(self._maintenance.read_events_forever(), name=f"admission-events-{self._replica_id}")
        self._tasks.spawn(self._maintenance.follow_positions_forever(), name=f"admission-positions-{self._replica_id}")

    async def aclose(self, *, deregister: bool = True) -> None:
        """Stop the background tasks; with `deregister`, leave the registry (any slot still held is reclaimed and
        its session marked lost). `deregister=False` leaves everything to expire, as a crash would. Idempotent."""
        link = self._link
        if link.closed:
            return
        link.closed = True
        await self._tasks.aclose()
        if deregister and link.started:
            try:
                await link.run("deregister")
            except UNAVAILABLE as exc:
                logger.warning("redis admission %s: could not deregister (%s)", self._replica_id, exc)
        self._tickets.fail_waiters()
        if self._owns_client:
            await link.redis.aclose()

    async def wait_available(self) -> None:
        """Wait until this replica is registered and in contact with Redis."""
        await self._link.up.wait()

    # ------------------------------------------------------------------------------------------------ observers

    def subscribe(self, listener: Callable[[SharedAdmissionEvent], None]) -> Callable[[], None]:
        """Register `listener` for every event from now on; returns an idempotent unsubscribe."""
        return self._mirror.subscribe(listener)

    def on_close_requested(self, listener: Callable[[CloseRequest], None]) -> Callable[[], None]:
        """Register the hook that receives close requests for sessions this replica owns (from any replica)."""
        return self._mirror.on_close_requested(listener)

    def on_pause_requested(self, listener: Callable[[PauseRequest], None]) -> Callable[[], None]:
        """Register the hook that receives pause and resume requests for sessions this replica owns."""
        return self._mirror.on_pause_requested(listener)

    def on_sessions_reaped(self, listener: Callable[[SharedTicketView], None]) -> Callable[[], None]:
        """Register `listener` for each session this replica declares lost with another replica (failed
        `replica_lost`, `last_seen_at` set): reaped by its maintenance, or an orphan its `adopt` failed (no
        checkpoint, or no adopter in time). Told here only, once per session in the deployment (each is one atomic
        script; a racing caller finds nothing left to fail). A listener told nothing is lost: a
        replica that dies between the script's reply and its listeners leaves those sessions unreported."""
        return self._mirror.on_reaped(listener)

    def on_replicas_reaped(self, listener: Callable[[str], None]) -> Callable[[], None]:
        """Register `listener` for each replica this replica's maintenance reaps (its liveness lapsed): told here
        only, once per reap in the deployment, after that replica's sessions were told to `on_sessions_reaped`."""
        return self._mirror.on_replica_reaped(listener)

    def watch(self, ticket_id: str) -> Callable[[], None]:
        """Follow a queued ticket created elsewhere (an SSE stream here): POSITION_CHANGED events for it, the first
        one with its current position. Returns an idempotent unwatch."""
        return self._mirror.watch(ticket_id)

    def held(self) -> Mapping[str, int]:
        """Ticket id -> worker of every slot this replica holds, lost-but-still-running sessions included."""
        return self._mirror.held()

    def statistics(self) -> AdmissionStatistics:
        """This replica's admission, as the in-memory controller reports it: its own workers' retained sessions
        and health, counters of what it decided, and the global queue depth as of its last call to Redis."""
        return self._mirror.statistics()

    async def shared_statistics(self) -> SharedAdmissionStatistics:
        """Every registered replica and the queue, read from Redis in one atomic script."""
        reply = await self._link.call("overview")
        replicas = sorted((decode_replica(*row) for row in reply.result), key=lambda r: r.replica_id)
        return SharedAdmissionStatistics(tuple(replicas), reply.queue_depth)

    async def usage(self, owner: str, since: float) -> UsageReport:
        """`owner`'s usage over every replica, from the bucket that holds `since` (Unix seconds) to now (Redis
        time). Running sessions' time is counted up to their replica's last heartbeat."""
        reply = await self._link.call("usage_read", owner, max(0, round(since * 1000)))
        first, now, running, queued, sessions, chunks, frames = (int(value) for value in reply.result)
        totals = UsageTotals(running / 1000, queued / 1000, sessions, chunks, frames)
        return UsageReport(owner, first / 1000, now / 1000, totals)

    async def usage_totals(self) -> dict[str, UsageTotals]:
        """Every owner's all-time usage over every replica."""
        reply = await self._link.call("usage_totals")
        out: dict[str, UsageTotals] = {}
        for raw_owner, running, queued, sessions, chunks, frames in reply.result:
            out[decode_text(raw_owner)] = UsageTotals(
                int(running) / 1000, int(queued) / 1000, int(sessions), int(chunks), int(frames)
            )
        return out

    async def flush_usage(self, generated: Mapping[str, tuple[int, int]]) -> None:
        """Count `owner -> (chunks, frames)` generated on this replica since its last flush (now, Redis time)."""
        args: list[str | int | bytes] = []
        for owner, (chunks, frames) in generated.items():
            args += [owner, chunks, frames]
        if args:
            await self._link.call("usage_flush", *args)

    # ------------------------------------------------------------------------------------------------ commands
    # Each is one script call; `service.scaleout.tickets` holds what the replies mean.

    async def create(
        self, owner: str, *, ticket_id: str | None = None, payload: bytes | None = None, body: str | None = None
    ) -> SharedTicketView:
        """Ask for a slot for a new session: ADMITTED onto this replica, QUEUED (global `position`), or REJECTED
        (queue full with `retry_after_s`, draining, or over the owner's quota). `payload` is kept for whichever
        replica admits it (`take_payload`); `body` is the registry body from the start. Raises `TicketExistsError`,
        and `AdmissionUnavailableError` while Redis cannot be reached."""
        return await self._tickets.create(owner, ticket_id=ticket_id, payload=payload, body=body)

    async def get(self, ticket_id: str) -> SharedTicketView:
        """The ticket's current snapshot with its live global position (live, or finished and remembered for
        `finished_ttl_s`), from any replica. Not a heartbeat. Unknown ids raise `UnknownTicketError`."""
        return await self._tickets.get(ticket_id)

    async def heartbeat(self, ticket_id: str, *, owner: str | None = None) -> SharedTicketView:
        """The waiting client is still there (a GET or an open SSE stream, on any replica): push its heartbeat
        deadline out, and return the snapshot as `get` does (one script call). A no-op for tickets that are not
        queued, and, with `owner`, for tickets of another owner (whose snapshot still comes back: the caller
        compares owners, in constant time)."""
        return await self._tickets.heartbeat(ticket_id, owner=owner)

    async def cancel(self, ticket_id: str) -> SharedTicketView:
        """Withdraw a queued ticket (CANCELLED, CLIENT_CANCELLED), from any replica; idempotent on finished tickets;
        an ADMITTED ticket raises `IllegalTransitionError` (use `request_close`)."""
        return await self._tickets.cancel(ticket_id)

    async def release(self, ticket_id: str) -> SharedTicketView:
        """The session is over: QUEUED -> CANCELLED (any replica); ADMITTED here -> RELEASED, the slot goes back and
        the queue head is admitted onto it; finished -> no-op. Idempotent. A ticket admitted on another replica
        raises `NotTicketOwnerError`. While Redis is unreachable, a release of a slot held here is replayed later."""
        return await self._tickets.release(ticket_id)

    async def mark_adoptable(self, ticket_id: str) -> bool:
        """This replica's admitted session can be rebuilt elsewhere (its checkpoint is in Redis): if this replica is
        lost, the reaper leaves it for an adopter instead of failing it. False when it is not held here."""
        reply = await self._link.call("adoptable", ticket_id)
        return reply.code == "ok"

    async def hand_off_room(self, ticket_id: str) -> str:
        """Whether this replica's admitted session could be handed off now (it writes nothing): "ok" when a live
        replica other than this one, not draining, has a free healthy slot beyond the orphans already waiting;
        "nowhere" when none has; "no_checkpoint", "elsewhere" or "unknown" as `hand_off`."""
        reply = await self._link.call("hand_off", ticket_id, "check")
        return reply.code

    async def hand_off(self, ticket_id: str, *, paused_for_s: float | None = None) -> str:
        """Give this replica's admitted session up for adoption now (a drain; it stopped generating and its checkpoint
        is in Redis): it waits in `orphans` for an adopter, ahead of the queue (status `recovering`, reason
        `replica_draining`). `paused_for_s`: the session is paused, since that long ago; the ticket keeps when its
        pause began (`SharedTicketView.paused_at`, the Redis clock) and its adopter goes on paused. Returns "ok",
        "no_checkpoint", "elsewhere" or "unknown"."""
        paused = "" if paused_for_s is None else str(max(0, round(paused_for_s * 1000)))
        reply = await self._link.call("hand_off", ticket_id, "go", paused)
        return reply.code

    async def adopt(self, max_wait_s: float, most: int) -> tuple[list[SharedTicketView], list[SharedTicketView]]:
        """Adopt up to `most` orphans (sessions whose replica was lost or handed them off) onto this replica's free
        slots, oldest first, ahead of the queue; each is adopted by exactly one replica, in one script. Orphans
        that waited longer than `max_wait_s`, or whose checkpoint is gone, fail first (`replica_lost`). Returns
        (adopted here, failed)."""
        reply = await self._link.call("adopt", round(max_wait_s * 1000), most)
        adopted, failed = reply.result
        lost = [decode_view(decode_fields(flat)) for flat in failed]
        for view in lost:  # declared lost here, once in the deployment: their `session.ended` goes out from here
            self._mirror.apply_reaped(view)
        return [decode_view(decode_fields(flat)) for flat in adopted], lost

    async def request_close(self, ticket_id: str, mode: str = "drain") -> SharedTicketView:
        """DELETE from any replica: a queued ticket is cancelled; for an admitted one a close request goes to its
        owner (its `on_close_requested` hooks; the owner's listeners see RELEASED once it closed); finished: no-op.
        Returns the snapshot after the request."""
        return await self._tickets.request_close(ticket_id, mode)

    async def request_pause(self, ticket_id: str, paused: bool) -> tuple[str, SharedTicketView]:
        """A pause (`paused`) or resume from any replica: for an admitted ticket the request goes to its owner (its
        `on_pause_requested` hooks). Returns the script's code ("requested"; "queued": the ticket still waits,
        nothing changed; "ok": it has finished) and the snapshot."""
        return await self._tickets.request_pause(ticket_id, paused)

    async def publish_status(
        self,
        ticket_id: str,
        status: str,
        *,
        reason: str | None = None,
        body: str | None = None,
        paused_for_s: float | None = None,
    ) -> SharedTicketView:
        """The owner records the session's status (running, draining, closed, failed ...), its reason and
        optionally a JSON body in the registry, for GETs on other replicas; listeners everywhere get STATUS.
        `paused_for_s`: the session is paused, since that long ago; the ticket keeps when its pause began
        (`SharedTicketView.paused_at`, the Redis clock) until a status without it, so that, if this replica is lost,
        its adopter goes on paused (as after a paused `hand_off`). A session reaped as lost keeps its failure.
        Raises `NotTicketOwnerError` on a non-owner."""
        return await self._tickets.publish_status(
            ticket_id, status, reason=reason, body=body, paused_for_s=paused_for_s
        )

    async def list_tickets(
        self,
        *,
        owner: str | None = None,
        state: TicketState | None = None,
        worker: int | None = None,
        replica: str | None = None,
    ) -> tuple[SharedTicketView, ...]:
        """Live (queued or admitted) tickets of every replica in creation order, filtered."""
        return await self._tickets.list_tickets(owner, state, worker, replica)

    async def take_payload(self, ticket_id: str) -> bytes | None:
        """The create payload of a ticket admitted here (once; then it is only in Redis until it expires)."""
        return await self._tickets.take_payload(ticket_id)

    async def wait_until_admitted(self, ticket_id: str) -> SharedTicketView:
        """Wait until the ticket is no longer queued (on whichever replica) and return that snapshot: ADMITTED, or
        EXPIRED/CANCELLED. Bound it with `asyncio.timeout`; cancelling it leaves the ticket queued."""
        return await self._tickets.wait_until_admitted(ticket_id)

    def set_worker_healthy(self, index: int, healthy: bool) -> None:
        """Mark worker `index` of this replica (un)healthy; Redis learns it at the next maintenance pass, which
        this call triggers at once. Sessions on it keep their slots. Idempotent."""
        if not 0 <= index < self._config.num_workers:
            raise UnknownWorkerError(index, self._config.num_workers)
        if self._mirror.healthy[index] != healthy:
            logger.info("redis admission: worker %d is now %s", index, "healthy" if healthy else "unhealthy")
        self._mirror.healthy[index] = healthy
        self._link.kick.set()

    async def drain(self) -> tuple[SharedTicketView, ...]:
        """Stop admitting onto this replica for good and reject creates here (DRAINING). The global queue keeps
        waiting for the other replicas; only when no other live replica admits are queued tickets cancelled
        (DRAINING). Returns the tickets cancelled. Never raises for an outage (the flag reaches Redis later)."""
        if not self._mirror.draining:
            logger.info("redis admission %s: draining", self._replica_id)
        self._mirror.draining = True
        if not self._link.started or self._link.closed:
            return ()
        try:
            reply = await self._link.run("drain")
        except UNAVAILABLE as exc:
            self._link.lost_contact(exc)
            return ()
        return tuple(decode_view(decode_fields(flat)) for flat in reply.result)

    async def replica_url(self, replica_id: str) -> str | None:
        """The address `replica_id` advertises to the other replicas (its `replica_url`), read now: None when it
        advertises none or its liveness lapsed (the address is kept with the liveness key, the same TTL). Raises
        `AdmissionUnavailableError` while Redis is unreachable."""
        self._link.require_started()
        try:
            raw = await self._link.timed(self._link.redis.get(f"{self._link.prefix}url:{replica_id}"))
        except UNAVAILABLE as exc:
            self._link.lost_contact(exc)
            raise AdmissionUnavailableError(UNAVAILABLE_MESSAGE) from exc
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    async def tick(self) -> None:
        """One maintenance pass now (what the background task does every `heartbeat_interval_s`): heartbeat,
        expire, reap dead replicas, re-assert this replica's slots, admit onto free slots here."""
        self._link.require_started()
        try:
            await self._maintenance.once()
        except UNAVAILABLE as exc:
            self._link.lost_contact(exc)
            raise AdmissionUnavailableError(UNAVAILABLE_MESSAGE) from exc
