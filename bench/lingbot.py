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
  (decode co-located, as `LINGSTREAM_STAGE_PLACEMENT=processes` runs it); processes_over_threads is their ratio
  (goal ≤ 1.15), processes_over_threads_p50 the same for the median chunk period (the p95 of a few dozen chunks
  follows the machine's load more than the placement). The processes figure pays for handing each chunk's frames
  (3.6 MB) back to the service process through shared memory.
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

`--quick` is a smoke run over the same paths (4 chunks per session); its figures are not the ones to compare. The
last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
from collections.abc import Mapping

import torch
from _common import report

from admission import ExecutionLease
from pipeline.bidirectional import CloseMode, ControlState
from pipeline.lingbot import ModelRuntimeConfig, ProcessPlacement, ReferenceModelFactory, plan_placement
from pipeline.lingbot.group_stages import LATENT_CHANNEL_TIMING
from pipeline.lingbot.reference_model import ReferenceWorldModel
from pipeline.lingbot.service import LingBotService
from pipeline.metrics import percentile
from service.runtime.workers import WORKER_ENVIRONMENT

CONFIG = {"width": 416, "height": 240, "fps": 16, "chunk_size": 3}
MEDIA_S = 4 * CONFIG["chunk_size"] / CONFIG["fps"]
NAN = float("nan")
ROUNDS = 3


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


async def main(chunks: int, threads: int, devices: tuple[str, ...]) -> dict[str, float]:
    torch.set_num_threads(threads)
    for name, value in WORKER_ENVIRONMENT.items():  # what `lingstream serve` gives its worker processes
        os.environ.setdefault(name, value)
    results: dict[str, float] = {"load_average_1m": os.getloadavg()[0]}
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
        denoise: dict[int, list[float]] = {1: [], 2: []}
        for turn in range(ROUNDS):
            for name, service in (("threads", threaded), ("processes", processes)):
                periods[name] += (await run(service, 1, turn_chunks, 1.0, f"side{turn}")).periods
            for ranks, ranked in ((1, processes), (2, two_ranks)):
                if ranked is not None:
                    denoise[ranks] += (await run(ranked, 1, turn_chunks, 8.0, f"ranks{turn}")).denoise
        rtf = {name: (percentile(values, 95) or float("nan")) / MEDIA_S for name, values in periods.items()}
        results["threads_rtf_p95"] = rtf["threads"]
        results["processes_rtf_p95"] = rtf["processes"]
        results["processes_over_threads"] = rtf["processes"] / rtf["threads"]
        medians = {name: percentile(values, 50) or float("nan") for name, values in periods.items()}
        results["processes_over_threads_p50"] = medians["processes"] / medians["threads"]
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
        await asyncio.gather(*(service.stop() for service in services))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--chunks", type=int, default=24, help="chunks per session")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (per rank of a 1-rank process group)")
    parser.add_argument(
        "--devices",
        default="cpu",
        help="cpu, or the GPUs to place the stages on, e.g. cuda:0,cuda:1,cuda:2 (scripts/gpu-check.sh passes them)",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds: 4 chunks per session")
    args = parser.parse_args()
    if args.quick:
        args.chunks = 4
    started = time.perf_counter()
    devices = tuple(name.strip() for name in args.devices.split(",") if name.strip()) or ("cpu",)
    report(asyncio.run(main(args.chunks, args.threads, devices)), started)
