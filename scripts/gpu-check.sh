#!/usr/bin/env bash
# The checks that need a GPU, in one short run (under 10 minutes): the `gpu`-marked tests (the LingBot-World-Fast
# tiny model in bf16 on CUDA among them), then bench/lingbot.py: the reference model with the processes placement on
# the GPUs this machine has (up to three: a 2-rank DiT and a VAE GPU), and the LingBot-World-Fast backend on cuda:0
# (real weights at 832x480 where LINGSTREAM_MODEL_PATH names a model directory, else the tiny random model); its JSON
# line last. Without a CUDA device it prints one JSON line saying so and exits 0, so CI runs it everywhere
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
tests=(timeout 330 "$python" -m pytest -q -p no:cacheprovider -m gpu tests/)
bench=(timeout 260 "$python" -m bench.lingbot --devices "$devices" --chunks 12 --fast-chunks 12)
if [ -n "${LINGSTREAM_MODEL_PATH:-}" ]; then
  bench+=(--model-path "$LINGSTREAM_MODEL_PATH" --fast-resolution 832x480)
fi

if [ "$dry_run" -eq 1 ]; then
  printf '%s\n' "${tests[*]}" "${bench[*]}"
  exit 0
fi

echo "== gpu-marked tests on $gpus GPU(s)" >&2
status=0
"${tests[@]}" >&2 || status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 5 ]; then  # 5: no test selected is not a failure here
  echo "{\"gpu_check\": \"failed\", \"stage\": \"tests\", \"exit\": $status, \"gpus\": $gpus}"
  exit "$status"
fi
echo "== ${bench[*]:2}" >&2
output=$("${bench[@]}")
echo "$output" >&2
echo "$output" | tail -n 1
