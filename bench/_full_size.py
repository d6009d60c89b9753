"""The GPU-truth harness behind `python -m bench.lingbot --random-full-size`: LingBot-World-Fast at its published size
with random weights, so a GPU machine measures the real model's speed without downloading anything.

On CUDA: the full-size DiT (18.5 B, `LINGBOT_FAST_14B`), a Wan2.1-config VAE (`AutoencoderKLWan()`, 127 M) and a
umt5-xxl-config encoder (5.7 B) are built on `meta` and moved to the device with `to_empty`, then given cheap random
bf16 weights (scaled by fan-in, so activations stay O(1)); the umt5 encodes one prompt (timed) and is freed before
the session's 23 GB KV cache is allocated. One session at 832x480 then generates chunks as the service does
(`sampler.denoise_chunk`: 4 steps and the clean pass over the rolling cache, window 18 / sink 6, camera input; the
streamed VAE decode of the chunk's 3 latent frames): `WARM_CHUNKS` chunks fill the window (and warm cuBLAS), the next
`chunks` are measured — steady state, every one evicting. Times are CUDA events: each DiT forward, the denoise, the
decode, the chunk. One more chunk runs under `torch.profiler`: its kernels' device time is split GEMM / attention /
other by kernel name. `max_memory_allocated`, the SDPA backend PyTorch picks for the self-attention shapes, and
FlashDreams' published figures sit beside ours.

Without CUDA the same code runs the tiny model (`TINY_DIT`, the tiny VAE and umt5) on the CPU with host timers, so the
harness is tested here (`tests/bench/test_full_size.py`); its times say nothing about a GPU. The CPU run also reports
the workload counter's figures for the full-size forward (`meta_forward_*`, counted on `meta`) and the per-P table
of **estimates** derived from them (`models/workload.py`).

DENOISE_RANKS P > 1 needs the DiT's context parallelism; until the DiT has it, every P > 1 is listed in
`skipped_ranks` with the reason, and only P = 1 is measured.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from pipeline.lingbot.models import (
    LINGBOT_FAST_14B,
    PUBLISHED_CACHE,
    TINY_DIT,
    TINY_UMT5_CONFIG,
    TINY_VAE_CONFIG,
    DiTConfig,
    LingBotFastDiT,
    StreamingVAE,
    denoise_chunk,
)
from pipeline.lingbot.models.workload import (
    FLASHDREAMS_MS_PER_CHUNK,
    calibration_forward,
    count_eviction,
    count_forward,
    estimate_table,
)

__all__ = ["WARM_CHUNKS", "FullSize", "full_size"]

WARM_CHUNKS = PUBLISHED_CACHE.capacity_frames // PUBLISHED_CACHE.chunk_frames
"""Chunks that fill the window (18 latent frames, 3 per chunk): every later chunk is steady state."""
FRAMES_PER_CHUNK = 4 * PUBLISHED_CACHE.chunk_frames
UMT5_XXL: dict[str, Any] = {
    "vocab_size": 256384,
    "d_model": 4096,
    "d_kv": 64,
    "d_ff": 10240,
    "num_layers": 24,
    "num_heads": 64,
    "relative_attention_num_buckets": 32,
    "relative_attention_max_distance": 128,
    "feed_forward_proj": "gated-gelu",
    "is_encoder_decoder": False,
    "use_cache": False,
    "tie_word_embeddings": False,
}
"""umt5-xxl's encoder (the text encoder LingBot-World reads), as transformers' `UMT5Config`."""
PROMPT_TOKENS = 24
"""Tokens of the random prompt (the rest of the 512 are padding, zeroed as `text.py` does)."""
CP_SKIP_REASON = (
    "the LingBot-World-Fast DiT has no context parallelism yet (issue #31): a DiT group of more than one rank is "
    "refused, so only DENOISE_RANKS=1 is measured"
)


@dataclasses.dataclass(frozen=True, slots=True)
class FullSize:
    """What one harness run builds: the real sizes on CUDA, the tiny ones on the CPU."""

    dit: DiTConfig
    vae: dict[str, Any]
    umt5: dict[str, Any]
    width: int
    height: int
    dtype: torch.dtype

    @classmethod
    def for_device(cls, device: torch.device) -> FullSize:
        if device.type == "cuda":
            return cls(LINGBOT_FAST_14B, {}, UMT5_XXL, 832, 480, torch.bfloat16)
        tiny_umt5 = {"vocab_size": 300, "d_model": TINY_DIT.text_dim, **TINY_UMT5_CONFIG}
        return cls(TINY_DIT, TINY_VAE_CONFIG, tiny_umt5, 64, 32, torch.float32)


# --- clocks -------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    """A point in the device's work: a recorded CUDA event on a GPU, the host clock (ms) on the CPU."""

    host_ms: float
    event: Any = None


