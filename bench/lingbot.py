"""Benchmark of LingBot sessions on the reference world model (runs in well under 60 s on 2 cores).

One model worker (`LingBotService`, three stage threads, one execution lease) generates as fast as it can
(`realtime=False`; the service's real-time pacing would otherwise pin the chunk period to the media duration)
with keys held, at 416×240, 16 fps, chunk_size 3 — first one session, then two sessions sharing the worker.
Figures come from the orchestrator's scheduler-observed metrics:

- rtf_p95: p95 chunk period ÷ media duration of one chunk (0.75 s); below 1 generation outruns playback;
- first_output_s: first accepted ingress (the condition prefetch) → first chunk emitted;
- control_to_output_p95_s: accepted control → the frames of the same chunk (anchored on the control);
- c2o_over_chunk_period: control_to_output_p95_s ÷ media duration of a chunk (target ≤ 2).

The same figures with the prefix `two_sessions_` (two sessions sharing the worker) and `heavy8_` (compute_scale 8).
`--quick` is a smoke run of a few seconds over the same path (4 chunks per session); its figures are not the ones
to compare. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import torch
from _common import report

from admission import ExecutionLease
from pipeline.bidirectional import CloseMode, ControlState
from pipeline.lingbot.reference_model import ReferenceWorldModel
from pipeline.lingbot.service import LingBotService

CONFIG = {"width": 416, "height": 240, "fps": 16, "chunk_size": 3}


async def run(sessions: int, chunks: int, compute_scale: float) -> dict[str, float]:
    service = LingBotService(ReferenceWorldModel("cpu"), lease=ExecutionLease(), realtime=False)
    await service.start()
    try:
        ids = [f"s{i}" for i in range(sessions)]
        prepared = service.prepare(dict(CONFIG, compute_scale=compute_scale), None)
        media = 4 * CONFIG["chunk_size"] / CONFIG["fps"]
        for sid in ids:
            await service.create_session(sid, prepared)

        async def drive(sid: str) -> None:
            outputs = service.outputs(sid)
            for seq in range(chunks):
                service.push_control(sid, ControlState(seq, frozenset({"w", "l"})))
                await anext(outputs)

        started = time.perf_counter()
        await asyncio.gather(*(drive(sid) for sid in ids))
        wall = time.perf_counter() - started
        rtf, first, c2o = [], [], []
        for sid in ids:
            metrics = service.orchestrator.metrics(sid)
            rtf.append(metrics.real_time_factor(media) or float("nan"))
            first.append(metrics.first_output_latency or float("nan"))
            c2o.append(metrics.control_to_output.p95 or float("nan"))
        for sid in ids:
            await service.close_session(sid, CloseMode.CANCEL)
        return {
            "rtf_p95": max(rtf),
            "first_output_s": max(first),
            "control_to_output_p95_s": max(c2o),
            "c2o_over_chunk_period": max(c2o) / media,
            "chunks_per_s": sessions * chunks / wall,
        }
    finally:
        await service.stop()


async def main(chunks: int, threads: int) -> dict[str, float]:
    torch.set_num_threads(threads)
    results: dict[str, float] = {}
    await run(1, 2, 1.0)  # warm-up: first-call costs (allocator, default scene) stay out of the figures
    for label, sessions, scale in (("", 1, 1.0), ("two_sessions_", 2, 1.0), ("heavy8_", 1, 8.0)):
        figures = await run(sessions, chunks, scale)
        results.update({f"{label}{k}": v for k, v in figures.items()})
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--chunks", type=int, default=24, help="chunks per session")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds: 4 chunks per session")
    args = parser.parse_args()
    if args.quick:
        args.chunks = 4
    started = time.perf_counter()
    report(asyncio.run(main(args.chunks, args.threads)), started)
