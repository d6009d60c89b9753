"""The model seam: three small protocols so VAE encode, DiT denoise and VAE decode can each live in its own actor.

Data flow of one session (every tensor float32 unless said otherwise; `h, w = H/8, W/8`; `cs` = chunk size):

    ReferenceEncoder.encode_reference(session, image [3, H, W] in [0, 1] | None)  -> base latent [16, T, h, w]
        once per session; `None` means the model's built-in default scene. `T >= 1` latent frames (the bounded
        reference prefix; the reference model returns T = 1).
    ChunkDenoiser.create_cache(session, config, base_latent)
        the base latent is handed over ONCE and stays resident on the denoise side (with any KV cache).
    ChunkDenoiser.denoise_chunk(session, chunk_index, cs, control: CameraChunk, prompt=text)
                                                                                     -> latent chunk [16, cs, h, w]
        the `condition` artifact carries only `ChunkCondition(chunk_index, chunk_size)`: the denoiser slices the
        resident base latent itself (`slice_condition`, repeating its tail when the prefix is shorter than the
        session) and builds the first-frame mask itself (`first_frame_mask`: only latent frame 0 of chunk 0 is the
        given reference frame). `control` is the chunk's camera (below). `prompt` is the chunk's text
        conditioning (below).
    ChunkDecoder.decode_chunk(session, chunk_index, latent [16, cs, h, w])           -> frames uint8 [T, H, W, 3]
        `T = 4*(cs-1)+1` for chunk 0 and `4*cs` after (`ChunkPlan.frames_in_chunk`), on the CPU, RGB.
    ProgressiveDecoder.decode_parts(session, chunk_index, latent [16, cs, h, w])  -> iterator of frames uint8
        the same chunk's frames one latent frame at a time (1 frame for latent frame 0 of chunk 0, 4 for every other),
        so the first can be played while the rest decode; their concatenation equals `decode_chunk`'s frames bit
        for bit. Optional: a decoder without it is decoded whole (`stages.DecodeStage`).

The camera (`control`). One contract for every model: `camera.CameraChunk`, LingBot-World-Fast's camera contract in
its defining data. Per latent frame of the chunk its pose relative to the previous latent frame's (`inverse(P[k-1]) @
P[k]`, float64 `[cs, 4, 4]`, translation divided by `translation_scale`, 4 x move_step), the pose the chunk moved from
(`start`, float64 `[4, 4]`, world = the session's reference camera) and the pinhole intrinsics at pixel resolution
(90 degree horizontal field of view). The denoise stage builds it from the control snapshot (`CameraController`,
`stages.py`), inside the DiT's process, so only the snapshot crosses a process boundary and every rank of a sharded
DiT builds the same one. LingBot-World-Fast turns it into its `[1, 384, cs, h, w]` Plücker map with
`camera.plucker_map`; the reference model renders from the world cameras it chains back (`video_frame_cameras`).
Why not the dense map itself: docs/lingbot-fast.md, "The camera contract".

Text conditioning (the prompt). Every `denoise_chunk` call names the prompt its chunk is generated from, as a plain
`str` keyword argument: "" means no prompt (the model's unconditioned / default text), anything else is at most
`MAX_PROMPT_BYTES` (512) UTF-8 bytes, already validated (`pipeline.bidirectional.check_prompt`) by whoever accepted it
(the REST create request, the `prompt` control message, a `lingstream generate` trace). The session policy takes the
newest prompt when it submits a chunk's control, so the prompt travels per chunk with the `control` artifact
(`ControlArtifact`, `stages.py`): a string pickles across the worker-process boundary, every rank of a sharded DiT
receives the same one, and a prompt change applies from the next chunk submitted on, never to a chunk already in flight.
Most chunks repeat the previous chunk's prompt, so a model that encodes text keeps its encoding per distinct prompt: a
real LingBot-class checkpoint runs its text encoder (umt5) once per new string and keeps the result (the DiT's per-layer
cross-attention K/V, `models.TextKV`) keyed by the string, per session (or in a small shared LRU), released with the
session's cache. Encoding a new prompt is part of that chunk's denoise call (and of its lease turn), so the encoder must
live where the denoiser runs (or be reached from it); the reference model derives a look (time of day, weather, palette)
from the words and caches it the same way (`looks.py`).

Each protocol has its own per-session `create_cache` / `release_cache`; `release_cache` is idempotent (an unknown id
is a no-op) so a failed release can be retried. Chunks of one session arrive in order 0, 1, 2, ... (the orchestrator
guarantees it); implementations may reject anything else with `ModelSessionError`. Calls on one object are serial
(one actor owns it); different sessions' caches are independent.

How a real LingBot-World checkpoint fills the seam (LingBot-World-Fast does: `pipeline.lingbot.models`,
`docs/lingbot-fast.md`). LingBot-World is built on Wan2.2 image-to-video: a causal 3D VAE with 16 latent channels,
8x spatial and 4x temporal compression (first latent frame = one video frame), and a DiT over 1x2x2 latent patches.
At the reference 832x480, 16 fps, a latent frame is 16 x 60 x 104.
- Encode: the Wan VAE encodes the reference image followed by zero frames for the bounded prefix, giving the
  16-channel `y` condition `[16, T, h, w]`; that is the base latent.
- Denoise: the DiT input per chunk is the noisy latent (16 channels) concatenated with a 4-channel first-frame mask
  (the 4 video frames folded per latent frame) and the sliced `y` (16 channels), 36 channels in all. The camera
  enters as a Plücker embedding: the official model builds a 6-channel ray map per latent frame at pixel resolution,
  folds each 8x8 patch onto channels (6*64 = 384 channels at latent resolution), patch-embeds it like the video
  tokens and injects it in every transformer block as a scale/shift modulation after self-attention. That map is
  `camera.plucker_map(control)`: the seam's `CameraChunk` is already in the checkpoint's own convention (framewise
  relative poses, normalised translation). The causal, distilled
  variant keeps a per-session KV cache of past chunks on the denoise side: that is `create_cache`'s state, sized by
  the session, and what admission counts.
- Decode: the Wan VAE decoder is causal in time and keeps a per-session feature cache between chunks, so decode has
  its own `create_cache`/`release_cache` and needs chunks in order. It decodes one latent frame per call anyway, so
  `decode_parts` (progressive decode) costs nothing more and gives the same frames.

Running in worker processes, sharded. With `processes` placement the parts are not handed over as objects: a
picklable `WorldModelFactory` builds each part inside the worker process that runs it, from a `ModelShard` (its
device, its rank and the world size of its group). What a checkpoint implements to run that way:
- The factory is a module-level class or function (spawned processes import it by name) and loads its weights
  in `encoder`/`denoiser`/`decoder`, on `shard.device`; it holds no open resources before that.
- Encode and decode are not sharded: they run on rank 0 of their group (a co-located decode runs on the DiT
  group's rank 0). `shard.world_size` is 1 for them unless decode is co-located, where ranks > 0 build no decoder.
- The denoiser is built on every rank of the DiT group. When `shard.world_size > 1` the worker has already joined the
  ranks into torch.distributed's default process group (gloo on CPU, nccl on CUDA), and every rank receives the same
  calls in the same order with the same arguments (`create_cache` with the whole base latent, `denoise_chunk` with the
  whole control tensor and the same prompt). Each rank computes its share and the ranks gather it, e.g. sequence
  parallelism: tokens split across ranks, all-to-all around attention (Ulysses) or a ring of KV blocks, each rank
  keeping the KV cache of its own tokens in its `create_cache` state. Rank 0 must return the whole latent chunk; what
  other ranks return is discarded. A collective must be reached by every rank in every call (a rank that skips one hangs
  the others until the worker's call timeout kills the group).
- Results must not depend on the world size beyond floating-point reassociation: the reference DiT splits latent
  rows across ranks and gathers them, and its 2-rank frames equal its 1-rank frames bit for bit (tested).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint
from pipeline.lingbot.errors import ChunkContractError, ModelInputError
from pipeline.lingbot.history import ChunkRecord, HistorySpec

__all__ = [
    "LATENT_CHANNELS",
    "ChunkCondition",
    "ChunkDecoder",
    "ChunkDenoiser",
    "HistoricDenoiser",
    "ModelShard",
    "ProgressiveDecoder",
    "ReferenceEncoder",
    "ReseedableDecoder",
    "ReseedableDenoiser",
    "WorldModel",
    "WorldModelFactory",
    "WorldModelParts",
    "first_frame_mask",
    "slice_condition",
    "validate_base_latent",
    "validate_control",
    "validate_latent_chunk",
]

LATENT_CHANNELS = 16


@dataclass(frozen=True, slots=True)
class ChunkCondition:
    """The `condition` artifact: which chunk to generate. It carries no tensor (the base latent is resident)."""

    chunk_index: int
    chunk_size: int

    def __post_init__(self) -> None:
        for name in ("chunk_index", "chunk_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ChunkContractError(f"{name} must be an int, got {type(value).__name__}")
        if self.chunk_index < 0:
            raise ChunkContractError(f"chunk_index must be >= 0, got {self.chunk_index}")
        if self.chunk_size < 1:
            raise ChunkContractError(f"chunk_size must be >= 1, got {self.chunk_size}")


@runtime_checkable
class ReferenceEncoder(Protocol):
    """VAE encode: the reference image, once per session."""

    def create_cache(self, session_id: str, config: LingBotSessionConfig) -> None: ...

    def encode_reference(self, session_id: str, image: torch.Tensor | None) -> torch.Tensor:
        """`image` float32 `[3, H, W]` in [0, 1] at the session resolution, or None for the default scene.

        Returns the base latent `[16, T, H/8, W/8]` float32, `T >= 1`.
        """
        ...

    def release_cache(self, session_id: str) -> None: ...


@runtime_checkable
class ChunkDenoiser(Protocol):
    """DiT denoise: one chunk of latent frames per call, conditioned on the resident base latent and the camera."""

    def create_cache(self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor) -> None: ...

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        """`control` the chunk's camera (`chunk_size` latent frames; see the module docstring); `prompt` the chunk's
        text conditioning ("" for none, else at most 512 UTF-8 bytes); returns the latent chunk `[16, chunk_size, h,
        w]` float32."""
        ...

    def release_cache(self, session_id: str) -> None: ...


@runtime_checkable
class ChunkDecoder(Protocol):
    """VAE decode: one latent chunk to video frames."""

    def create_cache(self, session_id: str, config: LingBotSessionConfig) -> None: ...

    def decode_chunk(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> torch.Tensor:
        """`latent` `[16, cs, h, w]`; returns uint8 RGB frames `[T, H, W, 3]` on the CPU (T per the chunk contract)."""
        ...

    def release_cache(self, session_id: str) -> None: ...


@runtime_checkable
class ProgressiveDecoder(ChunkDecoder, Protocol):
    """A `ChunkDecoder` that can also hand a chunk's frames over as they are decoded (progressive decode)."""

    def decode_parts(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> Iterator[torch.Tensor]:
        """`latent` `[16, cs, h, w]`; yields uint8 RGB frames `[T_i, H, W, 3]` on the CPU, one part per latent frame
        (`T_0 = 1` for chunk 0, 4 otherwise), whose concatenation equals `decode_chunk`'s frames bit for bit.

        The chunk counts as decoded (the next chunk may come) once the iterator is exhausted; a failure while
        iterating fails the chunk as a `decode_chunk` failure would, and a chunk left unfinished leaves the session's
        decode state unusable (its session fails and is released)."""
        ...


@runtime_checkable
class ReseedableDenoiser(ChunkDenoiser, Protocol):
    """A `ChunkDenoiser` that can rebuild a session's cache at a later chunk (re-seed after a worker loss,
    docs/continuity.md): the session then goes on at `resume.chunk_index` as if chunks 0 .. resume.chunk_index - 1
    had run here. The reference model needs nothing but the chunk index (its frames depend on the camera, the prompt,
    the seed and the chunk index only); a model with history rebuilds it here (e.g. a KV cache by a prefill)."""

    def reseed_cache(
        self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor, resume: ResumePoint
    ) -> None: ...


@runtime_checkable
class HistoricDenoiser(ChunkDenoiser, Protocol):
    """A `ChunkDenoiser` with history (LingBot-World-Fast's KV cache): after each chunk it says what a re-seed needs
    to rebuild that chunk's part of the history besides its latent (`chunk_record`), and which chunks to keep
    (`history_spec`); the stages carry the record and the latent to the session's checkpoint (docs/continuity.md)."""

    def history_spec(self, config: LingBotSessionConfig) -> HistorySpec: ...

    def chunk_record(self, session_id: str) -> ChunkRecord | None: ...


@runtime_checkable
class ReseedableDecoder(ChunkDecoder, Protocol):
    """A `ChunkDecoder` that can open a session at a later chunk (re-seed): the next chunk it decodes is
    `chunk_index`. `prime`: the latent frames before it (`[16, n, h, w]`, from the session's history), for a decoder
    that carries state between chunks; one without ignores it."""

    def reseed_cache(
        self, session_id: str, config: LingBotSessionConfig, chunk_index: int, prime: torch.Tensor | None = None
    ) -> None: ...


@dataclass(frozen=True, slots=True)
class ModelShard:
    """Where one model part runs: its device and its place among the ranks that run it together."""

    device: str = "cpu"
    """"cpu" or "cuda:N"."""
    rank: int = 0
    world_size: int = 1
    dtype: str = "float32"
    """The stage's configured dtype ("float32", "bfloat16", "float16"); the reference model computes in float32."""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ModelInputError(f"rank {self.rank} is outside 0..{self.world_size - 1}")


@runtime_checkable
class WorldModelFactory(Protocol):
    """Builds the parts of a world model inside the worker processes that run them (see the module docstring).

    Must be picklable by reference (a module-level class with picklable fields): it travels to every spawned rank.
    """

    def encoder(self, shard: ModelShard) -> ReferenceEncoder: ...

    def denoiser(self, shard: ModelShard) -> ChunkDenoiser: ...

    def decoder(self, shard: ModelShard) -> ChunkDecoder: ...


class WorldModel(Protocol):
    """A whole world model: its three stages, each placed in its own actor by the session graph."""

    @property
    def encoder(self) -> ReferenceEncoder: ...

    @property
    def denoiser(self) -> ChunkDenoiser: ...

    @property
    def decoder(self) -> ChunkDecoder: ...


@dataclass(frozen=True, slots=True)
class WorldModelParts:
    """A `WorldModel` assembled from three independent stage objects."""

    encoder: ReferenceEncoder
    denoiser: ChunkDenoiser
    decoder: ChunkDecoder


def slice_condition(base_latent: torch.Tensor, chunk_index: int, chunk_size: int) -> torch.Tensor:
    """Latent frames `[chunk_index*cs, (chunk_index+1)*cs)` of the base latent, repeating its last frame past its end.

    `base_latent` `[C, T, h, w]` -> `[C, chunk_size, h, w]` (a new tensor).
    """
    condition = ChunkCondition(chunk_index, chunk_size)
    if base_latent.ndim != 4 or base_latent.shape[1] < 1:
        raise ModelInputError(f"base latent must be [C, T>=1, h, w], got {list(base_latent.shape)}")
    start = condition.chunk_index * condition.chunk_size
    last = base_latent.shape[1] - 1
    index = torch.arange(start, start + condition.chunk_size, device=base_latent.device).clamp_(max=last)
    return base_latent.index_select(1, index)


def first_frame_mask(chunk_index: int, chunk_size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """`[chunk_size]` bool: True where the latent frame is the given reference frame (frame 0 of chunk 0 only)."""
    condition = ChunkCondition(chunk_index, chunk_size)
    mask = torch.zeros(condition.chunk_size, dtype=torch.bool, device=device)
    if condition.chunk_index == 0:
        mask[0] = True
    return mask


def validate_base_latent(base_latent: torch.Tensor, config: LingBotSessionConfig) -> None:
    expected = (LATENT_CHANNELS, config.latent_height, config.latent_width)
    shape = tuple(base_latent.shape)
    if base_latent.ndim != 4 or (shape[0], shape[2], shape[3]) != expected or shape[1] < 1:
        raise ModelInputError(
            f"base latent must be [{LATENT_CHANNELS}, T>=1, {config.latent_height}, {config.latent_width}], "
            f"got {list(shape)}"
        )
    _check_float_finite("base latent", base_latent)


def validate_control(control: CameraChunk, config: LingBotSessionConfig, chunk_size: int) -> None:
    """A `CameraChunk` of `chunk_size` latent frames for this session's frame size (re-checked: tensors are mutable)."""
    if not isinstance(control, CameraChunk):
        raise ModelInputError(f"control must be a CameraChunk, got {type(control).__name__}")
    control.check()
    if control.chunk_size != chunk_size:
        raise ModelInputError(f"control must have {chunk_size} latent frames, got {control.chunk_size}")
    expected = config.camera_intrinsics()
    if control.intrinsics != expected:
        raise ModelInputError(f"control intrinsics must be the session's {expected}, got {control.intrinsics}")


def validate_latent_chunk(latent: torch.Tensor, config: LingBotSessionConfig, chunk_size: int) -> None:
    expected = (LATENT_CHANNELS, chunk_size, config.latent_height, config.latent_width)
    if tuple(latent.shape) != expected:
        raise ModelInputError(f"latent chunk must be {list(expected)}, got {list(latent.shape)}")
    _check_float_finite("latent chunk", latent)


def _check_float_finite(name: str, tensor: torch.Tensor) -> None:
    if not tensor.is_floating_point():
        raise ModelInputError(f"{name} must be a floating-point tensor, got {tensor.dtype}")
    if not bool(torch.isfinite(tensor).all()):
        raise ModelInputError(f"{name} holds non-finite values")
