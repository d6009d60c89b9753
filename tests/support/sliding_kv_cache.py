"""The session KV cache as it was before the ring (issue #32): the window slides (every frame after the evicted ones
copied down) and a re-base rotates every cached key after the sink; each forward's RoPE angles are made at the
chunk's re-based position. Kept only as the reference the copy-free `KVCache` is proved against
(tests/unit/pipeline/lingbot/models/test_ring_cache.py): it duck-types what `LingBotFastDiT.forward` reads of a cache
(`layers`, `frame_tokens`, `patch_grid`, `check_slot`, `chunk_angles`) and produces the same `CacheSlot` record, with
one write piece and `visible` the end of the chunk."""

from __future__ import annotations

from typing import cast

import torch

from pipeline.lingbot.models import CacheConfig, DiTConfig, KVCache, LingBotFastDiT
from pipeline.lingbot.models.cache import CacheSlot, LayerKV
from pipeline.lingbot.models.rope import Rope3D, RopeAngles


class SlidingKVCache:
    """Today's cache before issue #32's ring, for windowed configs (no `continue_at`)."""

    def __init__(self, model: DiTConfig, config: CacheConfig, latent_height: int, latent_width: int) -> None:
        assert config.window_frames is not None, "the reference is for windowed caches"
        config.check_model(model)
        _, ph, pw = model.patch_size
        self.config = config
        self.patch_grid = (latent_height // ph, latent_width // pw)
        self.frame_tokens = self.patch_grid[0] * self.patch_grid[1]
        self._rope = Rope3D(model)
        shape = (1, config.capacity_frames * self.frame_tokens, model.num_heads, model.head_dim)
        self.layers = tuple(LayerKV(torch.zeros(shape), torch.zeros(shape)) for _ in range(model.num_layers))
        self._chunks = 0
        self._next_frame = 0
        self._stored = 0
        self._offset = 0
        self.rebases = 0

    def as_cache(self) -> KVCache:
        """This reference where a `KVCache` is expected (it has what a forward reads)."""
        return cast(KVCache, self)

    def begin_chunk(self, frames: int | None = None) -> CacheSlot:
        frames = self.config.chunk_frames if frames is None else frames
        overflow = self._stored + frames - self.config.capacity_frames
        if overflow > 0:
            self._evict(overflow)
        position = self._next_frame - self._offset
        if position + frames > self._rope.frames:
            shift = self.config.rebase_shift(self._rope.frames)
            self._rebase(shift)
            position -= shift
        start = self._stored * self.frame_tokens
        tokens = frames * self.frame_tokens
        slot = CacheSlot(
            chunk_index=self._chunks,
            first_frame=self._next_frame,
            position=position,
            rope_frame=position,
            frames=frames,
            writes=((start, tokens),),
            visible=start + tokens,
            write_index=torch.arange(start, start + tokens),
        )
        self._stored += frames
        self._next_frame += frames
        self._chunks += 1
        return slot

    def check_slot(self, slot: CacheSlot) -> None:
        assert slot.chunk_index == self._chunks - 1, "stale slot"

    def chunk_angles(self, slot: CacheSlot) -> RopeAngles:
        rows, cols = self.patch_grid
        return self._rope.angles(slot.rope_frame, (slot.frames, rows, cols), torch.device("cpu"))

    def _evict(self, frames: int) -> None:
        sink = self.config.sink * self.frame_tokens
        drop = frames * self.frame_tokens
        end = self._stored * self.frame_tokens
        for layer in self.layers:
            for tensor in (layer.k, layer.v):
                tensor[:, sink : end - drop] = tensor[:, sink + drop : end].clone()
        self._stored -= frames

    def _rebase(self, shift: int) -> None:
        sink = self.config.sink * self.frame_tokens
        end = self._stored * self.frame_tokens
        for layer in self.layers if end > sink else ():
            layer.k[:, sink:end] = self._rope.shift_frames(layer.k[:, sink:end], -shift)
        self._offset += shift
        self.rebases += 1


def sliding_cache(model: LingBotFastDiT, config: CacheConfig, latent_height: int, latent_width: int) -> KVCache:
    return SlidingKVCache(model.config, config, latent_height, latent_width).as_cache()
