"""LingBot-World-Fast, written here from the published facts: the causal DiT, its per-session KV cache, the
four-step Fast sampler and strict checkpoint loading (`docs/lingbot-fast.md` has the facts and the contracts).

    model = load_dit(path, LINGBOT_FAST_14B, dtype=torch.bfloat16, device="cuda")
    text = model.encode_text(umt5_states)                       # once per prompt
    cache = model.new_cache(PUBLISHED_CACHE, latent_h, latent_w)  # once per session
    x0 = denoise_chunk(model, cache, text, condition, noise, generator, control)   # per chunk

`safetensors` (the `lingbot` extra) is imported only by the checkpoint functions, when called.
"""

from __future__ import annotations

from pipeline.lingbot.models.cache import (
    PUBLISHED_CACHE,
    CacheConfig,
    CacheSlot,
    CacheStatistics,
    KVCache,
    LayerKV,
    TextKV,
    bytes_per_session,
)
from pipeline.lingbot.models.checkpoint import (
    DIT_INDEX,
    DIT_WEIGHTS,
    CheckpointLayout,
    TensorSpec,
    expected_specs,
    load_dit,
    locate_checkpoint,
    read_specs,
    write_tiny_checkpoint,
)
from pipeline.lingbot.models.config import LINGBOT_FAST_14B, TINY_DIT, DiTConfig
from pipeline.lingbot.models.dit import LingBotFastDiT
from pipeline.lingbot.models.errors import (
    CONTEXT_EXHAUSTED_REASON,
    CheckpointError,
    ModelConfigError,
    ModelContextExhaustedError,
)
from pipeline.lingbot.models.sampler import FAST_SCHEDULE, FastSchedule, denoise_chunk, fast_schedule, sample_chunk

__all__ = [
    "CONTEXT_EXHAUSTED_REASON",
    "DIT_INDEX",
    "DIT_WEIGHTS",
    "FAST_SCHEDULE",
    "LINGBOT_FAST_14B",
    "PUBLISHED_CACHE",
    "TINY_DIT",
    "CacheConfig",
    "CacheSlot",
    "CacheStatistics",
    "CheckpointError",
    "CheckpointLayout",
    "DiTConfig",
    "FastSchedule",
    "KVCache",
    "LayerKV",
    "LingBotFastDiT",
    "ModelConfigError",
    "ModelContextExhaustedError",
    "TensorSpec",
    "TextKV",
    "bytes_per_session",
    "denoise_chunk",
    "expected_specs",
    "fast_schedule",
    "load_dit",
    "locate_checkpoint",
    "read_specs",
    "sample_chunk",
    "write_tiny_checkpoint",
]
