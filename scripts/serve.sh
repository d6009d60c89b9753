#!/usr/bin/env bash
# Fresh machine → running service: install, then `lingstream serve` (embedded transport unless LIVEKIT_URL is set).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/lingstream serve "$@"
