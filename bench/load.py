"""Load and soak benchmark of a real `lingstream serve` on loopback: waves of clients above capacity (issue #8).

The service runs in its own process on a free 127.0.0.1 port with the embedded WebRTC transport and, by default,
the **real reference world model** (`LingBotService`: three stage threads and the execution lease) at a tiny
resolution (64x48, chunk_size 1, compute_scale 8, one torch thread): one model worker with 4 session slots and a
queue of 6. `--world fake` uses the test-only fake world (`tests.support.fakes.world:paced_fake_workers`, through
`LINGSTREAM_TEST_HOOKS=1 --worker-factory`) instead, for pure churn without model work.

Every `--wave-interval` seconds a wave of `--wave-size` clients (default 14: more than slots + queue, so some
queue and some get 429) starts the full life cycle at once. Each client creates a session, then by role:

- `peer` (3 in 7): listens to the session's SSE events, joins the embedded transport with the project's headless
  client (`transport.client`: a real aiortc peer, loopback only, as `lingstream play` uses it), holds keys (a
  `control_state` snapshot every 250 ms), counts the `chunk` statuses on the data channel, sends `stop` and waits
  for `done` on the channel and the terminal SSE event;
- `sse` (2 in 7): listens to SSE (its queue heartbeat), holds the running session a while without a transport,
  `DELETE`s it (drain) and waits for the terminal event;
- `poll` (1 in 7): polls `GET` (its heartbeat) until running, holds, `DELETE ?mode=cancel`, polls to the end;
- `vanish` (1 in 7): if queued, stops talking at once (its place must expire: `heartbeat_lost`); checked later.

`--tokens` runs the service with an API key and `LINGSTREAM_TOKEN_SECRET` (issue #35): every other client creates
as a browser would, with a client token its app's backend has just minted (`POST /v1/client_tokens` with the key,
then the create with the token), the rest with the key itself, in the same run; every other request uses the key.

Every session a client created must reach a terminal status the client saw (`sessions_lost` must be 0). Figures
on the last line (one JSON object):

- sessions_created / sessions_completed (closed after running) / rejected_429 / expired_heartbeat / failed;
- errors_5xx: answers >= 500 (must be 0); create_p50_ms / create_p99_ms: `POST /v1/sessions` latency;
- with `--tokens`: create_key_p95_ms (creates with the key), create_token_p95_ms (the mint plus the create with
  the token, as a browser's first create costs its app), token_mint_p95_ms, create_with_token_p95_ms (the create
  alone, token in hand: what verifying and counting the token adds), token_create_over_key_p95 (mint plus create
  over the key's create: two round trips over one; goal <= 1.1), create_with_token_over_key_p95 (the create with
  the token in hand over the key's create: one round trip each, what a page pays whose token was minted ahead),
  creates_with_key / creates_with_token;
- slots_leaked: after the run, `lingstream_admission_slots_retained` + |`slot_mismatch`| +
  `lingstream_pipeline_slot_leaks_total` + live sessions, from /metrics (must be 0);
- rss_*: the server's VmRSS from /proc/<pid>/status every `--rss-interval` s: rss_start_mb (after the warm-up, the
  first fifth of the run, or `--warmup` seconds), rss_end_mb (after the last client, before shutdown),
  rss_growth_mb, rss_peak_mb,
  rss_slope_mb_per_min (least squares over the post-warm-up samples; flat means close to 0) and
  rss_slope_last_half_mb_per_min (the same over their second half: bounded caches that fill up flatten out);
  rss_peak_growth_last_half_mb (the second half's peak minus the first half's: the plain test of "stopped
  growing", robust to the ~1 MB the allocator arenas move between samples);
- heap_*: the server's glibc malloc heap from /metrics (`lingstream_process_heap_*`): heap_in_use_start_mb (after
  the warm-up), heap_in_use_end_mb and heap_in_use_growth_mb (memory really held: a leak grows it), heap_free_end_mb
  (freed memory the arenas keep: fragmentation grows it) and heap_arenas;
  `--session-history N` sets the server's LINGSTREAM_SESSION_HISTORY (the finished sessions it keeps readable,
  and the close records behind them, which fill up over the first N sessions);
- lease_fairness_index: Jain's index of chunks per session among peer sessions that ran concurrently on the one
  model worker, over every interval with a fixed set of >= 2 such sessions lasting >= 1 s (time-weighted mean;
  lease_fairness_min is the worst interval); per-session chunk counts come from the `chunk` statuses.

    .venv/bin/python -m bench.load --quick      # ~30 s of churn (~50 s with the start and the wind-down)
    .venv/bin/python -m bench.load --quick --seconds 12   # the shortest smoke run (tests/bench runs this one)
    .venv/bin/python -m bench.load              # a 5-minute run (--minutes N to change it)
    .venv/bin/python -m bench.load --minutes 12 --warmup 420   # the soak: 5 minutes measured after 7 of warm-up
    .venv/bin/python -m bench.load --quick --tokens --world fake   # client tokens beside keys

Every loop is bounded in count and time and stops by itself; all traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import itertools
import json
import random
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench._common import Server, jain, metric_sum, report
from pipeline.metrics import percentile
from service.settings import Settings
from transport.base import ChunkStatus, StatusMessage
from transport.client import ApiError, ConnectError, LiveStream, ServiceClient, SessionInfo, connect

SLOTS = 4
QUEUE = 6
HEARTBEAT_S = 3.0
REFERENCE_CONFIG = {"width": 64, "height": 48, "fps": 16, "chunk_size": 1, "compute_scale": 8.0, "hud": False}
FAKE_CONFIG = {"fps": 20}
ROLES = ("peer", "sse", "peer", "poll", "peer", "sse", "vanish")
TERMINAL = frozenset({"closed", "expired", "failed", "cancelled"})
STEP_TIMEOUT_S = 30.0  # any single wait of a client (admission excepted) ends by then
CONTROL_PERIOD_S = 0.25
BENCH_KEY = "bench-load-key-0123456789abcdef"
BENCH_TOKEN_SECRET = "bench-load-token-secret-0123456789abcdef"


def serve(log: Path, world: str, history: int | None, tokens: bool = False) -> Server:
    """The service under load: one model worker with SLOTS slots and a queue of QUEUE, short heartbeat and grace."""
    settings = {
        "LINGSTREAM_NUM_WORKERS": "1",
        "LINGSTREAM_MAX_SESSIONS_PER_WORKER": str(SLOTS),
        "LINGSTREAM_QUEUE_SIZE": str(QUEUE),
        "LINGSTREAM_QUEUE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_S),
        "LINGSTREAM_RECONNECT_GRACE": "3",
        "LINGSTREAM_DRAIN_TIMEOUT": "10",
        "LINGSTREAM_TORCH_THREADS": "1",
        "LINGSTREAM_LOG_LEVEL": "WARNING",
        "LINGSTREAM_LOG_FORMAT": "json",
    }
    if history is not None:
        settings["LINGSTREAM_SESSION_HISTORY"] = str(history)
    if tokens:
        settings.update(LINGSTREAM_API_KEYS=BENCH_KEY, LINGSTREAM_TOKEN_SECRET=BENCH_TOKEN_SECRET)
    factory = "tests.support.fakes.world:paced_fake_workers" if world == "fake" else None
    return Server(log, settings, worker_factory=factory)


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def peak_growth(samples: list[tuple[float, float]]) -> float:
    """The peak of the second half of (seconds, MB) samples minus the peak of the first half: about 0 once memory
    stopped growing, however much it moves between samples (allocator arenas grow and shrink by ~1 MB)."""
    if len(samples) < 2:
        return 0.0
    half = len(samples) // 2
    return max(v for _, v in samples[half:]) - max(v for _, v in samples[:half])


def slope_per_minute(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    if len(samples) < 3:
        return 0.0
    n = len(samples)
    mean_t = sum(t for t, _ in samples) / n
    mean_v = sum(v for _, v in samples) / n
    var = sum((t - mean_t) ** 2 for t, _ in samples)
    if var == 0:
        return 0.0
    cov = sum((t - mean_t) * (v - mean_v) for t, v in samples)
    return cov / var * 60.0


def _ended(stream: LiveStream) -> bool:
    # A call, not the property inline: the stream ends while the peer awaits.
    return stream.ended


@dataclass
class PeerRecord:
    """One peer session's chunk statuses (monotonic arrival times) while it held keys."""

    start: float
    end: float = 0.0
    chunks: list[float] = field(default_factory=list)


