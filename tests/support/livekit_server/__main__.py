"""`python -m tests.support.livekit_server --host H --port P --webhook-url URL`: run the stand-in until SIGTERM or
SIGINT.

The API key and secret come from `LIVEKIT_API_KEY` and `LIVEKIT_API_SECRET`. Once listening it prints one line,
`listening on ws://H:P`, to stdout. On SIGTERM every room is closed (`SERVER_SHUTDOWN`) and the queued webhooks go
out before it exits.

Logs go to stderr at `--log-level` (DEBUG shows every signal message); aioice and aiortc log at WARNING unless
`--media-log-level` says otherwise (their DEBUG shows every connectivity check and SDP).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from aiohttp import web

from tests.support.livekit_server.server import StandIn


async def _serve(args: argparse.Namespace) -> None:
    standin = StandIn(
        os.environ["LIVEKIT_API_KEY"],
        os.environ["LIVEKIT_API_SECRET"],
        webhook_url=args.webhook_url,
        resume_window=args.resume_window,
    )
    runner = web.AppRunner(standin.app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, args.host, args.port).start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    print(f"listening on ws://{args.host}:{args.port}", flush=True)
    await stop.wait()
    await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description="A LiveKit-signalling stand-in, for tests only.")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--webhook-url", default=None)
    parser.add_argument("--resume-window", type=float, default=10.0)
    parser.add_argument("--log-level", default="INFO")
    parser.add_argument("--media-log-level", default="WARNING")
    args = parser.parse_args()
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("aioice", "aiortc"):  # their per-check INFO lines would drown the stand-in's own
        logging.getLogger(noisy).setLevel(args.media_log_level)
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
