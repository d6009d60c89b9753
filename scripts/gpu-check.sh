#!/usr/bin/env bash
# The checks that need a GPU, in one short run (under 10 minutes): the `gpu`-marked tests (the LingBot-World-Fast
# tiny model in bf16 on CUDA among them), then bench/lingbot.py twice: the reference model with the processes
# placement on the GPUs this machine has (up to three: a 2-rank DiT and a VAE GPU) and the LingBot-World-Fast backend
# on cuda:0 (real weights at 832x480 where LINGSTREAM_MODEL_PATH names a model directory, else the tiny random
# model); then the GPU-truth harness, `--random-full-size`: the full-size model (18.5 B DiT, Wan VAE, umt5-xxl) with
# random bf16 weights on cuda:0, no download, steady-state chunks at 832x480 (docs/lingbot-fast.md "Measuring on a
# GPU without weights"). The last line is one JSON object: {"gpu_check": "ok" | "failed", "gpus": N, "bench": the
# bench's figures, "random_full_size": the harness's}, a part that failed given as {"failed": its exit status,
# "partial": the figures it had printed so far or null} (and the script then exits 1, after the other part has run).
# Without a CUDA device it prints one JSON line saying so and exits 0, so CI runs it everywhere
# (tests/deploy/test_gpu_check.py); --dry-run prints the commands it would run instead of running them.
#
#   scripts/gpu-check.sh            # on a CUDA machine, after scripts/setup.sh --dev
#   scripts/gpu-check.sh --dry-run
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-.venv/bin/python}
dry_run=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry_run=1 ;;
    *) echo "usage: scripts/gpu-check.sh [--dry-run]" >&2; exit 2 ;;
  esac
done

gpus=$("$python" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$gpus" -eq 0 ] && [ "$dry_run" -eq 0 ]; then
  echo '{"gpu_check": "skipped", "reason": "torch sees no CUDA device", "gpus": 0}'
  exit 0
fi

used=$(( gpus < 1 ? 1 : (gpus > 3 ? 3 : gpus) ))
devices=$(seq -s, -f 'cuda:%g' 0 $(( used - 1 )))
# Budgets (seconds, each under `timeout`): 240 + 140 + 200 = 580 < 600.
tests=(timeout 240 "$python" -m pytest -q -p no:cacheprovider -m gpu tests/)
bench=(timeout 140 "$python" -m bench.lingbot --devices "$devices" --chunks 8 --fast-chunks 8)
if [ -n "${LINGSTREAM_MODEL_PATH:-}" ]; then
  bench+=(--model-path "$LINGSTREAM_MODEL_PATH" --fast-resolution 832x480)
fi
full_size=(timeout 200 "$python" -m bench.lingbot --random-full-size --devices cuda:0 --fast-chunks 6)

if [ "$dry_run" -eq 1 ]; then
  printf '%s\n' "${tests[*]}" "${bench[*]}" "${full_size[*]}"
  exit 0
fi

echo "== gpu-marked tests on $gpus GPU(s)" >&2
status=0
"${tests[@]}" >&2 || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then  # 5: no test selected is not a failure here
  echo "{\"gpu_check\": \"failed\", \"stage\": \"tests\", \"exit\": $status, \"gpus\": $gpus}"
  exit "$status"
fi

# One bench command: its output to stderr, its last line (the JSON figures) on stdout, or {"failed": status,
# "partial": the last JSON line it printed (the harness prints its figures so far before each DiT group), or null}.
figures() {
  local output code=0 partial
  echo "== ${*:3}" >&2
  output=$("$@") || code=$?
  echo "$output" >&2
  if [ "$code" -eq 0 ]; then
    echo "$output" | tail -n 1
  else
    partial=$(echo "$output" | grep '^{' | tail -n 1 || true)
    echo "{\"failed\": $code, \"partial\": ${partial:-null}}"
  fi
}
bench_json=$(figures "${bench[@]}")
full_size_json=$(figures "${full_size[@]}")
BENCH_JSON=$bench_json FULL_SIZE_JSON=$full_size_json GPUS=$gpus "$python" -c '
import json, os
parts = {"bench": json.loads(os.environ["BENCH_JSON"]), "random_full_size": json.loads(os.environ["FULL_SIZE_JSON"])}
failed = any("failed" in part for part in parts.values())
print(json.dumps({"gpu_check": "failed" if failed else "ok", "gpus": int(os.environ["GPUS"]), **parts}))
raise SystemExit(1 if failed else 0)
'
