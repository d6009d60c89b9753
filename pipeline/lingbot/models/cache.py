"""A session's attention state: the rolling self-attention KV cache (window + sink) and the prompt's text K/V.

The causal DiT generates a session chunk by chunk (3 latent frames each). Every layer keeps the keys and values
of the frames generated so far in `k`, `v` `[B, capacity_tokens, heads, head_dim]`, keys stored after RoPE. A
chunk's queries attend, without a mask, to everything in the cache up to and including the chunk itself:
bidirectional inside the chunk, causal across chunks (a chunk's K/V are final once it is done, later chunks never
write into them). The memory is allocated once, at creation, and never grows.

One chunk, driven by `sampler.denoise_chunk`:

    slot = cache.begin_chunk()        # evict / re-base if needed; reserve the chunk's tokens
    model(x_t, t, ..., cache, slot)   # every denoising call overwrites the slot with its K/V, then attends
    model(x_0, 0, ..., cache, slot)   # the extra clean pass at t = 0 leaves the chunk's final K/V in the slot

Eviction (a window of `window_frames` latent frames): when the next chunk does not fit, the oldest frames after the
first `sink_frames` are dropped and the rest slide down, so the cache always holds the sink followed by the most
recent frames. Without a window the cache holds `max_frames` and a chunk past it raises
`ModelContextExhaustedError` (reason `model_context_exhausted`).

Re-basing (endless sessions): RoPE positions are the absolute latent frame index while it fits the model's table
(`DiTConfig.rope_frames`, positions 0..1023), so the first ~4 minutes match the reference exactly. When the next
chunk would run off the table, every cached frame after the sink, and the positions of all later chunks, move back
by `rebase_frames` (default half the table, whole chunks): the cached keys are rotated in place (rotation composes),
so distances within the window, and what the chunk attends to there, are unchanged; only the distance from the sink
to the recent frames shrinks, back to one the model already used earlier in the same session. With no sink the
re-base changes nothing at all. The cache stays bounded and the session endless.

Concurrency: a cache belongs to one session and is used by one thread at a time (the denoise actor's).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.lingbot.config import SPATIAL_COMPRESSION
from pipeline.lingbot.errors import ModelSessionError
from pipeline.lingbot.models.config import DiTConfig
from pipeline.lingbot.models.errors import ModelConfigError, ModelContextExhaustedError
from pipeline.lingbot.models.rope import Rope3D

__all__ = [
    "PUBLISHED_CACHE",
    "CacheConfig",
    "CacheSlot",
    "CacheStatistics",
    "KVCache",
    "LayerKV",
    "TextKV",
    "bytes_per_session",
]


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """How much attention history a session keeps, in latent frames."""

    chunk_frames: int = 3
    window_frames: int | None = 18
    """Frames kept (sink included); `None`: no eviction, the cache holds `max_frames`."""
    sink_frames: int = 6
    """The first frames of the session, never evicted (ignored without a window)."""
    max_frames: int | None = None
    """Capacity without a window (required then, refused with one)."""
    rebase_frames: int | None = None
    """How far positions move back when the RoPE table ends; `None`: half the table, whole chunks."""

    def __post_init__(self) -> None:
        if self.chunk_frames < 1:
            raise ModelConfigError(f"CacheConfig: chunk_frames must be >= 1, got {self.chunk_frames}")
        if self.window_frames is None:
            if self.max_frames is None or self.max_frames < self.chunk_frames:
                raise ModelConfigError(
                    f"CacheConfig: without a window, max_frames must be >= chunk_frames ({self.chunk_frames}), "
                    f"got {self.max_frames}"
                )
        else:
            if self.max_frames is not None:
                raise ModelConfigError("CacheConfig: max_frames is only for a cache without a window")
            if self.sink_frames < 0 or self.sink_frames + self.chunk_frames > self.window_frames:
                raise ModelConfigError(
                    f"CacheConfig: need 0 <= sink_frames and sink_frames + chunk_frames <= window_frames, got "
                    f"sink {self.sink_frames}, chunk {self.chunk_frames}, window {self.window_frames}"
                )
        if self.rebase_frames is not None and self.rebase_frames < self.chunk_frames:
            raise ModelConfigError(f"CacheConfig: rebase_frames must be >= chunk_frames, got {self.rebase_frames}")

    @property
    def capacity_frames(self) -> int:
        capacity = self.window_frames if self.window_frames is not None else self.max_frames
        assert capacity is not None
        return capacity

    @property
    def sink(self) -> int:
        """Sink frames in effect (0 without a window)."""
        return self.sink_frames if self.window_frames is not None else 0

    def rebase_shift(self, rope_frames: int) -> int:
        if self.rebase_frames is not None:
            return self.rebase_frames
        return (rope_frames // 2) // self.chunk_frames * self.chunk_frames

    def check_model(self, model: DiTConfig) -> None:
        """Refuses a window the model's RoPE table cannot hold together with a re-base."""
        if self.window_frames is None:
            return
        shift = self.rebase_shift(model.rope_frames)
        if not self.chunk_frames <= shift <= model.rope_frames - self.window_frames:
            raise ModelConfigError(
                f"CacheConfig: a re-base by {shift} frames needs chunk_frames ({self.chunk_frames}) <= shift <= "
                f"rope_frames - window_frames ({model.rope_frames} - {self.window_frames})"
            )


