"""What the LingBot worker processes run: one `Stage` per worker group, and the artifacts that carry tensor refs.

Spawned ranks import this module by name (`build_group_stage` is every group's `stage_factory`), so everything here
is module level and picklable by reference. The parent side, the mapping from a placement plan to these groups and
the channels between them, is `pipeline.lingbot.graph.actors`; its docstring draws the whole picture.

Each group stage wraps the thread stages of `stages.py` (the same camera, HUD and cache logic) and only changes how
tensors arrive and leave: instead of tensors, the `condition` and `latent` artifacts carry `TensorRef`s
(`RemoteCondition`, `RemoteLatent`), and the tensors themselves cross through `WorkerTensorChannel`s. The frames
leave as `SharedFrames`: pickled as a shared-memory tensor (the reply pipe carries a handle, not megabytes), they
arrive in the service process as a plain `FramesArtifact` whose frames are a view of that memory. Every rank of
a group receives every call (`ParallelWorker`); only rank 0 encodes, decodes, sends and receives, and its artifacts
are the call's result; in the DiT group every rank runs the (sharded) denoiser.

Decode co-located in the DiT group (`GroupRole.DENOISE_DECODE`, issue #32): the group serves two stages, `denoise`
on its first call lane and `decode` on its second (`ParallelWorkerConfig.lanes`: a second thread of each rank, its
own CUDA stream on a GPU), so chunk k decodes while chunk k + 1's DiT runs, as on threads. The denoise call keeps the
latent in rank 0 (`_LatentStash`, with a CUDA event recorded after the DiT's kernels) and returns a `LocalLatent`
(metadata only); the decode call takes it there, its stream waiting on that event first. The stash holds at most
what the `latent` edge lets through (its capacity per session) and drops a session's entries at its release.

Progressive decode (`GroupOptions.progressive_decode`, a `ProgressiveDecoder`): the decoding rank hands each part of
a chunk to the parent as it is decoded, through the worker's partial replies (`WorkerContext.parts`): a
`SharedPart` carries its frames as a view of the chunk's one shared-memory buffer (`ChunkParts`) and arrives in the
service process as a `FramesPart`, ahead of the call's whole-chunk `frames` artifact, which then sends the same
buffer.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import cast

import numpy as np
import numpy.typing as npt
import torch
import torch.distributed as dist

from pipeline.actor import Stage, StageCall
from pipeline.lingbot.chunks import TEMPORAL_COMPRESSION, frame_num_for_latent_frames
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ModelSessionError
from pipeline.lingbot.graph.placement import DECODE_STAGE
from pipeline.lingbot.graph.stages import (
    CONTROL,
    FRAMES,
    ConditionArtifact,
    DecodeStage,
    DenoiseStage,
    EncodeStage,
    FramesArtifact,
    LatentArtifact,
)
from pipeline.lingbot.history import ChunkHistory, ChunkRecord
from pipeline.lingbot.seam import ChunkCondition, ModelShard, WorldModelFactory
from pipeline.process import PartSender, ReportsReady, TensorRef, WorkerContext, WorkerTensorChannel

__all__ = [
    "LATENT_CHANNEL_TIMING",
    "ChunkParts",
    "DecodeGroupStage",
    "DenoiseGroupStage",
    "EncodeGroupStage",
    "FramesPart",
    "GroupOptions",
    "GroupRole",
    "LocalLatent",
    "RemoteCondition",
    "RemoteLatent",
    "SharedFrames",
    "SharedPart",
    "build_group_stage",
]

LATENT_CHANNEL_TIMING = "latent_channel"
"""The chunk timing (seconds) of moving its latent between worker groups: the producer's send plus the consumer's
receive."""


class GroupRole(enum.Enum):
    """What one worker group runs."""

    ENCODE = "encode"  # VAE encode; sends each session's base latent to the DiT group
    DENOISE = "denoise"  # the DiT; sends each latent chunk to the decode group
    DENOISE_DECODE = "denoise_decode"  # the DiT with decode co-located: decode calls on the group's second lane
    DECODE = "decode"  # VAE decode of latents received from the DiT group


@dataclass(frozen=True, slots=True)
class GroupOptions:
    """What a group's ranks need besides their `WorkerContext` (travels as `ParallelWorkerConfig.options["group"]`)."""

    role: GroupRole
    factory: WorldModelFactory
    dtype: str
    base: WorkerTensorChannel
    """encode -> DiT: each session's base latent, once."""
    latent: WorkerTensorChannel | None
    """DiT -> decode: every latent chunk (None when decode is co-located)."""
    channel_timeout_s: float
    progressive_decode: bool = False
    """The decoding rank hands each chunk's parts over as they are decoded (`SharedPart`), if its decoder can."""


