"""Recordings: what a session created with `"record": true` generated, kept as an MP4 and a replayable control trace.

`RecordingStore` owns `LINGSTREAM_RECORDINGS_DIR`. For each recorded session it starts a `SessionRecording` when
the session starts, which writes exactly the frames the session generated, at the session's fps, as H.264 in MP4
through the writer `lingstream generate` uses (`service.offline.mp4.Mp4Writer`), and keeps, chunk by chunk, what
the chunk was generated from: the keys held, a pose reset, the prompt. When the session ends the recording is
finalised: the encoder is flushed, the control trace is written next to the MP4 in the trace format `lingstream
generate --controls` reads (`<id>.controls.jsonl`), and both are renamed from their temporary names (`.<id>...part`)
to their final ones, the MP4 last. Only a complete MP4 ever has its final name, so nothing half-written is served.

Recording never slows the stream. The session's output reader hands each chunk to `SessionRecording.offer`, which
never waits: the chunk goes into a queue bounded in bytes of frames (`queue_bytes`; one chunk is always taken), and
one task per recording feeds the writer, which encodes on its own thread (it is opened, PyAV and the encoder
loaded, as the recording starts, not when the first chunk arrives). A recording that falls behind by more than the
queue is dropped (the stream goes on, never the other way round): reason `recording_overrun`. A write error (disk
full, a file size limit, any encoder failure) stops the recording too: reason `recording_failed`. Either way the
partial files are removed and the session's client gets an `error` status message with that code; the session
itself goes on.

Object storage (optional, `LINGSTREAM_RECORDINGS_S3_*`): a recording finalised on disk is then uploaded
(`service.runtime.recording_objects.RecordingObjects`, state UPLOADING) and, once in the bucket, its local files are
removed; a refused or failed upload stops it with `recording_failed` (the files are removed; the session, already
ended, is not affected). The recordings catalog (`service.runtime.recording_catalog`) is told every change of every
recording (its owner, state, code, objects), in order, by the recording's own task; that is what any replica answers
GET and the list from. A catalog that cannot be written is logged, never fails a recording. `on_outcome` hears the
final entry of each recording (ready or failed: the `recording.ready|failed` webhooks).

Retention: after each recording is finalised (and at start), finished recordings beyond `max_count`, or beyond
`max_bytes` in total (MP4 plus trace), are removed, oldest first; leftovers of a crash (`.part` files) are removed
at start. The store remembers the outcome of the sessions it recorded (bounded) to answer `GET .../recording`.

Cancellation: `aclose()` finishes every recording still running (bounded by `close_timeout_s`; one not done by
then is abandoned and its partial files removed) and awaits every task.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

from pipeline.bidirectional import ChunkOutput
from service.runtime.recording_catalog import MemoryRecordingCatalog, RecordingCatalog, RecordingEntry, RecordingState
from service.runtime.recording_objects import RecordingObjects
from service.runtime.tasks import TaskSet

__all__ = [
    "RECORDING_FAILED",
    "RECORDING_OVERRUN",
    "FrameWriter",
    "RecordingConfig",
    "RecordingOutcome",
    "RecordingReport",
    "RecordingState",
    "RecordingStatistics",
    "RecordingStore",
    "SessionRecording",
    "WriterFactory",
    "mp4_writer",
    "trace_lines",
]

logger = logging.getLogger(__name__)

RECORDING_FAILED = "recording_failed"
"""Status code: a write error stopped the recording (the session goes on)."""
RECORDING_OVERRUN = "recording_overrun"
"""Status code: the recording fell behind the stream by more than its queue and was dropped (the session goes on)."""

_MP4 = ".mp4"
_TRACE = ".controls.jsonl"
_PART = ".part"
_REMEMBERED = 4096  # outcomes kept for GET (sessions older than the session history answer 404 anyway)
_CATALOG_WRITE_S = 5.0  # how long a recording waits for the catalog to take one change


class FrameWriter(Protocol):
    """Where a recording's frames go (`Mp4Writer`; tests inject failing ones). `write` encodes off the event loop;
    `close` flushes and finishes the file (blocking: called on a worker thread)."""

    @property
    def frames(self) -> int: ...

    async def write(self, frames: npt.NDArray[np.uint8]) -> None: ...

    def close(self) -> None: ...


WriterFactory = Callable[[Path, int, int, int], FrameWriter]
"""`(path, width, height, fps)` → a writer for one recording (blocking: called on a worker thread)."""


def mp4_writer(path: Path, width: int, height: int, fps: int) -> FrameWriter:
    """The writer `lingstream generate` uses: H.264 (yuv420p) in MP4 at a constant frame rate."""
    from service.offline.clip import UsageError  # PyAV and the offline package load only when recording
    from service.offline.mp4 import Mp4Writer, h264_encoder

    try:
        return Mp4Writer(path, width, height, fps, h264_encoder())
    except UsageError as exc:  # its message is worded for generate's --out option
        raise OSError(str(exc).removeprefix("--out: ")) from exc


@dataclass(frozen=True, slots=True)
class RecordingConfig:
    """`directory`: where recordings are kept; `max_bytes`/`max_count`: the retention budget; `queue_bytes`: how many
    bytes of frames a recording may be behind the stream before it is dropped; `close_timeout_s`: how long shutdown
    waits for the recordings still being written."""

    directory: Path
    max_bytes: int
    max_count: int
    queue_bytes: int = 128 * 1024 * 1024
    close_timeout_s: float = 30.0


@dataclass(frozen=True, slots=True)
class RecordingOutcome:
    """What GET answers from: the state, why (for FAILED and REMOVED), and once READY the files on disk, or the
    presigned URLs of its objects (with an object store)."""

    state: RecordingState
    reason: str | None = None
    video: Path | None = None
    trace: Path | None = None
    video_url: str | None = None
    trace_url: str | None = None


@dataclass(frozen=True, slots=True)
class RecordingReport:
    """One recording as the session's REST body shows it: its state, the stable code that stopped it (FAILED:
    `recording_failed` or `recording_overrun`), the frames written and the bytes on disk (while recording, the MP4
    so far; once ready, the MP4 and its trace; a stopped one's bytes were written, then removed)."""

    state: RecordingState
    code: str | None
    frames: int
    bytes: int


@dataclass(frozen=True, slots=True)
class RecordingStatistics:
    """The store's figures (metrics): `recording` now; recordings started, completed (`ready_total`), stopped by a
    write error (`failed_total`) or by falling behind (`overruns_total`), removed by retention; `bytes_total`: bytes
    written to recording files (a stopped recording's included); `kept`/`kept_bytes`: complete ones on disk (with an
    object store: in the bucket's prefix, as of the last retention pass); with an object store, uploads completed
    and failed, the bytes uploaded and the seconds spent uploading."""

    recording: int
    started_total: int
    ready_total: int
    failed_total: int
    overruns_total: int
    removed_total: int
    bytes_total: int
    kept: int
    kept_bytes: int
    uploads_total: int = 0
    upload_failures_total: int = 0
    uploaded_bytes_total: int = 0
    upload_seconds_total: float = 0.0


def trace_lines(chunks: list[tuple[int, frozenset[str], bool, str]], header: str) -> list[str]:
    """The control trace of a recording: `#` comment lines of `header`, then per chunk a `reset_pose` entry when the
    chunk started from the start pose, its `keys`, and its `prompt` whenever it changed (from chunk 0 on when set).
    `chunks` holds `(index, keys, reset_pose, prompt)` in chunk order."""
    lines = [f"# {line}" for line in header.splitlines()]
    prompt = ""
    for index, keys, reset_pose, chunk_prompt in chunks:
        if reset_pose:
            lines.append(json.dumps({"chunk": index, "reset_pose": True}))
        if chunk_prompt != prompt:
            lines.append(json.dumps({"chunk": index, "prompt": chunk_prompt}))
            prompt = chunk_prompt
        lines.append(json.dumps({"chunk": index, "keys": sorted(keys)}))
    return lines


class SessionRecording:
    """One session's recording (made by `RecordingStore.start`). `offer(chunk)` from the session's output reader;
    `finish()` once the session ended. `state` and `outcome()` say where it is."""

    def __init__(
        self,
        store: RecordingStore,
        session_id: str,
        owner: str,
        size: tuple[int, int, int],
        header: str,
        on_stop: Callable[[str, str], None],
        webhook_url: str | None = None,
    ) -> None:
        self._store = store
        self.session_id = session_id
        self.owner = owner
        self.webhook_url = webhook_url
        self.started_at = store.clock()
        self.video_key: str | None = None
        self.trace_key: str | None = None
        self._size = size
        self._header = header
        self._on_stop = on_stop
        self._queue: asyncio.Queue[ChunkOutput | None] = asyncio.Queue()  # bounded by `_queued_bytes`, not length
        self._queued_bytes = 0
        self._chunks: list[tuple[int, frozenset[str], bool, str]] = []
        self._writer: FrameWriter | None = None
        self.state = RecordingState.RECORDING
        self.reason: str | None = None
        self.code: str | None = None
        self.frames = 0
        self.bytes = 0
        self.video = store.config.directory / f"{session_id}{_MP4}"
        self.trace = store.config.directory / f"{session_id}{_TRACE}"
        self._video_part = store.config.directory / f".{session_id}{_MP4}{_PART}"
        self._trace_part = store.config.directory / f".{session_id}{_TRACE}{_PART}"
        self._task: asyncio.Task[None] | None = None

    def start(self, tasks: TaskSet) -> None:
        self._task = tasks.spawn(self._run(), name=f"recording-{self.session_id}")

    def offer(self, chunk: ChunkOutput) -> None:
        """Queue a generated chunk for the recording; never waits. A full queue drops the recording."""
        if self.state is not RecordingState.RECORDING:
            return
        limit = self._store.config.queue_bytes
        if self._queued_bytes and self._queued_bytes + chunk.frames.nbytes > limit:
            behind = self._queue.qsize()
            self._stop(RECORDING_OVERRUN, f"the recording fell {behind} chunks ({self._queued_bytes} bytes) behind")
            return
        self._queued_bytes += chunk.frames.nbytes
        self._queue.put_nowait(chunk)

    def finish(self) -> None:
        """The session ended: write what is queued, then finalise (in the recording's own task)."""
        if self.state is RecordingState.RECORDING:
            self.state = RecordingState.FINISHING
            self._queue.put_nowait(None)

    async def wait(self) -> None:
        """Until the recording is finalised or has failed."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    def report(self) -> RecordingReport:
        return RecordingReport(self.state, self.code, self.frames, self.bytes)

    def outcome(self) -> RecordingOutcome:
        if self.state is RecordingState.READY:
            if self.video_key is not None and self.trace_key is not None:
                return self._store.outcome_of(self.entry())
            return RecordingOutcome(self.state, video=self.video, trace=self.trace)
        return RecordingOutcome(self.state, self.reason)

    def _stop(self, code: str, message: str) -> None:
        """Give up the recording (the session goes on): tell the client, let the task clean up."""
        if self.state in (RecordingState.FAILED, RecordingState.READY, RecordingState.REMOVED):
            return
        self.state = RecordingState.FAILED
        self.code = code
        self.reason = f"{code}: {message}"
        self._store.count_failure(code)
        logger.warning("session %s: recording stopped (%s): %s", self.session_id, code, message)
        try:
            self._on_stop(code, f"the recording stopped; the session goes on: {message}")
        except Exception:
            logger.exception("session %s: reporting the stopped recording failed", self.session_id)
        if self._task is not None and asyncio.current_task() is not self._task:
            self._task.cancel()

    def entry(self) -> RecordingEntry:
        """The recording as the catalog keeps it, now."""
        return RecordingEntry(
            session_id=self.session_id,
            owner=self.owner,
            state=self.state,
            started_at=self.started_at,
            updated_at=self._store.clock(),
            code=self.code,
            reason=self.reason,
            frames=self.frames,
            bytes=self.bytes,
            video_key=self.video_key,
            trace_key=self.trace_key,
            webhook_url=self.webhook_url,
        )

    async def _run(self) -> None:
        try:
            await self._store.publish(self)
            await self._write_all()
            if self.state is RecordingState.FINISHING:
                self._measure(await asyncio.to_thread(self._finalise))
                objects = self._store.objects
                if objects is not None:
                    self.state = RecordingState.UPLOADING
                    await self._store.publish(self)
                    self.video_key, self.trace_key = await objects.upload(self.session_id, self.video, self.trace)
                    await asyncio.to_thread(self._remove_local)
                self.state = RecordingState.READY
                where = self.video_key or self.video
                logger.info("session %s: recording ready (%d frames): %s", self.session_id, self.frames, where)
                await self._store.publish(self, final=True)
                await self._store.finished(self)
        except asyncio.CancelledError:
            if self.state is not RecordingState.FAILED:
                self._stop(RECORDING_FAILED, "the service stopped before the recording was complete")
        except Exception as exc:
            self._stop(RECORDING_FAILED, f"{type(exc).__name__}: {exc}")
        finally:
            if self.state is not RecordingState.READY:
                await asyncio.shield(asyncio.to_thread(self._discard))
            if self.state is RecordingState.FAILED:
                await asyncio.shield(self._store.publish(self, final=True))

    async def _write_all(self) -> None:
        width, height, fps = self._size
        writer = await asyncio.to_thread(self._store.writer_factory, self._video_part, width, height, fps)
        self._writer = writer
        while True:
            chunk = await self._queue.get()
            if chunk is None:
                return
            self._queued_bytes -= chunk.frames.nbytes
            await writer.write(chunk.frames)
            self.frames += len(chunk.frames)
            self._chunks.append((chunk.index, chunk.keys, chunk.reset_pose, chunk.prompt))
            with contextlib.suppress(OSError):  # a stat: what the encoder has flushed to the file so far
                self._measure(self._video_part.stat().st_size)

    def _measure(self, size: int) -> None:
        """The recording's files hold `size` bytes now; the store counts what was added since the last look."""
        if size > self.bytes:
            self._store.count_bytes(size - self.bytes)
            self.bytes = size

    def _finalise(self) -> int:
        if not self._chunks:
            raise OSError("the session generated no frames to record")
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
        header = f"{self._header}\nchunks: {len(self._chunks)}, frames: {self.frames}"
        text = "\n".join(trace_lines(self._chunks, header)) + "\n"
        with self._trace_part.open("w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(self._trace_part, self.trace)
        os.replace(self._video_part, self.video)  # last: a final MP4 name means a complete recording
        return self.video.stat().st_size + self.trace.stat().st_size

    def _remove_local(self) -> None:
        """The recording is in the object store: its files here go."""
        for path in (self.video, self.trace):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _discard(self) -> None:
        # The names go first (an open file outlives its name), then the writer: closing it may flush a while. The
        # final names too: a recording whose upload failed was complete here.
        for path in (self._video_part, self._trace_part, self.video, self.trace):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        writer, self._writer = self._writer, None
        if writer is not None:
            with contextlib.suppress(Exception):
                writer.close()


class RecordingStore:
    """The recordings directory: starts sessions' recordings, keeps the retention budget, answers what GET needs.

    Example::

        store = RecordingStore(RecordingConfig(Path("/recordings"), max_bytes=10 << 30, max_count=100))
        await store.start()
        recording = store.record(session_id, owner, (416, 240, 16), header, on_stop=publish_error)
        ...  # recording.offer(chunk) for every chunk
        recording.finish()
        store.outcome(session_id)  # RECORDING → FINISHING → READY (or FAILED)
        await store.aclose()
    """

    def __init__(
        self,
        config: RecordingConfig,
        *,
        writer_factory: WriterFactory | None = None,
        objects: RecordingObjects | None = None,
        catalog: RecordingCatalog | None = None,
        on_outcome: Callable[[RecordingEntry], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`objects`: the object store recordings are uploaded to (None: they stay on disk); `catalog`: where every
        replica learns of them (default: in process); `on_outcome`: told each recording's final entry (ready or
        failed); `clock`: wall time (Unix seconds) for the catalog. The store closes `objects` and `catalog`."""
        self.config = config
        self.writer_factory: WriterFactory = writer_factory if writer_factory is not None else mp4_writer
        self.objects = objects
        self.catalog: RecordingCatalog = catalog if catalog is not None else MemoryRecordingCatalog()
        self.clock = clock
        self._on_outcome = on_outcome
        self._tasks = TaskSet("recordings")
        self._recordings: OrderedDict[str, SessionRecording] = OrderedDict()
        self._lock = asyncio.Lock()
        self._started_total = 0
        self._bytes_total = 0
        self._ready_total = 0
        self._failed_total = 0
        self._overruns_total = 0
        self._removed_total = 0
        self._kept = 0
        self._kept_bytes = 0

    async def start(self) -> None:
        """Create the directory, remove leftovers of a crash, apply retention (in the object store in the
        background: a store that cannot be reached now delays nothing and is logged; the next upload tries again)."""
        await asyncio.to_thread(self._prepare_directory)
        await self._retain(objects=False)
        if self.objects is not None:
            self._tasks.spawn(self._retain(), name="recordings-retention")

    def _prepare_directory(self) -> None:
        self.config.directory.mkdir(parents=True, exist_ok=True)
        for leftover in self.config.directory.glob(f".*{_PART}"):
            with contextlib.suppress(FileNotFoundError):
                leftover.unlink()
                logger.info("removed an unfinished recording file: %s", leftover.name)

    def record(
        self,
        session_id: str,
        owner: str,
        size: tuple[int, int, int],
        header: str,
        on_stop: Callable[[str, str], None],
        webhook_url: str | None = None,
    ) -> SessionRecording:
        """Start recording `owner`'s session: `size` is `(width, height, fps)`; `on_stop(code, message)` is called
        if the recording stops before the session does; `webhook_url`: the session's own webhook endpoint."""
        recording = SessionRecording(self, session_id, owner, size, header, on_stop, webhook_url)
        self._started_total += 1
        self._recordings[session_id] = recording
        while len(self._recordings) > _REMEMBERED:
            self._recordings.popitem(last=False)
        recording.start(self._tasks)
        return recording

    def outcome(self, session_id: str) -> RecordingOutcome | None:
        """The recording of a session this store recorded (None: it recorded none, or forgot it)."""
        recording = self._recordings.get(session_id)
        return recording.outcome() if recording is not None else None

    def outcome_of(self, entry: RecordingEntry) -> RecordingOutcome:
        """What GET answers for a catalog entry of an uploaded recording: READY with presigned URLs (short-lived,
        made now), else its state and reason."""
        if (
            entry.state is RecordingState.READY
            and self.objects is not None
            and entry.video_key is not None
            and entry.trace_key is not None
        ):
            return RecordingOutcome(
                entry.state,
                video_url=self.objects.url(entry.video_key, f"{entry.session_id}{_MP4}", "video/mp4"),
                trace_url=self.objects.url(entry.trace_key, f"{entry.session_id}{_TRACE}", "application/x-ndjson"),
            )
        return RecordingOutcome(entry.state, entry.reason)

    async def publish(self, recording: SessionRecording, *, final: bool = False) -> None:
        """Tell the catalog the recording's state now (bounded; a failure is logged); `final`: its outcome, told to
        `on_outcome` too."""
        entry = recording.entry()
        await self._write(entry)
        if final and self._on_outcome is not None:
            try:
                self._on_outcome(entry)
            except Exception:
                logger.exception("session %s: reporting the recording's outcome failed", entry.session_id)

    async def _write(self, entry: RecordingEntry) -> None:
        try:
            async with asyncio.timeout(_CATALOG_WRITE_S):
                await self.catalog.put(entry)
        except Exception as exc:  # the catalog is best effort: a recording never fails because of it
            logger.warning(
                "session %s: the recordings catalog was not told (%s): %s", entry.session_id, entry.state.value, exc
            )

    def count_bytes(self, added: int) -> None:
        self._bytes_total += added

    def count_failure(self, code: str) -> None:
        if code == RECORDING_OVERRUN:
            self._overruns_total += 1
        else:
            self._failed_total += 1

    async def fail_replica(self, replica_id: str) -> list[RecordingEntry]:
        """The recordings lost replica `replica_id` was making, moved to FAILED (`recording_failed`) in the catalog
        by this call (each by one caller only); a catalog that cannot be written is logged and yields none."""
        reason = (
            f"{RECORDING_FAILED}: the replica that made it ({replica_id}) was lost before it was complete; "
            "its local file went with it"
        )
        try:
            async with asyncio.timeout(_CATALOG_WRITE_S):
                failed = await self.catalog.fail_replica(replica_id, RECORDING_FAILED, reason, self.clock())
        except Exception as exc:
            logger.warning("recordings of lost replica %s: the catalog could not be told: %s", replica_id, exc)
            return []
        for entry in failed:
            logger.warning("session %s: its recording was lost with replica %s", entry.session_id, replica_id)
        return failed

    async def finished(self, recording: SessionRecording) -> None:
        self._ready_total += 1
        await self._retain()

    async def _retain(self, *, objects: bool = True) -> None:
        async with self._lock:
            removed = await asyncio.to_thread(self._apply_retention)
        if self.objects is not None and objects:
            try:
                retention = await self.objects.retain()
            except Exception as exc:
                logger.warning("recordings: retention in the object store failed (next pass retries): %s", exc)
            else:
                removed = [*removed, *retention.removed]
                self._kept, self._kept_bytes = retention.kept, retention.kept_bytes
        reason = "removed to keep LINGSTREAM_RECORDINGS_MAX_BYTES / _MAX_COUNT (oldest first)"
        for session_id in removed:
            recording = self._recordings.get(session_id)
            if recording is not None and recording.state is RecordingState.READY:
                recording.state = RecordingState.REMOVED
                recording.reason = reason
            try:
                entry = await self.catalog.get(session_id)
            except Exception as exc:
                logger.warning("session %s: the recordings catalog could not be read: %s", session_id, exc)
                continue
            if entry is not None and entry.state is RecordingState.READY:
                await self._write(entry.moved(RecordingState.REMOVED, self.clock(), reason=reason))

    def _apply_retention(self) -> list[str]:
        kept: list[tuple[float, str, int]] = []
        for video in self.config.directory.glob(f"*{_MP4}"):
            if video.name.startswith("."):
                continue
            session_id = video.name[: -len(_MP4)]
            try:
                stat = video.stat()
            except FileNotFoundError:
                continue
            trace = self.config.directory / f"{session_id}{_TRACE}"
            with contextlib.suppress(FileNotFoundError):
                stat_bytes = trace.stat().st_size
                kept.append((stat.st_mtime, session_id, stat.st_size + stat_bytes))
                continue
            kept.append((stat.st_mtime, session_id, stat.st_size))
        kept.sort()
        total = sum(size for _, _, size in kept)
        removed: list[str] = []
        while kept and (len(kept) > self.config.max_count or total > self.config.max_bytes):
            _, session_id, size = kept.pop(0)
            # The MP4 first: without it the recording no longer counts as complete.
            for path in (
                self.config.directory / f"{session_id}{_MP4}",
                self.config.directory / f"{session_id}{_TRACE}",
            ):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            total -= size
            removed.append(session_id)
            self._removed_total += 1
            logger.info("recording of session %s removed (retention: oldest first)", session_id)
        self._kept = len(kept)
        self._kept_bytes = total
        return removed

    async def aclose(self) -> None:
        """Finish what is being written (bounded), abandon the rest, await every task. Idempotent."""
        for recording in self._recordings.values():
            recording.finish()
        pending = [r.wait() for r in self._recordings.values() if r.state is RecordingState.FINISHING]
        if pending:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.config.close_timeout_s):
                    await asyncio.gather(*pending)
        await self._tasks.aclose()
        if self.objects is not None:
            await self.objects.aclose()
        await self.catalog.aclose()

    def statistics(self) -> RecordingStatistics:
        uploads = self.objects.statistics() if self.objects is not None else None
        return RecordingStatistics(
            recording=sum(1 for r in self._recordings.values() if r.state is RecordingState.RECORDING),
            started_total=self._started_total,
            ready_total=self._ready_total,
            failed_total=self._failed_total,
            overruns_total=self._overruns_total,
            removed_total=self._removed_total,
            bytes_total=self._bytes_total,
            kept=self._kept,
            kept_bytes=self._kept_bytes,
            uploads_total=uploads.uploads_total if uploads is not None else 0,
            upload_failures_total=uploads.upload_failures_total if uploads is not None else 0,
            uploaded_bytes_total=uploads.uploaded_bytes_total if uploads is not None else 0,
            upload_seconds_total=uploads.upload_seconds_total if uploads is not None else 0.0,
        )
