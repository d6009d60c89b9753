"""A session's attention state: the rolling self-attention KV cache (window + sink) and the prompt's text K/V.

The causal DiT generates a session chunk by chunk (3 latent frames each). Every layer keeps the keys and values
of the frames generated so far in `k`, `v` `[B, capacity_tokens, heads, head_dim]`, keys stored after RoPE. A
chunk's queries attend, without a mask, to everything in the cache up to and including the chunk itself:
bidirectional inside the chunk, causal across chunks (a chunk's K/V are final once it is done, later chunks never
write into them). The memory is allocated once, at creation, and never grows; so are the chunk's RoPE angles
(`chunk_angles`), which `begin_chunk` makes once for the chunk's forwards, on the device, from tables already there.

One chunk, driven by `sampler.denoise_chunk`:

    slot = cache.begin_chunk()        # evict / re-base if needed; reserve the chunk's tokens; make its angles
    model(x_t, t, ..., cache, slot)   # every denoising call overwrites the slot with its K/V, then attends
    model(x_0, 0, ..., cache, slot)   # the extra clean pass at t = 0 leaves the chunk's final K/V in the slot

Layout and eviction (a window of `window_frames` latent frames): the first `sink_frames` frames of the session fill
the sink, at the start of the buffer, and stay; every later frame goes to a ring of `window - sink` frames after
it, at the ring's head. When the ring is full the chunk writes over its oldest frames: eviction moves no data (the
sliding cache before it copied every frame after the evicted ones down, 46 GB per chunk at full size). A chunk
attends to the tokens `[0, slot.visible)`: the sink and the ring as they lie, which is the whole buffer once it is
full; unmasked attention does not depend on the order of its keys, so this equals attending to them oldest first
(within float rounding of the sum: ≤ 2.1e-7 relative over 42 chunks of the tiny model, `test_ring_cache.py`). A
chunk's tokens are written in one piece, or two where the ring wraps inside it (`slot.writes`). Without a window the
cache holds `max_frames` and a chunk past it raises `ModelContextExhaustedError` (reason `model_context_exhausted`).

Re-basing (endless sessions): the *distances* between frames the model sees must stay within its RoPE table
(`DiTConfig.rope_frames`, positions 0..1023); the first ~4 minutes use the absolute latent frame index, exactly the
reference's. When the next chunk would run off the table, the positions of every frame after the sink move back by
`rebase_frames` (default half the table, whole chunks; `slot.position` is the re-based position): distances within
the window are unchanged, and only the distance from the sink to the recent frames shrinks, back to one the model
already used earlier in the same session. With no sink the re-base changes nothing at all. The cache does this
without touching the ring: queries and keys are rotated at their absolute frame (`slot.rope_frame`; rotation angles
exist past the table), and the sink's keys are rotated `rebase_frames` later instead (rotation composes), which
makes exactly the re-based distances. So a re-base moves the sink's keys only (6 of 18 frames at the defaults, once
every 510 frames, ~2 min), where the sliding cache rotated every key after the sink. The cache stays bounded and the
session endless.

Concurrency: a cache belongs to one session and is used by one thread at a time (the denoise actor's).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipeline.lingbot.config import SPATIAL_COMPRESSION
from pipeline.lingbot.errors import ModelSessionError
from pipeline.lingbot.models.config import DiTConfig
from pipeline.lingbot.models.errors import ModelConfigError, ModelContextExhaustedError
from pipeline.lingbot.models.rope import Rope3D, RopeAngles

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
    """Where one chunk lives: the cache tokens its K/V are written to, what it attends to, its RoPE positions."""

    chunk_index: int
    first_frame: int
    """The chunk's absolute latent frame index in the session."""
    position: int
    """The re-based position of its first frame (`first_frame` until the first re-base): within the RoPE table."""
    rope_frame: int
    """The frame position its queries and keys are rotated at: `first_frame` (absolute, never re-based; the cache
    moves its sink instead, so every distance the chunk sees is the re-based one)."""
    frames: int
    writes: tuple[tuple[int, int], ...]
    """`(cache token, tokens)` pieces taking the chunk's tokens in order: one, or two where the ring wraps."""
    visible: int
    """The chunk attends to the cache's tokens `[0, visible)`, itself included (the whole buffer once it is full)."""
    write_index: torch.Tensor = field(compare=False, repr=False)
    """`writes` as a device tensor `[tokens]` (int64): the cache token of each of the chunk's tokens, in order. A view
    of one buffer the cache rewrites per chunk (so its address stays; read it before the next `begin_chunk`)."""

    @property
    def tokens(self) -> int:
        return sum(length for _, length in self.writes)


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
        patch_grid: tuple[int, int] | None = None,
    ) -> None:
        """`heads`: the heads this cache holds (a Ulysses rank's share, `parallel.py`); default all of them.
        `patch_grid`: a latent frame's `(rows, columns)` of patches; with it the cache makes each chunk's RoPE
        angles once, in `begin_chunk` (`chunk_angles`), as a forward needs (`LingBotFastDiT.new_cache` gives it)."""
        config.check_model(model)
        if frame_tokens < 1 or batch < 1:
            raise ModelConfigError(f"KVCache: frame_tokens and batch must be >= 1, got {frame_tokens}, {batch}")
        if patch_grid is not None and patch_grid[0] * patch_grid[1] != frame_tokens:
            raise ModelConfigError(f"KVCache: a {patch_grid} patch grid is not {frame_tokens} tokens per frame")
        self._config = config
        self._rope = Rope3D(model)
        self._frame_tokens = frame_tokens
        self._patch_grid = patch_grid
        heads = model.num_heads if heads is None else heads
        if not 1 <= heads <= model.num_heads:
            raise ModelConfigError(f"KVCache: heads must be in 1..{model.num_heads}, got {heads}")
        shape = (batch, config.capacity_frames * frame_tokens, heads, model.head_dim)
        self._layers = tuple(
            LayerKV(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
            for _ in range(model.num_layers)
        )
        # The chunk's RoPE angles, rewritten in place by every `begin_chunk`: one allocation for the session.
        self._rope.prepare(torch.device(device))  # the inverse frequencies on the device now: no chunk copies them
        angles_shape = (config.chunk_frames * frame_tokens, 1, model.head_dim // 2)
        self._cos = torch.zeros(angles_shape, device=device, dtype=torch.float32)
        self._sin = torch.zeros(angles_shape, device=device, dtype=torch.float32)
        # Where the chunk's tokens go, rewritten in place by every `begin_chunk` from `_token_range` (made once).
        chunk_tokens = config.chunk_frames * frame_tokens
        self._token_range = torch.arange(chunk_tokens, device=device)
        self._write_index = torch.zeros(chunk_tokens, device=device, dtype=torch.long)
        self._sink_frames = config.sink
        self._ring_frames = config.capacity_frames - self._sink_frames
        self._sink_stored = 0
        self._ring_stored = 0
        self._ring_head = 0
        self._chunks = 0
        self._next_frame = 0
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
    def patch_grid(self) -> tuple[int, int] | None:
        return self._patch_grid

    @property
    def layers(self) -> tuple[LayerKV, ...]:
        return self._layers

    def mark_static_addresses(self) -> None:
        """Tell torch.compile that the buffers a forward writes (every layer's K and V) or reads per chunk (the RoPE
        angles, the write index) keep their addresses for the cache's life (`torch._dynamo.mark_static_address`,
        unguarded: no recompile per layer or per session). Inductor's CUDA graphs skip a graph that writes into an
        input that is neither a parameter nor marked so; marked, they capture the block and read these buffers in
        place instead of copying them into the graph's own inputs at every replay (`compiled.py`, `max`)."""
        for layer in self._layers:
            torch._dynamo.mark_static_address(layer.k)
            torch._dynamo.mark_static_address(layer.v)
        for buffer in (self._cos, self._sin, self._write_index):
            torch._dynamo.mark_static_address(buffer)

    def begin_chunk(self, frames: int | None = None) -> CacheSlot:
        """Makes room for the next chunk (evicting, re-basing: neither moves a cached key but the sink's on a
        re-base), makes its RoPE angles, and returns its slot. Raises `ModelContextExhaustedError` when a cache
        without a window is full or its positions run out."""
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
            self._evicted += overflow  # the ring's oldest frames: the chunk writes over them
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
        writes = self._reserve(frames)
        slot = CacheSlot(
            chunk_index=self._chunks,
            first_frame=self._next_frame,
            position=position,
            rope_frame=self._next_frame,
            frames=frames,
            writes=writes,
            visible=self._stored * self._frame_tokens,
            write_index=self._make_write_index(writes),
        )
        self._make_angles(slot)
        self._next_frame += frames
        self._chunks += 1
        return slot

    def chunk_angles(self, slot: CacheSlot) -> RopeAngles:
        """The RoPE angles of the newest chunk's tokens (made by `begin_chunk`, read by each of its forwards)."""
        self.check_slot(slot)
        if self._patch_grid is None:
            raise ModelSessionError("this cache has no patch grid: make it with LingBotFastDiT.new_cache")
        tokens = slot.frames * self._frame_tokens
        return self._cos[:tokens], self._sin[:tokens]

    def continue_at(self, chunk_index: int, first_frame: int) -> None:
        """Make this fresh cache go on at chunk `chunk_index`, latent frame `first_frame` (a session re-seeded without
        its history, docs/continuity.md): it holds nothing yet, and the positions continue where the session's were
        (re-based as the session's would have been). Raises `ModelContextExhaustedError` where a cache without a window
        could not have got there."""
        if self._chunks or self._stored or self._next_frame:
            raise ModelSessionError("only a fresh cache can continue at a later chunk")
        self.skip_to(chunk_index, first_frame)

    def skip_to(self, chunk_index: int, first_frame: int) -> None:
        """Go on at chunk `chunk_index`, latent frame `first_frame`, past chunks that were not written here (a
        re-seed's prefill whose history lacks the chunks between the sink and the window's oldest, docs/continuity.md):
        what the cache holds stays, the positions continue as the session's did (re-based as it was). Raises
        `ModelSessionError` to go back, `ModelContextExhaustedError` where a cache without a window could not get
        there."""
        if chunk_index < self._chunks or first_frame < self._next_frame:
            raise ModelSessionError(
                f"chunk {chunk_index}, frame {first_frame}: the cache is at chunk {self._chunks}, frame "
                f"{self._next_frame} already"
            )
        chunk = self._config.chunk_frames
        if self._config.window_frames is None:
            if first_frame + chunk > min(self._config.capacity_frames, self._rope.frames):
                raise ModelContextExhaustedError(
                    f"latent frame {first_frame + chunk - 1} is past what a cache without a window holds"
                )
        else:
            shift = self._config.rebase_shift(self._rope.frames)
            while first_frame - self._offset + chunk > self._rope.frames:
                self._rebase(shift)  # moves the sink's keys where the cache holds a sink, as begin_chunk would
        self._chunks = chunk_index
        self._next_frame = first_frame

    def check_slot(self, slot: CacheSlot) -> None:
        """Only the newest slot may be written: an older one's tokens may have been overwritten."""
        if slot.chunk_index != self._chunks - 1:
            raise ModelSessionError(f"chunk slot {slot.chunk_index} is stale: the cache is at chunk {self._chunks - 1}")

    def tokens_oldest_first(self) -> torch.Tensor:
        """The cache tokens held, oldest frame first (the sink, then the ring from its oldest frame): the order the
        sliding cache kept them in. For comparing with it (tests, debugging); a forward never reorders."""
        ring = self._ring_stored
        oldest = (self._ring_head - ring) % self._ring_frames if ring else 0
        frames = [
            *range(self._sink_stored),
            *(self._sink_frames + (oldest + i) % self._ring_frames for i in range(ring)),
        ]
        tokens = [frame * self._frame_tokens + t for frame in frames for t in range(self._frame_tokens)]
        return torch.tensor(tokens, dtype=torch.long)

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

    @property
    def _stored(self) -> int:
        return self._sink_stored + self._ring_stored

    def _reserve(self, frames: int) -> tuple[tuple[int, int], ...]:
        """The cache frames the chunk's frames go to, in order: the sink's free frames first (a fresh cache), then
        the ring's, from its head on, over its oldest frames once it is full; merged into runs of tokens."""
        targets = []
        for _ in range(frames):
            if self._sink_stored < self._sink_frames:
                targets.append(self._sink_stored)
                self._sink_stored += 1
            else:
                targets.append(self._sink_frames + self._ring_head)
                self._ring_head = (self._ring_head + 1) % self._ring_frames
                self._ring_stored = min(self._ring_stored + 1, self._ring_frames)
        runs: list[list[int]] = []
        for target in targets:
            if runs and runs[-1][0] + runs[-1][1] == target:
                runs[-1][1] += 1
            else:
                runs.append([target, 1])
        return tuple((start * self._frame_tokens, length * self._frame_tokens) for start, length in runs)

    def _make_write_index(self, writes: tuple[tuple[int, int], ...]) -> torch.Tensor:
        taken = 0
        with torch.inference_mode():  # as `_make_angles`
            for start, tokens in writes:
                torch.add(self._token_range[:tokens], start, out=self._write_index[taken : taken + tokens])
                taken += tokens
        return self._write_index[:taken]

    def _make_angles(self, slot: CacheSlot) -> None:
        if self._patch_grid is None:
            return
        rows, cols = self._patch_grid
        device = self._cos.device
        with torch.inference_mode():  # the buffers may be inference tensors (a cache made under inference mode)
            cos, sin = self._rope.angles(slot.rope_frame, (slot.frames, rows, cols), device)
            tokens = cos.shape[0]
            self._cos[:tokens].copy_(cos)
            self._sin[:tokens].copy_(sin)

    def _rebase(self, shift: int) -> None:
        # Queries and the ring's keys keep their absolute positions; the sink moves `shift` frames later instead,
        # which shrinks the distance from the sink to every later frame by `shift`, as moving those back would.
        sink = self._sink_stored * self._frame_tokens
        with torch.inference_mode():
            for layer in self._layers if sink else ():
                layer.k[:, :sink] = self._rope.shift_frames(layer.k[:, :sink], shift)
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
