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

DENOISE_RANKS P > 1: the same session on every larger DiT group the machine has (CUDA: P GPUs over nccl, FlashDreams'
anchors 8 and 4 first, then 2 and 5; CPU: 2 and 4 gloo ranks of an 8-head tiny DiT), each rank a spawned process
with the DiT's Ulysses layout (`models/parallel.py`): umt5 on rank 0, its states broadcast, the decode on rank 0.
Every P's chunks are compared with P = 1's (`cp_equal_pP`: bit for bit, as on the CPU; `cp_max_abs_diff_pP`, which
on a GPU in bf16 need not be 0). A group that fails or would not fit the time budget is listed in `skipped_ranks`
with the reason, so the figures already measured still come back.

Steady state without paying for it: the first chunk runs (first calls), the window's middle chunks are only reserved
in the cache (`begin_chunk`: what the cache holds does not change the work), the chunk that fills the window runs,
and every measured chunk after it evicts.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import socket
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from pipeline.lingbot.models import (
    LINGBOT_FAST_14B,
    PUBLISHED_CACHE,
    SINGLE_RANK,
    TINY_UMT5_CONFIG,
    TINY_VAE_CONFIG,
    DiTConfig,
    KVCache,
    LingBotFastDiT,
    StreamingVAE,
    TextKV,
    Ulysses,
    denoise_chunk,
)
from pipeline.lingbot.models.attention import attention_capability, select_attention
from pipeline.lingbot.models.workload import (
    FLASHDREAMS_MS_PER_CHUNK,
    calibration_forward,
    count_eviction,
    count_forward,
    estimate_table,
)

__all__ = [
    "TINY_CP_DIT",
    "WARM_CHUNKS",
    "FullSize",
    "RankResult",
    "full_size",
    "group_sizes",
    "run_group",
    "run_session",
]

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
FORWARDS_PER_CHUNK = 5
"""4 sampler steps and the clean cache pass."""
CPU_RANKS = 4
"""The largest gloo group the CPU run starts (P = 2 and 4 prove the plumbing; they are not a speed)."""
GROUP_BUDGET_S = 150.0
"""Seconds the harness may spend in all (scripts/gpu-check.sh gives it 200 under `timeout`); a group that would start
with less than `MIN_GROUP_S` left is skipped with the reason."""
MIN_GROUP_S = 25.0
CPU_BUDGET_S = 900.0
"""The CPU run's budget: no 10-minute script around it, and a loaded machine is slow."""
TINY_CP_DIT = DiTConfig(dim=192, ffn_dim=256, num_layers=2, num_heads=8, freq_dim=32, text_dim=24, text_len=8)
"""The CPU run's DiT: TINY_DIT's kind with 8 heads (head_dim 24), so 2 and 4 ranks divide them."""


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
        tiny_umt5 = {"vocab_size": 300, "d_model": TINY_CP_DIT.text_dim, **TINY_UMT5_CONFIG}
        return cls(TINY_CP_DIT, TINY_VAE_CONFIG, tiny_umt5, 64, 32, torch.float32)


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


def build_dit(sizes: FullSize, device: torch.device, parallel: Ulysses = SINGLE_RANK, seed: int = 0) -> LingBotFastDiT:
    """The DiT with random weights, the same on every rank of a group (same seed, same device kind)."""
    with torch.device("meta"):
        dit = LingBotFastDiT(sizes.dit, parallel)
    built = _materialise(dit, device, sizes.dtype, seed)
    assert isinstance(built, LingBotFastDiT)
    built.set_attention(select_attention("auto", attention_capability(device)))  # as the service's default runs it
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
    choice = int(torch._fused_sdp_choice(q, kv, kv))
    try:
        return str(SDPBackend(choice).name)
    except ValueError:
        return f"unknown ({choice})"


# --- running -------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Session:
    dit: LingBotFastDiT
    vae: StreamingVAE | None
    """The decoder, on rank 0 only (the other ranks of a DiT group do not decode)."""
    text: TextKV
    cache: KVCache
    generator: torch.Generator
    latent_h: int
    latent_w: int


@dataclasses.dataclass(slots=True)
class _Chunk:
    points: dict[str, Point]
    x0: torch.Tensor


