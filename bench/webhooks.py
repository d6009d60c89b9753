"""Benchmark of webhook delivery through the real service at a steady rate of sessions (about a minute).

A real `lingstream serve` process on loopback (fake model workers through the test-only `--worker-factory` hook:
4 workers x 8 sessions) posts its webhooks to a real HTTP receiver (aiohttp) in this process. The bench creates 50
sessions per second for 20 s (each one deleted right after its create answered) and measures, per event, from its
`created_at` (the service's clock) to its arrival at the receiver (this machine's clock: the same one):

- webhook_delivery_ms_p50 / _p95 / _p99: that latency over every event received (`session.running` and
  `session.ended` of each session; a queued one also `session.queued`);
- events_received, events_per_s, sessions_created, sessions_per_s (achieved: created over the time until every
  create and delete answered), creates_refused (answers other than 201/202/5xx, e.g. 429 when the service falls
  behind), load_average_1m (the machine's, at the end: figures compare only on a quiet machine);
- ended_missing (sessions whose `session.ended` never arrived within 30 s of the last create: must be 0),
  duplicates (events received more than once: 0 unless the receiver was slow to answer), bad_signatures
  (deliveries the client's `verify_webhook` refused: must be 0), errors_5xx, delivered_total (the service's
  lingstream_webhook_deliveries_total{result="delivered"}).

`--quick` is a smoke run of 2 s at the same rate; its figures are not the ones to compare. The last line printed is
one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
from aiohttp import web

from bench._common import Server, metric_sum, report
from pipeline.metrics import percentile
from transport.client import SIGNATURE_HEADER, WebhookSignatureError, verify_webhook

SECRET = "bench-webhook-secret-0123456789"
SETTINGS = {
    "LINGSTREAM_NUM_WORKERS": "4",
    "LINGSTREAM_MAX_SESSIONS_PER_WORKER": "8",
    "LINGSTREAM_QUEUE_SIZE": "256",
    "LINGSTREAM_LOG_LEVEL": "WARNING",
    "LINGSTREAM_DRAIN_TIMEOUT": "5",
    "LINGSTREAM_WEBHOOK_SECRET": SECRET,
}


class Receiver:
    def __init__(self) -> None:
        self.latencies_ms: list[float] = []
        self.ids: Counter[str] = Counter()
        self.ended: set[str] = set()
        self.bad_signatures = 0
        self.arrived = asyncio.Event()

    async def handle(self, request: web.Request) -> web.Response:
        arrived = time.time()
        body = await request.read()
        try:
            event = verify_webhook(SECRET, body, request.headers.get(SIGNATURE_HEADER))
        except WebhookSignatureError:
            self.bad_signatures += 1
            return web.Response(status=400)
        self.ids[str(event["id"])] += 1
        self.latencies_ms.append((arrived - float(event["created_at"])) * 1000)  # type: ignore[arg-type]
        if event["type"] == "session.ended":
            data = event["data"]
            assert isinstance(data, dict)
            self.ended.add(str(data["session_id"]))
        self.arrived.set()
        return web.Response(status=204)


async def drive(url: str, rate: float, seconds: float) -> tuple[list[str], int, int]:
    """Creates `rate` sessions per second for `seconds` (each deleted once created); returns their ids, the 5xx and
    the creates refused otherwise (429: the service could not keep up)."""
    created: list[str] = []
    errors = 0
    refused = 0
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=url, timeout=10.0, limits=limits) as client:

        async def one() -> None:
            nonlocal errors, refused
            answer = await client.post("/v1/sessions", json={})
            if answer.status_code >= 500:
                errors += 1
                return
            if answer.status_code in (201, 202):
                sid = answer.json()["id"]
                created.append(sid)
                gone = await client.delete(f"/v1/sessions/{sid}", params={"mode": "cancel"})
                errors += gone.status_code >= 500
            else:
                refused += 1

        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        for index in range(int(rate * seconds)):
            delay = start + index / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # pacing on absolute deadlines
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
    return created, errors, refused


async def main(rate: float, seconds: float) -> dict[str, object]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hooks", receiver.handle)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    hook_url = f"http://127.0.0.1:{runner.addresses[0][1]}/hooks"
    try:
        with (
            tempfile.TemporaryDirectory() as folder,
            Server(
                Path(folder) / "serve.log",
                SETTINGS | {"LINGSTREAM_WEBHOOK_URLS": hook_url},
                worker_factory="tests.support.fakes.world:idle_fake_workers",
            ) as server,
        ):
            async with httpx.AsyncClient(timeout=5.0) as client:
                await server.wait_ready(client)
            began = time.monotonic()
            created, errors, refused = await drive(server.url, rate, seconds)
            driven_s = time.monotonic() - began
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30.0):
                    while not receiver.ended.issuperset(created):
                        receiver.arrived.clear()
                        await receiver.arrived.wait()
            with contextlib.suppress(TimeoutError):  # late duplicates, if any: until 0.5 s pass without one
                while True:
                    receiver.arrived.clear()
                    async with asyncio.timeout(0.5):
                        await receiver.arrived.wait()
            async with httpx.AsyncClient(timeout=5.0) as client:
                text = (await client.get(server.url + "/metrics")).text
            delivered = metric_sum(text, 'lingstream_webhook_deliveries_total{result="delivered"}')
            exit_code = await asyncio.to_thread(server.stop, 30.0)
    finally:
        await runner.cleanup()
    latencies = receiver.latencies_ms
    return {
        "webhook_delivery_ms_p50": percentile(latencies, 50) if latencies else -1.0,
        "webhook_delivery_ms_p95": percentile(latencies, 95) if latencies else -1.0,
        "webhook_delivery_ms_p99": percentile(latencies, 99) if latencies else -1.0,
        "events_received": len(latencies),
        "events_per_s": len(latencies) / driven_s,
        "sessions_created": len(created),
        "sessions_per_s": len(created) / driven_s,
        "ended_missing": len(set(created) - receiver.ended),
        "duplicates": sum(count - 1 for count in receiver.ids.values()),
        "bad_signatures": receiver.bad_signatures,
        "creates_refused": refused,
        "errors_5xx": errors,
        "delivered_total": delivered,
        "serve_exit_code": exit_code,
        "load_average_1m": os.getloadavg()[0],
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rate", type=float, default=50.0, help="sessions created per second")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 s at the same rate")
    args = parser.parse_args()
    if args.quick:
        args.seconds = 2.0
    started = time.perf_counter()
    figures = asyncio.run(main(args.rate, args.seconds))
    report(figures, started)
