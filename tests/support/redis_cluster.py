"""Replicas (RedisAdmission instances) in one process against one real redis-server, and the whole slot accounting
read back from Redis in one atomic script and checked: the harness of the Redis admission tests (test_redis_*.py).
The `cluster` fixture (conftest.py) builds a `Cluster` on the test's own redis-server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from redis.asyncio import Redis

from admission import (
    AdmissionConfig,
)
from service.scaleout.admission import (
    CloseRequest,
    RedisAdmission,
    SharedAdmissionEvent,
    SharedEventKind,
    SharedTicketView,
)
from tests.support.fakes.redis_server import RedisServer

PREFIX = "test:adm:"
TTL = 1.0
INTERVAL = 0.2


class EventLog:
    """A listener that records every event and lets a test await one."""

    def __init__(self) -> None:
        self.events: list[SharedAdmissionEvent] = []
        self._waiters: list[tuple[Callable[[SharedAdmissionEvent], bool], asyncio.Future[SharedAdmissionEvent]]] = []

    def __call__(self, event: SharedAdmissionEvent) -> None:
        self.events.append(event)
        for predicate, future in list(self._waiters):
            if not future.done() and predicate(event):
                future.set_result(event)

    async def wait_for(
        self, kind: SharedEventKind, ticket_id: str, within: float = 5.0, **fields: Any
    ) -> SharedAdmissionEvent:
        def matches(event: SharedAdmissionEvent) -> bool:
            return (
                event.kind is kind
                and event.ticket.ticket_id == ticket_id
                and all(getattr(event.ticket, name) == value for name, value in fields.items())
            )

        for event in self.events:
            if matches(event):
                return event
        future: asyncio.Future[SharedAdmissionEvent] = asyncio.get_running_loop().create_future()
        self._waiters.append((matches, future))
        try:
            async with asyncio.timeout(within):
                return await future
        finally:
            self._waiters.remove((matches, future))

    def of(self, kind: SharedEventKind) -> list[SharedTicketView]:
        return [event.ticket for event in self.events if event.kind is kind]


class CloseLog:
    """A close-request hook that records every request and lets a test await the next one."""

    def __init__(self) -> None:
        self.requests: list[CloseRequest] = []
        self._arrived = asyncio.Queue[CloseRequest]()

    def __call__(self, request: CloseRequest) -> None:
        self.requests.append(request)
        self._arrived.put_nowait(request)

    async def next(self, within: float = 5.0) -> CloseRequest:
        async with asyncio.timeout(within):
            return await self._arrived.get()


@dataclass
class Cluster:
    """Replicas sharing one Redis, each with its own client, event log and close requests."""

    server: RedisServer
    raw: Redis
    config: AdmissionConfig
    replicas: dict[str, RedisAdmission] = field(default_factory=dict)
    logs: dict[str, EventLog] = field(default_factory=dict)
    closes: dict[str, CloseLog] = field(default_factory=dict)

    async def add(
        self, name: str, *, start: bool = True, connect_timeout_s: float | None = None, **options: Any
    ) -> RedisAdmission:
        """A replica named `name` with its own client, made by `RedisAdmission` from the URL as the service's is (a 2 s
        connect timeout, unless `connect_timeout_s` says otherwise: a test that opens a storm of connections from one
        loaded event loop)."""
        config = options.pop("config", self.config)
        settings: dict[str, Any] = {
            "prefix": PREFIX,
            "replica_ttl_s": TTL,
            "heartbeat_interval_s": INTERVAL,
            "backoff_s": (0.02, 0.2),
        }
        settings.update(options)
        if connect_timeout_s is not None:
            settings["connect_timeout_s"] = connect_timeout_s
        replica = RedisAdmission(self.server.url, name, config, **settings)
        self.replicas[name] = replica
        self.logs[name] = EventLog()
        self.closes[name] = CloseLog()
        replica.subscribe(self.logs[name])
        replica.on_close_requested(self.closes[name])
        if start:
            await replica.start()
        return replica

    async def check(self) -> Snapshot:
        snapshot = await read_snapshot(self.raw)
        snapshot.check(
            {name: (r.config.num_workers, r.config.max_sessions_per_worker) for name, r in self.replicas.items()},
            heartbeats=self.config.queue_heartbeat_timeout is not None,
        )
        return snapshot


_SNAPSHOT = """
local P = ARGV[1]
local tickets, held = {}, {}
for _, key in ipairs(redis.call('KEYS', P .. 't:*')) do
  tickets[#tickets + 1] = {redis.call('HGETALL', key), redis.call('PTTL', key)}
end
for _, key in ipairs(redis.call('KEYS', P .. 'held:*')) do held[#held + 1] = {key, redis.call('HGETALL', key)} end
local owners = {}
for _, kind in ipairs({'kq', 'kr'}) do
  for _, key in ipairs(redis.call('KEYS', P .. kind .. ':*')) do
    owners[#owners + 1] = {key, redis.call('SMEMBERS', key)}
  end
end
local function zset(name) return redis.call('ZRANGE', P .. name, 0, -1) end
return {tickets, held, zset('queue'), zset('qdl'), zset('hbdl'), zset('live'), redis.call('HKEYS', P .. 'replicas'),
  owners, zset('orphans')}
"""


def _text(raw: Any) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _pairs(flat: list[Any]) -> dict[str, str]:
    return {_text(flat[i]): _text(flat[i + 1]) for i in range(0, len(flat), 2)}


@dataclass
class Snapshot:
    """Everything admission keeps in Redis, read in one atomic script."""

    tickets: dict[str, dict[str, str]]
    ttls: dict[str, int]
    held: dict[str, dict[str, int]]
    queue: list[str]
    qdl: list[str]
    hbdl: list[str]
    live: list[str]
    replicas: list[str]
    owner_sets: dict[str, set[str]] = field(default_factory=dict)  # "kq:<owner>" / "kr:<owner>" -> ticket ids
    orphans: list[str] = field(default_factory=list)  # admitted sessions waiting for an adopter (issue #33)

    def state(self, ticket_id: str) -> str:
        return self.tickets[ticket_id]["state"]

    def ids(self, state: str) -> set[str]:
        return {tid for tid, fields in self.tickets.items() if fields["state"] == state}

    def check(self, shapes: dict[str, tuple[int, int]], *, heartbeats: bool) -> None:
        admitted = self.ids("admitted")
        queued = self.ids("queued")
        for replica, slots in self.held.items():
            workers, per_worker = shapes[replica]
            counts = [0] * workers
            for tid, worker in slots.items():
                fields = self.tickets[tid]
                assert (fields["state"], fields["replica"], int(fields["worker"])) == ("admitted", replica, worker), tid
                counts[worker] += 1
            assert all(count <= per_worker for count in counts), (replica, counts)
        assert set(self.orphans) <= admitted, "an orphan that is not admitted"
        for tid in admitted:
            fields = self.tickets[tid]
            if tid in self.orphans:  # waiting for an adopter: in no replica's slots
                assert all(tid not in slots for slots in self.held.values()), f"orphan {tid} holds a slot"
                continue
            assert self.held.get(fields["replica"], {}).get(tid) == int(fields["worker"]), f"{tid} holds no slot"
        assert set(self.queue) == queued
        assert set(self.qdl) == queued
        assert set(self.hbdl) == (queued if heartbeats else set())
        assert [int(self.tickets[tid]["seq"]) for tid in self.queue] == sorted(
            int(self.tickets[tid]["seq"]) for tid in self.queue
        )
        assert set(self.live) == queued | admitted
        expected: dict[str, set[str]] = {}
        for tid in queued | admitted:
            kind = "kq" if tid in queued else "kr"
            expected.setdefault(f"{kind}:{self.tickets[tid]['owner']}", set()).add(tid)
        assert {name: ids for name, ids in self.owner_sets.items() if ids} == expected, "owner quota sets drifted"
        for tid, fields in self.tickets.items():
            finished = fields["state"] not in ("queued", "admitted")
            assert (self.ttls[tid] > 0) == finished, f"{tid} ({fields['state']}) has TTL {self.ttls[tid]}"
            # a pause (issue #33) is an admitted session's only: it never outlives the session, nor precedes it
            assert "paused" not in fields or fields["state"] == "admitted", f"{tid} ({fields['state']}) is paused"
        assert len(admitted) <= sum(workers * per for workers, per in shapes.values())


async def read_snapshot(raw: Redis) -> Snapshot:
    reply: Any = await raw.eval(_SNAPSHOT, 0, PREFIX)
    tickets, held, queue, qdl, hbdl, live, replicas, owners, orphans = reply
    decoded = {}
    ttls = {}
    for flat, ttl in tickets:
        fields = _pairs(flat)
        decoded[fields["id"]] = fields
        ttls[fields["id"]] = int(ttl)
    return Snapshot(
        tickets=decoded,
        ttls=ttls,
        held={
            _text(key)[len(PREFIX) + len("held:") :]: {k: int(v) for k, v in _pairs(flat).items()} for key, flat in held
        },
        queue=[_text(x) for x in queue],
        qdl=[_text(x) for x in qdl],
        hbdl=[_text(x) for x in hbdl],
        live=[_text(x) for x in live],
        replicas=[_text(x) for x in replicas],
        owner_sets={_text(key)[len(PREFIX) :]: {_text(x) for x in members} for key, members in owners},
        orphans=[_text(x) for x in orphans],
    )


@contextlib.asynccontextmanager
async def open_cluster(server: RedisServer, config: AdmissionConfig) -> AsyncIterator[Cluster]:
    """A `Cluster` on `server` with its own Redis client; every replica added to it and the client closed at the end."""
    raw = Redis.from_url(server.url)
    cluster = Cluster(server, raw, config)
    try:
        yield cluster
    finally:
        for replica in cluster.replicas.values():
            await replica.aclose()
        await raw.aclose()
