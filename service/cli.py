"""The `lingstream` command line: `serve` runs the service, `drain` asks a local one to drain (a preStop hook),
`generate` writes a clip offline (`service.offline.generate`, its own options), `play` drives a live session of a
running service from a control trace and records it (`service.play`, its own options).

    lingstream serve [--host H] [--port P] [--config FILE]
    lingstream drain [--wait] [--timeout SECONDS] [--port P]
    lingstream generate --out OUT.mp4 [...]
    lingstream play --url URL --controls TRACE --out OUT.mp4 [...]
    lingstream tiny-checkpoint DIR [--seed N]

`serve` reads the settings (environment, config file, these flags), prints one paragraph and exits 2 when they are
invalid, and otherwise runs the app under uvicorn in this one process (no workers: never fork after `livekit.rtc`
is imported); SIGTERM drains, then the process exits 0. `drain` POSTs `http://127.0.0.1:PORT/internal/drain`;
with `--wait` it polls until no session runs or the timeout passes. It exits 0 in both cases (a preStop hook must
not fail the pod's termination) and 1 when the service cannot be reached. `tiny-checkpoint` writes a LingBot-World-Fast
model directory with tiny random weights in the real layout (docs/lingbot-fast.md), for `LINGSTREAM_MODEL=lingbot-fast`
without real weights: the plumbing is real, the picture is noise. It refuses a directory that is not empty.

Test-only: `serve --worker-factory MODULE:CALLABLE` builds the model workers with that callable instead of the
LingBot service (e.g. `tests.support.fakes.world:paced_fake_workers`). It is hidden from `--help` and refused unless the
environment sets `LINGSTREAM_TEST_HOOKS=1`.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["main"]

TEST_HOOKS_VARIABLE = "LINGSTREAM_TEST_HOOKS"
_DEFAULT_PORT = 8080
_DEFAULT_DRAIN_TIMEOUT = 60.0
_POLL_INTERVAL_S = 0.5
_REQUEST_TIMEOUT_S = 5.0


def main(argv: list[str] | None = None) -> int:
    """`lingstream ...`; called by the console script without `argv` (the process's own arguments), it ends the
    process itself once `livekit.rtc` is loaded (`serve` on LiveKit, `play` on a LiveKit session): through
    `transport.livekit.ffi_exit.exit_process`, never Python's finalization, which the FFI's threads can abort."""
    code = _main(sys.argv[1:] if argv is None else argv)
    if argv is None:
        from transport.livekit.ffi_exit import exit_process, ffi_loaded

        if ffi_loaded():
            exit_process(code)
    return code


def _main(arguments: list[str]) -> int:
    if arguments[:1] == ["generate"]:
        # Its own parser, imported only here: it loads torch and PyAV, which `drain` must not pay for.
        from service.offline.generate import main as generate

        return generate(arguments[1:])
    if arguments[:1] == ["play"]:
        from service.play import main as play

        return play(arguments[1:])
    parser = argparse.ArgumentParser(prog="lingstream", description="Interactive world-model video sessions.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="run the HTTP service (SIGTERM drains, then exits 0)")
    serve.add_argument("--host", help="bind address (LINGSTREAM_HOST)")
    serve.add_argument("--port", type=int, help="TCP port (LINGSTREAM_PORT)")
    serve.add_argument("--config", type=Path, help="YAML or JSON settings file (LINGSTREAM_CONFIG_FILE)")
    serve.add_argument("--worker-factory", help=argparse.SUPPRESS)
    drain = commands.add_parser("drain", help="ask the local service to drain (a Kubernetes preStop hook)")
    drain.add_argument("--wait", action="store_true", help="wait until no session runs or the timeout passes")
    drain.add_argument("--timeout", type=float, help="seconds to wait with --wait (default LINGSTREAM_DRAIN_TIMEOUT)")
    drain.add_argument("--port", type=int, help="the service's port (default LINGSTREAM_PORT, else 8080)")
    commands.add_parser(
        "generate", help="generate a clip offline from an image and a control trace (see docs/generate.md)"
    )
    commands.add_parser(
        "play", help="drive a live session of a running service from a control trace (see docs/client.md)"
    )
    tiny = commands.add_parser(
        "tiny-checkpoint", help="write a tiny random LingBot-World-Fast model directory (docs/lingbot-fast.md)"
    )
    tiny.add_argument("directory", type=Path, metavar="DIR", help="where to write it (new or empty)")
    tiny.add_argument("--seed", type=int, default=0, help="random weights' seed (default 0)")
    args = parser.parse_args(arguments)
    if args.command == "serve":
        return _serve(args)
    if args.command == "tiny-checkpoint":
        return _tiny_checkpoint(args.directory, args.seed)
    return _drain(args)


def _tiny_checkpoint(directory: Path, seed: int) -> int:
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        sys.stderr.write(f"lingstream tiny-checkpoint: {directory} exists and is not an empty directory\n")
        return 2
    try:
        from pipeline.lingbot.models import write_tiny_model
    except ImportError as exc:
        sys.stderr.write(
            f"lingstream tiny-checkpoint: needs the lingbot extra (pip install 'lingstream[lingbot]'): {exc}\n"
        )
        return 1
    try:
        write_tiny_model(directory, seed=seed)
    except OSError as exc:
        sys.stderr.write(f"lingstream tiny-checkpoint: cannot write {directory}: {exc}\n")
        return 1
    sys.stdout.write(
        f"wrote a tiny random LingBot-World-Fast model to {directory} (dit/ vae/ text_encoder/ tokenizer/)\n"
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    # Imported here so that `lingstream drain` (a preStop hook) starts fast and needs nothing but the stdlib.
    from service.errors import SettingsError
    from service.settings import load_settings
    from service.telemetry.heap import limit_malloc_arenas

    try:
        settings = load_settings(config_file=args.config, host=args.host, port=args.port)
    except SettingsError as exc:
        sys.stderr.write(f"lingstream: {exc}\n")
        return 2
    arenas = limit_malloc_arenas(settings.malloc_arenas)  # before the imports below start any thread

    from service.app import WorkerFactory, create_app, runtime_of
    from service.logs import configure_logging
    from service.server import DrainingServer
    from service.transports import build_transport
    from service.workers import build_workers, load_factory

    factory: WorkerFactory = build_workers
    if args.worker_factory:
        if os.environ.get(TEST_HOOKS_VARIABLE) != "1":
            sys.stderr.write(f"lingstream: --worker-factory is a test hook; it needs {TEST_HOOKS_VARIABLE}=1\n")
            return 2
        try:
            factory = load_factory(args.worker_factory)  # type: ignore[assignment]
        except SettingsError as exc:
            sys.stderr.write(f"lingstream: {exc}\n")
            return 2
    # Logging is configured only once the process is committed to serving (it replaces the root handlers).
    configure_logging(settings.log_format, settings.log_level)
    logger = logging.getLogger("service.cli")
    logger.info("malloc arenas: %s", arenas)
    if args.worker_factory:
        logger.warning("TEST HOOK: model workers come from %s", args.worker_factory)
    try:
        app = create_app(settings, worker_factory=factory, transport=build_transport(settings))
    except SettingsError as exc:
        sys.stderr.write(f"lingstream: {exc}\n")
        return 2
    _warn_about_exposure(logger, settings.host or "", settings.api_key_list)

    import uvicorn

    config = uvicorn.Config(
        app,
        host=settings.host or "127.0.0.1",
        port=settings.port,
        log_config=None,
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=10,
        # None: no cap. uvicorn answers a plain-text 503 past it (before the app: not the one error shape).
        limit_concurrency=settings.max_connections,
    )
    server = DrainingServer(config, runtime_of(app))
    server.run()
    return 0 if server.started else 1


def _warn_about_exposure(logger: logging.Logger, host: str, keys: tuple[str, ...]) -> None:
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback and not keys:
        logger.warning("listening on %s without API keys: anyone who reaches this port can create sessions", host)
    short = sum(1 for key in keys if len(key) < 16)
    if short:
        logger.warning("%d API key(s) are shorter than 16 characters; use long random keys", short)


def _drain(args: argparse.Namespace) -> int:
    port = args.port if args.port is not None else int(_env_number("LINGSTREAM_PORT", _DEFAULT_PORT))
    timeout = (
        args.timeout if args.timeout is not None else _env_number("LINGSTREAM_DRAIN_TIMEOUT", _DEFAULT_DRAIN_TIMEOUT)
    )
    url = f"http://127.0.0.1:{port}/internal/drain"
    try:
        status = _call(url, "POST")
    except OSError as exc:
        sys.stderr.write(f"lingstream drain: the service at {url} is unreachable: {_reason(exc)}\n")
        return 1
    _report(status)
    if not args.wait:
        return 0
    deadline = time.monotonic() + float(timeout)
    while not _finished(status):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            sys.stderr.write(
                f"lingstream drain: {status.get('running')} session(s) still running after {timeout:g} s\n"
            )
            return 0
        time.sleep(min(_POLL_INTERVAL_S, remaining))
        try:
            status = _call(url, "GET")
        except OSError:
            sys.stderr.write("lingstream drain: the service has gone away (drained and stopped)\n")
            return 0
    _report(status)
    return 0


def _finished(status: dict[str, object]) -> bool:
    return bool(status.get("complete")) or (status.get("running") == 0 and status.get("queued") == 0)


def _call(url: str, method: str) -> dict[str, object]:
    request = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(request, timeout=_REQUEST_TIMEOUT_S) as response:
            body = json.loads(response.read().decode("utf-8"))
    except urllib.error.HTTPError as exc:
        raise OSError(f"HTTP {exc.code}: {exc.read().decode('utf-8', 'replace')[:200]}") from None
    except ValueError as exc:
        raise OSError(f"not a drain status: {exc}") from None
    if not isinstance(body, dict):
        raise OSError("not a drain status")
    return body


def _reason(exc: OSError) -> str:
    if isinstance(exc, urllib.error.URLError):
        return str(exc.reason)
    return str(exc)


def _report(status: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(status, sort_keys=True) + "\n")
    sys.stdout.flush()


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        return default


if __name__ == "__main__":
    raise SystemExit(main())