def _chunk(session: _Session, marks: _Marks, forwards: list[tuple[Point, Point]]) -> _Chunk:
    dit, config = session.dit, session.dit.config
    device = dit.device
    shape = (PUBLISHED_CACHE.chunk_frames, session.latent_h, session.latent_w)
    g = session.generator
    points: dict[str, Point] = {"start": marks.mark()}
    with torch.inference_mode():
        condition = torch.randn((1, config.in_dim - config.out_dim, *shape), generator=g, device=device)
        control = torch.randn((1, config.control_map_channels, *shape), generator=g, device=device)
        noise = torch.randn((1, config.out_dim, *shape), generator=g, device=device)
    with _forward_marks(dit, marks, forwards):
        x0 = denoise_chunk(dit, session.cache, session.text, condition, noise, g, control)
    points["denoised"] = marks.mark()
    if session.vae is not None:
        session.vae.decode_chunk("bench", x0[0])
    points["decoded"] = marks.mark()
    return _Chunk(points, x0)


def _fill_window(session: _Session, marks: _Marks) -> None:
    """Brings the session to steady state: a real first chunk (first calls: cuBLAS, the allocator, the VAE's first
    frame), the window's middle reserved without computing (the cache's contents do not change the work), and a real
    chunk that fills it; every later chunk evicts."""
    for index in range(WARM_CHUNKS):
        if index in (0, WARM_CHUNKS - 1):
            _chunk(session, marks, [])
        else:
            session.cache.begin_chunk()
    marks.finish()