class _Marks:
    """Points in the device's work, read only after the run (no sync inside the measured chunks): CUDA events on a
    GPU, host time on the CPU (where a call returns when its work is done)."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self._device = device

    def mark(self) -> Point:
        now = time.perf_counter() * 1000
        if not self._cuda:
            return Point(now)
        event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self._device))
        return Point(now, event)

    def finish(self) -> None:
        """Waits for the device, so every point so far can be read."""
        if self._cuda:
            torch.cuda.synchronize(self._device)


def between(start: Point, end: Point) -> float:
    """Milliseconds of device work from `start` to `end` (after `_Marks.finish`)."""
    if start.event is not None and end.event is not None:
        return float(start.event.elapsed_time(end.event))
    return end.host_ms - start.host_ms


@contextmanager
def _forward_marks(model: nn.Module, marks: _Marks, into: list[tuple[Point, Point]]) -> Iterator[None]:
    """Every forward of `model` while inside: a (start, end) pair of marks appended to `into`."""
    pending: list[Point] = []

    def before(module: nn.Module, args: Any) -> None:
        pending.append(marks.mark())

    def after(module: nn.Module, args: Any, output: Any) -> None:
        into.append((pending.pop(), marks.mark()))

    handles = [model.register_forward_pre_hook(before), model.register_forward_hook(after)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


# --- building ------------------------------------------------------------------------------------------------------


def random_init_(module: nn.Module, seed: int) -> None:
    """Cheap random weights in place: matrices and kernels N(0, 1/fan_in), norms' scales (1-D, or the VAE's
    `gamma`) 1, biases 0."""
    device = next(module.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("bias"):
                param.zero_()
            elif name.endswith("gamma") or param.ndim < 2:
                param.fill_(1.0)
            else:
                fan_in = max(1, param[0].numel())
                param.normal_(0.0, fan_in**-0.5, generator=generator)
        for buffer in module.buffers():
            if buffer.is_floating_point():
                buffer.zero_()


def _materialise(module: nn.Module, device: torch.device, dtype: torch.dtype, seed: int) -> nn.Module:
    module = module.to_empty(device=device)
    if next(module.parameters()).dtype != dtype:  # diffusers warns on every cast, even a no-op one
        module = module.to(dtype)
    random_init_(module, seed)
    return module.eval().requires_grad_(False)


def build_dit(sizes: FullSize, device: torch.device, seed: int = 0) -> LingBotFastDiT:
    with torch.device("meta"):
        dit = LingBotFastDiT(sizes.dit)
    built = _materialise(dit, device, sizes.dtype, seed)
    assert isinstance(built, LingBotFastDiT)
    return built


def build_vae(sizes: FullSize, device: torch.device, seed: int = 1) -> StreamingVAE:
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        vae = AutoencoderKLWan(**sizes.vae)
    return StreamingVAE(_materialise(vae, device, sizes.dtype, seed), device=device, dtype=sizes.dtype)


def encode_prompt(sizes: FullSize, device: torch.device, marks: _Marks, seed: int = 2) -> tuple[torch.Tensor, float]:
    """A random prompt's umt5 states `[1, text_len, text_dim]` (zero past its tokens) and the encode's ms; the
    encoder is freed before returning."""
    from transformers import UMT5Config, UMT5EncoderModel

    config = UMT5Config(pad_token_id=0, eos_token_id=1, **sizes.umt5)
    with torch.device("meta"):
        encoder = UMT5EncoderModel(config)
    encoder = _materialise(encoder, device, sizes.dtype, seed)
    assert isinstance(encoder, UMT5EncoderModel)
    encoder.encoder.embed_tokens = encoder.shared
    text_len = sizes.dit.text_len
    ids = torch.zeros(1, text_len, dtype=torch.long, device=device)
    mask = torch.zeros(1, text_len, dtype=torch.long, device=device)
    tokens = min(PROMPT_TOKENS, text_len)
    generator = torch.Generator(device=device).manual_seed(seed)
    ids[0, :tokens] = torch.randint(2, config.vocab_size, (tokens,), generator=generator, device=device)
    mask[0, :tokens] = 1
    with torch.inference_mode():
        start = marks.mark()
        states = encoder(input_ids=ids, attention_mask=mask).last_hidden_state.clone()
        states[:, tokens:] = 0
        end = marks.mark()
    marks.finish()
    del encoder
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return states, between(start, end)


def sdpa_backend(sizes: FullSize, device: torch.device) -> str:
    """The SDPA backend PyTorch picks for a steady-state self-attention (4 680 queries over 28 080 keys at full
    size), or "math/cpu" where no fused choice applies."""
    if device.type != "cuda":
        return "cpu"
    from torch.nn.attention import SDPBackend

    config = sizes.dit
    tokens = config.frame_tokens(sizes.height // 8, sizes.width // 8)
    chunk, window = tokens * PUBLISHED_CACHE.chunk_frames, tokens * PUBLISHED_CACHE.capacity_frames
    q = torch.empty(1, config.num_heads, chunk, config.head_dim, device=device, dtype=sizes.dtype)
    kv = torch.empty(1, config.num_heads, window, config.head_dim, device=device, dtype=sizes.dtype)
    choice = torch._fused_sdp_choice(q, kv, kv)
    return SDPBackend(choice).name


# --- running -------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Session:
    dit: LingBotFastDiT
    vae: StreamingVAE
    text: Any
    cache: Any
    generator: torch.Generator
    latent_h: int
    latent_w: int


def _chunk(session: _Session, marks: _Marks, forwards: list[tuple[Point, Point]]) -> dict[str, Point]:
    dit, config = session.dit, session.dit.config
    device = dit.device
    frames = PUBLISHED_CACHE.chunk_frames
    shape = (1, frames, session.latent_h, session.latent_w)
    g = session.generator
    points: dict[str, Point] = {"start": marks.mark()}
    with torch.inference_mode():
        condition = torch.randn((1, config.in_dim - config.out_dim, *shape[1:]), generator=g, device=device)
        control = torch.randn((1, config.control_map_channels, *shape[1:]), generator=g, device=device)
        noise = torch.randn((1, config.out_dim, *shape[1:]), generator=g, device=device)
    with _forward_marks(dit, marks, forwards):
        x0 = denoise_chunk(dit, session.cache, session.text, condition, noise, g, control)
    points["denoised"] = marks.mark()
    session.vae.decode_chunk("bench", x0[0])
    points["decoded"] = marks.mark()
    return points


def _profile_split(session: _Session, marks: _Marks) -> dict[str, float]:
    """One chunk under `torch.profiler`: its CUDA kernels' device time (ms) split GEMM / attention / other."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _chunk(session, marks, [])
        marks.finish()
    split = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        device_us = float(event.self_device_time_total)
        if device_us <= 0:
            continue
        split[_kernel_class(event.key)] += device_us / 1000
    return split


