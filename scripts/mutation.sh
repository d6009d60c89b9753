#!/usr/bin/env bash
# Mutation score of the core modules (pipeline scheduler and orchestrator, admission/, the control codec and pacing,
# the Redis admission's Python side): prints ONE JSON line. Not part of .ci/run (it takes long; see docs/testing.md).
#   scripts/mutation.sh [--quick] [--group NAME ...] [--max-children N] [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
MUTMUT_VERSION=3.8.1
if [ "$("$PYTHON" -c 'import importlib.metadata as m; print(m.version("mutmut"))' 2>/dev/null)" != "$MUTMUT_VERSION" ]; then
    "$PYTHON" -m pip install --quiet "mutmut==$MUTMUT_VERSION" >&2
fi
exec "$PYTHON" scripts/mutation.py "$@"