def _profile_split(session: _Session, marks: _Marks) -> dict[str, float]:
    """One chunk under `torch.profiler`: its CUDA kernels' device time (ms) split GEMM / attention / other."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        _chunk(session, marks, [])
        marks.finish()
    split = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
    for event in prof.key_averages():
        device_us = float(event.self_device_time_total)
        if device_us > 0:
            split[_kernel_class(event.key)] += device_us / 1000
    return split


def _kernel_class(name: str) -> str:
    lowered = name.lower()
    if any(word in lowered for word in ("flash", "fmha", "attention", "attn", "sdpa")):
        return "attention"
    if any(word in lowered for word in ("gemm", "cutlass", "xmma", "cublas", "nvjet", "matmul", "conv", "wgrad")):
        return "gemm"
    return "other"


@dataclasses.dataclass(frozen=True, slots=True)
class RankResult:
    """What rank 0 of a P-rank run measured (ms), and the x0 of every measured chunk (on the CPU)."""

    figures: dict[str, object]
    outputs: list[torch.Tensor]
    chunk_ms_p50: float


def run_session(
    sizes: FullSize, device: torch.device, parallel: Ulysses, chunks: int, *, profile: bool = False
) -> RankResult:
    """The module docstring's session on this rank of a DiT group of `parallel.world_size` (the group joined)."""
    p = parallel.world_size
    marks = _Marks(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.perf_counter()
    states, encode_ms = encode_prompt(sizes, device, marks) if parallel.rank == 0 else (None, 0.0)
    shape = (1, sizes.dit.text_len, sizes.dit.text_dim)
    states = parallel.broadcast(states, shape, sizes.dtype, device)  # umt5 on rank 0 only, as the service runs it
    dit = build_dit(sizes, device, parallel)
    vae = build_vae(sizes, device) if parallel.rank == 0 else None
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
    if vae is not None:
        vae.open("bench")
    _fill_window(session, marks)
    measured: list[_Chunk] = []
    forwards: list[tuple[Point, Point]] = []
    for _ in range(chunks):
        measured.append(_chunk(session, marks, forwards))
    marks.finish()
    chunk_ms = [between(c.points["start"], c.points["decoded"]) for c in measured]
    denoise_ms = [between(c.points["start"], c.points["denoised"]) for c in measured]
    decode_ms = [between(c.points["denoised"], c.points["decoded"]) for c in measured]
    forward_ms = [between(start, end) for start, end in forwards]
    p50 = statistics.median(chunk_ms)
    figures: dict[str, object] = {
        f"chunk_ms_p50_p{p}": p50,
        f"fps_p{p}": FRAMES_PER_CHUNK / (p50 / 1000),
        f"denoise_ms_p50_p{p}": statistics.median(denoise_ms),
        f"decode_ms_p50_p{p}": statistics.median(decode_ms),
        f"forward_ms_p50_p{p}": statistics.median(forward_ms),
        f"forward_ms_p{p}": [round(ms, 2) for ms in forward_ms[: 2 * FORWARDS_PER_CHUNK]],
        f"forwards_per_chunk_p{p}": len(forwards) // max(1, chunks),
        f"build_s_p{p}": built_s,
    }
    if p == 1:
        figures.update(
            umt5_encode_ms=encode_ms,
            sdpa_backend=sdpa_backend(sizes, device),
            attention=dit.attention.name,
            resolution=f"{sizes.width}x{sizes.height}",
            dit_parameters=sum(param.numel() for param in dit.parameters()),
        )
    if device.type == "cuda":
        figures[f"max_memory_allocated_gb_p{p}"] = torch.cuda.max_memory_allocated(device) / 1e9
        if p == 1:
            figures["device_name"] = torch.cuda.get_device_name(device)
        if profile:
            split = _profile_split(session, marks)
            total = sum(split.values()) or float("nan")
            figures.update({f"profile_{name}_ms_p{p}": ms for name, ms in split.items()})
            figures.update({f"profile_{name}_share_p{p}": ms / total for name, ms in split.items()})
    if vae is not None:
        vae.release("bench")
    return RankResult(figures, [c.x0.detach().cpu() for c in measured], p50)


def _rank_main(rank: int, world_size: int, port: int, device_type: str, chunks: int, out: str) -> None:
    """One rank of a spawned DiT group: joins it (nccl on CUDA, gloo on the CPU), runs the session, and rank 0 saves
    its `RankResult` to `out`."""
    if device_type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
        backend = "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        result = run_session(FullSize.for_device(device), device, Ulysses(rank, world_size), chunks)
        if rank == 0:
            torch.save({"figures": result.figures, "outputs": result.outputs, "p50": result.chunk_ms_p50}, out)
    finally:
        dist.destroy_process_group()


def run_group(device_type: str, world_size: int, chunks: int, timeout_s: float) -> RankResult | str:
    """The session on `world_size` spawned ranks (cuda:0.. or the CPU); rank 0's result, or why there is none."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="full-size-") as scratch:
        out = str(Path(scratch) / "rank0.pt")
        ranks = [
            context.Process(target=_rank_main, args=(rank, world_size, port, device_type, chunks, out))
            for rank in range(world_size)
        ]
        for process in ranks:
            process.start()
        deadline = time.monotonic() + timeout_s
        for process in ranks:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in ranks:
            if process.is_alive():
                process.kill()
                process.join()
        codes = [process.exitcode for process in ranks]
        if codes != [0] * world_size:
            return f"the {world_size} ranks exited with {codes} (timeout {timeout_s:.0f} s)"
        saved = torch.load(out, weights_only=False)
    return RankResult(saved["figures"], saved["outputs"], saved["p50"])


def workload_figures() -> dict[str, object]:
    """The workload counter's full-size forward and the per-P **estimates** (`models/workload.py`)."""
    with torch.device("meta"):
        dit = LingBotFastDiT(LINGBOT_FAST_14B).to(torch.bfloat16)
    forward = count_forward(dit=dit)
    eviction = count_eviction(dit=dit)
    ranks = {p: count_forward(ranks=p) for p in (2, 4, 8)}
    table = estimate_table(forward, eviction, calibration_forward(dit=dit), rank_forwards=ranks)
    figures: dict[str, object] = {
        "meta_forward_kernels": forward.kernels,
        "meta_forward_bytes": forward.bytes,
        "meta_forward_syncs": forward.syncs,
        "meta_forward_gemm_bytes": forward.gemm_bytes,
        "meta_forward_attention_bytes": forward.attention_bytes,
        "meta_forward_other_bytes": forward.other_bytes,
        "meta_forward_tflop": forward.flops / 1e12,
    }
    for p, rank in ranks.items():  # rank 0's share under Ulysses (what the estimate reads)
        figures[f"meta_rank_forward_kernels_p{p}"] = rank.kernels
        figures[f"meta_rank_forward_bytes_p{p}"] = rank.bytes
        figures[f"meta_rank_forward_collective_bytes_p{p}"] = rank.collective_bytes
    for row in table:
        figures[f"estimated_h100_ms_per_chunk_p{row.ranks}"] = row.ms_per_chunk
        figures[f"estimated_h100_fps_p{row.ranks}"] = row.fps
        figures[f"all_to_all_bytes_per_forward_p{row.ranks}"] = row.all_to_all_bytes_per_forward
    return figures


def group_sizes(config: DiTConfig, frame_tokens: int, available: int) -> list[int]:
    """The DiT group sizes worth measuring beyond 1 on `available` devices: FlashDreams' anchors first (8, 4), then
    2 and 5, each dividing the heads and a latent frame's tokens (the context-parallel rule)."""
    return [p for p in (8, 4, 2, 5) if p <= available and config.num_heads % p == 0 and frame_tokens % p == 0]


def full_size(
    device_name: str,
    chunks: int,
    *,
    profile: bool = True,
    estimates: bool = True,
    max_ranks: int | None = None,
    budget_s: float | None = None,
    progress: Callable[[Mapping[str, object]], None] | None = None,
) -> dict[str, object]:
    """The harness (module docstring) on `device_name`: P = 1 in this process, every larger DiT group the machine
    has (CUDA: its GPUs; CPU: up to 4 gloo ranks) on spawned ranks while `budget_s` lasts, the rest listed in
    `skipped_ranks` with the reason; FlashDreams' figures beside. `progress` is given the figures measured so far
    after each P, so a run stopped from outside (the GPU check's `timeout`) still leaves them behind."""
    started = time.monotonic()
    device = torch.device(device_name)
    budget_s = budget_s if budget_s is not None else GROUP_BUDGET_S if device.type == "cuda" else CPU_BUDGET_S
    sizes = FullSize.for_device(device)
    available = torch.cuda.device_count() if device.type == "cuda" else CPU_RANKS
    available = min(available, max_ranks) if max_ranks is not None else available
    frame_tokens = sizes.dit.frame_tokens(sizes.height // 8, sizes.width // 8)
    single = run_session(sizes, device, SINGLE_RANK, chunks, profile=profile and device.type == "cuda")
    if device.type == "cuda":  # the groups' rank 0 runs on this GPU: hand back what this process's allocator holds
        gc.collect()
        torch.cuda.empty_cache()
    figures: dict[str, object] = {"full_size": device.type == "cuda", **single.figures}
    measured: dict[int, RankResult] = {1: single}
    skipped: dict[str, str] = {}
    equal: dict[int, bool] = {}
    differences: dict[int, float] = {}
    for p in group_sizes(sizes.dit, frame_tokens, available):
        if progress is not None:
            progress({**figures, "ranks_measured": sorted(measured), "skipped_ranks": dict(skipped)})
        left = budget_s - (time.monotonic() - started)
        if left < MIN_GROUP_S:
            skipped[str(p)] = f"time: {left:.0f} s of the harness's {budget_s:.0f} s budget left"
            continue
        result = run_group(device.type, p, chunks, left)
        if isinstance(result, str):
            skipped[str(p)] = result
            continue
        measured[p] = result
        figures.update(result.figures)
        pairs = list(zip(single.outputs, result.outputs, strict=True))
        equal[p] = all(torch.equal(ours, theirs) for ours, theirs in pairs)
        differences[p] = max(float((ours - theirs).abs().max()) for ours, theirs in pairs)
    figures["ranks_measured"] = sorted(measured)
    figures["skipped_ranks"] = skipped
    for p in equal:
        figures[f"cp_equal_p{p}"] = equal[p]
        figures[f"cp_max_abs_diff_p{p}"] = differences[p]
    if device.type == "cpu":  # the plumbing figures (gloo on a few cores: not a speed claim)
        if equal:
            figures["cp_equal"] = all(equal.values())
        if 2 in measured:
            figures["cp2_over_cp1_chunk_ms"] = measured[2].chunk_ms_p50 / single.chunk_ms_p50
    for p, ms in FLASHDREAMS_MS_PER_CHUNK.items():
        figures[f"flashdreams_h100_ms_per_chunk_p{p}"] = ms
        figures[f"flashdreams_h100_fps_p{p}"] = FRAMES_PER_CHUNK / (ms / 1000)
    if estimates:
        figures.update(workload_figures())
    return figures
