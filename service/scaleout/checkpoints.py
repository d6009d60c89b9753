"""`RedisCheckpointStore`: session checkpoints in Redis, where another replica can read them (issue #33, the slice
after re-seed on worker loss; docs/continuity.md).

Keys (`P` is the prefix, default `lingstream:checkpoints:`):

    P h:<session id>   string  the checkpoint without its image (`SessionCheckpoint.header_bytes`, JSON, about 600 B),
                               written at every chunk boundary
    P i:<session id>   string  the reference image as float32 (`image_data`), written once per session

Both expire `ttl_s` after the last write (`SET ... PX`, and `PEXPIRE` of the image with each header), so a session
whose replica died leaves its checkpoint readable for that long and then nothing; `delete` drops both at the
session's end. One MULTI per write: a reader sees a header and the image of the same session, or neither. Which
sessions' images this store already wrote is remembered in the process (a replica writes its own sessions only).

Not wired into the runtime yet: adoption on replica loss (the next slice) is its reader. Errors reach the caller as
`CheckpointStoreError`; a checkpoint that cannot be read back (another version, a header without its image) reads
as None, logged.
"""

from __future__ import annotations

import logging

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from pipeline.lingbot.continuity import SessionCheckpoint
from pipeline.lingbot.errors import CheckpointVersionError

__all__ = ["DEFAULT_CHECKPOINTS_PREFIX", "CheckpointStoreError", "RedisCheckpointStore"]

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

    async def put(self, checkpoint: SessionCheckpoint) -> None:
        """Write the checkpoint (its image only the first time for the session); both keys live `ttl_s` more."""
        sid = checkpoint.session_id
        header_key, image_key = self._keys(sid)
        image = None if sid in self._with_image else checkpoint.image_data()
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.set(header_key, checkpoint.header_bytes(), px=self._ttl_ms)
                if image is not None:
                    pipe.set(image_key, image, px=self._ttl_ms)
                else:
                    pipe.pexpire(image_key, self._ttl_ms)
                await pipe.execute()
        except RedisError as exc:
            raise CheckpointStoreError(f"checkpoint of session {sid!r} not written: {exc}") from exc
        if image is not None:
            self._with_image.add(sid)

    async def get(self, session_id: str) -> SessionCheckpoint | None:
        """The session's newest checkpoint; None when there is none (never written, expired, deleted) or it cannot
        be read back."""
        try:
            header, image = await self._redis.mget(self._keys(session_id))
        except RedisError as exc:
            raise CheckpointStoreError(f"checkpoint of session {session_id!r} not read: {exc}") from exc
        if not isinstance(header, bytes) or not isinstance(image, bytes | None):
            return None  # none written (a client that decodes answers would hand str: this store's own never does)
        try:
            return SessionCheckpoint.from_parts(header, image)
        except CheckpointVersionError as exc:
            logger.warning("session %s: its checkpoint cannot be read back: %s", session_id, exc)
            return None

    async def delete(self, session_id: str) -> None:
        """Drop the session's checkpoint (at its end); an unknown id is a no-op."""
        self._with_image.discard(session_id)
        try:
            await self._redis.delete(*self._keys(session_id))
        except RedisError as exc:
            raise CheckpointStoreError(f"checkpoint of session {session_id!r} not deleted: {exc}") from exc

    async def aclose(self) -> None:
        if self._owns:
            await self._redis.aclose()

    def _keys(self, session_id: str) -> tuple[str, str]:
        return f"{self._prefix}h:{session_id}", f"{self._prefix}i:{session_id}"