PUBLISHED_CACHE = CacheConfig()
"""The published fast run: chunks of 3 latent frames, window 18, sink 6."""


@dataclass(frozen=True, slots=True)
class CacheSlot:
    """Where one chunk lives: its token range in the cache and its RoPE frame position."""

    chunk_index: int
    first_frame: int
    """The chunk's absolute latent frame index in the session."""
    position: int
    """The RoPE position of its first frame (`first_frame` until the first re-base)."""
    frames: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class CacheStatistics:
    chunks: int
    next_frame: int
    stored_frames: int
    capacity_frames: int
    evicted_frames: int
    rebases: int
    position_offset: int
    nbytes: int


class LayerKV:
    """One layer's cached keys (after RoPE) and values, `[B, capacity_tokens, heads, head_dim]`."""

    __slots__ = ("k", "v")

    def __init__(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k = k
        self.v = v


@dataclass(frozen=True, slots=True, eq=False)
class TextKV:
    """A prompt's cross-attention keys and values per layer, `[B, heads, text_len, head_dim]`: computed once."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.layers)


class KVCache:
    """The rolling self-attention cache of one session (see the module docstring for the policy)."""

    def __init__(
        self,
        model: DiTConfig,
        config: CacheConfig,
        *,
        frame_tokens: int,
        batch: int = 1,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        heads: int | None = None,
    ) -> None:
        """`heads`: the heads this cache holds (a Ulysses rank's share, `parallel.py`); default all of them."""
        config.check_model(model)
        if frame_tokens < 1 or batch < 1:
            raise ModelConfigError(f"KVCache: frame_tokens and batch must be >= 1, got {frame_tokens}, {batch}")
        self._config = config
        self._rope = Rope3D(model)
        self._frame_tokens = frame_tokens
        heads = model.num_heads if heads is None else heads
        if not 1 <= heads <= model.num_heads:
            raise ModelConfigError(f"KVCache: heads must be in 1..{model.num_heads}, got {heads}")
        shape = (batch, config.capacity_frames * frame_tokens, heads, model.head_dim)
        self._layers = tuple(
            LayerKV(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
            for _ in range(model.num_layers)
        )
        self._chunks = 0
        self._next_frame = 0
        self._stored = 0
        self._evicted = 0
        self._rebases = 0
        self._offset = 0

    @property
    def config(self) -> CacheConfig:
        return self._config

    @property
    def frame_tokens(self) -> int:
        return self._frame_tokens

    @property
    def layers(self) -> tuple[LayerKV, ...]:
        return self._layers

    def begin_chunk(self, frames: int | None = None) -> CacheSlot:
        """Makes room for the next chunk (evicting, re-basing) and returns its slot. Raises
        `ModelContextExhaustedError` when a cache without a window is full or its positions run out."""
        frames = self._config.chunk_frames if frames is None else frames
        if not 1 <= frames <= self._config.chunk_frames:
            raise ModelSessionError(f"a chunk has 1..{self._config.chunk_frames} latent frames, got {frames}")
        windowed = self._config.window_frames is not None
        overflow = self._stored + frames - self._config.capacity_frames
        if overflow > 0:
            if not windowed:
                raise ModelContextExhaustedError(
                    f"the cache holds {self._config.capacity_frames} latent frames and has no window; "
                    f"chunk {self._chunks} would need {self._stored + frames}"
                )
            self._evict(overflow)
        position = self._next_frame - self._offset
        if position + frames > self._rope.frames:
            if not windowed:
                raise ModelContextExhaustedError(
                    f"latent frame {self._next_frame + frames - 1} is past the RoPE table ({self._rope.frames} "
                    "positions) and a cache without a window cannot re-base"
                )
            shift = self._config.rebase_shift(self._rope.frames)
            self._rebase(shift)
            position -= shift
        start = self._stored * self._frame_tokens
        slot = CacheSlot(
            chunk_index=self._chunks,
            first_frame=self._next_frame,
            position=position,
            frames=frames,
            start=start,
            end=start + frames * self._frame_tokens,
        )
        self._stored += frames
        self._next_frame += frames
        self._chunks += 1
        return slot

    def continue_at(self, chunk_index: int, first_frame: int) -> None:
        """Make this fresh cache go on at chunk `chunk_index`, latent frame `first_frame` (a session re-seeded without
        its history, docs/continuity.md): it holds nothing yet, and the positions continue where the session's were
        (re-based as the session's would have been). Raises `ModelContextExhaustedError` where a cache without a window
        could not have got there."""
        if self._chunks or self._stored or self._next_frame:
            raise ModelSessionError("only a fresh cache can continue at a later chunk")
        if chunk_index < 0 or first_frame < 0:
            raise ModelSessionError(f"chunk {chunk_index}, frame {first_frame}: must not be negative")
        chunk = self._config.chunk_frames
        if self._config.window_frames is None:
            if first_frame + chunk > min(self._config.capacity_frames, self._rope.frames):
                raise ModelContextExhaustedError(
                    f"latent frame {first_frame + chunk - 1} is past what a cache without a window holds"
                )
        else:
            shift = self._config.rebase_shift(self._rope.frames)
            while first_frame - self._offset + chunk > self._rope.frames:
                self._offset += shift
                self._rebases += 1
        self._chunks = chunk_index
        self._next_frame = first_frame

    def check_slot(self, slot: CacheSlot) -> None:
        """Only the newest slot may be written: an older one's tokens may have moved."""
        if slot.chunk_index != self._chunks - 1:
            raise ModelSessionError(f"chunk slot {slot.chunk_index} is stale: the cache is at chunk {self._chunks - 1}")

    def statistics(self) -> CacheStatistics:
        return CacheStatistics(
            chunks=self._chunks,
            next_frame=self._next_frame,
            stored_frames=self._stored,
            capacity_frames=self._config.capacity_frames,
            evicted_frames=self._evicted,
            rebases=self._rebases,
            position_offset=self._offset,
            nbytes=sum(layer.k.nbytes + layer.v.nbytes for layer in self._layers),
        )

    def _evict(self, frames: int) -> None:
        # Slide everything after the evicted frames down onto them; the sink stays where it is.
        sink = self._config.sink * self._frame_tokens
        drop = frames * self._frame_tokens
        end = self._stored * self._frame_tokens
        for layer in self._layers:
            for tensor in (layer.k, layer.v):
                tensor[:, sink : end - drop] = tensor[:, sink + drop : end].clone()
        self._stored -= frames
        self._evicted += frames

    def _rebase(self, shift: int) -> None:
        sink = self._config.sink * self._frame_tokens
        end = self._stored * self._frame_tokens
        for layer in self._layers if end > sink else ():  # nothing after the sink (window = sink + chunk): no keys move
            layer.k[:, sink:end] = self._rope.shift_frames(layer.k[:, sink:end], -shift)
        self._offset += shift
        self._rebases += 1


def bytes_per_session(
    config: DiTConfig,
    height: int,
    width: int,
    dtype: torch.dtype,
    cache: CacheConfig = PUBLISHED_CACHE,
    *,
    batch: int = 1,
    ranks: int = 1,
) -> int:
    """Bytes a session holds on each denoise device for a `width`x`height` video: the self-attention cache
    (2 x layers x capacity_frames x frame_tokens x dim / ranks: a Ulysses rank caches its heads only) plus its
    prompt's text K/V (2 x layers x text_len x dim, on every rank), in `dtype`. 832x480, window 18, bf16, full size:
    23.0 GB + 0.42 GB on one rank, 2.88 GB + 0.42 GB on each of 8. Activations and weights are not included."""
    if height % SPATIAL_COMPRESSION or width % SPATIAL_COMPRESSION:
        raise ModelConfigError(f"{width}x{height} is not a multiple of {SPATIAL_COMPRESSION} pixels")
    tokens = config.frame_tokens(height // SPATIAL_COMPRESSION, width // SPATIAL_COMPRESSION)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if ranks < 1 or config.num_heads % ranks:
        raise ModelConfigError(f"{ranks} ranks do not divide the DiT's {config.num_heads} heads")
    cached = cache.capacity_frames * tokens * (config.dim // ranks)
    per_layer = 2 * batch * itemsize * (cached + config.text_len * config.dim)
    return config.num_layers * per_layer
