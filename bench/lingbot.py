"""Benchmark of LingBot sessions on the reference world model, on threads and on worker processes.

One model worker (`LingBotService`, one execution lease) generates as fast as it can (`realtime=False`; the
service's real-time pacing would otherwise pin the chunk period to the media duration) with keys held, at 416×240,
16 fps, chunk_size 3. Figures come from the orchestrator's scheduler-observed metrics:

- rtf_p95: p95 chunk period ÷ media duration of one chunk (0.75 s); below 1 generation outruns playback;
- first_output_s: first accepted ingress (the condition prefetch) → first chunk emitted;
- control_to_output_p95_s: accepted control → the frames of the same chunk (anchored on the control);
- c2o_over_chunk_period: control_to_output_p95_s ÷ media duration of a chunk (target ≤ 2).

Those with the prefix `two_sessions_` (two sessions sharing the worker) and `heavy8_` (compute_scale 8), all on the
threads placement. Then, side by side in the same run (every process group is started before the first figure):

- threads_rtf_p95, processes_rtf_p95: one session on threads, then on the `processes` placement with one DiT rank
  (decode co-located, as `LINGSTREAM_STAGE_PLACEMENT=processes` runs it: since issue #32 on the DiT group's second
  call lane, beside the next chunk's DiT, as on threads); processes_over_threads is their ratio (goal ≤ 1.05),
  processes_over_threads_p50 the same for the median chunk period (the p95 of a few dozen chunks follows the
  machine's load more than the placement). The processes figure pays for handing each chunk's frames (3.6 MB) back
  to the service process through shared memory, and both pay for decoding in parts (progressive decode, the
  default).
- threads_decode_overlap_ratio, processes_decode_overlap_ratio (issue #32): the median chunk period of those side by
  side runs ÷ max(median denoise, median decode) of the same chunks (`ChunkOutput.timings`): 1.0 when one session's
  chunk k decodes entirely beside chunk k + 1's DiT, (denoise + decode) / max(denoise, decode) when nothing overlaps
  (goal ≤ 1.10); decode_overlap_ratio is the larger of the two; {threads,processes}_{denoise,decode}_ms_p50 are the
  stage medians it is computed from.
- channel_ms_per_chunk: time one chunk's latent spends crossing from the DiT group to the decode group (send in the
  DiT's rank 0 plus receive in the decoder, `ChunkOutput.timings["latent_channel"]`), mean over the chunks of a
  2-rank session; channel_share_of_chunk_period: that ÷ the real-time chunk period (0.75 s; goal ≤ 3 %);
  channel_share_of_generation: that ÷ the measured mean chunk period at full speed.
- two_ranks_speedup: the DiT's time per chunk (`ChunkOutput.timings["denoise"]`, rank 0's call including the
  all-gather; median) with 1 rank ÷ with 2 ranks, at compute_scale 8, each as `LINGSTREAM_DENOISE_RANKS` sets it up
  by default: 1 rank with `--threads` torch threads, 2 ranks with one thread each. So both use the same cores, and
  the figure says whether splitting the rows across processes beats torch's own intra-op threads (it can only win
  where the work does not already scale with threads; what every rank still does whole — camera recovery, the
  seeded noise — and the all-gather cost it). denoise_ms_p50_1_rank and denoise_ms_p50_2_ranks are the two times.

Then the camera contract both models read (`camera.CameraChunk`, docs/lingbot-fast.md "The camera contract"), per
chunk of 3 latent frames, medians over `--chunks` chunks with keys held, on one torch thread whatever `--threads`:

- camera_ms_p50: the reference model's camera step: the chunk's `CameraChunk` built from a control snapshot plus the
  two video-frame cameras per latent frame the reference renders from (`video_frame_cameras`), at 416x240;
- plucker_map_ms_p50_416x240, plucker_map_ms_p50_832x480: LingBot-World-Fast's camera input, `plucker_map` (the
  384-channel map) from a `CameraChunk` with the session's precomputed rays, on the first of `--devices`.

Then the LingBot-World-Fast backend (`LINGSTREAM_MODEL=lingbot-fast`) on the service's real path: the model in
`--model-path` (real weights where a GPU has them), or by default a tiny random checkpoint written by `lingstream
tiny-checkpoint`'s function into a temporary directory (on a CPU that measures the plumbing around a
real-architecture model, not the model), on the first of `--devices`. One session on threads (`realtime=False`, so
the chunk period is generation, not playback), keys held, chunks of 3 latent frames (12 video frames), at
`--fast-resolution`, `--fast-chunks` chunks measured after a 2-chunk warm-up session. Figures (medians over the
chunks after the first):

- lingbot_fast_chunk_ms_p50: the chunk period, one chunk received by the caller to the next;
- lingbot_fast_dit_ms_p50, lingbot_fast_vae_ms_p50: one denoise call (4 steps + the clean cache pass) and one
  decode call, as the model's stages time them;
- lingbot_fast_rest_ms_p50: the time in a chunk period that is not model compute *on its critical path*. The bench
  records when every denoise and decode call ran (on CUDA, until the device finished it) and walks back from the
  chunk's arrival: its decode, then whichever of that decode's two inputs finished later (the previous chunk's
  decode, or this chunk's denoise; a denoise waits on the previous denoise), and so on until the previous chunk's
  arrival; rest = period - the model time on that path. So it is never negative: a DiT call that overlaps the
  decode on the critical path (decode of chunk k beside the denoise of chunk k + 1) is simply not on it, where
  "period - DiT - VAE" would count it twice and go below 0;
- lingbot_fast_overhead_share: the rest summed over the measured chunks ÷ their periods summed (goal <= 0.03);
- lingbot_fast_fps: video frames per second generated (12 ÷ chunk period);
- lingbot_fast_first_chunk_s: the session's first ingress to its first chunk (encode, prefix, first denoise and
  decode);
- flashdreams_h100_fps, flashdreams_h100_ms_per_chunk: NVIDIA FlashDreams' published figures for the real model on
  one H100 (5.56 fps, 2 157 ms per chunk), printed beside ours for comparison; they are not measured here.

Then the same measurement with the tiny decoder (`LINGSTREAM_DECODER=tiny`, issue #32) in place of the Wan VAE's, on
the same encoder and DiT, right after the Wan run (a warm-up session, then the measured one):

- lingbot_fast_tiny_decode_ms_p50, lingbot_fast_tiny_chunk_ms_p50: its decode call and the chunk period;
- lingbot_fast_tiny_over_wan_decode: lingbot_fast_tiny_decode_ms_p50 ÷ lingbot_fast_vae_ms_p50 (the Wan decode of
  the run before it). With the default tiny random checkpoint that compares the two decoders' plumbing at tiny
  widths, not their real cost; with `--model-path` a model directory without `tiny_decoder/` skips it and says so
  (lingbot_fast_tiny_decoder_skipped).

First frames, progressive against whole-chunk decode (issue #16), for the reference model at 416x240 and for the
LingBot-World-Fast model at `--fast-resolution` (its VAE decode is most of a chunk on a CPU): one session with keys
held, `realtime=False`, on a service that decodes progressively (the default: the decode stage hands each latent
frame's video frames on as soon as it has decoded them), then the same on one that decodes whole chunks
(`progressive_decode=False`), alternating, `FIRST_FRAME_ROUNDS` rounds of each; per chunk after the first, the
chunk's `control_to_first_frame` timing: from its control's submission (the chunk's start under its lease turn) to
its first frames out of the model (its first part; the whole chunk without progressive decode). That is what a
press from rest waits for before the first frame can be sent.

- first_frame_ms_p50, wholechunk_first_frame_ms_p50, first_frame_saving_ms: the reference model's two medians and
  their difference;
- processes_first_frame_ms_p50, processes_wholechunk_first_frame_ms_p50, processes_first_frame_saving_ms: the same
  on the `processes` placement (one DiT rank, decode co-located, a service started per session), where the parts
  come from the worker process as partial replies of its decode call;
- lingbot_fast_first_frame_ms_p50, lingbot_fast_wholechunk_first_frame_ms_p50, lingbot_fast_first_frame_saving_ms:
  the same for LingBot-World-Fast.

`--model reference` or `--model lingbot-fast` runs only that half (scripts/gpu-check.sh runs both).

`--random-full-size` runs only the GPU-truth harness instead (`bench/_full_size.py`, docs/lingbot-fast.md "Measuring
on a GPU without weights"): LingBot-World-Fast at its published size (18.5 B DiT, Wan VAE, umt5-xxl) with random
bf16 weights built on the first of `--devices`, `--fast-chunks` steady-state chunks at 832x480, for DENOISE_RANKS 1
and every larger context-parallel DiT group the machine's GPUs allow (8, 4, 2, 5) — per P: chunk_ms_p50_pP, fps_pP,
denoise/decode/forward medians (CUDA events), forward_ms_pP (the first two chunks' forwards),
max_memory_allocated_gb_pP, cp_equal_pP and cp_max_abs_diff_pP against P = 1; at P = 1 the profiler's GEMM /
attention / other split (profile_*), sdpa_backend and umt5_encode_ms; FlashDreams' published figures beside
(flashdreams_h100_*); skipped_ranks names every group not measured, and why. Without CUDA it runs an 8-head tiny model
on the CPU at P = 1, 2 and 4 over gloo (cp_equal, cp2_over_cp1_chunk_ms: plumbing, not speed). Both add the workload
counter's full-size forward (meta_forward_kernels, meta_forward_bytes, meta_forward_syncs, ...; rank 0's share at
P = 2, 4, 8 as meta_rank_forward_{kernels,bytes,collective_bytes}_pP) and the per-P
**estimates** derived from it (estimated_h100_ms_per_chunk_pP, estimated_h100_fps_pP, all_to_all_bytes_per_forward_pP).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from admission import ExecutionLease
from bench._common import report
from pipeline.bidirectional import CloseMode, ControlState
from pipeline.lingbot.camera import CameraChunk, CameraController, map_rays, plucker_map
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.graph.actors import ProcessPlacement
from pipeline.lingbot.graph.group_stages import LATENT_CHANNEL_TIMING
from pipeline.lingbot.graph.placement import ModelRuntimeConfig, plan_placement
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceModelFactory, ReferenceWorldModel
from pipeline.lingbot.seam import ChunkDecoder, ChunkDenoiser, WorldModel, WorldModelParts
from pipeline.metrics import percentile
from service.workers import WORKER_ENVIRONMENT

if TYPE_CHECKING:  # the lingbot extra (diffusers, transformers): imported where the LingBot-World-Fast half runs
    from pipeline.lingbot.models import LingBotFastOptions, LingBotFastWorldModel

CONFIG = {"width": 416, "height": 240, "fps": 16, "chunk_size": 3}
MEDIA_S = 4 * CONFIG["chunk_size"] / CONFIG["fps"]
NAN = float("nan")
ROUNDS = 3
FIRST_FRAME_ROUNDS = 3
FLASHDREAMS_H100_FPS = 5.56
FLASHDREAMS_H100_MS_PER_CHUNK = 2157.0


def placement(ranks: int, threads: int, devices: tuple[str, ...] = ("cpu",)) -> ProcessPlacement | None:
    """The placement `lingstream serve` builds for `LINGSTREAM_DENOISE_RANKS=ranks` on `devices` (`threads` per
    rank): on the CPU, decode apart from a multi-rank DiT; on CUDA, the DiT on the first `ranks` GPUs and the VAE on
    the next one if there is one, else co-located. None when there are fewer GPUs than ranks."""

    def runtime(names: tuple[str, ...]) -> ModelRuntimeConfig:
        return ModelRuntimeConfig(names, len(names), "float32", threads)

    dit: tuple[str, ...]
    vae: tuple[str, ...]
    if devices == ("cpu",):
        dit, vae = ("cpu",) * ranks, ("cpu",)
    elif len(devices) < ranks:
        return None
    else:
        dit = devices[:ranks]
        vae = devices[ranks : ranks + 1] or dit
    plan = plan_placement(runtime(vae[:1]), runtime(dit), runtime(vae))
    return ProcessPlacement(plan, ReferenceModelFactory(), call_timeout_s=300.0)


@dataclasses.dataclass
class Run:
    """One run's figures (the scheduler's, worst session) and the per-chunk samples its chunks reported."""

    figures: dict[str, float]
    periods: list[float]
    """`ChunkOutput.timings["chunk_period"]` of every chunk after the first."""
    denoise: list[float]
    channel: list[float]
    decode: list[float] = dataclasses.field(default_factory=list)
    """`ChunkOutput.timings["decode"]` of every chunk after the first."""
    denoise_after_first: list[float] = dataclasses.field(default_factory=list)


async def run(service: LingBotService, sessions: int, chunks: int, compute_scale: float, tag: str = "") -> Run:
    ids = [f"{tag}s{i}" for i in range(sessions)]
    prepared = service.prepare(dict(CONFIG, compute_scale=compute_scale), None)
    for sid in ids:
        await service.create_session(sid, prepared)
    result = Run({}, [], [], [])

    async def drive(sid: str) -> None:
        outputs = service.outputs(sid)
        for seq in range(chunks):
            service.push_control(sid, ControlState(seq, frozenset({"w", "l"})))
            chunk = await anext(outputs)
            result.denoise.append(chunk.timings["denoise"])
            if "chunk_period" in chunk.timings:
                result.periods.append(chunk.timings["chunk_period"])
                result.decode.append(chunk.timings["decode"])
                result.denoise_after_first.append(chunk.timings["denoise"])
            if LATENT_CHANNEL_TIMING in chunk.timings:
                result.channel.append(chunk.timings[LATENT_CHANNEL_TIMING])

    started = time.perf_counter()
    await asyncio.gather(*(drive(sid) for sid in ids))
    wall = time.perf_counter() - started
    rtf, first, c2o, periods = [], [], [], []
    for sid in ids:
        metrics = service.orchestrator.metrics(sid)
        rtf.append(metrics.real_time_factor(MEDIA_S) or float("nan"))
        first.append(metrics.first_output_latency or float("nan"))
        c2o.append(metrics.control_to_output.p95 or float("nan"))
        periods.append(metrics.chunk_period.mean or float("nan"))
    for sid in ids:
        await service.close_session(sid, CloseMode.CANCEL)
    result.figures.update(
        rtf_p95=max(rtf),
        first_output_s=max(first),
        control_to_output_p95_s=max(c2o),
        c2o_over_chunk_period=max(c2o) / MEDIA_S,
        chunks_per_s=sessions * chunks / wall,
        chunk_period_mean_s=max(periods),
    )
    return result


def _per_chunk(figures: Mapping[str, float]) -> dict[str, float]:
    keys = ("rtf_p95", "first_output_s", "control_to_output_p95_s", "c2o_over_chunk_period", "chunks_per_s")
    return {key: figures[key] for key in keys}


async def reference(chunks: int, threads: int, devices: tuple[str, ...]) -> dict[str, float]:
    """The reference model's figures: one worker on threads, two sessions, heavy, then the placements side by side."""
    for name, value in WORKER_ENVIRONMENT.items():  # what `lingstream serve` gives its worker processes
        os.environ.setdefault(name, value)
    results: dict[str, float] = {}
    one, two = placement(1, threads, devices), placement(2, max(1, threads // 2), devices)
    assert one is not None
    threaded = LingBotService(ReferenceWorldModel(devices[0]), lease=ExecutionLease(), realtime=False)
    processes = LingBotService(one, lease=ExecutionLease(), realtime=False)
    two_ranks = None if two is None else LingBotService(two, lease=ExecutionLease(), realtime=False)
    services = [service for service in (threaded, processes, two_ranks) if service is not None]
    await asyncio.gather(*(service.start() for service in services))
    try:
        # Warm-up: first-call costs (the allocator's growth, the default scene) stay out of the figures. Each worker
        # process warms up as long as a measured run: glibc raises its mmap threshold only as big blocks are freed,
        # and until then every chunk maps (and faults in) its tensors afresh.
        for service in services:
            await run(service, 1, max(4, chunks), 1.0, "warm")
        for label, sessions, scale in (("", 1, 1.0), ("two_sessions_", 2, 1.0), ("heavy8_", 1, 8.0)):
            figures = (await run(threaded, sessions, chunks, scale, label)).figures
            results.update({f"{label}{k}": v for k, v in _per_chunk(figures).items()})

        # Side by side: the placements take turns, so a change in the machine's load hits both alike.
        turn_chunks = max(3, chunks // ROUNDS)
        periods: dict[str, list[float]] = {"threads": [], "processes": []}
        stage_times: dict[str, tuple[list[float], list[float]]] = {"threads": ([], []), "processes": ([], [])}
        denoise: dict[int, list[float]] = {1: [], 2: []}
        for turn in range(ROUNDS):
            for name, service in (("threads", threaded), ("processes", processes)):
                side = await run(service, 1, turn_chunks, 1.0, f"side{turn}")
                periods[name] += side.periods
                stage_times[name][0].extend(side.denoise_after_first)
                stage_times[name][1].extend(side.decode)
            for ranks, ranked in ((1, processes), (2, two_ranks)):
                if ranked is not None:
                    denoise[ranks] += (await run(ranked, 1, turn_chunks, 8.0, f"ranks{turn}")).denoise
        rtf = {name: (percentile(values, 95) or float("nan")) / MEDIA_S for name, values in periods.items()}
        results["threads_rtf_p95"] = rtf["threads"]
        results["processes_rtf_p95"] = rtf["processes"]
        results["processes_over_threads"] = rtf["processes"] / rtf["threads"]
        medians = {name: percentile(values, 50) or float("nan") for name, values in periods.items()}
        results["processes_over_threads_p50"] = medians["processes"] / medians["threads"]
        for name, (dits, decodes) in stage_times.items():  # issue #32: the decode overlaps the next chunk's DiT
            dit, vae = statistics.median(dits or [NAN]), statistics.median(decodes or [NAN])
            results[f"{name}_denoise_ms_p50"] = dit * 1000
            results[f"{name}_decode_ms_p50"] = vae * 1000
            results[f"{name}_decode_overlap_ratio"] = medians[name] / max(dit, vae)
        results["decode_overlap_ratio"] = max(
            results["threads_decode_overlap_ratio"], results["processes_decode_overlap_ratio"]
        )
        single, double = (statistics.median(denoise[ranks] or [NAN]) for ranks in (1, 2))
        results["denoise_ms_p50_1_rank"] = single * 1000
        results["denoise_ms_p50_2_ranks"] = double * 1000
        results["two_ranks_speedup"] = single / double

        # The latent crosses groups only where decode has a group of its own (NaN where it has not: 1-2 GPUs).
        channel = Run({"chunk_period_mean_s": NAN}, [], [], [])
        if two_ranks is not None:
            channel = await run(two_ranks, 1, chunks, 1.0, "channel")
        moving = statistics.fmean(channel.channel or [NAN])
        results["channel_ms_per_chunk"] = moving * 1000
        results["channel_share_of_chunk_period"] = moving / MEDIA_S
        results["channel_share_of_generation"] = moving / channel.figures["chunk_period_mean_s"]
    finally:
        await asyncio.gather(*(service.aclose() for service in services))
    return results


# --- LingBot-World-Fast ------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """One model call: which stage, which chunk, when it ran (perf_counter seconds)."""

    stage: str
    chunk: int
    start: float
    end: float


class Spans:
    """Where every denoise and decode call of the measured session ran; appended from the stages' threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: dict[tuple[str, int], Span] = {}

    def add(self, stage: str, chunk: int, start: float) -> None:
        with self._lock:
            self._spans[stage, chunk] = Span(stage, chunk, start, time.perf_counter())

    def get(self, stage: str, chunk: int) -> Span | None:
        with self._lock:
            return self._spans.get((stage, chunk))

    def clear(self) -> None:
        with self._lock:
            self._spans.clear()


class TimedDenoiser:
    """The model's `ChunkDenoiser`, each `denoise_chunk` recorded in `spans` (on CUDA once the device is done)."""

    def __init__(self, inner: ChunkDenoiser, spans: Spans) -> None:
        self._inner, self._spans = inner, spans

    def create_cache(self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor) -> None:
        self._inner.create_cache(session_id, config, base_latent)

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        start = time.perf_counter()
        latent = self._inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)
        if latent.is_cuda:  # the kernels it launched belong to its span (decode would otherwise wait for them)
            torch.cuda.synchronize(latent.device)
        self._spans.add("denoise", chunk_index, start)
        return latent

    def release_cache(self, session_id: str) -> None:
        self._inner.release_cache(session_id)


class TimedDecoder:
    """The model's `ChunkDecoder`, each `decode_chunk` recorded in `spans`."""

    def __init__(self, inner: ChunkDecoder, spans: Spans) -> None:
        self._inner, self._spans = inner, spans

    def create_cache(self, session_id: str, config: LingBotSessionConfig) -> None:
        self._inner.create_cache(session_id, config)

    def decode_chunk(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        frames = self._inner.decode_chunk(session_id, chunk_index, latent)
        self._spans.add("decode", chunk_index, start)
        return frames

    def release_cache(self, session_id: str) -> None:
        self._inner.release_cache(session_id)


async def first_frame_session(
    model: WorldModel | ProcessPlacement, progressive: bool, width: int, height: int, chunks: int
) -> list[float]:
    """One session of `chunks` chunks, keys held, at full speed; each later chunk's `control_to_first_frame` (s)."""
    service = LingBotService(model, lease=ExecutionLease(), realtime=False, progressive_decode=progressive)
    await service.start()
    try:
        assert service.progressive_decode == progressive
        prepared = service.prepare({"width": width, "height": height, "fps": 16, "chunk_size": 3}, None)
        await service.create_session("first", prepared)
        outputs = service.outputs("first")
        firsts: list[float] = []
        for seq in range(chunks):
            service.push_control("first", ControlState(seq, frozenset({"w", "l"})))
            chunk = await anext(outputs)
            if seq > 0:
                firsts.append(chunk.timings["control_to_first_frame"])
        await service.close_session("first", CloseMode.CANCEL)
    finally:
        await service.aclose()
    return firsts


async def first_frame(
    model: WorldModel | ProcessPlacement, width: int, height: int, chunks: int, rounds: int, prefix: str = ""
) -> dict[str, float]:
    """First frames, progressive against whole-chunk decode, alternating sessions (the module docstring)."""
    progressive: list[float] = []
    whole: list[float] = []
    for _ in range(rounds):
        progressive += await first_frame_session(model, True, width, height, chunks)
        whole += await first_frame_session(model, False, width, height, chunks)
    fast = statistics.median(progressive) * 1000
    slow = statistics.median(whole) * 1000
    return {
        f"{prefix}first_frame_ms_p50": fast,
        f"{prefix}wholechunk_first_frame_ms_p50": slow,
        f"{prefix}first_frame_saving_ms": slow - fast,
    }


def critical_model_time(spans: Spans, chunk: int, since: float, until: float) -> float:
    """Model time on the path that made chunk `chunk` arrive at `until`, inside `(since, until]` (the module
    docstring): from its decode back through whichever input finished later, until `since`."""
    total = 0.0
    node = spans.get("decode", chunk)
    while node is not None and node.end > since:
        total += min(node.end, until) - max(node.start, since)
        if node.stage == "decode":
            inputs = [spans.get("decode", node.chunk - 1), spans.get("denoise", node.chunk)]
        else:
            inputs = [spans.get("denoise", node.chunk - 1)]
        earlier = [span for span in inputs if span is not None and span.end <= node.start]
        node = max(earlier, key=lambda span: span.end, default=None)
    return total


async def fast_session(
    model: LingBotFastWorldModel, spans: Spans, width: int, height: int, chunks: int
) -> dict[str, float]:
    timed = WorldModelParts(model.encoder, TimedDenoiser(model.denoiser, spans), TimedDecoder(model.decoder, spans))
    service = LingBotService(timed, lease=ExecutionLease(), realtime=False)
    spans.clear()
    await service.start()
    try:
        prepared = service.prepare({"width": width, "height": height, "fps": 16, "chunk_size": 3}, None)
        await service.create_session("fast", prepared)
        outputs = service.outputs("fast")
        arrived, periods, rest, dit, vae = [], [], [], [], []
        for seq in range(chunks):
            service.push_control("fast", ControlState(seq, frozenset({"w", "l"})))
            chunk = await anext(outputs)
            arrived.append(time.perf_counter())
            dit.append(chunk.timings["denoise"])
            vae.append(chunk.timings["decode"])
            if seq > 0:
                period = arrived[-1] - arrived[-2]
                periods.append(period)
                rest.append(period - critical_model_time(spans, chunk.index, arrived[-2], arrived[-1]))
        first = service.orchestrator.metrics("fast").first_output_latency or NAN
        await service.close_session("fast", CloseMode.CANCEL)
    finally:
        await service.aclose()
    period_ms = statistics.median(periods) * 1000
    return {
        "lingbot_fast_chunk_ms_p50": period_ms,
        "lingbot_fast_dit_ms_p50": statistics.median(dit[1:]) * 1000,
        "lingbot_fast_vae_ms_p50": statistics.median(vae[1:]) * 1000,
        "lingbot_fast_rest_ms_p50": statistics.median(rest) * 1000,
        "lingbot_fast_overhead_share": sum(rest) / sum(periods),
        "lingbot_fast_fps": 12 / (period_ms / 1000),
        "lingbot_fast_first_chunk_s": first,
        "flashdreams_h100_fps": FLASHDREAMS_H100_FPS,
        "flashdreams_h100_ms_per_chunk": FLASHDREAMS_H100_MS_PER_CHUNK,
    }


def lingbot_fast(
    model_path: Path | None, device: str, dtype: str, resolution: str, chunks: int, first_frame_rounds: int
) -> dict[str, float | str]:
    """The LingBot-World-Fast figures: the model in `model_path`, or a tiny random one written now."""
    from pipeline.lingbot.models import LingBotFastOptions, LingBotFastWorldModel, write_tiny_model

    width, height = (int(part) for part in resolution.lower().split("x"))
    spans = Spans()
    with tempfile.TemporaryDirectory(prefix="lingbot-fast-bench-") as scratch:
        path = model_path or write_tiny_model(Path(scratch) / "tiny")
        model = LingBotFastWorldModel.load(LingBotFastOptions(str(path), dtype=dtype), device)
        asyncio.run(fast_session(model, spans, width, height, 2))  # warm-up: first-call costs stay out
        results = asyncio.run(fast_session(model, spans, width, height, max(2, chunks)))
        first = first_frame(model, width, height, max(2, chunks // 2), first_frame_rounds, "lingbot_fast_")
        tiny = tiny_decoder(model, LingBotFastOptions(str(path), dtype=dtype), device, width, height, chunks)
        wan_ms = results["lingbot_fast_vae_ms_p50"]
        if "lingbot_fast_tiny_decode_ms_p50" in tiny:
            tiny["lingbot_fast_tiny_over_wan_decode"] = float(tiny["lingbot_fast_tiny_decode_ms_p50"]) / wan_ms
        return results | asyncio.run(first) | {"lingbot_fast_attention": model.denoiser.dit.attention.name} | tiny


def tiny_decoder(
    model: LingBotFastWorldModel, options: LingBotFastOptions, device: str, width: int, height: int, chunks: int
) -> dict[str, float | str]:
    """The tiny decoder's figures (module docstring): `model`'s encoder and DiT with the tiny decoder from the same
    model directory, so only the decode differs from the Wan run."""
    from pipeline.lingbot.models import TINY_DECODER_DIR, LingBotFastDecoder, LingBotFastWorldModel
    from pipeline.lingbot.models.world import load_streaming_decoder

    weights = options.root / TINY_DECODER_DIR / "model.safetensors"
    if not weights.is_file():
        return {"lingbot_fast_tiny_decoder_skipped": f"no tiny decoder weights at {weights}"}
    decoder = load_streaming_decoder(dataclasses.replace(options, decoder="tiny"), device)
    tiny = LingBotFastWorldModel(model.encoder, model.denoiser, LingBotFastDecoder(decoder))
    spans = Spans()
    asyncio.run(fast_session(tiny, spans, width, height, 2))  # warm-up, as for the Wan run
    results = asyncio.run(fast_session(tiny, spans, width, height, max(2, chunks)))
    return {
        "lingbot_fast_tiny_decode_ms_p50": results["lingbot_fast_vae_ms_p50"],
        "lingbot_fast_tiny_chunk_ms_p50": results["lingbot_fast_chunk_ms_p50"],
    }


def camera(chunks: int, device: str) -> dict[str, float]:
    """The camera contract's per-chunk costs (module docstring), one torch thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    keys = (["w", "l"], ["i", "a"], ["s", "j"], ["d", "k"])
    try:
        config = LingBotSessionConfig.from_mapping(CONFIG)
        controller = CameraController(config.pose_steps(), config.camera_intrinsics())
        step: list[float] = []
        for index in range(chunks):
            started = time.perf_counter()
            chunk = controller.chunk_control(ControlSnapshot.from_keys(index, keys[index % 4]), index, 3).camera
            chunk.video_frame_cameras((0, 2))
            step.append(time.perf_counter() - started)
        results = {"camera_ms_p50": round(statistics.median(step) * 1000, 3)}
        for width, height in ((416, 240), (832, 480)):
            sized = LingBotSessionConfig(width=width, height=height)
            controller = CameraController(sized.pose_steps(), sized.camera_intrinsics())
            rays = map_rays(sized.camera_intrinsics(), device)
            built: list[float] = []
            for index in range(chunks):
                chunk = controller.chunk_control(ControlSnapshot.from_keys(index, keys[index % 4]), index, 3).camera
                started = time.perf_counter()
                plucker_map(chunk, rays)
                if device.startswith("cuda"):
                    torch.cuda.synchronize(device)
                built.append(time.perf_counter() - started)
            results[f"plucker_map_ms_p50_{width}x{height}"] = round(statistics.median(built[1:]) * 1000, 3)
        return results
    finally:
        torch.set_num_threads(threads)


def main(args: argparse.Namespace) -> dict[str, object]:
    torch.set_num_threads(args.threads)
    devices = tuple(name.strip() for name in args.devices.split(",") if name.strip()) or ("cpu",)
    if args.random_full_size:
        from bench._full_size import full_size

        def progress(figures: Mapping[str, object]) -> None:  # a partial line: scripts/gpu-check.sh keeps it
            print(json.dumps({"partial": True, **figures}), flush=True)

        return {"load_average_1m": os.getloadavg()[0], **full_size(devices[0], args.fast_chunks, progress=progress)}
    results: dict[str, object] = {"load_average_1m": os.getloadavg()[0]}
    rounds = 1 if args.quick else FIRST_FRAME_ROUNDS
    if args.model in ("both", "reference"):
        results.update(asyncio.run(reference(args.chunks, args.threads, devices)))
        width, height = CONFIG["width"], CONFIG["height"]
        first = first_frame(ReferenceWorldModel(devices[0]), width, height, max(2, args.chunks // 3), rounds)
        results.update(asyncio.run(first))
        one_rank = placement(1, args.threads, devices)
        assert one_rank is not None
        first = first_frame(one_rank, width, height, max(2, args.chunks // 3), rounds, "processes_")
        results.update(asyncio.run(first))
        results.update(camera(args.chunks, devices[0]))
    if args.model in ("both", "lingbot-fast"):
        fast = lingbot_fast(args.model_path, devices[0], args.dtype, args.fast_resolution, args.fast_chunks, rounds)
        results.update(fast)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--chunks", type=int, default=24, help="chunks per session (the reference model)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (per rank of a 1-rank process group)")
    parser.add_argument(
        "--devices",
        default="cpu",
        help="cpu, or the GPUs to place the stages on, e.g. cuda:0,cuda:1,cuda:2 (scripts/gpu-check.sh passes them)",
    )
    parser.add_argument(
        "--model", choices=("both", "reference", "lingbot-fast"), default="both", help="which model(s) to measure"
    )
    parser.add_argument(
        "--model-path", type=Path, help="a LingBot-World-Fast model directory (default: a tiny random one, written now)"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        help="LingBot-World-Fast: auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16",
    )
    parser.add_argument("--fast-resolution", default="128x64", help="LingBot-World-Fast: WIDTHxHEIGHT, multiples of 16")
    parser.add_argument("--fast-chunks", type=int, default=12, help="LingBot-World-Fast: chunks measured")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: 4 chunks per session, 64x32 for the real model"
    )
    parser.add_argument(
        "--random-full-size",
        action="store_true",
        help="only the GPU-truth harness: the full-size model with random weights on the first device (CUDA), or "
        "the tiny one on the CPU; --fast-chunks steady-state chunks measured",
    )
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.fast_chunks, args.fast_resolution = 4, 4, "64x32"
    started = time.perf_counter()
    report(main(args), started)