@dataclass(frozen=True, slots=True)
class RemoteCondition:
    """The `condition` artifact between worker groups: chunk 0's carries the base latent's ref, later ones none."""

    condition: ChunkCondition
    base: TensorRef | None = None
    config: LingBotSessionConfig | None = None
    resume: ResumePoint | None = None

    def tensor_refs(self) -> tuple[TensorRef, ...]:
        return () if self.base is None else (self.base,)


@dataclass(frozen=True, slots=True)
class RemoteLatent:
    """The `latent` artifact between worker groups: the ref of the chunk's latent in the latent channel."""

    chunk_index: int
    latent: TensorRef
    snapshot: ControlSnapshot
    config: LingBotSessionConfig | None = None  # only for the session's first chunk (0, or a re-seed's first)
    denoise_s: float = 0.0
    send_s: float = 0.0
    """Seconds the DiT's rank 0 spent sending it (added to the receive time in the chunk's timings)."""
    record: ChunkRecord | None = None  # a model with history's (`LatentArtifact.record`)
    prime: torch.Tensor | None = None  # a re-seed's first chunk (`LatentArtifact.prime`)

    def tensor_refs(self) -> tuple[TensorRef, ...]:
        return (self.latent,)


@dataclass(frozen=True, slots=True)
class LocalLatent:
    """The `latent` artifact when decode is co-located: the latent stays in the DiT group's rank 0 (module
    docstring); this says which one the decode call takes."""

    chunk_index: int
    snapshot: ControlSnapshot
    config: LingBotSessionConfig | None = None  # only for the session's first chunk (0, or a re-seed's first)
    denoise_s: float = 0.0
    record: ChunkRecord | None = None  # a model with history's (`LatentArtifact.record`)
    prime: torch.Tensor | None = None  # a re-seed's first chunk (`LatentArtifact.prime`)


class _LatentStash:
    """Rank 0's latents between a denoise call (lane 0) and its decode call (lane 1), by session and chunk; thread
    safe. Each entry carries the CUDA event its producer's stream recorded after the latent was written (None on
    the CPU), which the consumer's stream waits on before it reads the latent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[tuple[str, int], tuple[torch.Tensor, torch.cuda.Event | None]] = {}

    def put(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> None:
        event = None
        if latent.is_cuda:
            event = torch.cuda.Event()  # type: ignore[no-untyped-call]
            event.record(torch.cuda.current_stream(latent.device))
        with self._lock:
            self._entries[(session_id, chunk_index)] = (latent, event)

    def take(self, session_id: str, chunk_index: int) -> torch.Tensor:
        with self._lock:
            entry = self._entries.pop((session_id, chunk_index), None)
        if entry is None:
            raise ModelSessionError(f"session {session_id!r}: no latent of chunk {chunk_index} in the DiT group")
        latent, event = entry
        if event is not None:
            stream = torch.cuda.current_stream(latent.device)
            stream.wait_event(event)
            latent.record_stream(stream)
        return latent

    def discard(self, session_id: str) -> None:
        with self._lock:
            for key in [key for key in self._entries if key[0] == session_id]:
                del self._entries[key]


class SharedFrames:
    """A `FramesArtifact` on its way out of a worker process: it pickles its frames as a shared-memory tensor and
    unpickles as the `FramesArtifact` itself (frames a numpy view of that memory, kept alive by the array). `shared`:
    the same frames already in shared memory (the chunk's parts were sent from it), sent as they are."""

    __slots__ = ("artifact", "shared")

    def __init__(self, artifact: FramesArtifact, shared: torch.Tensor | None = None) -> None:
        self.artifact = artifact
        self.shared = shared

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        artifact = self.artifact
        shared = self.shared
        if shared is None:
            shared = torch.from_numpy(artifact.frames).share_memory_()  # type: ignore[no-untyped-call]
        # The chunk's history (its latent, a model with history's) crosses beside the frames, inside the pickle
        # (`ChunkHistory.__reduce__`: 1.2 MB at 832x480, cheaper than a segment of its own).
        history = artifact.history
        return (_unshare_frames, (artifact.chunk_index, shared, artifact.snapshot, dict(artifact.timings), history))


def _unshare_frames(
    chunk_index: int,
    frames: torch.Tensor,
    snapshot: ControlSnapshot,
    timings: dict[str, float],
    history: ChunkHistory | None = None,
) -> FramesArtifact:
    return FramesArtifact(chunk_index, frames.numpy(), snapshot, timings, history)


@dataclass(frozen=True, slots=True)
class FramesPart:
    """Frames `offset ..` of chunk `chunk_index`, decoded ahead of the whole chunk, as the service process gets them
    (frames a numpy view of the shared memory they crossed in)."""

    chunk_index: int
    offset: int
    frames: npt.NDArray[np.uint8]


class SharedPart:
    """A `FramesPart` on its way out of a worker process: its frames (a shared-memory tensor, usually a view of the
    chunk's buffer) pickle as that memory's handle and unpickle as a `FramesPart`."""

    __slots__ = ("chunk_index", "frames", "offset")

    def __init__(self, chunk_index: int, offset: int, frames: torch.Tensor) -> None:
        self.chunk_index = chunk_index
        self.offset = offset
        self.frames = frames

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_unshare_part, (self.chunk_index, self.offset, self.frames))


