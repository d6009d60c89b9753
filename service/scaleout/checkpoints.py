"""Session checkpoints in Redis, where another replica can read them (issue #33; docs/continuity.md):
`RedisCheckpointStore`, the keys, and `CheckpointWriter`, how the owning replica writes them at chunk boundaries.

Keys (`P` is the prefix; the Redis admission backend uses its own key prefix followed by `ckpt:`, so one hash tag
keeps them in the admission's Redis Cluster slot and its scripts can see whether a session has a checkpoint):

    P h:<session id>   string  the checkpoint without its image (`header_bytes`, JSON, about 600 B), written at every
                               chunk boundary
    P i:<session id>   string  the reference image as float32 (`image_data`), written once per session
    P c:<session id>   hash    a model's history (LingBot-World-Fast: each chunk's clean latent, camera, prompt and
                               generator state, `history_part`), field = chunk index: each chunk written once, when
                               it first appears, and deleted when the checkpoint no longer lists it

All three expire `ttl_s` after the last write (`SET ... PX`, `PEXPIRE` of the image and the history with each
header) or the last `touch` (the owning replica's keep-alive of the sessions it holds, for those that make no
chunk: paused), so a session whose replica died leaves its checkpoint readable for that long and then nothing; `delete`
drops them at the session's end. One MULTI per write: a reader sees a header with the image and the history chunks
it lists, or nothing of that write. Which sessions' images and history chunks this store already wrote is
remembered in the process (a replica writes its own sessions only), so a chunk boundary writes the header and the
one new chunk of history (1.2 MB at 832x480), never the whole ring again.

Errors reach the caller as `CheckpointStoreError`; a checkpoint that cannot be read back (another version, a header
without its image) reads as None, logged. The store takes any `PortableCheckpoint` and loads the LingBot record
(and torch) only to read one back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from pipeline.bidirectional import PortableCheckpoint

if TYPE_CHECKING:
    from pipeline.lingbot.continuity import SessionCheckpoint

__all__ = [
    "DEFAULT_CHECKPOINTS_PREFIX",
    "CheckpointStoreError",
    "CheckpointWriter",
    "CheckpointWriterStatistics",
    "RedisCheckpointStore",
]

logger = logging.getLogger(__name__)

DEFAULT_CHECKPOINTS_PREFIX = "lingstream:checkpoints:"


class CheckpointStoreError(Exception):
    """The checkpoint store could not be read or written (Redis unreachable)."""


class RedisCheckpointStore:
    """Checkpoints in Redis with a TTL (module docstring): `redis` is a URL (the store owns its client) or a client
    (the caller owns it)."""

    def __init__(self, redis: Redis | str, *, ttl_s: float, prefix: str = DEFAULT_CHECKPOINTS_PREFIX) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self._owns = isinstance(redis, str)
        self._redis: Redis = (
            Redis.from_url(redis, socket_connect_timeout=2.0, retry=Retry(NoBackoff(), 0))
            if isinstance(redis, str)
            else redis
        )
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._prefix = prefix
        self._with_image: set[str] = set()
        self._written: set[str] = set()  # the sessions whose checkpoint this store wrote and did not delete
        self._history: dict[str, frozenset[int]] = {}  # the history chunks written per session

    @property
    def prefix(self) -> str:
        return self._prefix

    async def put(self, checkpoint: PortableCheckpoint) -> int:
        """Write the checkpoint (its image only the first time for the session); both keys live `ttl_s` more.
        Returns the bytes written."""
        sid = checkpoint.session_id
        header_key, image_key = self._keys(sid)
        history_key = self._history_key(sid)
        image = None if sid in self._with_image else checkpoint.image_data()
        header = checkpoint.header_bytes()
        indices = frozenset(checkpoint.history_indices())
        written = self._history.get(sid, frozenset())
        new = {str(index): checkpoint.history_part(index) for index in sorted(indices - written)}
        gone = [str(index) for index in sorted(written - indices)]
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(header_key, header, px=self._ttl_ms)
                if image is not None:
                    pipe.set(image_key, image, px=self._ttl_ms)
                else:
                    pipe.pexpire(image_key, self._ttl_ms)
                if gone:
                    pipe.hdel(history_key, *gone)
                if new:
                    pipe.hset(history_key, mapping=new)  # type: ignore[arg-type]
                pipe.pexpire(history_key, self._ttl_ms)
                await pipe.execute()
        except RedisError as exc:
            raise CheckpointStoreError(f"checkpoint of session {sid!r} not written: {exc}") from exc
        if image is not None:
            self._with_image.add(sid)
        self._written.add(sid)
        self._history[sid] = indices
        return len(header) + (len(image) if image is not None else 0) + sum(len(part) for part in new.values())

    async def get(self, session_id: str) -> SessionCheckpoint | None:
        """The session's newest checkpoint; None when there is none (never written, expired, deleted) or it cannot
        be read back."""
        from pipeline.lingbot.continuity import SessionCheckpoint  # here: torch loads only in a reader
        from pipeline.lingbot.errors import CheckpointVersionError

        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.mget(self._keys(session_id))
                pipe.hgetall(self._history_key(session_id))
                (header, image), stored = await pipe.execute()
        except RedisError as exc:
            raise CheckpointStoreError(f"checkpoint of session {session_id!r} not read: {exc}") from exc
        if not isinstance(header, bytes) or not isinstance(image, bytes | None):
            return None  # none written (a client that decodes answers would hand str: this store's own never does)
        try:
            history = {int(index): part for index, part in stored.items()}
            return SessionCheckpoint.from_parts(header, image, history)
        except CheckpointVersionError as exc:
            logger.warning("session %s: its checkpoint cannot be read back: %s", session_id, exc)
            return None

    async def touch(self, session_ids: Iterable[str]) -> None:
        """Let the checkpoints this store wrote of `session_ids` live `ttl_s` more (one pipeline, no data moved): a
        session that makes no chunk (paused) writes no checkpoint, and its keys must not lapse while its replica
        still holds it, or a hand-off or an adoption would find none (`no_checkpoint`). Keys already gone stay gone
        (`PEXPIRE` of a missing key is a no-op), so a touch never brings back a deleted checkpoint."""
        ids = [sid for sid in session_ids if sid in self._written]
        if not ids:
            return
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for sid in ids:
                    for key in (*self._keys(sid), self._history_key(sid)):
                        pipe.pexpire(key, self._ttl_ms)
                await pipe.execute()
        except RedisError as exc:
            raise CheckpointStoreError(f"checkpoints of {len(ids)} session(s) not kept alive: {exc}") from exc

    async def delete(self, session_id: str) -> None:
        """Drop the session's checkpoint (at its end); an unknown id is a no-op."""
        self._with_image.discard(session_id)
        self._written.discard(session_id)
        self._history.pop(session_id, None)
        try:
            await self._redis.delete(*self._keys(session_id), self._history_key(session_id))
        except RedisError as exc:
            raise CheckpointStoreError(f"checkpoint of session {session_id!r} not deleted: {exc}") from exc

    async def aclose(self) -> None:
        if self._owns:
            await self._redis.aclose()

    def _keys(self, session_id: str) -> tuple[str, str]:
        return f"{self._prefix}h:{session_id}", f"{self._prefix}i:{session_id}"

    def _history_key(self, session_id: str) -> str:
        return f"{self._prefix}c:{session_id}"


