"""Shared session admission in Redis: one global FIFO and per-(replica, worker) slots across every service replica.

`RedisAdmission` is the multi-replica counterpart of `admission.AdmissionController` (issue #10): each replica
runs one, all of them share one Redis. Every decision (create, admit, expire, release, reap a dead replica) is one
Lua script in `service.scaleout.redis_side`, so nothing is double-granted or leaked however replicas race. The ticket
hashes
double as the session registry every replica can read, and a Redis stream carries every change and the close
requests for owners. Deadlines use Redis server time. This module is the asyncio shell around those scripts: it
keeps the replica alive (heartbeat, reaper, anti-entropy), delivers events, follows queue positions, and rides out
Redis outages. The key schema and every script's contract are in `service.scaleout.redis_side`; the design in
`docs/scale-out.md`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self, TypeVar

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ReadOnlyError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from admission import (
    AdmissionClosedError,
    AdmissionConfig,
    AdmissionConfigError,
    AdmissionInvariantError,
    AdmissionStatistics,
    Clock,
    IllegalTransitionError,
    KeyQuota,
    MonotonicClock,
    TicketExistsError,
    TicketReason,
    TicketState,
    UnknownTicketError,
    UnknownWorkerError,
)
from service.errors import AdmissionUnavailableError
from service.runtime.tasks import TaskSet
from service.scaleout.redis_side import SCRIPTS
from service.scaleout.redis_side.mirror import ReplicaMirror
from service.scaleout.redis_side.records import (
    CloseRequest,
    NotTicketOwnerError,
    PauseRequest,
    ReplicaStatistics,
    ScriptReply,
    SharedAdmissionEvent,
    SharedAdmissionStatistics,
    SharedEventKind,
    SharedTicketView,
    decode_fields,
    decode_replica,
    decode_reply,
    decode_text,
    decode_view,
)
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

# What an unreachable, restarting or failed-over Redis raises (BusyLoadingError is a ConnectionError).
_UNAVAILABLE: tuple[type[Exception], ...] = (RedisConnectionError, RedisTimeoutError, ReadOnlyError, OSError)
_UNAVAILABLE_MESSAGE = "the shared admission backend is unavailable; retry shortly"
_CLOSE_MODES = frozenset({"drain", "cancel"})

T = TypeVar("T")


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
    back-off (first, max); `call_timeout_s` bounds every Redis call.
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
    ) -> None:
        interval = replica_ttl_s / 3 if heartbeat_interval_s is None else heartbeat_interval_s
        if not replica_id or any(ch.isspace() for ch in replica_id):
            raise AdmissionConfigError(f"replica_id must be a non-empty word, got {replica_id!r}")
        if not 0 < interval < replica_ttl_s:
            raise AdmissionConfigError(f"need 0 < heartbeat_interval_s ({interval}) < replica_ttl_s ({replica_ttl_s})")
        valid = finished_ttl_s > 0 and payload_ttl_s > 0 and call_timeout_s > 0 and events_maxlen >= 100
        if not (valid and 0 < backoff_s[0] <= backoff_s[1]):
            raise AdmissionConfigError("a TTL, call_timeout_s, events_maxlen (>= 100) or backoff_s is invalid")
        self._owns_client = isinstance(redis, str)
        if isinstance(redis, str):
            # No client retries: an outage must surface at once (the maintenance task retries with back-off). No
            # socket timeout: redis-py then bounds writes with asyncio.wait_for, which on Python 3.11 can swallow a
            # cancellation; every call here is bounded by `call_timeout_s` instead.
            redis = Redis.from_url(redis, socket_timeout=None, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))
        kwargs = redis.connection_pool.connection_kwargs
        if kwargs.get("decode_responses"):
            raise AdmissionConfigError("the Redis client must not decode responses (payloads are bytes)")
        socket_timeout = kwargs.get("socket_timeout")
        if socket_timeout is not None and sys.version_info < (3, 12):
            logger.warning("redis admission: a client with socket_timeout may swallow task cancellation on Python 3.11")
        self._block_ms = 1000 if socket_timeout is None else max(10, min(1000, int(float(socket_timeout) * 500)))
        self._call_timeout = call_timeout_s
        self._redis = redis
        self._replica_id = replica_id
        self._config = config
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._prefix = prefix
        self._stream_key = f"{prefix}events"
        self._ttl_ms = round(replica_ttl_s * 1000)
        self._interval = interval
        self._finished_ttl_ms = round(finished_ttl_s * 1000)
        self._payload_ttl_ms = round(payload_ttl_s * 1000)
        self._events_maxlen = events_maxlen
        self._backoff = backoff_s
        self._scripts = {name: redis.register_script(source) for name, source in SCRIPTS.items()}
        self._tasks = TaskSet(f"redis-admission-{replica_id}")
        self._started = False
        self._closed = False
        self._available = False
        self._unavailable_since: float | None = None
        self._registered_once = False
        self._reconnections = 0
        self._up = asyncio.Event()
        self._kick = asyncio.Event()
        self._positions_dirty = asyncio.Event()
        self._epoch: str | None = None
        self._audit_at: float | None = None  # on `clock`: when to look for queued tickets Redis lost
        self._reader_reset = False
        self._stream_from: Any = None
        self._waiters: dict[str, set[asyncio.Future[SharedTicketView]]] = {}
        self._mirror = ReplicaMirror(
            replica_id, config, wake_maintenance=self._kick.set, wake_positions=self._positions_dirty.set
        )
        self._mirror.subscribe(self._wake_waiters)

    # ------------------------------------------------------------------------------------------------ lifecycle

    @property
    def replica_id(self) -> str:
        return self._replica_id

    @property
    def config(self) -> AdmissionConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def draining(self) -> bool:
        return self._mirror.draining

    @property
    def available(self) -> bool:
        """Registered and in contact with Redis (readiness). False from start until the first registration."""
        return self._available and not self._closed

    @property
    def reconnections(self) -> int:
        """How often contact with Redis (or this replica's registration) came back after it was lost. Each time,
        this replica's slots were re-asserted, re-created if Redis lost its data (then without what the owner had
        published: a caller that keeps state in the registry writes it again when this grows)."""
        return self._reconnections

    @property
    def unavailable_for_s(self) -> float | None:
        """Seconds (on `clock`) since contact with Redis was lost, or None while available."""
        if self._available or self._unavailable_since is None:
            return None
        return self._clock.now() - self._unavailable_since

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Register this replica (if Redis answers; else it keeps trying) and start the background tasks."""
        if self._closed:
            raise AdmissionClosedError("the redis admission backend is closed")
        if self._started:
            return
        self._started = True
        self._unavailable_since = self._clock.now()
        try:
            await self._maintain_once()
        except _UNAVAILABLE as exc:
            logger.warning("redis admission %s: Redis is not reachable at start (%s); retrying", self._replica_id, exc)
        self._tasks.spawn(self._maintain_forever(), name=f"admission-maintain-{self._replica_id}")
        self._tasks.spawn(self._read_events_forever(), name=f"admission-events-{self._replica_id}")
        self._tasks.spawn(self._follow_positions_forever(), name=f"admission-positions-{self._replica_id}")

    async def aclose(self, *, deregister: bool = True) -> None:
        """Stop the background tasks; with `deregister`, leave the registry (any slot still held is reclaimed and
        its session marked lost). `deregister=False` leaves everything to expire, as a crash would. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self._tasks.aclose()
        if deregister and self._started:
            try:
                await self._run("deregister")
            except _UNAVAILABLE as exc:
                logger.warning("redis admission %s: could not deregister (%s)", self._replica_id, exc)
        waiters, self._waiters = self._waiters, {}
        for futures in waiters.values():
            for future in futures:
                if not future.done():
                    future.set_exception(AdmissionClosedError("the redis admission backend closed while waiting"))
        if self._owns_client:
            await self._redis.aclose()

    async def wait_available(self) -> None:
        """Wait until this replica is registered and in contact with Redis."""
        await self._up.wait()

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
        reply = await self._call("overview")
        replicas = sorted((decode_replica(*row) for row in reply.result), key=lambda r: r.replica_id)
        return SharedAdmissionStatistics(tuple(replicas), reply.queue_depth)

    async def usage(self, owner: str, since: float) -> UsageReport:
        """`owner`'s usage over every replica, from the bucket that holds `since` (Unix seconds) to now (Redis
        time). Running sessions' time is counted up to their replica's last heartbeat."""
        reply = await self._call("usage_read", owner, max(0, round(since * 1000)))
        first, now, running, queued, sessions, chunks, frames = (int(value) for value in reply.result)
        totals = UsageTotals(running / 1000, queued / 1000, sessions, chunks, frames)
        return UsageReport(owner, first / 1000, now / 1000, totals)

    async def usage_totals(self) -> dict[str, UsageTotals]:
        """Every owner's all-time usage over every replica."""
        reply = await self._call("usage_totals")
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
            await self._call("usage_flush", *args)

    # ------------------------------------------------------------------------------------------------ commands

    async def create(
        self, owner: str, *, ticket_id: str | None = None, payload: bytes | None = None, body: str | None = None
    ) -> SharedTicketView:
        """Ask for a slot for a new session: ADMITTED onto this replica, QUEUED (global `position`), or REJECTED
        (QUEUE_FULL with `retry_after_s`, DRAINING, or RUNNING_QUOTA / QUEUED_QUOTA: the owner's quota from
        `config.quota_of(owner)`, checked in the same script as the admission decision). `payload` (opaque bytes,
        e.g. the request) is kept while the ticket waits, for whichever replica admits it (`take_payload`). `body`
        is the registry body from the start (what GETs on other replicas read until the owner publishes one).
        Raises `TicketExistsError`, and `AdmissionUnavailableError` while Redis cannot be reached."""
        self._require_started()
        ticket_id = ticket_id if ticket_id is not None else secrets.token_urlsafe(12)
        if self._mirror.draining:
            return self._reject(ticket_id, owner, TicketReason.DRAINING, None, time.time())
        if not self._available:
            raise AdmissionUnavailableError(_UNAVAILABLE_MESSAGE)
        config = self._config
        heartbeat_ms = 0 if config.queue_heartbeat_timeout is None else round(config.queue_heartbeat_timeout * 1000)
        args: list[str | int | bytes] = [
            *(ticket_id, owner, secrets.token_hex(8), config.queue_size, round(config.queue_timeout * 1000)),
            *(heartbeat_ms, round(config.default_session_seconds * 1000), config.max_retry_after_s),
            *((1, payload) if payload is not None else (0, b"")),
            *((1, body) if body is not None else (0, "")),
            *_bounds(config.quota_of(owner)),
        ]
        self._mirror.create_started(ticket_id)  # the reply carries the position: the follower waits for it
        try:
            return await self._create_once(ticket_id, owner, args)
        finally:
            self._mirror.create_ended(ticket_id)

    async def _create_once(self, ticket_id: str, owner: str, args: list[str | int | bytes]) -> SharedTicketView:
        """The create script and what its reply means (`create`'s answers and errors)."""
        departures = self._mirror.departures
        try:
            reply = await self._run("create", *args)
        except _UNAVAILABLE as exc:
            self._mirror.deferred[ticket_id] = "abort"  # it may exist: take it back once Redis answers
            self._lost_contact(exc)
            raise AdmissionUnavailableError(_UNAVAILABLE_MESSAGE) from exc
        except asyncio.CancelledError:
            self._mirror.deferred[ticket_id] = "abort"
            self._kick.set()
            raise
        except ResponseError as exc:
            raise AdmissionInvariantError(f"admission script 'create' failed: {exc}") from exc
        if reply.code == "exists":
            raise TicketExistsError(ticket_id)
        if reply.code == "unregistered":
            self._registration_lapsed()
            raise AdmissionUnavailableError(_UNAVAILABLE_MESSAGE)
        if reply.code == "rejected":
            reason, retry_after, now_ms = reply.result
            refusal = TicketReason(decode_text(reason))
            if refusal is not TicketReason.QUEUE_FULL:  # draining, or the owner's quota
                return self._reject(ticket_id, owner, refusal, None, int(now_ms) / 1000)
            return self._reject(ticket_id, owner, TicketReason.QUEUE_FULL, int(retry_after), int(now_ms) / 1000)
        view = decode_view(decode_fields(reply.result))
        if view.state is TicketState.QUEUED and self._mirror.departures == departures:
            self._mirror.position_current(ticket_id)  # nothing left the queue meanwhile: its position is exact
        return view

    async def get(self, ticket_id: str) -> SharedTicketView:
        """The ticket's current snapshot with its live global position (live, or finished and remembered for
        `finished_ttl_s`), from any replica. Not a heartbeat. Unknown ids raise `UnknownTicketError`."""
        return self._ok(ticket_id, await self._call("get", ticket_id))

    async def heartbeat(self, ticket_id: str, *, owner: str | None = None) -> SharedTicketView:
        """The waiting client is still there (a GET or an open SSE stream, on any replica): push its heartbeat
        deadline out, and return the snapshot as `get` does (one script call). A no-op for tickets that are not
        queued, and, with `owner`, for tickets of another owner (whose snapshot still comes back: the caller
        compares owners, in constant time)."""
        timeout = self._config.queue_heartbeat_timeout
        hb_ms = 0 if timeout is None else round(timeout * 1000)
        return self._ok(ticket_id, await self._call("heartbeat", ticket_id, hb_ms, owner or ""))

    async def cancel(self, ticket_id: str) -> SharedTicketView:
        """Withdraw a queued ticket (CANCELLED, CLIENT_CANCELLED), from any replica; idempotent on finished tickets;
        an ADMITTED ticket raises `IllegalTransitionError` (use `request_close`)."""
        reply = await self._call("cancel", ticket_id)
        if reply.code == "illegal":
            hint = "an admitted session ends with release() by its owner, or request_close() from anywhere"
            raise IllegalTransitionError(ticket_id, "admitted", "cancelled", hint)
        return self._ok(ticket_id, reply)

    async def release(self, ticket_id: str) -> SharedTicketView:
        """The session is over: QUEUED -> CANCELLED (any replica); ADMITTED here -> RELEASED, the slot goes back and
        the queue head is admitted onto it; finished -> no-op. Idempotent. A ticket admitted on another replica
        raises `NotTicketOwnerError`. While Redis is unreachable, the release of a slot held here is remembered
        and replayed (the returned view is then this replica's own, marked RELEASED)."""
        self._require_started()
        zombie = self._mirror.end_zombie(ticket_id)  # a lost session the service stopped: its slot is free again
        try:
            reply = await self._run("release", ticket_id, self._config.session_length_window)
        except _UNAVAILABLE as exc:
            self._lost_contact(exc)
            if zombie is not None:
                return zombie
            held = self._mirror.forget_held(ticket_id)
            if held is None:
                raise AdmissionUnavailableError(_UNAVAILABLE_MESSAGE) from exc
            self._mirror.deferred[ticket_id] = "release"
            logger.warning("redis admission: release of %s deferred until Redis is back", ticket_id)
            return dataclasses.replace(held, state=TicketState.RELEASED, reason=TicketReason.SESSION_ENDED)
        except asyncio.CancelledError:
            if self._mirror.holds(ticket_id):
                self._mirror.deferred[ticket_id] = "release"
                self._kick.set()
            raise
        except ResponseError as exc:
            raise AdmissionInvariantError(f"admission script 'release' failed: {exc}") from exc
        if reply.code == "unknown" and zombie is not None:
            return zombie
        if reply.code == "elsewhere":
            raise NotTicketOwnerError(ticket_id, decode_view(decode_fields(reply.result)).replica)
        return self._ok(ticket_id, reply)

    async def request_close(self, ticket_id: str, mode: str = "drain") -> SharedTicketView:
        """DELETE from any replica: a queued ticket is cancelled; for an admitted one a close request goes to its
        owner (its `on_close_requested` hooks; the owner's listeners see RELEASED once it closed); finished: no-op.
        Returns the snapshot after the request."""
        if mode not in _CLOSE_MODES:
            raise ValueError(f"mode must be one of {sorted(_CLOSE_MODES)}, got {mode!r}")
        return self._ok(ticket_id, await self._call("request_close", ticket_id, mode))

    async def request_pause(self, ticket_id: str, paused: bool) -> tuple[str, SharedTicketView]:
        """A pause (`paused`) or resume from any replica: for an admitted ticket the request goes to its owner (its
        `on_pause_requested` hooks). Returns the script's code ("requested"; "queued": the ticket still waits,
        nothing changed; "ok": it has finished) and the snapshot."""
        reply = await self._call("request_pause", ticket_id, "pause" if paused else "resume")
        return reply.code, self._ok(ticket_id, reply)

    async def publish_status(
        self, ticket_id: str, status: str, *, reason: str | None = None, body: str | None = None
    ) -> SharedTicketView:
        """The owner records the session's status (running, draining, closed, failed ...), its reason and
        optionally a JSON body in the registry, for GETs on other replicas; listeners everywhere get STATUS.
        A session reaped as lost keeps its failure. Raises `NotTicketOwnerError` on a non-owner."""
        args = (ticket_id, status, reason or "", *((1, body) if body is not None else (0, "")))
        reply = await self._call("publish_status", *args)
        if reply.code == "elsewhere":
            raise NotTicketOwnerError(ticket_id, decode_view(decode_fields(reply.result)).replica)
        return self._ok(ticket_id, reply)

    async def list_tickets(
        self,
        *,
        owner: str | None = None,
        state: TicketState | None = None,
        worker: int | None = None,
        replica: str | None = None,
    ) -> tuple[SharedTicketView, ...]:
        """Live (queued or admitted) tickets of every replica in creation order, filtered."""
        filters = (owner or "", state.value if state else "", "" if worker is None else worker, replica or "")
        reply = await self._call("list", *filters)
        return tuple(decode_view(decode_fields(flat)) for flat in reply.result)

    async def take_payload(self, ticket_id: str) -> bytes | None:
        """The create payload of a ticket admitted here (once; then it is only in Redis until it expires)."""
        payload = self._mirror.take_payload(ticket_id)
        if payload is not None:
            return payload
        try:
            raw: Any = await self._timed(self._redis.get(f"{self._prefix}p:{ticket_id}"))
        except _UNAVAILABLE as exc:
            self._lost_contact(exc)
            raise AdmissionUnavailableError(_UNAVAILABLE_MESSAGE) from exc
        return None if raw is None else bytes(raw)

    async def wait_until_admitted(self, ticket_id: str) -> SharedTicketView:
        """Wait until the ticket is no longer queued (on whichever replica) and return that snapshot: ADMITTED, or
        EXPIRED/CANCELLED. Bound it with `asyncio.timeout`; cancelling it leaves the ticket queued."""
        future: asyncio.Future[SharedTicketView] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(ticket_id, set()).add(future)  # before the read: no event can slip between
        try:
            view = await self.get(ticket_id)
            if view.state is not TicketState.QUEUED:
                return view
            return await future
        finally:
            futures = self._waiters.get(ticket_id)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._waiters[ticket_id]

    def set_worker_healthy(self, index: int, healthy: bool) -> None:
        """Mark worker `index` of this replica (un)healthy; Redis learns it at the next maintenance pass, which
        this call triggers at once. Sessions on it keep their slots. Idempotent."""
        if not 0 <= index < self._config.num_workers:
            raise UnknownWorkerError(index, self._config.num_workers)
        if self._mirror.healthy[index] != healthy:
            logger.info("redis admission: worker %d is now %s", index, "healthy" if healthy else "unhealthy")
        self._mirror.healthy[index] = healthy
        self._kick.set()

    async def drain(self) -> tuple[SharedTicketView, ...]:
        """Stop admitting onto this replica for good and reject creates here (DRAINING). The global queue keeps
        waiting for the other replicas; only when no other live replica admits are queued tickets cancelled
        (DRAINING). Returns the tickets cancelled. Never raises for an outage (the flag reaches Redis later)."""
        if not self._mirror.draining:
            logger.info("redis admission %s: draining", self._replica_id)
        self._mirror.draining = True
        if not self._started or self._closed:
            return ()
        try:
            reply = await self._run("drain")
        except _UNAVAILABLE as exc:
            self._lost_contact(exc)
            return ()
        return tuple(decode_view(decode_fields(flat)) for flat in reply.result)

    async def tick(self) -> None:
        """One maintenance pass now (what the background task does every `heartbeat_interval_s`): heartbeat,
        expire, reap dead replicas, re-assert this replica's slots, admit onto free slots here."""
        self._require_started()
        try:
            await self._maintain_once()
        except _UNAVAILABLE as exc:
            self._lost_contact(exc)
            raise AdmissionUnavailableError(_UNAVAILABLE_MESSAGE) from exc

    # ------------------------------------------------------------------------------------------------ internals

    def _require_started(self) -> None:
        if self._closed or not self._started:
            raise AdmissionClosedError("the redis admission backend is not running (start() it; closed for good)")

    async def _timed(self, call: Awaitable[T], extra_s: float = 0.0) -> T:
        """Every Redis call is bounded here; the timeout surfaces as `TimeoutError`, i.e. an outage."""
        async with asyncio.timeout(self._call_timeout + extra_s):
            return await call

    def _header(self) -> list[str | int | bytes]:
        return [
            *(self._prefix, self._replica_id, self._finished_ttl_ms, self._events_maxlen, self._mirror.info()),
            self._payload_ttl_ms,
        ]

    async def _run(self, name: str, *args: str | int | bytes) -> ScriptReply:
        """Run one script; deliver the events it reports. Redis errors propagate."""
        return self._take(await self._timed(self._scripts[name](args=[*self._header(), *args])))

    async def _run_pipelined(self, name: str, calls: list[tuple[str | int | bytes, ...]]) -> list[ScriptReply]:
        """Run one script once per argument tuple, in one round trip (a pipeline, not a transaction: each call is
        atomic on its own); deliver the events of each in order. Redis errors propagate."""
        pipe = self._redis.pipeline(transaction=False)
        header = self._header()
        for args in calls:
            await self._scripts[name](args=[*header, *args], client=pipe)
        raw: list[Any] = await self._timed(pipe.execute())
        return [self._take(reply) for reply in raw]

    def _take(self, raw: Any) -> ScriptReply:
        """Decode a script's reply and apply it: queue depth, payloads taken, events."""
        reply = decode_reply(raw)
        self._mirror.queue_depth = reply.queue_depth
        for ticket_id, payload in reply.taken:  # before the events: a listener may ask for the payload
            if payload is not None:
                self._mirror.stash_payload(ticket_id, bytes(payload))
        for fields in reply.events:
            self._mirror.apply(fields)
        return reply

    async def _call(self, name: str, *args: str | int | bytes) -> ScriptReply:
        """`_run` for the public calls: Redis errors become `AdmissionUnavailableError` (or an invariant error)."""
        self._require_started()
        try:
            return await self._run(name, *args)
        except _UNAVAILABLE as exc:
            self._lost_contact(exc)
            raise AdmissionUnavailableError(_UNAVAILABLE_MESSAGE) from exc
        except ResponseError as exc:
            raise AdmissionInvariantError(f"admission script {name!r} failed: {exc}") from exc

    @staticmethod
    def _ok(ticket_id: str, reply: ScriptReply) -> SharedTicketView:
        if reply.code == "unknown":
            raise UnknownTicketError(ticket_id)
        return decode_view(decode_fields(reply.result))

    def _reject(
        self, ticket_id: str, owner: str, reason: TicketReason, retry_after_s: int | None, now: float
    ) -> SharedTicketView:
        view = SharedTicketView(
            ticket_id=ticket_id,
            owner=owner,
            state=TicketState.REJECTED,
            reason=reason,
            position=None,
            worker=None,
            retry_after_s=retry_after_s,
            created_at=now,
            admitted_at=None,
            ended_at=now,
            queue_deadline=None,
            heartbeat_deadline=None,
            origin=self._replica_id,
        )
        return self._mirror.reject(view)

    def _lost_contact(self, exc: BaseException) -> None:
        if self._available:
            logger.warning(
                "redis admission %s: lost contact with Redis (%s: %s); creates are refused, running sessions go on",
                self._replica_id,
                type(exc).__name__,
                exc,
            )
            self._unavailable_since = self._clock.now()
        self._available = False
        self._up.clear()
        self._kick.set()

    def _registration_lapsed(self) -> None:
        logger.warning("redis admission %s: its liveness key lapsed; re-registering", self._replica_id)
        if self._available:
            self._unavailable_since = self._clock.now()
        self._available = False
        self._up.clear()
        self._kick.set()

    def _wake_waiters(self, event: SharedAdmissionEvent) -> None:
        if event.ticket.state is not TicketState.QUEUED:
            for future in self._waiters.pop(event.ticket.ticket_id, set()):
                if not future.done():
                    future.set_result(event.ticket)

    # ------------------------------------------------------------------------------------------ background tasks

    async def _maintain_once(self) -> float:
        """Replay deferred calls, then one `maintain` script; returns the seconds until the next pass is due."""
        recovering = not self._available
        if recovering and self._epoch is not None:
            # Idle pooled connections may predate the outage (a restarted Redis closed them): each would fail its
            # next call once and flap `available`. Drop them; calls reconnect.
            with contextlib.suppress(*_UNAVAILABLE):
                await self._timed(self._redis.connection_pool.disconnect(inuse_connections=False))
        if self._stream_from is None:
            # Listeners hear every event from when this replica first reached Redis (those before concern tickets
            # it never saw). That point is read before the first registration, which may admit tickets here whose
            # later events (a close request) must not be skipped, even if its reply is lost and it is retried.
            newest: Any = await self._timed(self._redis.xrevrange(self._stream_key, count=1))
            self._stream_from = newest[0][0] if newest else "0-0"
        window = self._config.session_length_window
        for ticket_id, action in list(self._mirror.deferred.items()):
            if action == "release":
                await self._run("release", ticket_id, window)
            else:  # abort a create whose outcome is unknown: cancel it, or close it wherever it was admitted
                reply = await self._run("request_close", ticket_id, "cancel")
                if reply.code == "requested" and decode_view(decode_fields(reply.result)).replica == self._replica_id:
                    await self._run("release", ticket_id, window)
            self._mirror.deferred.pop(ticket_id, None)
        args: list[str | int] = [self._ttl_ms, self._epoch or "", secrets.token_hex(8)]
        for view in self._mirror.held_views():  # re-asserted (and re-created if Redis lost its data)
            admitted_ms = round((view.admitted_at if view.admitted_at is not None else view.created_at) * 1000)
            args += [view.ticket_id, view.worker or 0, view.owner, round(view.created_at * 1000), admitted_ms]
            args.append(view.version)
        reply = await self._run("maintain", *args)
        existed, raw_epoch, dead, lost, unknown, next_ms = reply.result
        epoch = decode_text(raw_epoch)
        if self._epoch is not None and epoch != self._epoch:
            logger.warning(
                "redis admission %s: Redis lost its data; re-asserted %d slot(s)",
                self._replica_id,
                (len(args) - 3) // 6,
            )
            self._reader_reset = True
            self._audit_at = self._clock.now() + self._ttl_ms / 1000  # once every live replica re-asserted
        elif self._epoch is not None and not existed:
            logger.warning("redis admission %s: its liveness key had lapsed; re-registered", self._replica_id)
        self._epoch = epoch
        for replica in dead:
            logger.warning(
                "redis admission: replica %s stopped heartbeating; its slots were reclaimed", decode_text(replica)
            )
        for flat in lost:
            self._mirror.apply_lost(decode_view(decode_fields(flat)))
        for flat in unknown:
            self._mirror.apply_unknown(decode_view(decode_fields(flat)))
        if self._audit_at is not None and self._clock.now() >= self._audit_at:
            self._audit_at = None
            queued = self._mirror.queued_here()
            replies = await self._run_pipelined("get", [(ticket_id,) for ticket_id in queued]) if queued else []
            for ticket_id, answer in zip(queued, replies, strict=True):
                if answer.code == "unknown":
                    self._mirror.apply_vanished(ticket_id, time.time())
        if recovering:
            if self._registered_once:
                self._reconnections += 1
            self._registered_once = True
            self._available = True
            self._unavailable_since = None
            self._up.set()
            self._mirror.positions_stale()
            logger.info("redis admission %s: registered with Redis", self._replica_id)
        delay = self._interval if self._audit_at is None else min(self._interval, self._ttl_ms / 1000)
        if int(next_ms) >= 0:
            delay = min(delay, int(next_ms) / 1000 + 0.002)
        return delay

    async def _maintain_forever(self) -> None:
        backoff = self._backoff[0]
        while True:
            _stop_if_cancelled()
            self._kick.clear()
            try:
                delay = await self._maintain_once()
                backoff = self._backoff[0]
            except _UNAVAILABLE as exc:
                self._lost_contact(exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self._backoff[1])
                continue
            except ResponseError:
                logger.exception("redis admission %s: the maintenance script failed", self._replica_id)
                delay = self._interval
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._kick.wait()

    async def _read_events_forever(self) -> None:
        """Read the event stream from where it stood when this replica first reached Redis; resume after outages
        (from the start of a new stream when Redis lost its data)."""
        last: Any = None
        while True:
            _stop_if_cancelled()
            await self._up.wait()
            if self._reader_reset:
                last, self._reader_reset = "0-0", False
            elif last is None:
                last = self._stream_from  # read before the registration that set `_up`
            try:
                read = self._redis.xread({self._stream_key: last}, count=512, block=self._block_ms)
                reply: Any = await self._timed(read, self._block_ms / 1000)
            except _UNAVAILABLE as exc:
                self._lost_contact(exc)
                continue
            except ResponseError:  # e.g. the stream key was overwritten: a bug or an operator; keep trying
                logger.exception("redis admission %s: reading the event stream failed", self._replica_id)
                await asyncio.sleep(self._interval)
                continue
            for _stream, entries in reply or ():
                for entry_id, raw in entries:
                    last = entry_id
                    fields = {decode_text(key): bytes(value) for key, value in raw.items()}
                    try:
                        if fields.get("k") == b"close":
                            self._mirror.apply_close(fields)
                        elif fields.get("k") == b"pause":
                            self._mirror.apply_pause(fields)
                        else:
                            self._mirror.apply(fields)
                    except Exception:
                        logger.exception("redis admission: bad event %r", fields)

    async def _follow_positions_forever(self) -> None:
        """Read the positions the mirror asks for (those behind a departure, new ones) in one script call each
        time, coalescing every change that arrives meanwhile."""
        while True:
            _stop_if_cancelled()
            await self._positions_dirty.wait()
            self._positions_dirty.clear()
            if not self._available:
                continue  # the recovery marks every position stale again
            request = self._mirror.positions_request()
            if request is None:
                continue
            whole, ranked = request
            try:
                reply = await self._run("positions", len(whole), *whole, *ranked)
            except _UNAVAILABLE as exc:
                self._lost_contact(exc)
                continue
            except ResponseError:
                logger.exception("redis admission %s: reading queue positions failed", self._replica_id)
                continue
            records, flat = reply.result
            views = []
            for record in records:
                fields = decode_fields(record)
                views.append((decode_view(fields), int(fields["seq"]) if fields.get("seq") else None))
            ranks = [(decode_text(flat[i]), int(flat[i + 1])) for i in range(0, len(flat) - 1, 2)]
            self._mirror.apply_positions([*whole, *ranked], views, ranks)


def _bounds(quota: KeyQuota) -> tuple[int, int]:
    """A quota as the create script takes it: max_running, max_queued, -1 for no bound."""
    return (
        -1 if quota.max_running is None else quota.max_running,
        -1 if quota.max_queued is None else quota.max_queued,
    )


def _stop_if_cancelled() -> None:
    """Re-raise a cancellation that a library swallowed (asyncio.wait_for on Python 3.11 can), so that a
    background loop still ends when its owner cancels it."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError
