"""How many LingBot-World-Fast sessions fit on a device: the weights and what the worker needs once, plus each
session's caches.

    model bytes    = (DiT + VAE + umt5 encoder parameters) x the run dtype's size
    once bytes     = one chunk's camera modulation + the DiT forward's, a decoder step's and the prefix encode's
                     transients + the CUDA context (`memory_parts.py`: measured on `meta` from the real shapes; the
                     context a stated constant)
    session bytes  = the DiT's self-attention cache (window x tokens per latent frame, K and V, every layer) plus its
                     prompt's cross-attention K/V (`cache.bytes_per_session`) plus the VAE decoder's feature cache
                     (`memory_parts.decoder_memory`; the tiny decoder's memory with `LINGSTREAM_DECODER=tiny`), at the
                     planning resolution
    fits           = floor((usable - model bytes - once bytes) / session bytes),  usable = device x `USABLE_SHARE` (0.9)

Everything is counted on the denoise device (the threads placement puts every part there; with processes the VAE
may sit elsewhere, so the estimate errs on the safe side), and the three transients as if they coincided (a prefix
encode for a new session while another session's chunk denoises and the previous one decodes). With a DiT group of
P ranks (`LINGSTREAM_DENOISE_RANKS`, Ulysses context parallelism, `parallel.py`) the figures are per rank: every
rank holds the whole DiT (and rank 0 the umt5 encoder and the VAE, counted as if on every rank), but a session's
self-attention cache, the camera modulation and the forward's transient divide by P (rank 0's share measured); the
prompt's text K/V stay whole on every rank. The 10% held back is for the allocator's rounding and fragmentation
(`expandable_segments` is set for CUDA, `service/workers.py`).

The planning resolution is the model's published 832x480 (1 560 tokens per latent frame). Full size, window 18,
bf16: 48.7 GB of weights (the DiT 37.1), 12.3 GB once (camera modulation 3.8, DiT forward 1.1, decode 3.7, encode
2.7, context 1.0) and 25.3 GB per session (attention 23.4, decoder cache 1.9), so one 80 GiB H100 (76.5 GB usable)
holds no session at this window (86.4 GB with one: the issue's "≈78-80 GB" without the transients) and needs a
shorter window or a DiT group; an H200 (141 GB) holds two. A session asked at a larger size would need
proportionally more (1280x720: 2.3x), so `session_limits` refuses more pixels than the planning resolution at
create (422), as it refuses a chunk the cache window cannot hold beside its sink.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from pipeline.lingbot.config import SPATIAL_COMPRESSION, LingBotSessionConfig
from pipeline.lingbot.errors import SessionConfigError
from pipeline.lingbot.models.bundle import LingBotFastOptions, ModelDirSummary
from pipeline.lingbot.models.cache import bytes_per_session
from pipeline.lingbot.models.memory_parts import WorkerMemory, worker_memory
from pipeline.lingbot.models.parallel import DENOISE_RANKS_VARIABLE, check_parallel

__all__ = [
    "PLAN_HEIGHT",
    "PLAN_WIDTH",
    "USABLE_SHARE",
    "MemoryEstimate",
    "device_bytes",
    "estimate_memory",
    "session_limits",
]

PLAN_WIDTH, PLAN_HEIGHT = 832, 480
PATCH_PIXELS = 16
"""Video pixels per DiT token along each axis: 8x VAE compression, then 2x2 latent patches."""
USABLE_SHARE = 0.9


@dataclass(frozen=True, slots=True)
class MemoryEstimate:
    device: str
    dtype: str
    model_bytes: int
    session_bytes: int
    device_bytes: int
    usable_bytes: int
    fits_sessions: int
    """Sessions that fit beside the weights (0: not even one)."""
    width: int
    height: int
    denoise_ranks: int = 1
    """P: `session_bytes` is what each of the DiT group's ranks holds per session."""
    once_bytes: int = 0
    """What the worker needs once besides the weights (`parts.once_bytes`)."""
    attention_cache_bytes: int = 0
    """The part of `session_bytes` that is the DiT's K/V (self-attention cache and the prompt's)."""
    parts: WorkerMemory | None = field(default=None, compare=False)

    def total_bytes(self, sessions: int) -> int:
        return self.model_bytes + self.once_bytes + sessions * self.session_bytes

    def to_mapping(self) -> dict[str, object]:
        parts = self.parts
        return {
            "device": self.device,
            "dtype": self.dtype,
            "model_bytes": self.model_bytes,
            "session_bytes": self.session_bytes,
            "once_bytes": self.once_bytes,
            "device_bytes": self.device_bytes,
            "usable_bytes": self.usable_bytes,
            "fits_sessions": self.fits_sessions,
            "resolution": f"{self.width}x{self.height}",
            "denoise_ranks": self.denoise_ranks,
            "parts": {
                "attention_cache_bytes": self.attention_cache_bytes,
                "decoder_cache_bytes": parts.decoder_cache_bytes if parts else 0,
                "camera_modulation_bytes": parts.camera_modulation_bytes if parts else 0,
                "dit_transient_bytes": parts.dit_transient_bytes if parts else 0,
                "decode_transient_bytes": parts.decode_transient_bytes if parts else 0,
                "encode_transient_bytes": parts.encode_transient_bytes if parts else 0,
                "context_bytes": parts.context_bytes if parts else 0,
            },
        }


def device_bytes(device: str) -> int:
    """The device's memory: a CUDA device's total, or the machine's physical RAM for the CPU."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.get_device_properties(torch.device(device)).total_memory)
    import os

    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def estimate_memory(
    summary: ModelDirSummary,
    options: LingBotFastOptions,
    device: str,
    *,
    capacity: int | None = None,
    width: int = PLAN_WIDTH,
    height: int = PLAN_HEIGHT,
) -> MemoryEstimate:
    """The estimate for `summary`'s model run as `options` say on `device` (`capacity`: its bytes, measured when
    None)."""
    dtype = options.torch_dtype(device)
    itemsize = torch.empty((), dtype=dtype).element_size()
    model = itemsize * (summary.dit_parameters + summary.vae_parameters + summary.text_encoder_parameters)
    ranks = options.denoise_ranks
    check_parallel(
        summary.dit, ranks, summary.dit.frame_tokens(height // SPATIAL_COMPRESSION, width // SPATIAL_COMPRESSION)
    )
    cache = options.cache_config(3)
    attention = bytes_per_session(summary.dit, height, width, dtype, cache, ranks=ranks)
    cuda = torch.device(device).type == "cuda"
    tiny = summary.tiny_decoder if options.decoder == "tiny" else None
    parts = worker_memory(
        summary.dit, summary.vae_config or {}, width, height, dtype, cache, ranks=ranks, cuda=cuda, tiny_decoder=tiny
    )
    session = attention + parts.decoder_cache_bytes
    once = parts.once_bytes
    total = device_bytes(device) if capacity is None else capacity
    usable = int(total * USABLE_SHARE)
    fits = max(0, (usable - model - once) // session) if session > 0 else 0
    return MemoryEstimate(
        device=device,
        dtype=str(dtype).removeprefix("torch."),
        model_bytes=model,
        session_bytes=session,
        device_bytes=total,
        usable_bytes=usable,
        fits_sessions=int(fits),
        width=width,
        height=height,
        denoise_ranks=ranks,
        once_bytes=once,
        attention_cache_bytes=attention,
        parts=parts,
    )


def session_limits(options: LingBotFastOptions) -> Callable[[LingBotSessionConfig], None]:
    """The check `LingBotService(check_config=...)` runs on every create: a session may not ask for more pixels than
    the memory estimate planned with (832x480), nor a chunk the cache window cannot hold beside its sink, nor a size
    whose latent frames' tokens the DiT group (P ranks) does not divide. Raises `SessionConfigError` (422
    `invalid_config`) naming the field."""
    window, sink, ranks = options.window_frames, options.sink_frames, options.denoise_ranks

    def check(config: LingBotSessionConfig) -> None:
        if config.width * config.height > PLAN_WIDTH * PLAN_HEIGHT:
            raise SessionConfigError(
                f"width x height: {config.width}x{config.height} is more pixels than the {PLAN_WIDTH}x{PLAN_HEIGHT} "
                "this lingbot-fast worker plans its memory for"
            )
        if sink + config.chunk_size > window:
            raise SessionConfigError(
                f"chunk_size: {config.chunk_size} latent frames do not fit the model's attention window "
                f"({window} frames, {sink} of them the sink): at most {window - sink} (the model was trained with 3)"
            )
        tokens = (config.height // PATCH_PIXELS) * (config.width // PATCH_PIXELS)
        if tokens % ranks:
            raise SessionConfigError(
                f"width x height: {config.width}x{config.height} makes {tokens} tokens per latent frame, which the "
                f"DiT's {ranks} ranks ({DENOISE_RANKS_VARIABLE}) cannot split evenly: the tokens per frame, "
                f"(height / {PATCH_PIXELS}) x (width / {PATCH_PIXELS}), must divide by {ranks}"
            )

    return check