def fairness(records: list[PeerRecord], min_window_s: float = 1.0) -> tuple[float | None, float | None, int]:
    """Jain's index over every interval in which a fixed set of >= 2 peer sessions held keys together."""
    edges = sorted({r.start for r in records} | {r.end for r in records})
    weighted = 0.0
    weight = 0.0
    worst: float | None = None
    windows = 0
    for left, right in itertools.pairwise(edges):
        if right - left < min_window_s:
            continue
        active = [r for r in records if r.start <= left and r.end >= right]
        if len(active) < 2:
            continue
        counts = [float(sum(1 for t in r.chunks if left <= t < right)) for r in active]
        if sum(counts) == 0:
            continue
        index = jain(counts)
        windows += 1
        weighted += index * (right - left)
        weight += right - left
        worst = index if worst is None else min(worst, index)
    return (weighted / weight if weight else None), worst, windows


class Load:
    def __init__(
        self, client: httpx.AsyncClient, world: str, hold: tuple[float, float], seed: int, tokens: bool = False
    ) -> None:
        self.client = client  # with the service's base URL
        self.service = ServiceClient(str(client.base_url), http=client)  # the headless peers' REST side
        self.config = REFERENCE_CONFIG if world == "reference" else FAKE_CONFIG
        self.hold = hold
        self.random = random.Random(seed)
        self.creates_ms: list[float] = []
        self.tokens = tokens
        self.key_creates_ms: list[float] = []
        self.token_creates_ms: list[float] = []  # the mint plus the create
        self.token_only_creates_ms: list[float] = []  # the create alone, with the token in hand
        self.mints_ms: list[float] = []
        self.statuses: Counter[int] = Counter()
        self.finals: Counter[str] = Counter()
        self.reasons: Counter[str] = Counter()
        self.problems: Counter[str] = Counter()
        self.errors_5xx = 0
        self.created = 0
        self.lost = 0
        self.completed = 0
        self.peers: list[PeerRecord] = []
        self.peer_chunks = 0
        self.peer_frames = 0
        self.missing_retry_after = 0
        self.vanished: dict[str, float] = {}

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = await self.client.request(method, path, **kwargs)
        if response.status_code >= 500:
            self.errors_5xx += 1
            self.problems[f"{method} {response.status_code} {response.text[:80]}"] += 1
        return response

    def finish(self, session: dict[str, Any] | None, where: str) -> None:
        if session is None or session.get("status") not in TERMINAL:
            self.lost += 1
            self.problems[f"lost ({where})"] += 1
            return
        self.finals[session["status"]] += 1
        self.reasons[str(session.get("reason"))] += 1
        if session["status"] == "failed":
            self.problems[f"failed: {session.get('error')}"] += 1

    # -- one client ---------------------------------------------------------------------------------------------

    async def client_life(self, index: int, role: str) -> None:
        body = {"config": dict(self.config, seed=index)}
        with_token = self.tokens and index % 2 == 1
        headers: dict[str, str] = {}
        started = time.perf_counter()
        if with_token:  # the app's backend mints, the browser creates with what it got
            minted = await self.request("POST", "/v1/client_tokens", json={"max_creates": 1, "ttl_seconds": 60})
            self.mints_ms.append((time.perf_counter() - started) * 1000)
            if minted.status_code != 201:
                self.problems[f"mint {minted.status_code}"] += 1
                return
            headers["Authorization"] = f"Bearer {minted.json()['token']}"
        create_started = time.perf_counter()
        created = await self.request("POST", "/v1/sessions", json=body, headers=headers)
        done = time.perf_counter()
        self.creates_ms.append((done - create_started) * 1000)
        if self.tokens:
            (self.token_creates_ms if with_token else self.key_creates_ms).append((done - started) * 1000)
            if with_token:
                self.token_only_creates_ms.append((done - create_started) * 1000)
        self.statuses[created.status_code] += 1
        if created.status_code == 429:
            if "retry-after" not in created.headers:
                self.missing_retry_after += 1
            return
        if created.status_code not in (201, 202):
            self.problems[f"create {created.status_code}"] += 1
            return
        self.created += 1
        session = created.json()
        sid = session["id"]
        if role == "vanish":
            if created.status_code == 202:
                self.vanished[sid] = time.monotonic()
                return
            final = await self.delete(sid, "cancel")
            self.finish(final, "vanish-delete")
            return
        if role == "poll":
            await self.poll_life(sid, session)
            return
        async with self.events(sid) as events:
            current = await events.until(lambda s: s["status"] != "queued")
            if current is None or current["status"] in TERMINAL:
                self.finish(current, f"{role}-admission")
                return
            if role == "peer" and current["status"] in ("admitted", "running"):
                current = await events.until(lambda s: s["status"] != "admitted")
                if current is not None and current["status"] == "running":
                    await self.peer_life(sid, current)
                else:
                    self.problems["peer: never running"] += 1
                    await self.delete(sid, "cancel")
            else:
                await asyncio.sleep(self.random.uniform(*self.hold))
                await self.delete(sid, "drain")
            final = await events.until(lambda s: s["status"] in TERMINAL)
            self.finish(final, role)
            if final is not None and final["status"] == "closed":
                self.completed += 1

    async def poll_life(self, sid: str, session: dict[str, Any]) -> None:
        deadline = time.monotonic() + 300
        while session["status"] == "queued" and time.monotonic() < deadline:
            await asyncio.sleep(0.5)  # the poll is the queued session's heartbeat (well inside HEARTBEAT_S)
            session = (await self.request("GET", f"/v1/sessions/{sid}")).json()
        if session["status"] in TERMINAL:
            self.finish(session, "poll-admission")
            return
        await asyncio.sleep(self.random.uniform(*self.hold))
        await self.delete(sid, "cancel")
        deadline = time.monotonic() + STEP_TIMEOUT_S
        while session.get("status") not in TERMINAL and time.monotonic() < deadline:
            session = (await self.request("GET", f"/v1/sessions/{sid}")).json()
            if session.get("status") not in TERMINAL:
                await asyncio.sleep(0.2)
        self.finish(session, "poll")
        if session.get("status") == "closed":
            self.completed += 1

    async def delete(self, sid: str, mode: str) -> dict[str, Any] | None:
        response = await self.request("DELETE", f"/v1/sessions/{sid}?mode={mode}")
        if response.status_code not in (200, 202):
            self.problems[f"delete {response.status_code}"] += 1
            return None
        body: dict[str, Any] = response.json()
        return body

    async def peer_life(self, sid: str, session: dict[str, Any]) -> None:
        """A headless client: the project's own (`transport.client`) joins over the embedded transport, holds keys,
        counts the `chunk` statuses, sends `stop` and waits for `done`."""
        loop = asyncio.get_running_loop()
        record = PeerRecord(start=0.0)
        holding = True
        after_stop = 0

        def on_status(message: StatusMessage) -> None:
            nonlocal after_stop
            if isinstance(message, ChunkStatus):
                if holding:
                    record.chunks.append(loop.time())
                else:
                    after_stop += 1

        try:
            stream = await connect(self.service, SessionInfo.from_body(session), connect_timeout=STEP_TIMEOUT_S)
        except ApiError as exc:
            self.problems[f"offer {exc.status}"] += 1
            await self.delete(sid, "cancel")
            return
        except ConnectError:
            self.problems["peer: channel never opened"] += 1
            await self.delete(sid, "cancel")
            return
        stream.add_status_listener(on_status)
        drain = asyncio.create_task(self.drain_frames(stream))
        try:
            record.start = loop.time()
            hold_until = record.start + self.random.uniform(*self.hold)
            keys = (frozenset({"w"}), frozenset({"w", "l"}), frozenset({"j"}))
            sent = 0
            next_send = record.start
            while (now := loop.time()) < hold_until and not _ended(stream):
                if now >= next_send:
                    await stream.send_keys(keys[sent % len(keys)])
                    sent += 1
                    next_send += CONTROL_PERIOD_S
                await asyncio.sleep(max(0.0, min(next_send, hold_until) - loop.time()))  # an absolute deadline
            record.end = loop.time()
            holding = False
            try:
                async with asyncio.timeout(STEP_TIMEOUT_S):
                    done = await stream.stop()
                if done.reason.startswith("connection lost"):
                    self.problems["peer: no done on the data channel"] += 1
            except TimeoutError:
                self.problems["peer: no done on the data channel"] += 1
            self.peers.append(record)
            self.peer_chunks += len(record.chunks) + after_stop
        finally:
            drain.cancel()
            await asyncio.gather(drain, return_exceptions=True)
            await stream.aclose()

    async def drain_frames(self, stream: LiveStream) -> None:
        async for _frame in stream.frames():
            self.peer_frames += 1

    @contextlib.asynccontextmanager
    async def events(self, sid: str) -> AsyncIterator[EventReader]:
        reader = EventReader(self.client, f"/v1/sessions/{sid}/events")
        reader.task = asyncio.create_task(reader.run())
        try:
            yield reader
        finally:
            reader.task.cancel()
            await asyncio.gather(reader.task, return_exceptions=True)

    async def check_vanished(self, older_than: float) -> None:
        """A vanished queued client's place must be gone within the heartbeat timeout (+ the admission tick).

        Only sessions created more than `older_than` seconds ago are looked at (a GET of a queued session is a
        heartbeat, so looking earlier would keep it alive)."""
        now = time.monotonic()
        for sid in [sid for sid, created in self.vanished.items() if now - created > older_than]:
            session = (await self.request("GET", f"/v1/sessions/{sid}")).json()
            if session.get("status") == "queued":
                self.problems["vanished client still queued after the heartbeat timeout"] += 1
                await self.delete(sid, "cancel")
                continue
            if session.get("status") in ("admitted", "running", "draining"):
                # Admitted before its heartbeat ran out (it waited less than HEARTBEAT_S): end it like a client would.
                self.reasons["vanish_admitted_first"] += 1
                session = await self.delete(sid, "cancel") or session
                deadline = time.monotonic() + STEP_TIMEOUT_S
                while session.get("status") not in TERMINAL and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                    session = (await self.request("GET", f"/v1/sessions/{sid}")).json()
            self.finish(session, "vanish")
            del self.vanished[sid]