def _unshare_part(chunk_index: int, offset: int, frames: torch.Tensor) -> FramesPart:
    return FramesPart(chunk_index, offset, frames.numpy())


class ChunkParts:
    """The decode stage's part sink inside a worker process: the chunk's frames go into one shared-memory buffer as
    they are decoded, and each part leaves as a partial reply carrying its view of that buffer.

    One segment per chunk, not one per part: the parent maps it once (torch's receive side recognises a segment it
    already holds), and the whole chunk's reply then sends the same buffer instead of copying the frames into a new
    segment. The buffer is sized by the chunk contract (`chunks.py`: 4·cs − 3 frames for chunk 0, 4·cs after); a
    part that would not fit (a decoder that breaks the contract) is sent from a segment of its own, and the whole
    chunk then too. Each region of the buffer is written once, before the part that announces it is sent, so the
    parent never reads memory that is still being written.
    """

    def __init__(self, parts: PartSender) -> None:
        self._parts = parts
        self._buffer: torch.Tensor | None = None
        self._frames = 0  # the chunk's frames by the contract
        self._filled = 0  # frames written into the buffer so far, all sent

    def begin(self, chunk_index: int, latent_frames: int) -> None:
        """Start chunk `chunk_index` of `latent_frames` latent frames (before its first part)."""
        self._buffer = None
        self._frames = (
            frame_num_for_latent_frames(latent_frames) if chunk_index == 0 else TEMPORAL_COMPRESSION * latent_frames
        )
        self._filled = 0

    def __call__(self, _session_id: str, chunk_index: int, offset: int, frames: npt.NDArray[np.uint8]) -> None:
        part = torch.from_numpy(frames)
        if offset == self._filled and offset + len(frames) <= self._frames:
            if self._buffer is None:
                empty = torch.empty((self._frames, *part.shape[1:]), dtype=part.dtype)
                self._buffer = empty.share_memory_()  # type: ignore[no-untyped-call]
            if self._buffer.shape[1:] == part.shape[1:]:
                view = self._buffer[offset : offset + len(frames)]
                view.copy_(part)
                self._filled += len(frames)
                self._parts.send(SharedPart(chunk_index, offset, view))
                return
        self._filled = -1  # off the contract: this part and the whole chunk travel in their own segments
        self._parts.send(SharedPart(chunk_index, offset, part.share_memory_()))  # type: ignore[no-untyped-call]

    def finish(self, artifact: FramesArtifact) -> SharedFrames:
        """The chunk's reply: the buffer when every part went through it (it then holds the artifact's frames)."""
        buffer, self._buffer = self._buffer, None
        whole = buffer is not None and self._filled == self._frames and tuple(buffer.shape) == artifact.frames.shape
        return SharedFrames(artifact, buffer if whole else None)


def _decode_stage(
    ctx: WorkerContext, options: GroupOptions, shard: ModelShard
) -> tuple[DecodeStage, ChunkParts | None]:
    parts = ChunkParts(ctx.parts) if options.progressive_decode else None
    return DecodeStage(options.factory.decoder(shard), parts), parts


def _decode(
    decode: tuple[DecodeStage, ChunkParts | None],
    call: StageCall,
    latent: LatentArtifact,
    timings: Mapping[str, float] | None = None,
) -> SharedFrames:
    """Decode `latent` (in parts where progressive) and return the chunk's frames, with `timings` added, ready to
    leave the process."""
    stage, parts = decode
    if parts is not None:
        parts.begin(latent.chunk_index, int(latent.latent.shape[1]))
    frames = stage.process(_with_inputs(call, {"latent": latent}))[FRAMES]
    if not isinstance(frames, FramesArtifact):
        raise ModelSessionError(f"decode produced {type(frames).__name__}, not a FramesArtifact")
    if timings:
        frames = replace(frames, timings={**frames.timings, **timings})
    return SharedFrames(frames) if parts is None else parts.finish(frames)


