"""One LingBot session's policy on top of the orchestrator: condition prefetch, control admission, chunk loop.

Condition prefetch (lookahead 2), independent of control admission::

    start:                 submit condition[0], condition[1] while the ingress edge has room
    after denoise of i:    refill the window (normally condition[i + 2])
    always:                0 <= next_condition_index - next_control_index <= 2
    starved (the window is empty when control i is admitted, because backpressure refused the prefetch):
                           control[i] and condition[i] are submitted together, all or nothing

The latency anchor is `control`, so a prefetched condition never starts the control-to-output clock.

The chunk loop runs one chunk's DiT per execution-lease grant (issue #32: the lease grants the DiT, not the decode): it
waits until the session has something to generate (chunk 0, a held key, a new snapshot, a pose reset, a new prompt),
takes the lease, submits the chunk's control with the newest snapshot and the newest prompt (each chunk reports both),
waits until the chunk's denoise is done (`denoised`, told by the service's stage listener; or its frames, whichever
comes first), and gives the lease back while the chunk decodes. So another session's DiT, or this session's next
chunk, runs beside the decode. Up to `max_in_flight` chunks of one session are in flight (submitted, not yet handed
out): `chunks_in_flight`, 2 by default (denoise k + 1 while chunk k decodes). A second task
(the collector) takes the chunks' frames from the orchestrator in order and hands them to the reader through a
bounded queue (capacity 2, the collector waits: a reader that stops reading stops the session's generation, never
the lease). Both tasks belong to `run`: when either fails, the other is cancelled; a cancel of `run` cancels both
and awaits them. In real-time mode a chunk starts just in time (`playout.py`): ready a small
margin before the previous chunk's playback ends, so a key shows up after about one generation time plus the wait for
the next chunk start, not behind a buffer of video generated ahead; under-runs are counted (`playout_statistics`) and
each chunk carries `playout_lead` (and `underrun` when it came late) in its timings. While chunk k is still in
flight, the schedule dates chunk k + 1 from where chunk k's playback is expected to end (`playout.py`), and the date
is taken again whenever a chunk is handed out; so a session that generates faster than real time starts chunk k + 1
after chunk k is ready as before, and one that does not starts it while chunk k decodes. Cancellation of the loop at
any await leaves the orchestrator session for `close` to cancel and release.

Progressive decode: where the decode stage hands a chunk over in parts (`stages.DecodeStage`), the service passes
each part to `take_part` on the loop as it comes; the session queues it for the reader at once (`ChunkPart`, ahead
of its chunk, never waiting for room) and the whole chunk follows as before. A part of chunk k + 1 that comes before
chunk k was handed out (decoded, but the collector is behind) is held and queued right after chunk k, so the reader
still sees every chunk's parts after the chunk before it and ahead of the chunk itself (at most one chunk's parts
are held: two chunks in flight). The playout schedule sees when each part came (`playout.py`), and the chunk's
`control_to_first_frame` timing is the control's submission to its first frames (its first part; the whole chunk
without parts). If the chunk fails after some parts, the session fails as for any failed chunk, and the parts the
reader had not taken yet are dropped with it.

Checkpoint and re-seed (docs/continuity.md): each chunk handed to the reader updates `checkpoint` (a frozen
`continuity.SessionCheckpoint`: the next chunk, the camera pose after the chunk, integrated here from the same snapshots
the denoise stage used, the prompt and control counters, the stream clock, and for a model with history the bounded
ring of its chunks' latents that came back with their frames, `history.SessionHistory`); one is taken at `open` too.
After the orchestrator session failed (a worker group died, a stage raised), `reseed()` opens a new orchestrator
session under the same id and goes on from the checkpoint: chunk `next_chunk`'s condition request carries the config,
the image and the `ResumePoint` (chunk, pose and history), so the workers rebuild the session's caches there;
orchestrator sequence ids start again at 0 and map to chunk indices from `next_chunk` on (`_seq_base`). The chunk that
failed is generated again with the newest controls.

Pause: a paused session wants no chunk, so it asks for no lease turn (the other sessions of the worker share the model
without it); a pause that lands while it waits for its turn gives the grant back unused. Controls and prompts that
arrive while paused are kept (newest wins) and apply from the first chunk after `Resume`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt
import torch

from admission.lease import LeaseStatistics
from pipeline.bidirectional import (
    ChunkItem,
    ChunkOutput,
    ChunkPart,
    ControlMessage,
    ControlState,
    Pause,
    ResetPose,
    Resume,
    SetPrompt,
    Stop,
)
from pipeline.clock import Clock
from pipeline.errors import SessionClosedError, SessionFailedError
from pipeline.lingbot.camera import PoseIntegrator
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import NO_HISTORY, ResumePoint, SessionCheckpoint
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ControlError
from pipeline.lingbot.graph.stages import CONDITION_REQUEST, CONTROL, ConditionRequest, ControlArtifact, FramesArtifact
from pipeline.lingbot.policy.playout import PlayoutConfig, PlayoutScheduler, PlayoutStatistics
from pipeline.orchestrator import OutputStream, StreamingPipelineOrchestrator

__all__ = ["LOOKAHEAD", "ChunkLease", "LingBotSession"]

logger = logging.getLogger(__name__)

LOOKAHEAD = 2
_OUT_CAPACITY = 2


class ChunkLease(Protocol):
    """The cross-session policy seam: one grant = one chunk's DiT, from its control's submission until its denoise
    is done; its decode runs after the grant (admission.ExecutionLease satisfies it)."""

    def grant(self, session_id: str) -> AbstractAsyncContextManager[None]: ...

    def remove_session(self, session_id: str) -> None: ...

    def statistics(self) -> LeaseStatistics | None:
        """What the service's metrics report of the lease (None: a lease with nothing to report)."""
        ...