@dataclass(frozen=True, slots=True)
class CheckpointWriterStatistics:
    """What a `CheckpointWriter` did: `writes` checkpoints written (`bytes_written` in all, header and the images
    written once), `write_seconds` spent in those writes (each one MULTI, from the call to its reply), `deletes`
    done, `failures` calls that failed (what they carried was kept and retried, unless something newer replaced it),
    `pending` sessions waiting for their next write or delete, `coalesced` checkpoints replaced by a newer one before
    they were written."""

    writes: int
    bytes_written: int
    write_seconds: float
    deletes: int
    failures: int
    pending: int
    coalesced: int


class CheckpointWriter:
    """Writes the checkpoints a replica offers at its sessions' chunk boundaries into a `RedisCheckpointStore`, in
    the background, at a bounded rate (docs/continuity.md).

    Problem: every running session reaches a chunk boundary every chunk period (750 ms at the defaults), and the
    chunk loop must never wait for Redis. `offer` and `discard` only note the newest wish per session (a checkpoint
    to write, or the session's end: delete its keys) and never wait; `run` does the writing::

        writer = CheckpointWriter(store)
        tasks.spawn(writer.run())
        writer.offer(checkpoint)       # at each chunk boundary
        writer.discard(session_id)     # after the session's release

    Ordering: one round at a time; a round takes every pending wish and carries each out with its own call (one
    MULTI a session), so there is at most one write in flight per session, and a session's wishes reach Redis in the
    order they were made (a delete after a write is never overtaken by it). Backpressure: newest wins; a checkpoint
    offered while an older one of the same session waits replaces it (`coalesced`), so at most one wish per session
    is ever kept and a slow Redis costs freshness, not memory. Rate: rounds start at least `min_interval_s` apart,
    so no session is written more often than that. `on_written(session_id)` is told after each write that succeeded.
    Failures: a wish whose call failed (Redis unreachable) is kept
    unless a newer one replaced it meanwhile, and the next round waits `retry_s`; the TTL bounds what a delete that
    never got through leaves behind. Cancellation: cancelling `run` drops the round in flight and what is pending;
    Redis keeps what was written, until its TTL.
    """

    def __init__(
        self,
        store: RedisCheckpointStore,
        *,
        min_interval_s: float = 0.25,
        retry_s: float = 1.0,
        timer: Callable[[], float] = time.perf_counter,
        on_written: Callable[[str], None] | None = None,
    ) -> None:
        if min_interval_s < 0 or retry_s <= 0:
            raise ValueError(f"need min_interval_s >= 0 and retry_s > 0, got {min_interval_s} and {retry_s}")
        self._store = store
        self._min_interval = min_interval_s
        self._retry = retry_s
        self._timer = timer
        self._on_written = on_written
        self._pending: dict[str, PortableCheckpoint | None] = {}  # None: delete
        self._wake = asyncio.Event()
        self._busy = False
        self._in_flight: frozenset[str] = frozenset()  # the sessions of the round in flight
        self._round_done = asyncio.Event()
        self._writes = 0
        self._bytes = 0
        self._seconds = 0.0
        self._deletes = 0
        self._failures = 0
        self._coalesced = 0

    def offer(self, checkpoint: PortableCheckpoint) -> None:
        """Write `checkpoint` with the next round (replacing an older one of its session not yet written)."""
        sid = checkpoint.session_id
        if sid in self._pending:
            if self._pending[sid] is None:
                return  # the session ended: a late checkpoint must not bring its keys back
            self._coalesced += 1
        self._pending[sid] = checkpoint
        self._wake.set()

    def discard(self, session_id: str) -> None:
        """The session ended here: delete its checkpoint with the next round (instead of any write still waiting)."""
        self._pending[session_id] = None
        self._wake.set()

    async def written(self, session_id: str) -> None:
        """Wait until nothing is pending for the session and no round carrying its wish is in flight: its newest
        checkpoint is in Redis (or its keys deleted). `run` must be running; bound it with a timeout (through an
        outage it waits for Redis)."""
        while session_id in self._pending or session_id in self._in_flight:
            await self._round_done.wait()

    async def flushed(self) -> None:
        """Wait until nothing is pending and no round is in flight (`run` must be running; bound it with a
        timeout: through an outage it waits for Redis)."""
        while self._pending or self._busy:
            await self._round_done.wait()

    def statistics(self) -> CheckpointWriterStatistics:
        return CheckpointWriterStatistics(
            self._writes,
            self._bytes,
            self._seconds,
            self._deletes,
            self._failures,
            len(self._pending),
            self._coalesced,
        )

    async def run(self) -> None:
        """The rounds, until cancelled (class docstring)."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            round_, self._pending = self._pending, {}
            self._busy = True
            self._in_flight = frozenset(round_)
            try:
                failed = await self._round(round_)
            finally:
                self._busy = False
                self._in_flight = frozenset()
                done, self._round_done = self._round_done, asyncio.Event()
                done.set()
            await asyncio.sleep(self._retry if failed else self._min_interval)  # the next round starts no sooner
            if self._pending:
                self._wake.set()

    async def _round(self, round_: dict[str, PortableCheckpoint | None]) -> bool:
        results = await asyncio.gather(*(self._carry_out(sid, wish) for sid, wish in round_.items()))
        failed = False
        for (sid, wish), ok in zip(round_.items(), results, strict=True):
            if not ok:
                failed = True
                self._pending.setdefault(sid, wish)  # kept, unless something newer came meanwhile
        return failed

    async def _carry_out(self, session_id: str, wish: PortableCheckpoint | None) -> bool:
        try:
            if wish is None:
                await self._store.delete(session_id)
                self._deletes += 1
                return True
            started = self._timer()
            written = await self._store.put(wish)
            self._seconds += self._timer() - started
            self._writes += 1
            self._bytes += written
            if self._on_written is not None:
                self._on_written(session_id)
        except CheckpointStoreError as exc:
            self._failures += 1
            logger.debug("session %s: checkpoint not written (kept for the next round): %s", session_id, exc)
            return False
        return True
