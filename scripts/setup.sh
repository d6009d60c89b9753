#!/usr/bin/env bash
# Installs everything lingstream needs into ./.venv (idempotent; a second run is quick).
#   scripts/setup.sh          runtime dependencies
#   scripts/setup.sh --dev    plus the test tools
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
# torch first and pinned: the CPU wheel. An unpinned resolve may fetch a multi-GB CUDA build.
.venv/bin/python -c 'import torch' 2>/dev/null || pip install "torch==${LINGSTREAM_TORCH_VERSION:-2.13.0}"
if [ "${1:-}" = "--dev" ]; then
    pip install -e '.[dev]'
else
    pip install -e .
fi