class EventReader:
    """Reads one session's SSE stream into the latest snapshot; `until` waits for a condition (bounded)."""

    def __init__(self, client: httpx.AsyncClient, path: str) -> None:
        self.client = client
        self.path = path
        self.latest: dict[str, Any] | None = None
        self.changed = asyncio.Event()
        self.ended = False
        self.task: asyncio.Task[None] | None = None

    async def run(self) -> None:
        try:
            async with self.client.stream("GET", self.path, timeout=httpx.Timeout(10.0, read=60.0)) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        self.latest = json.loads(line[len("data: ") :])
                        self.changed.set()
        finally:
            self.ended = True
            self.changed.set()

    async def until(self, predicate: Any, within: float = 300.0) -> dict[str, Any] | None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                while True:
                    if self.latest is not None and predicate(self.latest):
                        return self.latest
                    if self.ended:
                        return self.latest
                    self.changed.clear()
                    await self.changed.wait()
        return self.latest


async def run(args: argparse.Namespace) -> dict[str, Any]:
    duration = args.seconds if args.seconds is not None else 30.0 if args.quick else args.minutes * 60.0
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "serve.log"
        with serve(log, args.world, args.session_history, args.tokens) as server:
            limits = httpx.Limits(max_connections=200, max_keepalive_connections=50)
            headers = {"Authorization": f"Bearer {BENCH_KEY}"} if args.tokens else {}
            async with httpx.AsyncClient(base_url=server.url, timeout=30.0, limits=limits, headers=headers) as client:
                await server.wait_ready(client, within=120.0)
                rss_ready = rss_mb(server.process.pid) or 0.0
                load = Load(client, args.world, (args.hold_min, args.hold_max), args.seed, args.tokens)
                figures = await drive(load, server.process.pid, duration, args)
                text = (await client.get("/metrics")).text
                ready_after = (await client.get("/readyz")).status_code
            exit_code = await asyncio.to_thread(server.stop, 60.0)
            log_text = log.read_text(errors="replace")
    live = metric_sum(text, "lingstream_sessions")
    retained = metric_sum(text, "lingstream_admission_slots_retained")
    mismatch = abs(metric_sum(text, "lingstream_admission_slot_mismatch"))
    pipeline_leaks = metric_sum(text, "lingstream_pipeline_slot_leaks_total")
    heap_end = heap_figures(text)
    start_in_use = figures.get("heap_in_use_start_mb")
    figures.update(
        heap_in_use_end_mb=heap_end.get("in_use_mb"),
        heap_in_use_growth_mb=None
        if start_in_use is None or "in_use_mb" not in heap_end
        else round(heap_end["in_use_mb"] - start_in_use, 1),
        heap_free_end_mb=heap_end.get("free_mb"),
        heap_arenas=heap_end.get("arenas"),
        rss_ready_mb=round(rss_ready, 1),
        live_sessions_after=live,
        slots_leaked=retained + mismatch + pipeline_leaks + live,
        pipeline_cleanup_failures=metric_sum(text, "lingstream_pipeline_cleanup_failures_total"),
        ready_after=ready_after,
        serve_exit_code=exit_code,
        server_tracebacks=log_text.count("Traceback"),
    )
    return figures