@dataclass(frozen=True, slots=True)
class _Submitted:
    seq: int
    snapshot: ControlSnapshot
    keys: frozenset[str]
    submitted_at: float
    lease_wait: float
    prompt: str
    prompt_seq: int
    reset_pose: bool
    parts: list[tuple[float, int]] = field(default_factory=list)
    """When each part of the chunk came and how many frames it held (progressive decode)."""


class _ChunkQueue:
    """Bounded hand-off of finished chunks (and their parts) to the one reader. Overflow policy: the producer of a
    whole chunk waits; parts go in at once (they belong to the one chunk in flight)."""

    def __init__(self, session_id: str, capacity: int) -> None:
        self._session_id = session_id
        self._items: deque[ChunkItem] = deque()
        self._whole = 0
        self._capacity = capacity
        self._changed = asyncio.Event()
        self._ended = False
        self._failure: str | None = None

    def allow_more(self, count: int) -> None:
        """The session is stopping: the chunks in flight (`count` at most) may go in even if the reader is behind."""
        self._capacity += count
        self._changed.set()

    async def put(self, chunk: ChunkOutput) -> None:
        while self._whole >= self._capacity and not self._ended:
            self._changed.clear()
            await self._changed.wait()
        if not self._ended:
            self._items.append(chunk)
            self._whole += 1
            self._changed.set()

    def put_part(self, part: ChunkPart) -> None:
        if not self._ended:
            self._items.append(part)
            self._changed.set()

    def end(self, failure: str | None) -> None:
        if not self._ended:
            self._ended = True
            self._failure = failure
            # Parts at the end belong to a chunk that never came whole (it failed, or a cancel cut it short): the
            # ones the reader has not taken are dropped, so no half of a chunk is left behind.
            while self._items and isinstance(self._items[-1], ChunkPart):
                self._items.pop()
            self._changed.set()

    async def items(self, parts: bool) -> AsyncIterator[ChunkItem]:
        while True:
            if self._items:
                item = self._items.popleft()
                if isinstance(item, ChunkOutput):
                    self._whole -= 1
                self._changed.set()
                if parts or isinstance(item, ChunkOutput):
                    yield item
                continue
            if self._ended:
                if self._failure is not None:
                    raise SessionFailedError(self._session_id, self._failure)
                return
            self._changed.clear()
            await self._changed.wait()


