#!/usr/bin/env bash
# Installs everything lingstream needs into ./.venv (idempotent: a second run checks, installs nothing and says so).
#   scripts/setup.sh          runtime dependencies (+ the browser files: livekit-client and Swagger UI, from npm)
#   scripts/setup.sh --dev    plus the test tools, headless Chromium for the browser tests and the real LiveKit server
#                             (livekit-server, built with Go) for the LiveKit tests
#   add --check               only say what would be installed (exit 1 when something would be): every step runs
#                             its test, and `pip`, npm and apt-get do nothing
# Each step says what it installs, how big it is and how long it took on the 2-core machine where the figures were
# measured (a fresh --dev install there: 3 minutes; a second run: under a second). pip, npm and apt-get keep their
# own output, so downloads show their progress and errors stay loud.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEV=
CHECK=
for arg in "$@"; do
    case $arg in
        --dev) DEV=1 ;;
        --check) CHECK=1 ;;
        *) echo "setup: unknown option $arg (known: --dev, --check)" >&2; exit 2 ;;
    esac
done
TORCH_VERSION=${LINGSTREAM_TORCH_VERSION:-2.13.0}
started=$SECONDS
steps=0
say() { echo "setup: $*"; }
step() {
    steps=$((steps + 1))
    step_started=$SECONDS
    if [ -n "$CHECK" ]; then say "would run: $*"; else echo; say "$*"; fi
}
done_step() { [ -n "$CHECK" ] || say "  done in $((SECONDS - step_started)) s"; }
# Installers go through these, so that --check runs every step's test and installs nothing.
pip() { [ -n "$CHECK" ] || .venv/bin/python -m pip --disable-pip-version-check "$@"; }
installer() { [ -n "$CHECK" ] || "$@"; }

# What is missing: Python packages (pyproject.toml, followed transitively) and the browser files (web/package.json).
if [ -x .venv/bin/python ]; then
    missing=$(.venv/bin/python scripts/missing_packages.py ${DEV:+--dev})
else
    missing="create .venv (and everything in it)"
fi
debs=()
unmet=()
if [ -n "$DEV" ]; then
    [ -x /usr/bin/chromium ] || debs+=(chromium)
    command -v redis-server >/dev/null || debs+=(redis-server)
fi
if [ -n "$CHECK" ] && [ ! -x .venv/bin/python ]; then
    say "would run: creating the virtual environment .venv and installing everything into it"
    exit 1
fi

if [ ! -x .venv/bin/python ]; then
    step "creating the virtual environment .venv with $("$PY" --version 2>&1) (about 10 s here)"
    "$PY" -m venv .venv
    missing=$(.venv/bin/python scripts/missing_packages.py ${DEV:+--dev})
    done_step
fi
# torch first and pinned. Which build comes is the package index's choice: where a CPU-only wheel is offered it is
# that one; PyPI alone (the polyglot machines) offers its default Linux build, which pulls its CUDA runtime wheels
# (nvidia-*, triton). It runs on a CPU all the same; the CUDA libraries lie unused there.
if grep -q '^python torch' <<<"$missing"; then
    step "installing torch ${TORCH_VERSION} as the package index offers it: a CPU-only wheel where one is offered" \
        "(~190 MB, ~870 MB installed, about 45 s); else PyPI's default Linux build with its CUDA runtime wheels" \
        "(measured here, 2026-12-02: a 527 MB wheel plus ~2.2 GB of nvidia-* and triton wheels, 4.5 GB installed," \
        "144 s)"
    pip install "torch==${TORCH_VERSION}"
    done_step
fi
python_missing=$(grep '^python ' <<<"$missing" | grep -v '^python torch' || true)
if [ -n "$python_missing" ]; then
    if grep -q '(this checkout, editable)' <<<"$python_missing" && [ "$(wc -l <<<"$python_missing")" -gt 5 ]; then
        if [ -n "$DEV" ]; then
            step "installing lingstream (editable) with its runtime packages and the test tools (pytest, mypy, ruff," \
                "playwright, schemathesis, helm, hadolint): ~100 packages, ~230 MB to download, ~1.1 GB installed" \
                "(about 2 min here)"
        else
            step "installing lingstream (editable) with its runtime packages (fastapi, aiortc, livekit, av," \
                "opentelemetry, ...): ~65 packages, ~35 MB to download, ~330 MB installed (about 1.5 min here)"
        fi
    else
        step "installing what changed since the last run:" $(sed 's/^python //' <<<"$python_missing" | tr '\n' ' ')
    fi
    if [ -n "$DEV" ]; then
        pip install -e '.[dev]'
    else
        pip install -e .
    fi
    done_step
fi
# The LingBot DiT parity tests' oracle: telefuser's DiT module, without its dependencies (they pin transformers and
# pull torchvision and triton); its few small imports come with the dev extra.
TELEFUSER_VERSION=0.1.0.post3
if [ -n "$DEV" ] && [ "$(.venv/bin/python -c 'from importlib.metadata import version; print(version("telefuser"))' \
    2>/dev/null)" != "$TELEFUSER_VERSION" ]; then
    step "installing telefuser ${TELEFUSER_VERSION} --no-deps, the parity tests' oracle (a ~0.8 MB wheel)"
    pip install --no-deps "telefuser==${TELEFUSER_VERSION}"
    done_step
