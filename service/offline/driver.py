"""The offline driver: `generate(request)` runs one session of the model worker's real `LingBotService`
(`realtime=False`) through a control trace and writes its chunks to an MP4 (`lingstream generate` is its command
line, `service.offline.generate`).

Determinism. The session starts a chunk whenever it wants one and takes the newest snapshot at that moment; while
a key is held it wants the next chunk right after emitting the last, before this driver has even read that chunk.
So the driver hands the service a `ChunkLease` of its own, `_TraceGate`: the session's grant for chunk k (taken
between deciding to generate and reading the snapshot) waits until the driver has pushed chunk k's control, which it
does as soon as chunk k-1's output arrived. Every chunk gets a fresh snapshot sequence number (`seq = k`), so the
session also generates chunks in which no key is held, and each `ChunkOutput` is checked to report exactly the
trace's `seq` and keys. The reference model is deterministic, and so is libx264 once kept off its AVX-512 code
(`service.offline.mp4`): the same image, seed and trace give the same file.

Stopping. A `stop` event (the CLI sets it on SIGINT), or a `KeyboardInterrupt` raised in this coroutine (e.g. by a
progress callback), ends generation after the chunks already written: the session is closed with CANCEL (queued
work discarded, the call in flight awaited and dropped), the encoder is flushed and the container closed, so the
file is a valid, shorter MP4; the result says `interrupted`. Any other exception (including cancellation of the
coroutine) takes the same cleanup path and propagates.

The checks that refuse bad inputs before any work (`check_output_path`, `config_message`) are here too, for the
command line and this driver alike.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from pipeline.bidirectional import (
    ChunkOutput,
    CloseMode,
    ControlState,
    PreparedSession,
    ResetPose,
    SessionSummary,
    SetPrompt,
)
from pipeline.errors import SessionFailedError
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.errors import ImageInputError, SessionConfigError
from pipeline.lingbot.graph.actors import ProcessPlacement
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceWorldModel
from pipeline.lingbot.seam import WorldModel
from pipeline.metrics import SessionMetricsSnapshot, StreamingSessionMetrics
from service.offline.clip import ChunkRecord, GenerateRequest, GenerateResult, GenerationError, Progress, UsageError
from service.offline.control_trace import ControlTrace, TraceError
from service.offline.mp4 import Mp4Writer, h264_encoder

__all__ = ["check_output_path", "config_message", "generate"]

logger = logging.getLogger(__name__)

_SESSION_ID = "offline"
_CONFIG_OPTIONS = (  # a config error starts with its field's name; tell the user which option it was
    ("frame_num", "--frames"),
    ("max_duration_s", "--seconds"),
    ("duration", "--seconds"),
    ("width", "--resolution"),
    ("height", "--resolution"),
    ("fps", "--fps"),
    ("chunk_size", "--chunk-size"),
    ("seed", "--seed"),
    ("compute_scale", "--compute-scale"),
)


async def generate(
    request: GenerateRequest,
    *,
    model: WorldModel | ProcessPlacement | None = None,
    check_config: Callable[[LingBotSessionConfig], None] | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    stop: asyncio.Event | None = None,
) -> GenerateResult:
    """Generate one clip (see the module docstring for the lifecycle, determinism and stopping).

    Raises `UsageError` for bad inputs before anything is generated or written, `GenerationError` when generation
    fails. `model` defaults to the reference world model on the CPU. `check_config` is the model's own limit on a
    session (`LingBotService`'s, the one `lingstream serve` runs at create; lingbot-fast's `session_limits`).
    """
    check_output_path(request.out, ".mp4", "--out")
    gate = _TraceGate()
    service = LingBotService(
        model if model is not None else ReferenceWorldModel("cpu"),
        lease=gate,
        realtime=False,
        torch_threads=request.torch_threads,
        check_config=check_config,
        progressive_decode=False,  # a file is written from whole chunks: nobody plays the parts
    )
    try:
        prepared = await asyncio.to_thread(service.prepare, request.config, request.image)
    except SessionConfigError as exc:
        raise UsageError(config_message(exc)) from None
    except ImageInputError as exc:
        raise UsageError(f"--image: {exc}") from None
    config = prepared.config
    if not isinstance(config, LingBotSessionConfig):
        raise TypeError("LingBotService.prepare returned a foreign config")
    plan = config.chunk_plan
    try:
        trace = ControlTrace.resolve(request.trace, plan, config.fps, request.trace_source)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    encoder = h264_encoder()
    logger.info(
        "generating %d chunks (%d frames, %dx%d at %d fps, seed %d) into %s with %s",
        plan.num_chunks,
        plan.frame_num,
        config.width,
        config.height,
        config.fps,
        config.seed,
        request.out,
        encoder,
    )
    run = _Run(service, gate, trace, config, on_progress, stop)
    writer = Mp4Writer(request.out, config.width, config.height, config.fps, encoder)
    try:
        await run.execute(prepared, writer)
    finally:
        writer.close()
    return GenerateResult(
        out=request.out,
        config=config,
        encoder=encoder,
        chunks_planned=plan.num_chunks,
        chunks=tuple(run.records),
        frames=writer.frames,
        wall_s=run.wall_s,
        interrupted=run.interrupted,
        metrics=run.metrics,
        summary=run.summary,
    )


class _TraceGate:
    """The offline session's `ChunkLease`: the grant for chunk k waits until the driver released chunk k.

    The lease is the one hook a `LingBotSession` offers between deciding to generate a chunk and reading the newest
    control snapshot for it, so holding the grant until the driver has pushed chunk k's control makes chunk k use
    exactly that control, however fast the model runs. There is one session, so no fairness question. Cancellation:
    a grant waiting here is cancelled with the session's chunk loop (`close_session` with CANCEL).
    """

    def __init__(self) -> None:
        self._released = 0  # chunks 0.._released-1 may start
        self._granted = 0
        self._changed = asyncio.Event()

    def release(self, chunk_index: int) -> None:
        self._released = max(self._released, chunk_index + 1)
        self._changed.set()

    @asynccontextmanager
    async def grant(self, session_id: str) -> AsyncIterator[None]:
        index = self._granted
        while self._released <= index:
            self._changed.clear()
            await self._changed.wait()
        self._granted += 1
        yield

    def remove_session(self, session_id: str) -> None:
        return None

    def statistics(self) -> None:
        return None  # one session, no turns to report


class _Run:
    """One generation run: push, read, verify, write, report progress; closes the session whatever happens."""

    def __init__(
        self,
        service: LingBotService,
        gate: _TraceGate,
        trace: ControlTrace,
        config: LingBotSessionConfig,
        on_progress: Callable[[Progress], None] | None,
        stop: asyncio.Event | None,
    ) -> None:
        self._service = service
        self._gate = gate
        self._trace = trace
        self._config = config
        self._on_progress = on_progress
        self._stop = stop
        self.records: list[ChunkRecord] = []
        self.interrupted = False
        self.metrics: SessionMetricsSnapshot | None = None
        self.summary: SessionSummary | None = None
        self.wall_s = 0.0

    async def execute(self, prepared: PreparedSession, writer: Mp4Writer) -> None:
        service = self._service
        started = time.perf_counter()
        await service.start()
        try:
            await service.create_session(_SESSION_ID, prepared)
            # A session that ends on its own (its last chunk) is finalized at once, and closing forgets its metrics:
            # keep the live object from while it is open and snapshot it after the last chunk.
            live = service.orchestrator.metrics(_SESSION_ID)
            completed = False
            try:
                completed = await self._chunks(writer, live, started)
            except KeyboardInterrupt:
                logger.info("interrupted after %d chunks", len(self.records))
                self.interrupted = True
            finally:
                self.metrics = live.snapshot()
                mode = CloseMode.DRAIN if completed else CloseMode.CANCEL
                self.summary = await service.close_session(_SESSION_ID, mode)
        finally:
            await service.aclose()
            self.wall_s = time.perf_counter() - started

    async def _chunks(self, writer: Mp4Writer, live: StreamingSessionMetrics, started: float) -> bool:
        """Run the clip; False when stopped early."""
        outputs = self._service.outputs(_SESSION_ID)
        total = self._trace.num_chunks
        last = time.perf_counter()
        self._push(0)
        for index in range(total):
            chunk = await self._next(outputs, index)
            if chunk is None:
                logger.info("stopped after %d of %d chunks", index, total)
                self.interrupted = True
                return False
            arrived = time.perf_counter()
            self._verify(chunk, index)
            if index + 1 < total:
                self._push(index + 1)  # the model generates chunk k+1 while chunk k is encoded
            await writer.write(chunk.frames)
            self.records.append(self._record(chunk, arrived - last))
            last = arrived
            if self._on_progress is not None:
                elapsed = time.perf_counter() - started
                done = index + 1
                self._on_progress(
                    Progress(
                        chunks_done=done,
                        chunks_total=total,
                        frames_written=writer.frames,
                        elapsed_s=elapsed,
                        real_time_factor=live.real_time_factor(self._config.chunk_media_s),
                        eta_s=elapsed / done * (total - done),
                    )
                )
            if self._stop is not None and self._stop.is_set():
                self.interrupted = index + 1 < total
                return not self.interrupted
        return True

    def _push(self, index: int) -> None:
        control = self._trace.for_chunk(index)
        if control.reset_pose:
            self._service.push_control(_SESSION_ID, ResetPose())
        if control.prompt is not None:
            self._service.push_control(_SESSION_ID, SetPrompt(seq=index, text=control.prompt))
        self._service.push_control(_SESSION_ID, ControlState(seq=index, keys=control.keys))
        self._gate.release(index)

    async def _next(self, outputs: AsyncIterator[ChunkOutput], index: int) -> ChunkOutput | None:
        """The next chunk, or None when `stop` was set first."""
        try:
            if self._stop is None:
                return await anext(outputs)
            if self._stop.is_set():
                return None
            chunk_task = asyncio.ensure_future(anext(outputs))
            stop_task = asyncio.ensure_future(self._stop.wait())
            try:
                await asyncio.wait({chunk_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (chunk_task, stop_task):
                    task.cancel()
                await asyncio.gather(chunk_task, stop_task, return_exceptions=True)
            if chunk_task.cancelled():
                return None
            return chunk_task.result()
        except StopAsyncIteration:
            raise GenerationError(f"the session ended after {index} of {self._trace.num_chunks} chunks") from None
        except SessionFailedError as exc:
            raise GenerationError(f"the session failed at chunk {index}: {exc.reason}") from None

    def _verify(self, chunk: ChunkOutput, index: int) -> None:
        expected = self._trace.for_chunk(index).keys
        if chunk.index != index or chunk.applied_seq != index or chunk.keys != expected:
            raise GenerationError(
                f"chunk {chunk.index} was generated from control seq {chunk.applied_seq} keys {sorted(chunk.keys)}, "
                f"expected chunk {index} from seq {index} keys {sorted(expected)}"
            )
        prompt = self._trace.for_chunk(index).prompt
        if prompt is not None and (chunk.prompt, chunk.prompt_seq) != (prompt, index):
            raise GenerationError(
                f"chunk {chunk.index} was generated from prompt seq {chunk.prompt_seq}, expected the trace's prompt "
                f"of chunk {index}"
            )

    def _record(self, chunk: ChunkOutput, wall_s: float) -> ChunkRecord:
        return ChunkRecord(
            index=chunk.index,
            frames=int(chunk.frames.shape[0]),
            applied_seq=chunk.applied_seq,
            keys=tuple(sorted(chunk.keys)),
            reset_pose=self._trace.for_chunk(chunk.index).reset_pose,
            wall_s=wall_s,
            control_to_output_s=chunk.timings.get("control_to_output"),
            lease_wait_s=chunk.timings.get("lease_wait"),
        )


def check_output_path(path: Path, suffix: str | None, option: str) -> None:
    """Refuse, before any work, an output path that cannot be written: wrong extension, a directory, no such
    directory, or one that refuses a new file (probed with a temporary file that is removed at once)."""
    if suffix is not None and path.suffix.lower() != suffix:
        raise UsageError(f"{option}: {path} must end in {suffix}")
    if path.is_dir():
        raise UsageError(f"{option}: {path} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise UsageError(f"{option}: the directory {parent} does not exist")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{option}: {path} exists and is not writable")
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".lingstream-probe-"):
            pass
    except OSError as exc:
        raise UsageError(f"{option}: cannot write in {parent}: {exc.strerror or exc}") from None


def config_message(exc: SessionConfigError) -> str:
    message = str(exc)
    for name, option in _CONFIG_OPTIONS:
        if message.startswith(name):
            return f"{option}: {message}"
    return f"invalid session: {message}"