class LingBotSession:
    """The policy of one session; created and driven by `LingBotService` (or the offline generator)."""

    def __init__(
        self,
        session_id: str,
        config: LingBotSessionConfig,
        image: torch.Tensor | None,
        orchestrator: StreamingPipelineOrchestrator,
        clock: Clock,
        lease: ChunkLease | None = None,
        *,
        pace_ahead_s: float | None = None,
        chunks_in_flight: int = 2,
    ) -> None:
        if chunks_in_flight < 1:
            raise ValueError(f"chunks_in_flight must be at least 1, got {chunks_in_flight}")
        self.session_id = session_id
        self.config = config
        self._image = image
        self._orchestrator = orchestrator
        self._clock = clock
        self._lease = lease
        self._plan = config.chunk_plan
        self.next_condition_index = 0
        self.next_control_index = 0
        self._latest: ControlSnapshot | None = None
        self._applied_seq = -1
        self._prompt = config.prompt
        self._prompt_seq = -1
        self._applied_prompt_seq = -1
        self._reset_pending = False
        self._paused = False
        self._stop_requested = False
        self._wake = asyncio.Event()
        self._stream: OutputStream | None = None
        self._submitted: dict[int, _Submitted] = {}
        self._out = _ChunkQueue(session_id, _OUT_CAPACITY)
        self._last_emit: float | None = None
        self._pace_ahead_s = pace_ahead_s
        self._media_origin: float | None = None
        self._playout: PlayoutScheduler | None = None
        if pace_ahead_s is not None and config.schedule == "just_in_time":
            self._playout = PlayoutScheduler(PlayoutConfig(fps=float(config.fps)))
        self.max_in_flight = chunks_in_flight
        """Chunks of this session in flight at once (submitted, not yet handed to the reader): the module docstring."""
        self._in_flight: deque[int] = deque()  # their chunk indices, oldest first
        self._held_parts: list[ChunkPart] = []  # parts of a chunk whose predecessor is not handed out yet
        self._denoised = -1  # the newest orchestrator sequence id whose denoise is done
        self._submitted_seq = -1  # the newest snapshot seq / prompt seq submitted (what wants_chunk compares to)
        self._submitted_prompt_seq = -1
        self._producing = False
        self._step = asyncio.Event()  # a chunk was submitted, denoised or handed out
        self.chunks_emitted = 0
        self.stale_controls = 0
        self.invalid_controls = 0
        self.failure: str | None = None
        self._camera = PoseIntegrator(config.pose_steps())  # the pose after the last chunk handed out
        self._frames_emitted = 0
        self._seq_base = 0  # the chunk index of orchestrator sequence id 0 (0, or where a re-seed went on)
        self._resume: ResumePoint | None = None
        self._history = NO_HISTORY  # a model with history's chunks, bounded by its spec (`history.SessionHistory`)
        self.checkpoint: SessionCheckpoint | None = None
        self.on_chunk: Callable[[], None] | None = None
        """Told (on the loop) each time a chunk is handed to the reader, after its checkpoint was taken."""

    @property
    def num_chunks(self) -> int:
        return self._plan.num_chunks

    def playout_statistics(self) -> PlayoutStatistics | None:
        """The just-in-time schedule's figures (None: offline, or the old `media_clock` schedule)."""
        return self._playout.statistics() if self._playout is not None else None

    def is_finished(self) -> bool:
        return self.next_control_index >= self._plan.num_chunks or self._stop_requested

    # -- lifecycle -------------------------------------------------------------------------------------------

    def open(self) -> None:
        """Open the orchestrator session and prefetch the first conditions (before any control arrives)."""
        self._stream = self._orchestrator.open_session(self.session_id)
        self._take_checkpoint()
        self.refill()

    def reseed(self) -> None:
        """Go on from the checkpoint on a new orchestrator session under the same id (the old one is closed and
        released): its first condition request carries the config, the image and the resume point (module docstring).
        Raises what `open_session` raises (e.g. `SessionPoisonedError` when the old one's release failed)."""
        checkpoint = self.checkpoint
        if checkpoint is None:
            raise RuntimeError(f"session {self.session_id}: no checkpoint to re-seed from")
        start = checkpoint.next_chunk
        self._stream = self._orchestrator.open_session(self.session_id)
        self._submitted.clear()
        self._in_flight.clear()
        self._held_parts.clear()
        self._denoised = -1
        self._submitted_seq = self._applied_seq  # the chunks in flight are lost: they are generated again
        self._submitted_prompt_seq = self._applied_prompt_seq
        self._seq_base = start
        self.next_condition_index = start
        self.next_control_index = start
        self._resume = checkpoint.resume_point if start > 0 else None
        if self._playout is not None:
            self._playout.abandon_all()  # the failed chunks' starts would count the recovery as generation time
        self.refill()

    def restore(self, checkpoint: SessionCheckpoint) -> None:
        """Open the session where `checkpoint` left it (a session adopted from a replica that was lost, written by
        another process): its counters, prompt, controls and camera pose are taken from it, then it goes on as a
        re-seed does (`reseed`). Raises `ValueError` for another session's checkpoint."""
        if checkpoint.session_id != self.session_id:
            raise ValueError(f"checkpoint of session {checkpoint.session_id!r}, not {self.session_id!r}")
        self._prompt, self._prompt_seq = checkpoint.prompt, checkpoint.prompt_seq
        self._applied_prompt_seq = checkpoint.prompt_seq
        self._latest, self._applied_seq = checkpoint.latest, checkpoint.applied_seq
        self._submitted_seq, self._submitted_prompt_seq = self._applied_seq, self._applied_prompt_seq
        self._camera.place(checkpoint.pose)
        self._frames_emitted = checkpoint.frames_emitted
        self._history = checkpoint.history
        self.checkpoint = checkpoint
        self.reseed()

    @property
    def stop_requested(self) -> bool:
        """A `Stop` control or a drain asked the session to end."""
        return self._stop_requested

    def request_stop(self) -> None:
        """Finish the chunk in progress, then end (a `Stop` control or a drain)."""
        if not self._stop_requested:
            self._stop_requested = True
            self._out.allow_more(self.max_in_flight)
        self._wake.set()

    def end_output(self, failure: str | None) -> None:
        self._out.end(failure)

    def chunks(self, *, parts: bool = False) -> AsyncIterator[ChunkItem]:
        """The session's chunks in order; with `parts`, each chunk's `ChunkPart`s before it (progressive decode)."""
        return self._out.items(parts)

    def take_part(self, chunk_index: int, offset: int, frames: npt.NDArray[np.uint8]) -> None:
        """Frames `offset ..` of chunk `chunk_index`, decoded ahead of the chunk (on the loop; never waits). A part
        of a chunk that is not in flight (it was emitted, or never submitted) is dropped."""
        record = self._submitted.get(chunk_index)
        if record is None or len(frames) == 0:
            return
        if offset != sum(count for _, count in record.parts):
            logger.warning(
                "session %s: part at %d of chunk %d out of order; dropped", self.session_id, offset, chunk_index
            )
            return
        record.parts.append((self._clock.now(), len(frames)))
        first = self._plan.first_frame_of_chunk(chunk_index) + offset
        part = ChunkPart(self.session_id, chunk_index, frames, float(self.config.fps), first, offset)
        if self._in_flight and self._in_flight[0] != chunk_index:
            self._held_parts.append(part)  # the chunk before it is not handed out yet: queued right after it
        else:
            self._out.put_part(part)

    def denoised(self, sequence_id: int) -> None:
        """The denoise of orchestrator sequence `sequence_id` is done (the service's stage listener, on the loop):
        the chunk's lease grant can go back while it decodes."""
        if sequence_id > self._denoised:
            self._denoised = sequence_id
            self._step.set()

    # -- control ---------------------------------------------------------------------------------------------

    def push(self, message: ControlMessage) -> None:
        """Take a control message. Stale or duplicate snapshots are dropped and counted (newest wins)."""
        if isinstance(message, ControlState):
            if self._latest is not None and message.seq <= self._latest.seq:
                self.stale_controls += 1
                return
            try:
                self._latest = ControlSnapshot.from_keys(message.seq, message.keys)
            except (ControlError, ValueError) as exc:
                self.invalid_controls += 1
                logger.info("session %s: invalid control snapshot dropped: %s", self.session_id, exc)
                return
        elif isinstance(message, SetPrompt):
            if message.seq <= self._prompt_seq:
                self.stale_controls += 1
                return
            self._prompt = message.text
            self._prompt_seq = message.seq
        elif isinstance(message, Pause):
            self._paused = True
        elif isinstance(message, Resume):
            self._paused = False
        elif isinstance(message, ResetPose):
            self._reset_pending = True
        elif isinstance(message, Stop):
            self.request_stop()
        self._wake.set()

    @property
    def paused(self) -> bool:
        return self._paused

    def wants_chunk(self) -> bool:
        if self.is_finished() or self._paused:
            return False
        if self.next_control_index == 0 or self._reset_pending or self._prompt_seq > self._submitted_prompt_seq:
            return True
        latest = self._latest
        return latest is not None and (not latest.idle or latest.seq > self._submitted_seq)

    # -- prefetch --------------------------------------------------------------------------------------------

    def refill(self) -> None:
        """Top the condition window up to LOOKAHEAD without waiting (a full edge just stops the refill)."""
        while (
            self.next_condition_index - self.next_control_index < LOOKAHEAD
            and self.next_condition_index < self._plan.num_chunks
        ):
            index = self.next_condition_index
            item = (index - self._seq_base, self._request(index))
            if not self._orchestrator.try_submit(self.session_id, {CONDITION_REQUEST: item}):
                break
            self.next_condition_index += 1
        self._check_window()

    def _request(self, index: int) -> ConditionRequest:
        if index == self._seq_base:  # the orchestrator session's first: chunk 0, or where a re-seed goes on
            return ConditionRequest(index, self._plan.chunk_size, self.config, self._image, self._resume)
        return ConditionRequest(index, self._plan.chunk_size)

    def _check_window(self) -> None:
        gap = self.next_condition_index - self.next_control_index
        if not 0 <= gap <= LOOKAHEAD:
            raise AssertionError(f"session {self.session_id}: condition window {gap} outside 0..{LOOKAHEAD}")

    # -- the chunk loop --------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Generate chunks until the plan is done, a stop is requested, or the session fails: the producer (lease,
        control, denoise) and the collector (frames to the reader) as two tasks (module docstring). Returns once
        every chunk in flight was handed out, or the session failed; on cancel, both tasks are cancelled and
        awaited."""
        loop = asyncio.get_running_loop()
        self._producing = True
        producer = loop.create_task(self._produce(), name=f"lingbot-produce-{self.session_id}")
        collector = loop.create_task(self._collect(), name=f"lingbot-collect-{self.session_id}")
        try:
            done, _ = await asyncio.wait({producer, collector}, return_when=asyncio.FIRST_EXCEPTION)
            if producer in done and not producer.cancelled() and producer.exception() is None:
                await asyncio.wait({collector})  # the chunks still in flight are handed out
        finally:
            for task in (producer, collector):
                task.cancel()
            await asyncio.gather(producer, collector, return_exceptions=True)
        for task in (collector, producer):  # the collector's failure carries the session's reason
            failure = None if task.cancelled() else task.exception()
            if isinstance(failure, SessionFailedError):
                self.failure = failure.reason
                logger.warning("session %s failed: %s", self.session_id, failure.reason)
                return
            if isinstance(failure, SessionClosedError):
                # The orchestrator closed the session under the loop (it failed: e.g. an actor died while this loop
                # waited to submit). Its close report carries the reason, which the service's close reads.
                logger.info("session %s: closed while generating: %s", self.session_id, failure)
                return
            if failure is not None:
                raise failure

    async def _produce(self) -> None:
        try:
            while not self.is_finished():
                if not self.wants_chunk():
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                await self._room()
                await self._pace()
                if self.is_finished():
                    break
                if not self.wants_chunk():  # paused while it waited for the chunk's start
                    continue
                await self._start_chunk()
        finally:
            self._producing = False
            self._step.set()

    async def _room(self) -> None:
        """Wait until fewer than `max_in_flight` chunks are in flight."""
        while len(self._in_flight) >= self.max_in_flight:
            self._step.clear()
            await self._step.wait()

    async def _collect(self) -> None:
        """Hand the chunks in flight to the reader in order; ends when the producer ended and none is left."""
        while True:
            while not self._in_flight:
                if not self._producing:
                    return
                self._step.clear()
                await self._step.wait()
            chunk = await self._next_chunk()
            await self._out.put(chunk)
            self._handed_out()

    def _handed_out(self) -> None:
        self._in_flight.popleft()
        self._wake.set()  # a pacing wait takes its date again (`_pace`)
        if self._in_flight:
            head = self._in_flight[0]
            for part in [p for p in self._held_parts if p.index == head]:
                self._out.put_part(part)
            self._held_parts = [p for p in self._held_parts if p.index != head]
        self._step.set()

    async def _pace(self) -> None:
        """Real-time mode: wait until the next chunk is due. Offline generation passes `pace_ahead_s=None`.

        `just_in_time` asks the `PlayoutScheduler`. `media_clock` (the old policy, kept to measure against) starts
        chunk i no earlier than `pace_ahead_s` before its media time counted from the first chunk; that clock stands
        still while the session is idle, so after a pause the chunks are all overdue and generated at full speed,
        and the transport's pacer ring (2 s) fills with video generated ahead of playback.
        """
        if self._pace_ahead_s is None:
            return
        while not self._stop_requested:
            self._wake.clear()  # before the date is taken: a chunk handed out after it wakes the wait below
            if self._playout is not None:
                in_flight = sum(self._plan.frames_in_chunk(index) for index in self._in_flight)
                due = self._playout.due(frames_in_flight=in_flight)
            elif self._media_origin is None:
                return
            else:
                first_frame = self._plan.first_frame_of_chunk(self.next_control_index)
                due = self._media_origin + first_frame / self.config.fps - self._pace_ahead_s
            delay = due - self._clock.now()
            if delay <= 0:
                return
            try:
                # a stop, a control or a chunk handed out may arrive meanwhile: the date is taken again
                async with asyncio.timeout(delay):
                    await self._wake.wait()
            except TimeoutError:
                return

    async def _start_chunk(self) -> bool:
        """Submit the next chunk under one lease grant and hold the grant until its denoise is done (or its frames
        came, whichever first); False when the session was paused while it waited for the grant (the grant goes back
        unused: a paused session does no model work)."""
        if self._stream is None:
            raise RuntimeError("the session is not open")
        wanted_at = self._clock.now()
        if self._playout is not None:
            self._playout.started(wanted_at)
        grant: AbstractAsyncContextManager[None] = (
            self._lease.grant(self.session_id) if self._lease is not None else nullcontext()
        )
        async with grant:
            if self._paused:
                if self._playout is not None:
                    self._playout.abandon()
                return False
            granted_at = self._clock.now()
            index = self.next_control_index
            latest = self._latest
            snapshot = latest if latest is not None else ControlSnapshot(0, frozenset())
            reset_pose = self._reset_pending
            control = ControlArtifact(index, snapshot, reset_pose=reset_pose, prompt=self._prompt)
            self._reset_pending = False
            sequence = index - self._seq_base
            items: dict[str, tuple[int, object]] = {CONTROL: (sequence, control)}
            starved = self.next_condition_index == index
            if starved:
                items[CONDITION_REQUEST] = (sequence, self._request(index))
            await self._orchestrator.submit(self.session_id, items)
            self.next_control_index += 1
            if starved:
                self.next_condition_index += 1
            self._check_window()
            self._submitted[index] = _Submitted(
                latest.seq if latest is not None else -1,
                snapshot,
                snapshot.keys,
                self._clock.now(),
                granted_at - wanted_at,
                self._prompt,
                self._prompt_seq,
                reset_pose,
            )
            if latest is not None:
                self._submitted_seq = max(self._submitted_seq, latest.seq)
            self._submitted_prompt_seq = max(self._submitted_prompt_seq, self._prompt_seq)
            self._in_flight.append(index)
            self._step.set()
            while self._denoised < sequence and index in self._in_flight:
                self._step.clear()
                await self._step.wait()
        self.refill()
        return True

    async def _next_chunk(self) -> ChunkOutput:
        """The next chunk's frames from the orchestrator, as the reader gets them."""
        stream = self._stream
        if stream is None:
            raise RuntimeError("the session is not open")
        item = await anext(stream)
        return self._to_chunk(item.payload)

    def _take_checkpoint(self, next_chunk: int = 0) -> None:
        self.checkpoint = SessionCheckpoint(
            session_id=self.session_id,
            config=self.config,
            image=self._image,
            next_chunk=next_chunk,
            pose=self._camera.pose,
            prompt=self._prompt,
            prompt_seq=self._prompt_seq,
            applied_seq=self._applied_seq,
            latest=self._latest,
            frames_emitted=self._frames_emitted,
            taken_at=self._clock.now(),
            history=self._history,
        )

    def _to_chunk(self, payload: object) -> ChunkOutput:
        if not isinstance(payload, FramesArtifact):
            raise RuntimeError(f"unexpected output {type(payload).__name__}")
        now = self._clock.now()
        record = self._submitted.pop(payload.chunk_index)
        self._applied_seq = max(self._applied_seq, record.seq)
        self._applied_prompt_seq = max(self._applied_prompt_seq, record.prompt_seq)
        first_frames_at = record.parts[0][0] if record.parts else now
        timings = {
            **payload.timings,
            "control_to_output": now - record.submitted_at,
            "control_to_first_frame": first_frames_at - record.submitted_at,
            "lease_wait": record.lease_wait,
        }
        if self._playout is not None:
            playout = self._playout.ready(now, len(payload.frames), parts=record.parts)
            timings["playout_lead"] = playout.lead_s
            if playout.underrun_s > 0:
                timings["underrun"] = playout.underrun_s
        if self._last_emit is not None:
            timings["chunk_period"] = now - self._last_emit
        self._last_emit = now
        if self._media_origin is None:
            self._media_origin = now
        self.chunks_emitted += 1
        if record.reset_pose:
            self._camera.reset_pose()
        self._camera.chunk_poses(
            record.snapshot, first_chunk=payload.chunk_index == 0, latent_frames=self._plan.chunk_size
        )
        self._frames_emitted = self._plan.first_frame_of_chunk(payload.chunk_index) + len(payload.frames)
        if payload.history is not None:
            self._history = self._history.append(payload.history)
        self._take_checkpoint(payload.chunk_index + 1)
        if self.on_chunk is not None:
            self.on_chunk()
        return ChunkOutput(
            session_id=self.session_id,
            index=payload.chunk_index,
            frames=payload.frames,
            fps=float(self.config.fps),
            first_frame_index=self._plan.first_frame_of_chunk(payload.chunk_index),
            applied_seq=record.seq,
            keys=record.keys,
            timings=timings,
            prompt=record.prompt,
            prompt_seq=record.prompt_seq,
            reset_pose=record.reset_pose,
        )
