"""`RecordingObjects`: finished recordings in an S3-compatible object store — upload, retention, presigned URLs.

With `LINGSTREAM_RECORDINGS_S3_*` set, a recording finalised on disk (`service.runtime.recordings`) is uploaded:
the control trace first, the MP4 last (as on disk, the MP4 is what makes a recording complete), under

    <prefix><UTC time of the upload, %Y%m%dT%H%M%S%fZ>-<session id>.mp4           video/mp4
    <prefix><the same stem>.controls.jsonl                                          application/x-ndjson

so that the keys sort oldest first. The local files are then removed by the store. A failed upload removes what it
put (best effort) and raises `ObjectStoreError`; the store fails the recording with `recording_failed`.

Retention mirrors the local one on the whole prefix, shared by every replica that uses it: after each upload (and
at start) the prefix is listed and the oldest recordings are deleted until at most `max_count` remain and they take
at most `max_bytes` (MP4 and trace). Only keys of the form above are counted or deleted (anything else under the
prefix is left alone); a trace without its MP4 (an upload that died between the two) is deleted once an hour old.
Deletes race harmlessly between replicas (deleting a missing key succeeds).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from service.storage.s3 import ObjectStoreError, S3Client

__all__ = ["RecordingObjectStatistics", "RecordingObjects", "RetentionPass"]

logger = logging.getLogger(__name__)

_VIDEO = ".mp4"
_TRACE = ".controls.jsonl"
_KEY = re.compile(r"^(?P<stem>\d{8}T\d{12}Z-(?P<id>[^/]+?))(?P<kind>\.mp4|\.controls\.jsonl)$")
_ORPHAN_AGE_S = 3600.0


@dataclass(frozen=True, slots=True)
class RecordingObjectStatistics:
    """Uploads completed and failed, bytes and seconds spent uploading, recordings deleted by retention."""

    uploads_total: int
    upload_failures_total: int
    uploaded_bytes_total: int
    upload_seconds_total: float
    removed_total: int


@dataclass(frozen=True, slots=True)
class RetentionPass:
    """What one retention pass did: the sessions whose recordings it deleted, and what it kept."""

    removed: tuple[str, ...]
    kept: int
    kept_bytes: int


@dataclass(slots=True)
class _Group:
    session_id: str
    keys: list[str]
    size: int = 0
    video: bool = False
    modified: float = 0.0


class RecordingObjects:
    """The recordings in `client`'s bucket under its prefix (see the module docstring). `clock` (Unix seconds) names
    the uploads and ages the orphans; `monotonic` times the uploads."""

    def __init__(
        self,
        client: S3Client,
        *,
        max_count: int,
        max_bytes: int,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._clock = clock
        self._monotonic = monotonic
        self._prefix = client.config.prefix
        self._lock = asyncio.Lock()
        self._uploads = 0
        self._failures = 0
        self._bytes = 0
        self._seconds = 0.0
        self._removed = 0

    def _stem(self, session_id: str) -> str:
        stamp = datetime.fromtimestamp(self._clock(), UTC).strftime("%Y%m%dT%H%M%S%fZ")
        return f"{self._prefix}{stamp}-{session_id}"

    async def upload(self, session_id: str, video: Path, trace: Path) -> tuple[str, str]:
        """Upload a finished recording's MP4 and trace; returns their keys. Raises `ObjectStoreError` (what was put
        is deleted again, best effort)."""
        stem = self._stem(session_id)
        video_key, trace_key = f"{stem}{_VIDEO}", f"{stem}{_TRACE}"
        started = self._monotonic()
        put: list[str] = []
        try:
            sent = await self.client.put_file(trace_key, trace, "application/x-ndjson")
            put.append(trace_key)
            sent += await self.client.put_file(video_key, video, "video/mp4")
        except ObjectStoreError:
            self._failures += 1
            for key in put:
                try:
                    await self.client.delete(key)
                except ObjectStoreError as exc:
                    logger.warning("recording of session %s: could not delete %s again: %s", session_id, key, exc)
            raise
        self._uploads += 1
        self._bytes += sent
        elapsed = self._monotonic() - started
        self._seconds += elapsed
        logger.info("recording of session %s uploaded (%d bytes in %.2f s): %s", session_id, sent, elapsed, video_key)
        return video_key, trace_key

    def url(self, key: str, filename: str, content_type: str) -> str:
        """A presigned GET of `key` (the store's URL TTL), downloaded as `filename`."""
        return self.client.presign_get(key, filename=filename, content_type=content_type)

    async def retain(self) -> RetentionPass:
        """One retention pass over the prefix (see the module docstring). Raises `ObjectStoreError`."""
        async with self._lock:
            objects = await self.client.list(self._prefix)
            groups: dict[str, _Group] = {}
            for item in objects:
                match = _KEY.match(item.key[len(self._prefix) :])
                if match is None:
                    continue
                group = groups.setdefault(match["stem"], _Group(match["id"], []))
                group.keys.append(item.key)
                group.size += item.size
                group.modified = max(group.modified, item.modified)
                group.video = group.video or match["kind"] == _VIDEO
            now = self._clock()
            doomed: list[_Group] = [
                group for group in groups.values() if not group.video and now - group.modified > _ORPHAN_AGE_S
            ]
            kept = sorted(((stem, group) for stem, group in groups.items() if group.video), key=lambda item: item[0])
            total = sum(group.size for _, group in kept)
            while kept and (len(kept) > self.max_count or total > self.max_bytes):
                _, group = kept.pop(0)
                total -= group.size
                doomed.append(group)
            removed: list[str] = []
            for group in doomed:
                for key in sorted(group.keys, key=lambda key: not key.endswith(_VIDEO)):  # the MP4 first
                    await self.client.delete(key)
                if group.video:
                    removed.append(group.session_id)
                    self._removed += 1
                    logger.info("recording of session %s deleted from the bucket (retention)", group.session_id)
            return RetentionPass(tuple(removed), len(kept), total)

    def statistics(self) -> RecordingObjectStatistics:
        return RecordingObjectStatistics(self._uploads, self._failures, self._bytes, self._seconds, self._removed)

    async def aclose(self) -> None:
        await self.client.aclose()
