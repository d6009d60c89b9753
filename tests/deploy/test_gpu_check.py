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


def test_the_dry_run_names_the_gpu_tests_and_the_processes_bench() -> None:
    result = _run("--dry-run")
    assert result.returncode == 0, result.stderr
    tests, bench = result.stdout.strip().splitlines()
    assert tests.endswith("-m pytest -q -p no:cacheprovider -m gpu tests/")
    # Both models: the reference on the placements, LingBot-World-Fast (the tiny model without weights) on cuda:0.
    assert bench.endswith("-m bench.lingbot --devices cuda:0 --chunks 12 --fast-chunks 12")
    budget = [int(line.split()[1]) for line in (tests, bench)]  # each under `timeout`
    assert sum(budget) < 600, budget


def test_with_real_weights_the_dry_run_benches_them_at_the_published_size(tmp_path: Path) -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHON": sys.executable, "LINGSTREAM_MODEL_PATH": str(tmp_path)}
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    bench = result.stdout.strip().splitlines()[-1]
    assert bench.endswith(f"--chunks 12 --fast-chunks 12 --model-path {tmp_path} --fast-resolution 832x480")


def test_an_unknown_argument_is_refused() -> None:
    assert _run("--gpus=4").returncode == 2
