"""scripts/gpu-check.sh, the one script that runs the GPU checks, works where CI runs: it parses, says in one JSON
line that it skipped when torch sees no CUDA device, and its dry run names the commands a GPU machine would run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable}  # no GPU, even on a GPU machine
    return subprocess.run(
        ["bash", str(SCRIPT), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_script_parses_and_is_executable() -> None:
    assert os.access(SCRIPT, os.X_OK)
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stderr


def test_without_a_gpu_it_skips_in_one_json_line_and_exits_0() -> None:
    result = _run()
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "gpu_check": "skipped",
        "reason": "torch sees no CUDA device",
        "gpus": 0,
    }


def test_the_dry_run_names_the_gpu_tests_the_processes_bench_and_the_full_size_harness() -> None:
    result = _run("--dry-run")
    assert result.returncode == 0, result.stderr
    tests, bench, full_size = result.stdout.strip().splitlines()
    assert tests.endswith("-m pytest -q -p no:cacheprovider -m gpu tests/")
    # Both models: the reference on the placements, LingBot-World-Fast (the tiny model without weights) on cuda:0.
    assert bench.endswith("-m bench.lingbot --devices cuda:0 --chunks 8 --fast-chunks 8")
    # The GPU-truth harness: the full-size model with random weights, no download.
    assert full_size.endswith("-m bench.lingbot --random-full-size --devices cuda:0 --fast-chunks 6")
    budget = [int(line.split()[1]) for line in (tests, bench, full_size)]  # each under `timeout`
    assert sum(budget) < 600, budget


def test_with_real_weights_the_dry_run_benches_them_at_the_published_size(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, "LINGSTREAM_MODEL_PATH": str(tmp_path)}
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    bench = result.stdout.strip().splitlines()[1]
    assert bench.endswith(f"--chunks 8 --fast-chunks 8 --model-path {tmp_path} --fast-resolution 832x480")


_FAKE_PYTHON = """#!/usr/bin/env bash
# A stand-in interpreter for scripts/gpu-check.sh: one GPU, the tests pass, each bench prints a table and its JSON.
case "$*" in
  "-c import torch"*) echo 1 ;;
  "-m pytest"*) exit 0 ;;
  *--random-full-size*)
    echo '{"partial": true, "chunk_ms_p50_p1": 3000.0}'
    [ -n "${FULL_SIZE_EXIT:-}" ] && { echo "Traceback (most recent call last):"; exit "$FULL_SIZE_EXIT"; }
    echo "table"; echo '{"chunk_ms_p50_p1": 3000.0, "chunk_ms_p50_p8": 600.0}' ;;
  "-m bench.lingbot"*) echo "table"; echo '{"lingbot_fast_fps": 5.0}' ;;
  *) exec "$REAL_PYTHON" "$@" ;;
esac
"""


def _run_on_a_stand_in_gpu(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "python"
    fake.write_text(_FAKE_PYTHON, encoding="utf-8")
    fake.chmod(0o755)
    environment = {**os.environ, "PYTHON": str(fake), "REAL_PYTHON": sys.executable, **env}
    return subprocess.run(
        ["bash", str(SCRIPT)], cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120, check=False
    )


def test_on_a_gpu_the_last_line_holds_both_benches_figures(tmp_path: Path) -> None:
    result = _run_on_a_stand_in_gpu(tmp_path)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {
        "gpu_check": "ok",
        "gpus": 1,
        "bench": {"lingbot_fast_fps": 5.0},
        "random_full_size": {"chunk_ms_p50_p1": 3000.0, "chunk_ms_p50_p8": 600.0},
    }
    assert "python -m bench.lingbot --random-full-size --devices cuda:0" in result.stderr  # what ran, on stderr


def test_a_harness_cut_short_keeps_its_figures_so_far_beside_the_others_and_fails_the_check(tmp_path: Path) -> None:
    result = _run_on_a_stand_in_gpu(tmp_path, FULL_SIZE_EXIT="124")  # what `timeout` answers
    assert result.returncode == 1
    last = json.loads(result.stdout.strip().splitlines()[-1])
    assert last["gpu_check"] == "failed"
    assert last["bench"] == {"lingbot_fast_fps": 5.0}
    assert last["random_full_size"] == {"failed": 124, "partial": {"partial": True, "chunk_ms_p50_p1": 3000.0}}


def test_an_unknown_argument_is_refused() -> None:
    assert _run("--gpus=4").returncode == 2