def _key(session_id: str, chunk_index: int, what: str) -> str:
    return f"{session_id}/{chunk_index}/{what}"


def _session_prefix(session_id: str) -> str:
    return f"{session_id}/"


def _with_inputs(call: StageCall, inputs: Mapping[str, object]) -> StageCall:
    return StageCall(call.stage_id, call.session_id, call.sequence_id, inputs)


class EncodeGroupStage:
    """VAE encode on rank 0; chunk 0's base latent leaves through the base channel, the artifact keeps its ref."""

    def __init__(self, ctx: WorkerContext, options: GroupOptions) -> None:
        self._options = options
        shard = ModelShard(ctx.device, ctx.rank, ctx.world_size, options.dtype)
        self._inner = EncodeStage(options.factory.encoder(shard)) if ctx.rank == 0 else None

    def process(self, call: StageCall) -> Mapping[str, object]:
        if self._inner is None:
            return {}
        artifact = self._inner.process(call)["condition"]
        if not isinstance(artifact, ConditionArtifact):
            raise ModelSessionError(f"encode produced {type(artifact).__name__}, not a ConditionArtifact")
        ref = None
        if artifact.base_latent is not None:
            key = _key(call.session_id, artifact.condition.chunk_index, "base")
            ref = self._options.base.send(key, artifact.base_latent, timeout_s=self._options.channel_timeout_s)
        return {"condition": RemoteCondition(artifact.condition, ref, artifact.config, artifact.resume)}

    def release(self, session_id: str) -> None:
        if self._inner is not None:
            self._inner.release(session_id)


class DenoiseGroupStage:
    """The DiT on every rank (sharded); rank 0 receives the base latent and either sends each latent chunk on to
    the decode group or, co-located, decodes it in place."""

    def __init__(self, ctx: WorkerContext, options: GroupOptions) -> None:
        self._options = options
        self._rank = ctx.rank
        self._world_size = ctx.world_size
        self._device = torch.device(ctx.device)
        shard = ModelShard(ctx.device, ctx.rank, ctx.world_size, options.dtype)
        self._denoiser = options.factory.denoiser(shard)
        self._denoise = DenoiseStage(self._denoiser)
        self._decode: tuple[DecodeStage, ChunkParts | None] | None = None
        self._colocated = options.role is GroupRole.DENOISE_DECODE
        self._stash = _LatentStash()
        if self._colocated and ctx.rank == 0:
            self._decode = _decode_stage(ctx, options, ModelShard(ctx.device, 0, 1, options.dtype))
        elif options.role is GroupRole.DENOISE and options.latent is None:
            raise ModelSessionError("a DiT group without co-located decode needs the latent channel")

    def ready_report(self) -> object:
        """`ReportsReady`: the denoiser's, when it has one (LingBot-World-Fast: its warm-up, `models/warmup.py`)."""
        return self._denoiser.ready_report() if isinstance(self._denoiser, ReportsReady) else None

    def process(self, call: StageCall) -> Mapping[str, object]:
        if call.stage_id == DECODE_STAGE:
            return self._decode_local(call)
        remote = call.inputs["condition"]
        if not isinstance(remote, RemoteCondition):
            raise ModelSessionError(f"denoise expects a RemoteCondition, got {type(remote).__name__}")
        base = None if remote.base is None else self._base_latent(call.session_id, remote.base)
        condition = ConditionArtifact(remote.condition, base, remote.config, remote.resume)
        latent = self._denoise.process(_with_inputs(call, {"condition": condition, CONTROL: call.inputs[CONTROL]}))
        artifact = latent["latent"]
        if self._rank != 0:
            return {}
        if not isinstance(artifact, LatentArtifact):
            raise ModelSessionError(f"denoise produced {type(artifact).__name__}, not a LatentArtifact")
        if self._colocated:
            self._stash.put(call.session_id, artifact.chunk_index, artifact.latent)
            local = LocalLatent(
                artifact.chunk_index,
                artifact.snapshot,
                artifact.config,
                artifact.denoise_s,
                artifact.record,
                artifact.prime,
            )
            return {"latent": local}
        channel = cast(WorkerTensorChannel, self._options.latent)
        started = time.perf_counter()
        key = _key(call.session_id, artifact.chunk_index, "latent")
        ref = channel.send(key, artifact.latent, timeout_s=self._options.channel_timeout_s)
        sent = RemoteLatent(
            artifact.chunk_index,
            ref,
            artifact.snapshot,
            artifact.config,
            denoise_s=artifact.denoise_s,
            send_s=time.perf_counter() - started,
            record=artifact.record,
            prime=artifact.prime,
        )
        return {"latent": sent}

    def _decode_local(self, call: StageCall) -> Mapping[str, object]:
        """A co-located decode call (lane 1): the chunk's latent from the stash (rank 0), decoded to frames."""
        if self._decode is None:
            if not self._colocated:
                raise ModelSessionError("decode called on a DiT group without co-located decode")
            return {}  # ranks 1..N-1: rank 0 decodes
        local = call.inputs["latent"]
        if not isinstance(local, LocalLatent):
            raise ModelSessionError(f"co-located decode expects a LocalLatent, got {type(local).__name__}")
        tensor = self._stash.take(call.session_id, local.chunk_index)
        latent = LatentArtifact(
            local.chunk_index, tensor, local.snapshot, local.config, local.denoise_s, local.record, local.prime
        )
        return {FRAMES: _decode(self._decode, call, latent)}

    def _base_latent(self, session_id: str, ref: TensorRef) -> torch.Tensor:
        """Rank 0 receives the base latent; with more ranks it broadcasts it (after a flag saying whether it could,
        so a failed receive fails the call on every rank instead of leaving the others in the broadcast)."""
        tensor: torch.Tensor | None = None
        failure: Exception | None = None
        if self._rank == 0:
            try:
                tensor = self._options.base.receive(ref, timeout_s=self._options.channel_timeout_s).to(self._device)
            except Exception as exc:
                failure = exc
        if self._world_size > 1:
            flag = torch.tensor([0.0 if failure is not None else 1.0], device=self._device)
            dist.broadcast(flag, src=0)
            if flag.item() == 0.0:
                if failure is not None:
                    raise failure
                raise ModelSessionError(f"session {session_id!r}: rank 0 could not receive the base latent")
            if tensor is None:
                tensor = torch.empty(ref.shape, dtype=getattr(torch, ref.dtype), device=self._device)
            dist.broadcast(tensor, src=0)
        if failure is not None:
            raise failure
        assert tensor is not None
        return tensor

    def release(self, session_id: str) -> None:
        self._denoise.release(session_id)
        self._stash.discard(session_id)
        if self._decode is not None:
            self._decode[0].release(session_id)
        if self._rank == 0:
            self._options.base.discard(_session_prefix(session_id))


