"""LingBot-World-Fast, written here from the published facts: the causal DiT, its per-session KV cache, the
four-step Fast sampler and strict checkpoint loading (`docs/lingbot-fast.md` has the facts and the contracts).

    model = load_dit(path, LINGBOT_FAST_14B, dtype=torch.bfloat16, device="cuda")
    text = model.encode_text(umt5_states)                       # once per prompt
    cache = model.new_cache(PUBLISHED_CACHE, latent_h, latent_w)  # once per session
    x0 = denoise_chunk(model, cache, text, condition, noise, generator, control)   # per chunk

`safetensors`, `diffusers` and `transformers` (the `lingbot` extra) are imported only by the functions that use
them, when called.
"""

from __future__ import annotations

from pipeline.lingbot.models.blocks import CameraModulation
from pipeline.lingbot.models.bundle import (
    DECODERS,
    DIT_DIR,
    DTYPES,
    TEXT_ENCODER_DIR,
    TOKENIZER_DIR,
    VAE_DIR,
    LingBotFastOptions,
    ModelDirSummary,
    check_model_dir,
    read_dit_config,
    write_tiny_model,
)
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
    compare_specs,
    expected_specs,
    load_dit,
    load_strict,
    locate_checkpoint,
    read_specs,
    write_tiny_checkpoint,
)
from pipeline.lingbot.models.compiled import COMPILE_MODES, CompileMode, compile_blocks
from pipeline.lingbot.models.config import LINGBOT_FAST_14B, TINY_DIT, DiTConfig
from pipeline.lingbot.models.dit import LingBotFastDiT
from pipeline.lingbot.models.errors import (
    CONTEXT_EXHAUSTED_REASON,
    CheckpointError,
    ModelConfigError,
    ModelContextExhaustedError,
)
from pipeline.lingbot.models.memory_plan import (
    PLAN_HEIGHT,
    PLAN_WIDTH,
    USABLE_SHARE,
    MemoryEstimate,
    device_bytes,
    estimate_memory,
    session_limits,
)
from pipeline.lingbot.models.parallel import DENOISE_RANKS_VARIABLE, SINGLE_RANK, Ulysses, check_parallel
from pipeline.lingbot.models.sampler import FAST_SCHEDULE, FastSchedule, denoise_chunk, fast_schedule, sample_chunk
from pipeline.lingbot.models.text import (
    DEFAULT_PROMPT,
    TEXT_ENCODER_WEIGHTS,
    TINY_UMT5_CONFIG,
    UMT5TextEncoder,
    load_text_encoder,
    write_tiny_text_encoder,
)
from pipeline.lingbot.models.tiny_decoder import (
    TINY_DECODER_DIR,
    StreamingTinyDecoder,
    TinyDecoderConfig,
    TinyVideoDecoder,
    check_tiny_decoder,
    load_tiny_decoder,
    write_tiny_decoder,
)
from pipeline.lingbot.models.vae import (
    DEFAULT_MAX_PREFIX_FRAMES,
    TINY_VAE_CONFIG,
    PrefixEncoding,
    StreamingVAE,
    VAEStatistics,
    load_vae,
    tiny_vae,
    write_tiny_vae,
)
from pipeline.lingbot.models.workload import (
    ChunkEstimate,
    Workload,
    WorkloadCounter,
    count_eviction,
    count_forward,
    estimate_table,
)
from pipeline.lingbot.models.world import (
    LingBotFastDecoder,
    LingBotFastDenoiser,
    LingBotFastEncoder,
    LingBotFastFactory,
    LingBotFastWorldModel,
)

__all__ = [
    "COMPILE_MODES",
    "CONTEXT_EXHAUSTED_REASON",
    "DECODERS",
    "DEFAULT_MAX_PREFIX_FRAMES",
    "DEFAULT_PROMPT",
    "DENOISE_RANKS_VARIABLE",
    "DIT_DIR",
    "DIT_INDEX",
    "DIT_WEIGHTS",
    "DTYPES",
    "FAST_SCHEDULE",
    "LINGBOT_FAST_14B",
    "PLAN_HEIGHT",
    "PLAN_WIDTH",
    "PUBLISHED_CACHE",
    "SINGLE_RANK",
    "TEXT_ENCODER_DIR",
    "TEXT_ENCODER_WEIGHTS",
    "TINY_DECODER_DIR",
    "TINY_DIT",
    "TINY_UMT5_CONFIG",
    "TINY_VAE_CONFIG",
    "TOKENIZER_DIR",
    "USABLE_SHARE",
    "VAE_DIR",
    "CacheConfig",
    "CacheSlot",
    "CacheStatistics",
    "CameraModulation",
    "CheckpointError",
    "CheckpointLayout",
    "ChunkEstimate",
    "CompileMode",
    "DiTConfig",
    "FastSchedule",
    "KVCache",
    "LayerKV",
    "LingBotFastDecoder",
    "LingBotFastDenoiser",
    "LingBotFastDiT",
    "LingBotFastEncoder",
    "LingBotFastFactory",
    "LingBotFastOptions",
    "LingBotFastWorldModel",
    "MemoryEstimate",
    "ModelConfigError",
    "ModelContextExhaustedError",
    "ModelDirSummary",
    "PrefixEncoding",
    "StreamingTinyDecoder",
    "StreamingVAE",
    "TensorSpec",
    "TextKV",
    "TinyDecoderConfig",
    "TinyVideoDecoder",
    "UMT5TextEncoder",
    "Ulysses",
    "VAEStatistics",
    "Workload",
    "WorkloadCounter",
    "bytes_per_session",
    "check_model_dir",
    "check_parallel",
    "check_tiny_decoder",
    "compare_specs",
    "compile_blocks",
    "count_eviction",
    "count_forward",
    "denoise_chunk",
    "device_bytes",
    "estimate_memory",
    "estimate_table",
    "expected_specs",
    "fast_schedule",
    "load_dit",
    "load_strict",
    "load_text_encoder",
    "load_tiny_decoder",
    "load_vae",
    "locate_checkpoint",
    "read_dit_config",
    "read_specs",
    "sample_chunk",
    "session_limits",
    "tiny_vae",
    "write_tiny_checkpoint",
    "write_tiny_decoder",
    "write_tiny_model",
    "write_tiny_text_encoder",
    "write_tiny_vae",
]
