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
# On LINGSTREAM_TEST_WORKERS processes (default 2, one a core: the e2e modules wait on real time, but the suite as a
# whole kept 1.3 cores busy on 3 workers), a module to a worker so a module's servers start once; 0 runs it in this
# one process. Arguments go to pytest as they are.
workers="${LINGSTREAM_TEST_WORKERS:-2}"
echo "== pytest ($workers workers)"; pytest -n "$workers" --dist loadfile "$@"
