"""Benchmark of the LingBot-World-Fast backend on the service's real path: one session, keys held, as fast as it goes.

The model is the one in `--model-path` (real weights where a GPU has them), or by default a tiny random checkpoint
written by `lingstream tiny-checkpoint`'s function into a temporary directory: on a CPU that measures the plumbing
around a real-architecture model, not the model. One model worker (`LingBotService`, `realtime=False`, so the chunk
period is generation, not playback), chunks of 3 latent frames (12 video frames), `--resolution` (default 128x64).
Figures (medians over the chunks after the first; each chunk's `timings`):

- lingbot_fast_chunk_ms_p50: the chunk period (one chunk emitted to the next);
- lingbot_fast_dit_ms_p50, lingbot_fast_vae_ms_p50: the denoise call (4 steps + the clean cache pass) and the
  decode call;
- lingbot_fast_rest_ms_p50: chunk period - DiT - VAE, everything that is not model compute (controls, the camera
  adapter, the orchestrator, the hand-offs); negative when decode overlaps the next chunk's denoise;
- lingbot_fast_overhead_share: rest ÷ chunk period (goal <= 0.03);
- lingbot_fast_fps: video frames per second generated (12 ÷ chunk period);
- lingbot_fast_first_chunk_s: the session's first ingress to its first chunk (encode, prefix, first denoise and
  decode);
- flashdreams_h100_fps, flashdreams_h100_ms_per_chunk: NVIDIA FlashDreams' published figures for the real model on
  one H100 (5.56 fps, 2 157 ms per chunk), printed beside ours for comparison; they are not measured here.

`--quick` is a smoke run (4 chunks at 64x32). The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from _common import report

from admission import ExecutionLease
from pipeline.bidirectional import CloseMode, ControlState
from pipeline.lingbot.models import LingBotFastOptions, LingBotFastWorldModel, write_tiny_model
from pipeline.lingbot.service import LingBotService

FLASHDREAMS_H100_FPS = 5.56
FLASHDREAMS_H100_MS_PER_CHUNK = 2157.0


async def session(model: LingBotFastWorldModel, width: int, height: int, chunks: int) -> dict[str, float]:
    service = LingBotService(model, lease=ExecutionLease(), realtime=False)
    await service.start()
    try:
        prepared = service.prepare({"width": width, "height": height, "fps": 16, "chunk_size": 3}, None)
        await service.create_session("bench", prepared)
        outputs = service.outputs("bench")
        periods, dit, vae = [], [], []
        for seq in range(chunks):
            service.push_control("bench", ControlState(seq, frozenset({"w", "l"})))
            chunk = await anext(outputs)
            if "chunk_period" in chunk.timings:  # every chunk after the first
                periods.append(chunk.timings["chunk_period"])
                dit.append(chunk.timings["denoise"])
                vae.append(chunk.timings["decode"])
        first = service.orchestrator.metrics("bench").first_output_latency or float("nan")
        await service.close_session("bench", CloseMode.CANCEL)
    finally:
        await service.stop()
    period, dit_ms, vae_ms = (statistics.median(values) * 1000 for values in (periods, dit, vae))
    rest = period - dit_ms - vae_ms
    return {
        "lingbot_fast_chunk_ms_p50": period,
        "lingbot_fast_dit_ms_p50": dit_ms,
        "lingbot_fast_vae_ms_p50": vae_ms,
        "lingbot_fast_rest_ms_p50": rest,
        "lingbot_fast_overhead_share": rest / period,
        "lingbot_fast_fps": 12 / (period / 1000),
        "lingbot_fast_first_chunk_s": first,
        "flashdreams_h100_fps": FLASHDREAMS_H100_FPS,
        "flashdreams_h100_ms_per_chunk": FLASHDREAMS_H100_MS_PER_CHUNK,
    }


def main(args: argparse.Namespace) -> dict[str, float]:
    torch.set_num_threads(args.threads)
    width, height = (int(part) for part in args.resolution.lower().split("x"))
    with tempfile.TemporaryDirectory(prefix="lingbot-fast-bench-") as scratch:
        path = args.model_path or write_tiny_model(Path(scratch) / "tiny")
        model = LingBotFastWorldModel.load(LingBotFastOptions(str(path), dtype=args.dtype), args.device)
        asyncio.run(session(model, width, height, 2))  # warm-up: first-call costs stay out of the figures
        results = asyncio.run(session(model, width, height, args.chunks))
    results["load_average_1m"] = os.getloadavg()[0]
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--model-path", type=Path, help="a model directory (default: a tiny random one, written now)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda:N")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    parser.add_argument("--chunks", type=int, default=12, help="chunks measured")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--resolution", default="128x64", help="WIDTHxHEIGHT, multiples of 16")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 chunks at 64x32")
    args = parser.parse_args()
    if args.quick:
        args.chunks, args.resolution = 4, "64x32"
    started = time.perf_counter()
    report(main(args), started)