def heap_figures(metrics_text: str) -> dict[str, float]:
    """The server's malloc heap from its /metrics (glibc only; empty elsewhere): in use and free MB, arenas."""
    found: dict[str, float] = {}
    for name, key, scale in (
        ("lingstream_process_heap_in_use_bytes", "in_use_mb", 1 / 1048576),
        ("lingstream_process_heap_free_bytes", "free_mb", 1 / 1048576),
        ("lingstream_process_heap_arenas", "arenas", 1.0),
    ):
        if f"\n{name} " in metrics_text:
            found[key] = round(metric_sum(metrics_text, name) * scale, 1)
    return found


async def drive(load: Load, pid: int, duration: float, args: argparse.Namespace) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    began = loop.time()
    stop_at = began + duration
    warmup_end = began + (duration / 5 if args.warmup is None else min(args.warmup, duration))
    samples: list[tuple[float, float]] = []
    heap_start: dict[str, float] = {}
    sampling = True

    async def sample() -> None:
        while sampling:
            value = rss_mb(pid)
            if value is not None:
                samples.append((loop.time() - began, value))
            if not heap_start and loop.time() >= warmup_end:
                heap_start.update(heap_figures((await load.client.get("/metrics")).text))
            await asyncio.sleep(args.rss_interval)

    clients: set[asyncio.Task[None]] = set()
    sampler = asyncio.create_task(sample())
    index = 0
    waves = 0
    try:
        while loop.time() < stop_at:
            for _ in range(args.wave_size):
                role = ROLES[index % len(ROLES)]
                task = asyncio.create_task(load.client_life(index, role))
                clients.add(task)
                task.add_done_callback(clients.discard)
                index += 1
            waves += 1
            await load.check_vanished(older_than=HEARTBEAT_S + 1.5)
            await asyncio.sleep(max(0.0, min(args.wave_interval, stop_at - loop.time())))
            pending = [t for t in clients if not t.done()]
            if len(pending) > args.max_clients:
                await asyncio.wait(pending, timeout=STEP_TIMEOUT_S)
        ended_load = loop.time()
        if clients:
            await asyncio.wait(set(clients), timeout=300)
        for task in list(clients):
            task.cancel()
        results = await asyncio.gather(*clients, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                load.problems[f"client crashed: {type(result).__name__}"] += 1
        await asyncio.sleep(HEARTBEAT_S + 1.5)  # every vanished client's place has expired by now
        await load.check_vanished(older_than=0.0)
        await asyncio.sleep(args.rss_interval)
    finally:
        sampling = False
        await sampler
    warm = [(t, v) for t, v in samples if t >= warmup_end - began]
    rss_start = warm[0][1] if warm else (samples[0][1] if samples else 0.0)
    rss_end = samples[-1][1] if samples else 0.0
    fair, worst, windows = fairness(load.peers)
    if args.rss_trace is not None:
        args.rss_trace.write_text(json.dumps([[round(t, 2), round(v, 2)] for t, v in samples]))
    return {
        "world": args.world,
        "mode": "quick" if args.quick else f"{duration / 60:g}-minute",
        "session_history": args.session_history or Settings.model_fields["session_history"].default,
        "duration_s": round(ended_load - began, 1),
        "warmup_s": round(warmup_end - began, 1),
        "waves": waves,
        "clients": index,
        "sessions_created": load.created,
        "sessions_completed": load.completed,
        "sessions_lost": load.lost,
        "admitted_201": load.statuses[201],
        "queued_202": load.statuses[202],
        "rejected_429": load.statuses[429],
        "missing_retry_after": load.missing_retry_after,
        "expired_heartbeat": load.reasons["heartbeat_lost"],
        "failed": load.finals["failed"],
        "errors_5xx": load.errors_5xx,
        "create_p50_ms": round(percentile(load.creates_ms, 50) or 0.0, 1),
        "create_p99_ms": round(percentile(load.creates_ms, 99) or 0.0, 1),
        "peer_sessions": len(load.peers),
        "peer_chunks": load.peer_chunks,
        "peer_frames": load.peer_frames,
        "lease_fairness_index": None if fair is None else round(fair, 4),
        "lease_fairness_min": None if worst is None else round(worst, 4),
        "fairness_windows": windows,
        "rss_start_mb": round(rss_start, 1),
        "rss_end_mb": round(rss_end, 1),
        "rss_growth_mb": round(rss_end - rss_start, 1),
        "rss_peak_mb": round(max((v for _, v in samples), default=0.0), 1),
        "rss_slope_mb_per_min": round(slope_per_minute(warm), 3),
        "rss_slope_last_half_mb_per_min": round(slope_per_minute(warm[len(warm) // 2 :]), 3),
        "rss_peak_growth_last_half_mb": round(peak_growth(warm), 1),
        "rss_samples": len(samples),
        "heap_in_use_start_mb": heap_start.get("in_use_mb"),
        **token_figures(load),
        "problems": dict(load.problems),
    }


def token_figures(load: Load) -> dict[str, Any]:
    """The `--tokens` figures (none without it): key creates beside mint-plus-create with a client token."""
    if not load.tokens:
        return {}
    key_p95 = percentile(load.key_creates_ms, 95)
    token_p95 = percentile(load.token_creates_ms, 95)
    mint_p95 = percentile(load.mints_ms, 95)
    only_p95 = percentile(load.token_only_creates_ms, 95)
    return {
        "creates_with_key": len(load.key_creates_ms),
        "creates_with_token": len(load.token_creates_ms),
        "create_key_p95_ms": None if key_p95 is None else round(key_p95, 1),
        "create_token_p95_ms": None if token_p95 is None else round(token_p95, 1),
        "token_mint_p95_ms": None if mint_p95 is None else round(mint_p95, 1),
        "create_with_token_p95_ms": None if only_p95 is None else round(only_p95, 1),
        "token_create_over_key_p95": None if not key_p95 or token_p95 is None else round(token_p95 / key_p95, 3),
        "create_with_token_over_key_p95": None if not key_p95 or only_p95 is None else round(only_p95 / key_p95, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a ~30 s run instead of --minutes")
    parser.add_argument("--minutes", type=float, default=5.0, help="length of the churn run (default 5)")
    parser.add_argument(
        "--seconds", type=float, help="length of the churn run in seconds, instead of --minutes or --quick's 30"
    )
    parser.add_argument("--world", choices=("reference", "fake"), default="reference")
    parser.add_argument("--wave-size", type=int, default=14, help="clients per wave (slots 4 + queue 6 < 14)")
    parser.add_argument("--wave-interval", type=float, default=4.0, help="seconds between waves")
    parser.add_argument("--max-clients", type=int, default=60, help="pause new waves above this many live clients")
    parser.add_argument("--hold-min", type=float, default=1.5, help="shortest time a client keeps its session")
    parser.add_argument("--hold-max", type=float, default=3.0, help="longest time a client keeps its session")
    parser.add_argument("--rss-interval", type=float, default=2.0, help="seconds between RSS samples")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument(
        "--warmup", type=float, help="seconds left out of the RSS and heap figures (default: a fifth of the run)"
    )
    parser.add_argument(
        "--session-history",
        type=int,
        help="LINGSTREAM_SESSION_HISTORY of the server (default: the service's own default)",
    )
    parser.add_argument("--rss-trace", type=Path, help="write the (seconds, MB) RSS samples to this JSON file")
    parser.add_argument(
        "--tokens",
        action="store_true",
        help="an API key and a token secret: every other client mints a client token and creates with it",
    )
    args = parser.parse_args()
    if args.seconds is not None and args.seconds <= 0:
        parser.error(f"--seconds must be positive, got {args.seconds:g}")
    if args.quick:
        args.rss_interval = min(args.rss_interval, 1.0)
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    started = time.perf_counter()
    report({"started_at": started_at, **asyncio.run(run(args))}, started)


if __name__ == "__main__":
    main()