class DecodeGroupStage:
    """VAE decode on rank 0 of its own group: receives each latent chunk from the latent channel."""

    def __init__(self, ctx: WorkerContext, options: GroupOptions) -> None:
        if options.latent is None:
            raise ModelSessionError("a decode group needs the latent channel")
        self._options = options
        self._channel = options.latent
        shard = ModelShard(ctx.device, ctx.rank, ctx.world_size, options.dtype)
        self._inner = _decode_stage(ctx, options, shard) if ctx.rank == 0 else None

    def process(self, call: StageCall) -> Mapping[str, object]:
        if self._inner is None:
            return {}
        remote = call.inputs["latent"]
        if not isinstance(remote, RemoteLatent):
            raise ModelSessionError(f"decode expects a RemoteLatent, got {type(remote).__name__}")
        started = time.perf_counter()
        tensor = self._channel.receive(remote.latent, timeout_s=self._options.channel_timeout_s)
        received = time.perf_counter() - started
        latent = LatentArtifact(
            remote.chunk_index, tensor, remote.snapshot, remote.config, remote.denoise_s, remote.record, remote.prime
        )
        return {FRAMES: _decode(self._inner, call, latent, {LATENT_CHANNEL_TIMING: remote.send_s + received})}

    def release(self, session_id: str) -> None:
        if self._inner is not None:
            self._inner[0].release(session_id)
            self._channel.discard(_session_prefix(session_id))


def build_group_stage(ctx: WorkerContext) -> Stage:
    """The `stage_factory` of every LingBot worker group: builds the group's stage from `ctx.options["group"]`."""
    options = ctx.options.get("group")
    if not isinstance(options, GroupOptions):
        raise TypeError(f"worker {ctx.name!r}: options['group'] must be GroupOptions, got {type(options).__name__}")
    if options.role is GroupRole.ENCODE:
        return EncodeGroupStage(ctx, options)
    if options.role is GroupRole.DECODE:
        return DecodeGroupStage(ctx, options)
    return DenoiseGroupStage(ctx, options)
