#!/usr/bin/env bash
# Fresh machine → the whole suite: install, style, types, tests. Any failure (pytest's "no tests" exit 5 included)
# fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
export PATH="$PWD/.venv/bin:$PATH"
# One command per line: under `set -e` a failure on the left of `&&` does not stop the script.
echo "== ruff"
ruff format --check .
ruff check .
echo "== mypy"; mypy
echo "== pytest"; pytest "$@"