fi
# The LiveKit Agents tests' worker (tests/e2e/test_livekit_agents.py, the `agents` extra): livekit-agents 1.8 pins
# livekit==1.1.x while the service runs livekit 1.2, so it gets an environment of its own, .venv-agents, and runs with
# this checkout on its path (it needs aiortc too: transport.client imports it).
LIVEKIT_AGENTS_VERSION=1.8.9
if [ -n "$DEV" ] && [ "$(.venv-agents/bin/python -c 'from importlib.metadata import version; print(version("livekit-agents"))' \
    2>/dev/null)" != "$LIVEKIT_AGENTS_VERSION" ]; then
    step "creating .venv-agents with livekit-agents ${LIVEKIT_AGENTS_VERSION} for the Agents worker tests (~60 packages;" \
        "a few minutes here)"
    installer "$PY" -m venv .venv-agents
    aiortc_version=$(.venv/bin/python -c 'from importlib.metadata import version; print(version("aiortc"))')
    [ -n "$CHECK" ] || .venv-agents/bin/python -m pip --disable-pip-version-check install \
        "livekit-agents==${LIVEKIT_AGENTS_VERSION}" "aiortc==${aiortc_version}" "httpx>=0.27"
    done_step
fi
# The browser files come from npm (nothing from a CDN at run time; not committed): the page's livekit-client bundle
# and Swagger UI for /docs; and the build tools (devDependencies): TypeScript 5.9 and esbuild (with its binary
# package) for the SDK packages in web/packages/, React and its types for @lingstream/react, openapi-typescript for
# web/openapi/. The page's build of @lingstream/client is committed (service/http/web/), so serving needs none of
# them. --ignore-scripts: none needs an install script (swagger-ui-dist pulls one that would report the install to
# its vendor; esbuild's only checks its binary package).
npm_missing=$(grep '^npm ' <<<"$missing" | sed 's/^npm //' | tr '\n' ' ' || true)
if [ -n "$npm_missing" ]; then
    if command -v npm >/dev/null; then
        step "installing the browser files from npm into web/node_modules: ${npm_missing}(about 50 packages," \
            "~92 MB; about 20 s here)"
        (cd web && installer npm ci --ignore-scripts --no-audit --no-fund)
        done_step
    else
        echo "setup: npm not found; the page works on the embedded transport only (no livekit-client bundle) and" \
            "/docs says what to install (no Swagger UI)" >&2
    fi
fi
if [ -n "$DEV" ]; then
    # Debian's Chromium for the browser tests (Playwright drives it through executable_path) and a real
    # redis-server for the scale-out tests (the fixtures start it on a loopback port).
    if [ ${#debs[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
            step "installing Debian packages ${debs[*]} (chromium: ~110 MB to download, ~350 MB installed;" \
                "redis-server: ~2 MB; with the package lists' update about 30 s here)"
            installer apt-get update -q
            DEBIAN_FRONTEND=noninteractive installer apt-get install -y -q "${debs[@]}"
            done_step
        else
            echo "setup: ${debs[*]} missing and not installable here; the tests that need them will skip" >&2
            unmet+=("${debs[@]}")
        fi
    fi
fi
# The real LiveKit server the LiveKit tests run, at the release pyproject.toml pins ([tool.lingstream.dev-tools]),
# built from its Go module into .venv/bin (go install names it `server`).
livekit_server=$(grep '^go livekit-server ' <<<"$missing" | sed 's/^go livekit-server //' || true)
if [ -n "$DEV" ] && [ -n "$livekit_server" ]; then
    if command -v go >/dev/null; then
        step "building livekit-server ${livekit_server} with $(go version | cut -d' ' -f3) (go install of" \
            "github.com/livekit/livekit-server: ~75 MB into .venv/bin; about 3 min here with its modules, 1 min when" \
            "Go's module and build caches hold them)"
        if [ -z "$CHECK" ]; then
            gobin=$(mktemp -d)
            GOBIN=$gobin go install "github.com/livekit/livekit-server/cmd/server@v${livekit_server}"
            mv "$gobin/server" .venv/bin/livekit-server
            rmdir "$gobin"
        fi
        done_step
    else
        echo "setup: go not found; livekit-server ${livekit_server} cannot be built here and the LiveKit tests" \
            "will skip (install Go, then run this again)" >&2
        unmet+=(livekit-server)
    fi
fi
if [ -n "$CHECK" ]; then
    [ "$steps" -gt 0 ] || say "nothing needed installing"
    [ "$steps" -eq 0 ]
    exit
fi
# Check the result the same way: what pip could not satisfy is an error; what had no installer here was said above.
left=$missing
[ "$steps" -eq 0 ] || left=$(.venv/bin/python scripts/missing_packages.py ${DEV:+--dev})
if grep -q '^python ' <<<"$left" || { command -v go >/dev/null && grep -q '^go ' <<<"$left"; }; then
    echo "setup: still missing after installing:" $(grep '^python \|^go ' <<<"$left" | sed 's/^[a-z]* //') >&2
    exit 1
fi
if [ -n "$left" ] || [ ${#unmet[@]} -gt 0 ]; then
    say "installed what could be installed here; still missing:" $(grep -v '^go ' <<<"$left" | sed 's/^npm //') \
        "${unmet[@]}"
elif [ "$steps" -eq 0 ]; then
    checked=$((SECONDS - started))
    say "nothing needed installing: .venv, its Python packages${DEV:+ (with the test tools)} and the browser files" \
        "are in place${DEV:+, and so are chromium, redis-server and livekit-server} (checked in $([ "$checked" -gt 0 ] && echo "$checked s" || echo "under a second"))"
else
    echo
    say "installed in $((SECONDS - started)) s ($steps steps); a second run installs nothing"
fi
