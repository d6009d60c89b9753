#!/usr/bin/env bash
# Installs everything lingstream needs into ./.venv (idempotent; a second run is quick).
#   scripts/setup.sh          runtime dependencies (+ the browser client's livekit-client bundle)
#   scripts/setup.sh --dev    plus the test tools and headless Chromium for the browser tests
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
# The page's LiveKit client comes from the npm package (no CDN at run time; not committed).
if [ ! -f web/node_modules/livekit-client/dist/livekit-client.umd.js ]; then
    if command -v npm >/dev/null; then
        (cd web && npm ci --no-audit --no-fund --loglevel=error)
    else
        echo "setup: npm not found; the page works on the embedded transport only (no livekit-client bundle)" >&2
    fi
fi
if [ "${1:-}" = "--dev" ]; then
    # Debian's Chromium for the browser tests (Playwright drives it through executable_path) and a real
    # redis-server for the scale-out tests (the fixtures start it on a loopback port).
    missing=()
    [ -x /usr/bin/chromium ] || missing+=(chromium)
    command -v redis-server >/dev/null || missing+=(redis-server)
    if [ ${#missing[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            apt-get update -qq >/dev/null
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
        else
            echo "setup: ${missing[*]} missing and not installable here; the tests that need them will skip" >&2
        fi
    fi
fi
