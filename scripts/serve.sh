#!/usr/bin/env bash
# Fresh machine → running service: install (scripts/setup.sh says what and how long; a second run installs nothing),
# then `lingstream serve` (embedded transport unless LIVEKIT_URL is set).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "serve: starting lingstream serve $* (the page at /, the API reference at /docs; Ctrl-C stops it)"
exec .venv/bin/lingstream serve "$@"
