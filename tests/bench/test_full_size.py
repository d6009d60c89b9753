"""The GPU-truth harness (`python -m bench.lingbot --random-full-size`, `bench/_full_size.py`) runs here, without
CUDA, on the tiny model: the same building (meta, `to_empty`, random init), the same steady-state chunks through
`denoise_chunk` and the streamed VAE, the same figures. On a GPU `scripts/gpu-check.sh` runs it at full size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench._full_size import TINY_CP_DIT, WARM_CHUNKS, FullSize, full_size, group_sizes, random_init_
from pipeline.lingbot.models import LINGBOT_FAST_14B, PUBLISHED_CACHE, TINY_DIT, LingBotFastDiT

ROOT = Path(__file__).resolve().parents[2]


def test_the_harness_builds_the_published_sizes_on_cuda_and_the_tiny_ones_elsewhere() -> None:
    full = FullSize.for_device(torch.device("cuda", 0))
    assert (full.dit, full.width, full.height, full.dtype) == (LINGBOT_FAST_14B, 832, 480, torch.bfloat16)
    assert full.vae == {}  # AutoencoderKLWan's defaults are the Wan2.1 VAE
    assert (full.umt5["d_model"], full.umt5["num_layers"]) == (LINGBOT_FAST_14B.text_dim, 24)
    tiny = FullSize.for_device(torch.device("cpu"))
    assert tiny.dit == TINY_CP_DIT
    assert tiny.umt5["d_model"] == TINY_CP_DIT.text_dim
    # Steady state starts once the window is full: every measured chunk evicts.
    assert WARM_CHUNKS * PUBLISHED_CACHE.chunk_frames == PUBLISHED_CACHE.window_frames


def test_random_init_gives_finite_fan_in_scaled_weights() -> None:
    with torch.device("meta"):
        model = LingBotFastDiT(TINY_DIT)
    model = model.to_empty(device="cpu")
    random_init_(model, seed=0)
    weight = model.get_parameter("blocks.0.self_attn.q.weight").detach()
    assert torch.isfinite(weight).all()
    assert 0.5 < float(weight.std()) * TINY_DIT.dim**0.5 < 2.0
    assert torch.equal(model.get_parameter("blocks.0.self_attn.q.bias"), torch.zeros(TINY_DIT.dim))
    assert torch.equal(model.get_parameter("blocks.0.self_attn.norm_q.weight"), torch.ones(TINY_DIT.dim))


def test_the_groups_measured_are_the_machines_sizes_that_divide_heads_and_frame_tokens() -> None:
    # 40 heads, 1 560 tokens per latent frame at 832x480: FlashDreams' anchors first.
    assert group_sizes(LINGBOT_FAST_14B, 1560, 8) == [8, 4, 2, 5]
    assert group_sizes(LINGBOT_FAST_14B, 1560, 4) == [4, 2]
    assert group_sizes(LINGBOT_FAST_14B, 1560, 1) == []
    assert group_sizes(TINY_CP_DIT, 8, 4) == [4, 2]


@pytest.mark.timeout(300)
def test_on_the_cpu_it_measures_steady_state_chunks_of_the_tiny_model_at_one_rank() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        figures = full_size("cpu", 2, profile=False, estimates=False, max_ranks=1)
    finally:
        torch.set_num_threads(threads)
    assert figures["full_size"] is False
    assert figures["ranks_measured"] == [1]
    assert figures["skipped_ranks"] == {}
    assert figures["forwards_per_chunk_p1"] == 5  # 4 sampler steps and the clean pass
    chunk, denoise, decode = (figures[f"{name}_ms_p50_p1"] for name in ("chunk", "denoise", "decode"))
    assert isinstance(chunk, float)
    assert isinstance(denoise, float)
    assert isinstance(decode, float)
    assert 0 < denoise < chunk
    assert 0 < decode < chunk
    assert figures["fps_p1"] == pytest.approx(12 / (chunk / 1000))
    assert figures["dit_parameters"] == sum(p.numel() for p in LingBotFastDiT(TINY_CP_DIT).parameters())
    assert figures["flashdreams_h100_ms_per_chunk_p8"] == 393.0
    assert "cp_equal" not in figures  # nothing to compare with one rank only
    assert figures["attention"] == "sdpa"  # LINGSTREAM_ATTENTION=auto on the CPU: PyTorch's own SDPA choice


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_documented_quick_command_prints_the_workload_figures_and_the_labelled_estimates() -> None:
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    command = [sys.executable, "-m", "bench.lingbot", "--random-full-size", "--quick"]
    run = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=540, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    lines = run.stdout.strip().splitlines()
    figures = json.loads(lines[-1])
    # Before each larger group, the figures so far (what scripts/gpu-check.sh keeps if `timeout` cuts the run).
    partial = [json.loads(line) for line in lines if line.startswith('{"partial": true')]
    assert [line["ranks_measured"] for line in partial] == [[1], [1, 4]]
    for line in partial:  # the last line's floats are rounded to 4 decimals, the partial lines' are not
        assert line["chunk_ms_p50_p1"] == pytest.approx(figures["chunk_ms_p50_p1"], abs=1e-4)
    assert figures["meta_forward_kernels"] > 0
    assert figures["meta_forward_bytes"] > 0
    assert figures["meta_forward_syncs"] >= 0
    for ranks in (1, 2, 4, 8):
        assert figures[f"estimated_h100_ms_per_chunk_p{ranks}"] > 0
        assert f"estimated_h100_fps_p{ranks}" in figures
        assert f"all_to_all_bytes_per_forward_p{ranks}" in figures
    # Nothing measured is named like an estimate, and no estimate like a measurement.
    assert not any(key.startswith("chunk_ms") for key in figures if "estimated" in key)
    assert figures["chunk_ms_p50_p1"] > 0
    # P = 2 and 4 over gloo: the same chunks bit for bit (the context-parallel DiT is exact on the CPU).
    assert figures["ranks_measured"] == [1, 2, 4]
    assert figures["skipped_ranks"] == {}
    assert figures["cp_equal_p2"] is True
    assert figures["cp_equal_p4"] is True
    assert figures["cp_equal"] is True
    assert figures["cp2_over_cp1_chunk_ms"] > 0