def _kernel_class(name: str) -> str:
    lowered = name.lower()
    if any(word in lowered for word in ("flash", "fmha", "attention", "attn", "sdpa")):
        return "attention"
    if any(word in lowered for word in ("gemm", "cutlass", "xmma", "cublas", "nvjet", "matmul", "conv", "wgrad")):
        return "gemm"
    return "other"


def run_ranks_1(device: torch.device, chunks: int, profile: bool) -> dict[str, object]:
    """One DiT rank on `device`: the module docstring's session, its figures (ms; P = 1)."""
    sizes = FullSize.for_device(device)
    marks = _Marks(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    states, encode_ms = encode_prompt(sizes, device, marks)
    dit = build_dit(sizes, device)
    vae = build_vae(sizes, device)
    built_s = time.perf_counter() - started
    latent_h, latent_w = sizes.height // 8, sizes.width // 8
    with torch.inference_mode():
        text = dit.encode_text(states)
    session = _Session(
        dit=dit,
        vae=vae,
        text=text,
        cache=dit.new_cache(PUBLISHED_CACHE, latent_h, latent_w),
        generator=torch.Generator(device=device).manual_seed(3),
        latent_h=latent_h,
        latent_w=latent_w,
    )
    vae.open("bench")
    for _ in range(WARM_CHUNKS):
        _chunk(session, marks, [])
    marks.finish()
    measured: list[dict[str, Point]] = []
    forwards: list[tuple[Point, Point]] = []
    for _ in range(chunks):
        measured.append(_chunk(session, marks, forwards))
    marks.finish()
    chunk_ms = [between(points["start"], points["decoded"]) for points in measured]
    denoise_ms = [between(points["start"], points["denoised"]) for points in measured]
    decode_ms = [between(points["denoised"], points["decoded"]) for points in measured]
    forward_ms = [between(start, end) for start, end in forwards]
    p50 = statistics.median(chunk_ms)
    figures: dict[str, object] = {
        "chunk_ms_p50_p1": p50,
        "fps_p1": FRAMES_PER_CHUNK / (p50 / 1000),
        "denoise_ms_p50_p1": statistics.median(denoise_ms),
        "decode_ms_p50_p1": statistics.median(decode_ms),
        "forward_ms_p50_p1": statistics.median(forward_ms),
        "forward_ms_p1": [round(ms, 2) for ms in forward_ms[: 5 * 2]],
        "forwards_per_chunk": len(forwards) // max(1, chunks),
        "umt5_encode_ms": encode_ms,
        "build_s": built_s,
        "sdpa_backend": sdpa_backend(sizes, device),
        "resolution": f"{sizes.width}x{sizes.height}",
        "dit_parameters": sum(param.numel() for param in dit.parameters()),
    }
    if device.type == "cuda":
        figures["max_memory_allocated_gb_p1"] = torch.cuda.max_memory_allocated(device) / 1e9
        figures["device_name"] = torch.cuda.get_device_name(device)
        if profile:
            split = _profile_split(session, marks)
            total = sum(split.values()) or float("nan")
            figures.update({f"profile_{name}_ms": ms for name, ms in split.items()})
            figures.update({f"profile_{name}_share": ms / total for name, ms in split.items()})
    vae.release("bench")
    return figures


def workload_figures() -> dict[str, object]:
    """The workload counter's full-size forward and the per-P **estimates** (`models/workload.py`)."""
    with torch.device("meta"):
        dit = LingBotFastDiT(LINGBOT_FAST_14B).to(torch.bfloat16)
    forward = count_forward(dit=dit)
    eviction = count_eviction(dit=dit)
    table = estimate_table(forward, eviction, calibration_forward(dit=dit))
    figures: dict[str, object] = {
        "meta_forward_kernels": forward.kernels,
        "meta_forward_bytes": forward.bytes,
        "meta_forward_syncs": forward.syncs,
        "meta_forward_gemm_bytes": forward.gemm_bytes,
        "meta_forward_attention_bytes": forward.attention_bytes,
        "meta_forward_other_bytes": forward.other_bytes,
        "meta_forward_tflop": forward.flops / 1e12,
    }
    for row in table:
        figures[f"estimated_h100_ms_per_chunk_p{row.ranks}"] = row.ms_per_chunk
        figures[f"estimated_h100_fps_p{row.ranks}"] = row.fps
        figures[f"all_to_all_bytes_per_forward_p{row.ranks}"] = row.all_to_all_bytes_per_forward
    return figures


def full_size(device_name: str, chunks: int, *, profile: bool = True, estimates: bool = True) -> dict[str, object]:
    """The harness (module docstring): P = 1 measured on `device_name`, every other P the machine has listed as
    skipped with the reason, FlashDreams' figures beside."""
    device = torch.device(device_name)
    available = torch.cuda.device_count() if device.type == "cuda" else 4
    wanted = [p for p in (2, 4, 5, 8) if p <= available]
    figures: dict[str, object] = {"full_size": device.type == "cuda", "ranks_measured": [1]}
    figures.update(run_ranks_1(device, chunks, profile))
    figures["skipped_ranks"] = {str(p): CP_SKIP_REASON for p in wanted}
    for p, ms in FLASHDREAMS_MS_PER_CHUNK.items():
        figures[f"flashdreams_h100_ms_per_chunk_p{p}"] = ms
        figures[f"flashdreams_h100_fps_p{p}"] = FRAMES_PER_CHUNK / (ms / 1000)
    if estimates:
        figures.update(workload_figures())
    return figures
