"""A session outlives its replica (issue #33; docs/continuity.md): two real `lingstream serve` replicas on one real
redis-server, the reference model on threads, the embedded transport. The replica running a session is SIGKILLed;
the other adopts it from its Redis checkpoint (same id, its slot moved in one script), and the Python client,
connecting again through the surviving replica with the same session id and API key, gets frames of the chunks
after the checkpoint, not a new session from chunk 0. The served page, in Chromium behind a front door (one origin
for both replicas, as a load balancer), does the same by itself: `@lingstream/client`'s embedded link rejoins.
That the reference model's frames after adoption are the frames of an unbroken run, bit for bit, is proven at the
worker (`tests/unit/pipeline/lingbot/policy/test_reseed.py`): here they cross a lossy video codec.

Its own module, not a test of `test_scaleout.py`: those replicas run fake workers, which cannot be rebuilt from a
checkpoint; this one needs the reference model (each replica's start costs a torch import)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
import redis
from redis.asyncio import Redis

from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.browser.pages import start_session, wait_frames
from tests.support.fakes.redis_server import NEEDS_REDIS_SERVER, RedisServer
from tests.support.front_door import FrontDoor, ThreadedFrontDoor
from tests.support.serving import Replica, spawn_replica, wait_until_ready
from tests.support.waits import until, until_sync
from tests.support.watching import SessionWatch, rejoined_at, watch_session
from transport.base import StateStatus
from transport.client import LiveStream, ReconnectPolicy, ServiceClient, connect

if TYPE_CHECKING:  # playwright is a dev extra; BROWSER_SKIPS skips the page's test without it
    from playwright.sync_api import Page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(400),
    NEEDS_REDIS_SERVER,
]

TTL_S = 1.5
# The page's test: a checkpoint lives three TTLs, and its orphan waits for the survivor's slot (held by a second
# session until the page has been refused once; Chromium notices the dead peer after several seconds): 1.5 s would
# let the checkpoint lapse first (the session then fails `replica_lost ... no checkpoint`, as the page duly shows).
PAGE_TTL_S = 6.0
PREFIX = "lingstream:admission:"
KEY = "adoption-test-key-0123456789abcd"
CONFIG = {"width": 64, "height": 48, "chunk_size": 1, "hud": False, "seed": 11}
STARTUP_S = 90.0
PAUSED = "r2"  # the rolling restart: r2's session is paused when its replica is drained
# The client's own reconnect, with a budget for this test's TTL (the default, 60 s, covers the default 10 s TTL).
POLICY = ReconnectPolicy(budget_s=TTL_S + 40, stall_s=2.0)


async def _ready(http: httpx.AsyncClient, replica: Replica) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if replica.process.poll() is not None:
            pytest.fail(f"replica {replica.name} exited with {replica.process.returncode}:\n{replica.output()}")
        with contextlib.suppress(httpx.TransportError):
            if (await http.get(replica.url + "/readyz")).status_code == 200:
                return
        await asyncio.sleep(0.1)  # polling a subprocess with a deadline
    pytest.fail(f"replica {replica.name} was not ready in {STARTUP_S} s:\n{replica.output()}")


def _spawn(tmp_path: Path, redis_url: str, name: str, **settings: str) -> Replica:
    log = tmp_path / f"{name}.log"
    process, port = spawn_replica(
        log,
        redis_url=redis_url,
        replica_id=name,
        worker_factory=None,
        LINGSTREAM_REPLICA_TTL=str(TTL_S),
        LINGSTREAM_API_KEYS=KEY,
        LINGSTREAM_TORCH_THREADS="1",
        **settings,
    )
    return Replica(name, process, port, log)


@contextlib.asynccontextmanager
async def _replicas(
    tmp_path: Path, names: tuple[str, ...] = ("r1", "r2"), **settings: str
) -> AsyncIterator[tuple[Redis, dict[str, Replica], Callable[[str], Replica]]]:
    """Replicas `names` on one redis-server, ready; the third value starts another one (in the same dict, not waited
    for). Every replica is killed at the end, and on a failure their output is printed."""
    with RedisServer(tmp_path) as server:
        raw = Redis.from_url(server.url)
        replicas: dict[str, Replica] = {}

        def spawn(name: str) -> Replica:
            replica = replicas[name] = _spawn(tmp_path, server.url, name, **settings)
            return replica

        for name in names:
            spawn(name)
        try:
            with _reaped(replicas):
                async with httpx.AsyncClient(timeout=15.0) as http:
                    await asyncio.gather(*(_ready(http, replica) for replica in replicas.values()))
                yield raw, replicas, spawn
        finally:
            await raw.aclose()


@contextlib.contextmanager
def _reaped(replicas: dict[str, Replica]) -> Iterator[None]:
    """On a failure inside, print every replica's output (pytest hands a fixture no failure); at the end, kill
    every replica still running."""
    try:
        yield
    except BaseException:
        for replica in replicas.values():
            print(f"--- {replica.name}\n{replica.output()[-8000:]}")
        raise
    finally:
        for replica in replicas.values():
            if replica.process.poll() is None:
                replica.process.kill()
            replica.process.wait(timeout=10)


async def _chunks_seen(stream: LiveStream, count: int, within: float) -> list[int]:
    """Chunk indices of the frames received until `count` distinct chunks came."""
    seen: list[int] = []
    async with asyncio.timeout(within):
        while len(seen) < count:
            frame = await stream.next_frame()
            assert frame is not None, f"the stream ended: {stream.done}"
            if frame.chunk is not None and frame.chunk.index not in seen:
                seen.append(frame.chunk.index)
    return seen


async def test_a_killed_replicas_session_is_adopted_and_its_client_follows_it_by_itself(tmp_path: Path) -> None:
    async with _replicas(tmp_path) as (raw, replicas, _), FrontDoor([replicas["r1"].port, replicas["r2"].port]) as door:
        first, second = replicas["r1"], replicas["r2"]
        async with ServiceClient(door.url, api_key=KEY) as service:
            created = await service.create(config=CONFIG)  # through the front door: r1 takes it
            sid = created.id
            stream = await connect(service, await service.wait_streaming(sid), reconnect=POLICY)
            states: list[tuple[float, StateStatus]] = []
            stream.add_status_listener(
                lambda m: states.append((time.monotonic(), m)) if isinstance(m, StateStatus) else None
            )
            try:
                await stream.send_keys(["w", "l"])
                before = await _chunks_seen(stream, 3, within=60)
                assert (await raw.hget(f"{PREFIX}t:{sid}", "replica")) == b"r1"
                await until(lambda: raw.hget(f"{PREFIX}t:{sid}", "ad"), "the session marked adoptable", within=10)
                header = await raw.get(f"{PREFIX}ckpt:h:{sid}")
                assert header is not None
                killed_at = time.monotonic()
                first.process.send_signal(signal.SIGKILL)
                first.process.wait(timeout=10)
                checkpoint = json.loads(await raw.get(f"{PREFIX}ckpt:h:{sid}") or header)
                resume_at = checkpoint["next_chunk"]
                assert resume_at > max(before) - 2  # written at the chunk boundaries as they came

                # Nothing more is done by hand: the same stream notices the silence, asks the service (the front
                # door now reaches r2 only), is refused until r2 adopted the session, joins it there, sends its
                # held keys again, and its frames go on.
                after: list[int] = []
                async with asyncio.timeout(TTL_S + 60):
                    while len(after) < 2:
                        frame = await stream.next_frame()
                        assert frame is not None, f"the stream ended: {stream.done} {stream.errors}"
                        chunk = frame.chunk
                        if chunk is not None and frame.received_at > rejoined_at(states) and chunk.index not in after:
                            after.append(chunk.index)
                recovered_s = time.monotonic() - killed_at
                assert min(after) >= resume_at, (before, resume_at, after)  # it went on; no chunk 0 again
                assert await _on(raw, sid, b"r2")
                assert await raw.hgetall(f"{PREFIX}held:r2") == {sid.encode(): b"0"}
                stats = stream.statistics()
                assert stats.reconnects == 1, stats
                told = [(s.state, s.detail) for at, s in states if at > killed_at]
                assert told[0][0] == "recovering", told  # surfaced to the caller, then running again
                assert ("running", "reconnected") in told, told
                assert door.connections[second.port] > 0
                done = await stream.stop()
                assert done.reason == "client_stop", done
            finally:
                await stream.aclose()
            ended = await service.get(sid)
            assert ended.status == "closed", ended
            metrics = (await service.request("GET", "/metrics")).text
            assert 'lingstream_sessions_recovered_total{cause="replica_lost"} 1.0' in metrics
            # Counted from r1's last heartbeat: the reaper waited at least one TTL after it before orphaning.
            recovery_s = _sample(metrics, 'lingstream_session_recovery_seconds_sum{cause="replica_lost"}')
            assert TTL_S <= recovery_s < TTL_S + 60, recovery_s
        print(f"states after the kill: {told}; recovery_seconds{{replica_lost}} {recovery_s:.2f} s")
        print(
            f"the client joined the adopted session by itself {stats.last_recovery_s:.2f} s after giving its "
            f"connection up; first frame of a later chunk {recovered_s:.2f} s after the kill (TTL {TTL_S} s)"
        )
        await until(lambda: _no_slots(raw), "every slot back, no orphan left", within=10)
        assert "Traceback" not in second.output()


def _sample(metrics: str, name: str) -> float:
    line = next(line for line in metrics.splitlines() if line.startswith(name + " "))
    return float(line.rsplit(" ", 1)[1])


async def _on(raw: Redis, sid: str, replica: bytes) -> bool:
    fields = await raw.hmget(f"{PREFIX}t:{sid}", ["replica", "state"])
    return fields == [replica, b"admitted"] and await raw.zscore(f"{PREFIX}orphans", sid) is None


async def _no_slots(raw: Redis) -> bool:
    held = [key async for key in raw.scan_iter(match=f"{PREFIX}held:*")]
    orphans = await raw.zcard(f"{PREFIX}orphans")
    checkpoints = [key async for key in raw.scan_iter(match=f"{PREFIX}ckpt:*")]
    return not held and orphans == 0 and not checkpoints


def _in_chromium(test: Callable[..., None]) -> Callable[..., None]:
    for mark in (pytest.mark.browser, *BROWSER_SKIPS):
        test = mark(test)
    return test


@_in_chromium
def test_the_page_rejoins_by_itself_when_its_replica_is_killed(tmp_path: Path) -> None:
    """The page keeps playing the same session through the loss of its replica: no new create, no error shown,
    `recovering` then frames of the chunks after the checkpoint on a new peer connection to the adopter.

    The adoption is held back until the page has tried to rejoin and been refused (409: the registry names the dead
    replica, or the orphan is on no transport yet), which a page must ride out: a second session fills the survivor's
    one slot meanwhile, and the test frees it once the page's connection line shows the refusal. Without that order
    the page's loss detection (Chromium notices a dead peer after some seconds) could outlast the adoption and the
    refusal path would go untried.

    Then the page pauses the session and its new replica is drained with hand-off (SIGTERM, as a rolling restart's
    next step, the front door's endpoints moved to a third replica): the page rejoins the adopter, shows `paused`
    (never `running`, Resume offered), gets no chunk, and its Resume plays chunks from the checkpoint on."""
    with RedisServer(tmp_path) as server:
        raw = redis.Redis.from_url(server.url)
        replicas: dict[str, Replica] = {}

        def spawn(name: str) -> Replica:
            log = tmp_path / f"{name}.log"
            process, port = spawn_replica(
                log,
                redis_url=server.url,
                replica_id=name,
                worker_factory=None,
                LINGSTREAM_REPLICA_TTL=str(PAGE_TTL_S),
                LINGSTREAM_TORCH_THREADS="1",
                LINGSTREAM_DRAIN_MODE="hand_off",
                LINGSTREAM_DRAIN_TIMEOUT="40",
            )
            replicas[name] = Replica(name, process, port, log)
            return replicas[name]

        try:
            with _reaped(replicas):
                for name in ("r1", "r2"):
                    spawn(name)
                for replica in replicas.values():
                    wait_until_ready(replica.url, replica.process, replica.output, within_s=STARTUP_S)
                first, second = replicas["r1"], replicas["r2"]
                with ThreadedFrontDoor([first.port, second.port]) as door, launch_chromium() as browser:
                    page = browser.new_context().new_page()
                    page.set_default_timeout(60_000)
                    page_errors: list[str] = []
                    page.on("pageerror", lambda error: page_errors.append(str(error)))
                    page.goto(door.url)
                    page.wait_for_function("window.lingstream !== undefined")
                    start_session(page, CONFIG["width"], CONFIG["height"])
                    wait_frames(page, 10)
                    sid = page.evaluate("window.lingstream.sessionId")
                    assert raw.hget(f"{PREFIX}t:{sid}", "replica") == b"r1"
                    deadline = time.monotonic() + 15
                    while not raw.hget(f"{PREFIX}t:{sid}", "ad"):
                        assert time.monotonic() < deadline, "the session was not marked adoptable"
                        time.sleep(0.05)  # polling Redis against a deadline
                    blocker = httpx.post(f"{second.url}/v1/sessions", json={"config": CONFIG}, timeout=15).json()["id"]
                    assert raw.hget(f"{PREFIX}t:{blocker}", "replica") == b"r2", "the blocker holds the survivor's slot"
                    page.evaluate(
                        """() => { window.seenStates = []; window.seenLines = [];
                           window.lingstream.session.on("state", ({ state }) => window.seenStates.push(state));
                           window.lingstream.session.on("connection", ({ text }) => window.seenLines.push(text)); }"""
                    )
                    generation = page.evaluate("window.lingstream.generation")

                    killed_at = time.monotonic()
                    first.process.send_signal(signal.SIGKILL)
                    first.process.wait(timeout=10)
                    frames_at_kill = page.evaluate("window.lingstream.frames")
                    resume_at = json.loads(raw.get(f"{PREFIX}ckpt:h:{sid}") or b"{}")["next_chunk"]

                    # A hiccup: recovering; the page's tries are refused while nobody has adopted the session; once the
                    # survivor has room it adopts it and the same session plays again on a new peer connection.
                    seen = "() => ({ states: seenStates, lines: seenLines, errors: window.lingstream.session.errors })"
                    try:
                        page.wait_for_function("window.seenStates.includes('recovering')", timeout=30_000)
                        page.wait_for_function(
                            "window.seenLines.some((line) => line.startsWith('offer refused: 409'))", timeout=30_000
                        )
                    except Exception:
                        print(f"the page saw: {page.evaluate(seen)}; Redis: {raw.hgetall(f'{PREFIX}t:{sid}')}")
                        raise
                    assert raw.hget(f"{PREFIX}t:{sid}", "replica") != b"r2", "adopted before the page was refused"
                    cancelled = httpx.delete(
                        f"{second.url}/v1/sessions/{blocker}", params={"mode": "cancel"}, timeout=15
                    )
                    assert cancelled.status_code == 200, cancelled.text
                    try:
                        page.wait_for_function(
                            # A chunk status on the new connection: the adopter generated and sent a chunk (the
                            # frame count alone also grows with its track's keep-warm repeats before its first
                            # chunk, and the last status may be the lost replica's chunk at the checkpoint).
                            """([frames, chunk, generation]) => window.lingstream.state === "running"
                               && window.lingstream.generation > generation && window.lingstream.frames > frames + 10
                               && window.lingstream.chunks.some((c) => c.generation > generation
                                                                        && c.index >= chunk)""",
                            arg=[frames_at_kill, resume_at, generation],
                            timeout=45_000,
                        )
                    except Exception:
                        print(f"the page saw: {page.evaluate(seen)}; Redis: {raw.hgetall(f'{PREFIX}t:{sid}')}")
                        raise
                    rejoined_s = time.monotonic() - killed_at
                    assert page.evaluate("window.lingstream.sessionId") == sid
                    assert raw.hget(f"{PREFIX}t:{sid}", "replica") == b"r2"
                    assert page.evaluate("window.lingstream.session.errors") == []
                    assert not page.evaluate("document.getElementById('message').classList.contains('error')")
                    assert page.evaluate("window.lingstream.ended") is False
                    listed = httpx.get(f"{door.url}/v1/sessions", timeout=10).json()["sessions"]
                    assert sorted(body["id"] for body in listed) == sorted([sid, blocker]), "the page created no other"
                    until_sync(
                        lambda: (
                            'lingstream_sessions_recovered_total{cause="replica_lost"} 1.0'
                            in httpx.get(f"{second.url}/metrics", timeout=10).text
                        ),
                        "the adopter counted the recovery",
                    )

                    page_lines_refused = page.evaluate(
                        "window.seenLines.filter((line) => line.startsWith('offer refused')).length"
                    )
                    shown_s, exited_s = _paused_page_handed_off(page, raw, door, second, spawn("r3"), sid)
                    page.click("#stop")
                    page.wait_for_function("window.lingstream.done === 'client_stop'")
                    assert page_errors == []
                refused = page_lines_refused
                print(
                    f"the page played again {rejoined_s:.2f} s after the kill (TTL {PAGE_TTL_S} s; {refused} refused "
                    f"tries before the survivor had room); routed {door.connections}; handed off paused, shown "
                    f"paused again on the adopter {shown_s:.2f} s after the SIGTERM (the old replica exited after "
                    f"{exited_s:.2f} s)"
                )
                assert "Traceback" not in second.output()
                assert "Traceback" not in replicas["r3"].output()
        finally:
            raw.close()


def _paused_page_handed_off(
    page: Page, raw: redis.Redis, door: ThreadedFrontDoor, old: Replica, new: Replica, sid: str
) -> tuple[float, float]:
    """The page holds `w` and pauses its session on `old`; `new` (just spawned) becomes the front door's endpoint and
    `old` is drained with hand-off. The page rejoins the session on `new` by itself and shows it `paused` (told by the
    adopter; never `running`), no chunk comes; its Resume plays chunks from the checkpoint on. How long after the
    SIGTERM the page showed `paused` again, and `old` exited."""
    page.focus("#stage")
    page.keyboard.down("w")  # resent every 250 ms while held: paused, it generates nothing; resumed, chunks flow
    page.click("#pause")
    page.wait_for_function("window.lingstream.state === 'paused'", polling=100)
    wait_until_ready(new.url, new.process, new.output, within_s=STARTUP_S)  # seconds: the pause lasts through it
    deadline = time.monotonic() + 15
    while not raw.hget(f"{PREFIX}t:{sid}", "ad"):
        assert time.monotonic() < deadline, "the session was not marked adoptable on its adopter"
        time.sleep(0.05)  # polling Redis against a deadline
    page.evaluate("() => { window.seenStates = []; }")
    page.evaluate(
        """() => { window.timeline = []; const t0 = performance.now();
           const at = () => Math.round(performance.now() - t0); const s = window.lingstream.session;
           s.on("state", ({ state }) => window.timeline.push([at(), "state", state]));
           s.on("snapshot", (snap) => window.timeline.push([at(), "snapshot", snap.status]));
           s.on("connection", ({ text }) => window.timeline.push([at(), "connection", text])); }"""
    )
    chunks = len(page.evaluate("window.lingstream.chunks"))
    generation = page.evaluate("window.lingstream.generation")
    door.route([new.port])  # the Service's endpoints: the ready replacement, not the draining pod
    drained_at = time.monotonic()
    old.process.send_signal(signal.SIGTERM)
    seen = "() => ({ states: seenStates, timeline: window.timeline, errors: window.lingstream.session.errors })"
    try:
        page.wait_for_function(
            """(generation) => window.seenStates.includes('recovering') && window.lingstream.state === 'paused'
               && window.lingstream.generation > generation""",
            arg=generation,
            polling=100,
        )
    except Exception:
        print(f"the page saw: {page.evaluate(seen)}; Redis: {raw.hgetall(f'{PREFIX}t:{sid}')}")
        raise
    shown_s = time.monotonic() - drained_at
    assert old.process.wait(timeout=60) == 0, old.output()[-4000:]
    exited_s = time.monotonic() - drained_at
    # The page's event stream, opened on `old` while the session was orphaned, ends with the drain: the server's
    # shutdown neither waits for it nor cancels it (it did, 10 s and a traceback, before `_end_streams`).
    assert "timeout graceful shutdown exceeded" not in old.output(), old.output()[-4000:]
    assert raw.hget(f"{PREFIX}t:{sid}", "replica") == new.name.encode()
    next_chunk = json.loads(raw.get(f"{PREFIX}ckpt:h:{sid}") or b"{}")["next_chunk"]
    assert page.inner_text("#pause") == "Resume"
    assert page.is_enabled("#pause")
    saw = page.evaluate(seen)
    assert "running" not in saw["states"], saw  # told paused by the adopter, never running
    assert len(page.evaluate("window.lingstream.chunks")) == chunks, saw  # paused: no chunk generated
    assert httpx.get(f"{new.url}/v1/sessions/{sid}", timeout=10).json()["status"] == "paused"
    assert "goes on paused" in new.output()
    page.click("#pause")  # Resume
    page.wait_for_function(
        """([count, chunk]) => window.lingstream.state === "running"
           && window.lingstream.chunks.length >= count + 2 && window.lingstream.lastChunk.index >= chunk + 1""",
        arg=[chunks, next_chunk],
        polling=100,
    )
    page.keyboard.up("w")
    after = [c["index"] for c in page.evaluate("window.lingstream.chunks")[chunks:]]
    assert after == sorted(after), after
    assert min(after) >= next_chunk, (after, next_chunk)  # from the checkpoint on
    assert page.evaluate("window.lingstream.sessionId") == sid
    assert page.evaluate("window.lingstream.session.errors") == []
    assert not page.evaluate("document.getElementById('message').classList.contains('error')")
    metrics = httpx.get(f"{new.url}/metrics", timeout=10).text
    assert 'lingstream_sessions_recovered_total{cause="replica_draining"} 1.0' in metrics
    print(f"handed off paused: the page's timeline (ms after the SIGTERM) {page.evaluate('window.timeline')[:16]}")
    return shown_s, exited_s


async def test_a_rolling_restart_of_three_replicas_hands_three_live_sessions_on_and_ends_none(
    tmp_path: Path,
) -> None:
    """Three replicas of one slot each, three sessions live; as a Deployment with `maxSurge: 1` rolls, each replica in
    turn gets its replacement, then SIGTERM (`LINGSTREAM_DRAIN_MODE=hand_off`): it hands its session to the
    replacement (the only free slot) and exits 0 once it has. Every session goes on with its id through its hand-off
    and ends only when its client stops it. Each client reaches the service through its own front door, routed as a
    Service's endpoints are: the replica running its session, then the replacement once it is ready (the embedded
    transport's offer must reach the replica that runs the session). r2's session is paused when its turn comes: it
    is handed off too, goes on paused on the adopter (its pause counted from its first pause) and plays once
    resumed."""
    names = ("r1", "r2", "r3")
    async with _replicas(tmp_path, names, LINGSTREAM_DRAIN_MODE="hand_off", LINGSTREAM_DRAIN_TIMEOUT="40") as (
        raw,
        replicas,
        spawn,
    ):
        async with contextlib.AsyncExitStack() as doors:
            watches: dict[str, SessionWatch] = {}
            sigterm_at: dict[str, float] = {}
            for name in names:
                door = await doors.enter_async_context(FrontDoor([replicas[name].port]))
                async with ServiceClient(door.url, api_key=KEY) as service:
                    sid = (await service.create(config=CONFIG)).id
                await until(_on_replica(raw, sid, name), f"{sid} admitted on {name}", within=30)
                watches[name] = SessionWatch(sid, door)
            async with asyncio.TaskGroup() as group:
                for watch in watches.values():
                    group.create_task(watch_session(watch, KEY, POLICY))
                for watch in watches.values():
                    await until(_frames(watch, 3), f"frames of {watch.sid}", within=90)
                for name in names:
                    if name == PAUSED:  # its player paused it before the rollout reached its replica
                        async with ServiceClient(watches[name].door.url, api_key=KEY) as service:
                            assert (await service.pause(watches[name].sid)).status == "paused"
                        paused_at = time.monotonic()
                    old, new, watch = replicas[name], spawn(f"{name}-next"), watches[name]
                    async with httpx.AsyncClient(timeout=15.0) as http:
                        await _ready(http, new)  # seconds (a replica's start): the pause lasts through it
                    await until(_marked(raw, watch.sid), "marked adoptable", within=10)
                    watch.door.route([new.port])  # the endpoints: the ready replacement, not the draining pod
                    sigterm_at[name] = time.monotonic()
                    old.process.send_signal(signal.SIGTERM)
                    assert await asyncio.to_thread(old.process.wait, 60) == 0, old.output()[-4000:]
                    if name == PAUSED:
                        await _resumed_paused_on(new, watch, sigterm_at[name], paused_at)
                    await until(watch.streaming_again(sigterm_at[name]), f"{watch.sid} streaming again", within=60)
                    assert await _on(raw, watch.sid, new.name.encode())
                    assert "handed off" in old.output()
                    async with httpx.AsyncClient(timeout=15.0) as http:
                        metrics = (await http.get(f"{new.url}/metrics")).text
                    # counted as a hand-off (the orphan's reason reached the adopter), not as a replica loss
                    assert _sample(metrics, 'lingstream_sessions_recovered_total{cause="replica_draining"}') == 1.0
                    assert 'lingstream_sessions_recovered_total{cause="replica_lost"}' not in metrics
                for watch in watches.values():
                    watch.stop.set()
        gaps: list[float] = []
        for watch in watches.values():
            assert watch.done is not None, watch
            assert watch.done.reason == "client_stop", watch
            assert watch.stream is not None
            assert watch.stream.statistics().reconnects == 1, watch  # one hand-off each, joined again once
            told = [state.state for _, state in watch.states]
            assert "recovering" in told, told  # told before its connection closed
            chunks = [chunk for _, chunk in watch.frames if chunk >= 0]
            assert chunks == sorted(chunks), watch.sid  # it went on; no chunk 0 again
            if watch is not watches[PAUSED]:  # the paused one's gap is its pause
                gaps.append(watch.gap())
        async with ServiceClient(replicas["r3-next"].url, api_key=KEY) as service:
            for watch in watches.values():
                assert (await service.get(watch.sid)).status == "closed"
        await until(lambda: _no_slots(raw), "every slot back, no orphan left", within=10)
        print(f"hand-off gaps at the client (last frame before to first after, s): {[round(g, 2) for g in gaps]}")
        for replica in replicas.values():
            assert "Traceback" not in replica.output(), replica.name


async def _resumed_paused_on(new: Replica, watch: SessionWatch, sigterm_at: float, paused_at: float) -> None:
    """The session handed off while paused goes on paused on `new`: its client joins it there and is told `paused`,
    no frame comes, its pause counts from its first pause (the adopter's log says how long ago); resumed, it plays."""
    await until(lambda: watch.rejoined_at(sigterm_at) < float("inf"), f"{watch.sid} joined again", within=60)
    async with ServiceClient(new.url, api_key=KEY) as service:
        await until(lambda: _status_is(service, watch.sid, "paused"), f"{watch.sid} paused on {new.name}", within=30)
        joined = watch.rejoined_at(sigterm_at)
        await until(
            lambda: any(at >= joined and s.state == "paused" for at, s in watch.states), "told paused", within=10
        )
        assert watch.frames_after(joined) == 0  # paused: nothing generated since it moved
        logged = re.search(r"goes on paused \(paused ([0-9.]+) s ago", new.output())
        assert logged is not None, new.output()[-4000:]
        before_sigterm = sigterm_at - paused_at  # the replacement's start: seconds
        assert before_sigterm > 0.5, before_sigterm
        # From its first pause, not from its arrival (which would log a fraction of a second); %.1f rounds down.
        assert float(logged.group(1)) >= before_sigterm - 0.1, (logged.group(0), before_sigterm)
        print(
            f"handed off paused: the adopter counts {logged.group(1)} s of pause, {before_sigterm:.2f} s before SIGTERM"
        )
        assert (await service.resume(watch.sid)).status == "running"


async def _status_is(service: ServiceClient, sid: str, status: str) -> bool:
    return (await service.get(sid)).status == status


def _on_replica(raw: Redis, sid: str, name: str) -> Callable[[], Awaitable[bool]]:
    return lambda: _on(raw, sid, name.encode())


def _marked(raw: Redis, sid: str) -> Callable[[], Awaitable[object]]:
    return lambda: raw.hget(f"{PREFIX}t:{sid}", "ad")


def _frames(watch: SessionWatch, count: int) -> Callable[[], bool]:
    return lambda: len(watch.frames) >= count
