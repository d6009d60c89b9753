"""Two browser pages outlive their replicas, and their picture goes on where it was (issue #33, "Prove it";
docs/continuity.md): page A on the real `livekit-server`, page B on the embedded transport, one Chromium, inside a
private network namespace with no way out; the reference model (deterministic: pose and seed carry the picture).

A replica runs one transport (`service/transports.py`: no router transport serves both kinds side by side), so the
pages' sessions cannot share a replica, and a replica of one kind cannot adopt a session of the other. The layout is
two deployments on one redis-server, each its own admission pool of the issue's three replicas: database 0, three
LiveKit replicas (the owner killed, two survivors race to adopt, exactly one does); database 1, three embedded ones
that advertise their addresses (`LINGSTREAM_REPLICA_URL`): the page's WebRTC offer reaches whichever survivor its
front door picks, which forwards it to the adopter (`service/scaleout/forwarding.py`). Each pool is reached through
one address in front of its replicas (`tests/support/front_door.py`, as a Kubernetes Service without affinity: each
connection to the first replica that accepts it). Each page's session runs on the first replica of its pool; both
are SIGKILLed at the same moment, and a survivor of each pool adopts its session from the Redis checkpoint. In the
embedded pool the survivor the front door picks (`e2`) is kept from adopting (a paused session of its own holds its
one slot), so the adopter is `e3` and every offer of the page after the kill is forwarded: the case that left the
page `recovering` before forwarding existed. Nothing is done by hand after the kill: page A stays in its room (the
same participant) and follows the adopter's new track, page B rejoins through its front door with the same session
id.

For both pages: the same session id (no new create; each pool lists only it), no error shown, frames and chunks after
the kill, the chunk indices never going back past the checkpoint's `next_chunk`, the adopter's metrics counting one
`replica_lost` recovery (the other survivor none, and no slot). And the picture: the page holds `l` (turn right)
across the kill, then lets go; once the session idles, the picture the page shows is grabbed and compared with the
frame an uninterrupted render of the same session (`pipeline/lingbot/reference`, in this process, the same config
and the key of every chunk as the page's chunk statuses report them) has at that chunk. A pose one chunk off (the
hiccup losing or repeating a chunk's turn) shows a different picture: the bound sits between the two, both measured
and printed. The checkpoint's pose, the one the adopter went on from, is also checked against the uninterrupted
render's pose after that chunk.
"""

from __future__ import annotations

import contextlib
import functools
import json
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import pytest
from redis import Redis

from pipeline.lingbot.camera import CameraPose
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.reference.model import ReferenceWorldModel
from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.browser.livekit_pages import session_of
from tests.support.browser.pages import SETTLED_JS, grab, start_session, wait_frames
from tests.support.fakes.redis_server import NEEDS_REDIS_SERVER, RedisServer
from tests.support.front_door import ThreadedFrontDoor
from tests.support.lingbot import close_session, generate_chunk, gray, open_session
from tests.support.livekit_server_real import LiveKitServerProcess
from tests.support.livekit_stack import LiveKitStack, metric
from tests.support.netns import HOST_A, PrivateNetwork
from tests.support.serving import OWN_URL, Replica, free_port, spawn_replica, wait_until_ready

if TYPE_CHECKING:  # playwright is a dev extra; BROWSER_SKIPS skips the module without it
    from playwright.sync_api import Browser, Page

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.timeout(300),
    *BROWSER_SKIPS,
    pytest.mark.skipif(LiveKitStack.skip_reason() is not None, reason=str(LiveKitStack.skip_reason())),
    NEEDS_REDIS_SERVER,
]

# A replica's liveness lapses after TTL_S; with 5 replicas, Chromium and the LiveKit server on 2 shared cores, a
# shorter TTL risks reaping a replica that was only held up (its session then adopted behind its back).
TTL_S = 3.0
PREFIX = "lingstream:admission:"
WIDTH, HEIGHT, SEED = 128, 96, 5
STARTUP_S = 90.0
WAIT_MS = 45_000
RECOVERED = "lingstream_sessions_recovered_total"
FORWARDED = "lingstream_forwarded_requests_total"
# The id of the video track the page plays: a new one on a new peer connection (embedded). Not on LiveKit: the page's
# subscriber connection may carry the adopter's track on the transceiver the lost one used, the same track object
# (seen: the same id in 1 run of 5).
VIDEO_TRACK_JS = "document.getElementById('video').srcObject.getVideoTracks()[0].id"
# Mean absolute difference in grey levels (0..255) between the grabbed picture and a reference frame: codec and colour
# conversion keep the right frame under it, a pose one chunk's turn away is far above it (the figures are printed).
BOUND = 8.0
HISTORY = 64  # chunk statuses a page keeps (web/packages/client/src/session.ts)


@dataclass
class Pool:
    """One deployment: its replicas (the first runs the page's session; one of the others adopts it), its Redis
    database and the front door before them."""

    kind: str
    replicas: tuple[Replica, ...]
    redis: Redis
    door: ThreadedFrontDoor

    @property
    def first(self) -> Replica:
        return self.replicas[0]

    def owner(self, sid: str) -> Replica:
        """The replica Redis says runs `sid` now."""
        raw = self.redis.hget(f"{PREFIX}t:{sid}", "replica")
        name = raw.decode() if isinstance(raw, bytes) else str(raw)
        (replica,) = [replica for replica in self.replicas if replica.name == name]
        return replica


@dataclass
class Seen:
    """What one page showed, and what the test learnt about its session."""

    page: Page
    sid: str
    next_chunk: int
    pose: CameraPose
    chunks_at_kill: int
    frames_at_kill: int
    generation_at_kill: int
    track_at_kill: str


@pytest.fixture
def pools(tmp_path: Path) -> Iterator[tuple[Pool, Pool, LiveKitServerProcess, Browser]]:
    """The namespace, one redis-server, the real livekit-server, six replicas (three on LiveKit, three embedded;
    started at once, then waited for), two front doors and Chromium; on a failure every replica's output is
    printed."""
    with PrivateNetwork(), RedisServer(tmp_path) as server:
        livekit = LiveKitServerProcess(HOST_A, free_port(), free_port(), tmp_path / "livekit-server.log")
        common = {"LINGSTREAM_REPLICA_TTL": str(TTL_S), "LINGSTREAM_TORCH_THREADS": "1"}
        on_livekit = {
            "LIVEKIT_URL": livekit.url,
            "LIVEKIT_API_KEY": livekit.api_key,
            "LIVEKIT_API_SECRET": livekit.api_secret,
        }
        embedded_url = server.url.rsplit("/", 1)[0] + "/1"  # the other deployment's own admission pool
        replicas: list[Replica] = []
        with livekit, contextlib.ExitStack() as stack:
            stack.callback(_kill_all, replicas)

            def spawn(name: str, url: str, **settings: str) -> Replica:
                process, port = spawn_replica(
                    tmp_path / f"{name}.log", redis_url=url, replica_id=name, worker_factory=None, **common, **settings
                )
                replicas.append(Replica(name, process, port, tmp_path / f"{name}.log"))
                return replicas[-1]

            on_lk = tuple(spawn(f"lk{n}", server.url, **on_livekit) for n in (1, 2, 3))
            # Each advertises its address: the survivor the front door picks forwards the page's offer to the adopter.
            embedded = tuple(spawn(f"e{n}", embedded_url, LINGSTREAM_REPLICA_URL=OWN_URL) for n in (1, 2, 3))
            try:
                for replica in replicas:
                    wait_until_ready(replica.url, replica.process, replica.output, within_s=STARTUP_S)
                lk_redis, e_redis = Redis.from_url(server.url), Redis.from_url(embedded_url)
                stack.callback(lk_redis.close)
                stack.callback(e_redis.close)
                lk_door = stack.enter_context(ThreadedFrontDoor([r.port for r in on_lk]))
                e_door = stack.enter_context(ThreadedFrontDoor([r.port for r in embedded]))
                browser = stack.enter_context(launch_chromium())
                yield (
                    Pool("livekit", on_lk, lk_redis, lk_door),
                    Pool("embedded", embedded, e_redis, e_door),
                    livekit,
                    browser,
                )
            except BaseException:
                for replica in replicas:
                    print(f"--- {replica.name}\n{replica.output()[-6000:]}")
                raise


def _kill_all(replicas: list[Replica]) -> None:
    for replica in replicas:
        if replica.process.poll() is None:
            replica.process.kill()
        replica.process.wait(timeout=10)


def _until(check: Callable[[], Any], what: str, within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)  # polling Redis and other processes against a deadline
    pytest.fail(f"{what}: not within {within} s")


def _open(browser: Browser, pool: Pool, errors: list[str]) -> Page:
    page = browser.new_context().new_page()
    page.set_default_timeout(WAIT_MS)
    page.on("pageerror", lambda error: errors.append(f"{pool.kind}: {error}"))
    page.goto(pool.door.url)
    page.wait_for_function("window.lingstream !== undefined")
    page.fill("#seed", str(SEED))
    start_session(page, WIDTH, HEIGHT)
    wait_frames(page)
    return page


def _hold_turn(page: Page) -> None:
    """Hold `l` (the page resends it every 250 ms while held) until two chunks have applied it."""
    page.bring_to_front()
    page.focus("#stage")
    page.keyboard.down("l")
    page.wait_for_function("window.lingstream.chunks.filter((c) => c.keys.includes('l')).length >= 2", polling=100)


def test_both_pages_keep_playing_the_same_picture_through_the_loss_of_their_replicas(
    pools: tuple[Pool, Pool, LiveKitServerProcess, Browser],
) -> None:
    livekit, embedded, server, browser = pools
    errors: list[str] = []
    pages = {pool.kind: _open(browser, pool, errors) for pool in (livekit, embedded)}
    # The embedded survivor the front door picks (the first that accepts) holds its one slot with a paused session of
    # its own, so it cannot adopt the page's: the other survivor does, and the page's offers reach it only forwarded.
    picked, adopter_to_be = embedded.replicas[1], embedded.replicas[2]
    filler = _paused_session(picked)
    seen: dict[str, Seen] = {}
    for pool in (livekit, embedded):
        page = pages[pool.kind]
        assert page.evaluate("window.lingstream.transport") == pool.kind
        sid = page.evaluate("window.lingstream.sessionId")
        assert pool.owner(sid) is pool.first, pool.kind
        _hold_turn(page)
        _until(functools.partial(pool.redis.hget, f"{PREFIX}t:{sid}", "ad"), f"{pool.kind}: marked adoptable", 20)
        seen[pool.kind] = Seen(page, sid, -1, CameraPose(), 0, 0, 0, "")
    details = session_of(pages["livekit"])["transport"]
    room, identity = details["room"], details["identity"]
    in_room = server.participants(room)[identity].sid

    killed_at = time.monotonic()
    for pool in (livekit, embedded):
        pool.first.process.send_signal(signal.SIGKILL)
    for pool in (livekit, embedded):
        pool.first.process.wait(timeout=10)
        mark = seen[pool.kind]
        header = json.loads(pool.redis.get(f"{PREFIX}ckpt:h:{mark.sid}") or b"{}")
        mark.next_chunk, mark.pose = header["next_chunk"], CameraPose(**header["pose"])
        mark.chunks_at_kill = len(mark.page.evaluate("window.lingstream.chunks"))
        mark.frames_at_kill = mark.page.evaluate("window.lingstream.frames")
        mark.generation_at_kill = mark.page.evaluate("window.lingstream.generation")
        mark.track_at_kill = mark.page.evaluate(VIDEO_TRACK_JS)

    # Nothing by hand from here: in each pool one survivor adopts the session; page A follows the adopter's new track
    # in its room, page B rejoins through its front door. Both play chunks after the checkpoint again.
    recovered_s: dict[str, float] = {}
    for pool in (livekit, embedded):
        mark = seen[pool.kind]
        try:
            mark.page.wait_for_function(
                """([chunk, count]) => window.lingstream.state === "running"
                   && window.lingstream.chunks.length > count
                   && window.lingstream.lastChunk.index >= chunk + 1""",
                arg=[mark.next_chunk, mark.chunks_at_kill],
                polling=100,
            )
        except Exception:
            print(f"{pool.kind} page: {_what_it_saw(mark.page)}; Redis: {pool.redis.hgetall(f'{PREFIX}t:{mark.sid}')}")
            for replica in pool.replicas:  # the adopter's log says where the session stands
                print(f"--- {replica.name}\n{replica.output()[-6000:]}")
            raise
        recovered_s[pool.kind] = time.monotonic() - killed_at
    adopters = {pool.kind: pool.owner(seen[pool.kind].sid).name for pool in (livekit, embedded)}

    grabs = {kind: _released_and_settled(mark.page) for kind, mark in seen.items()}

    for pool in (livekit, embedded):
        mark = seen[pool.kind]
        page = mark.page
        assert page.evaluate("window.lingstream.sessionId") == mark.sid, pool.kind
        assert page.evaluate("window.lingstream.errors") == [], pool.kind
        assert not page.evaluate("document.getElementById('message').classList.contains('error')"), pool.kind
        assert page.evaluate("window.lingstream.ended") is False, pool.kind
        # Frames presented after the kill: at least a chunk's (12 at chunk size 3) beyond those it had.
        assert page.evaluate("window.lingstream.frames") >= mark.frames_at_kill + 12, pool.kind
        listed = httpx.get(f"{pool.door.url}/v1/sessions", timeout=10).json()["sessions"]
        others = {filler} if pool is embedded else set()
        assert {body["id"] for body in listed} == {mark.sid, *others}, f"{pool.kind}: the page created no other session"
        # Exactly one survivor adopted it: the session's slot is held there, the other survivor holds none of it.
        adopter = pool.owner(mark.sid)
        assert adopter is not pool.first, pool.kind
        for replica in pool.replicas[1:]:
            held = pool.redis.hgetall(f"{PREFIX}held:{replica.name}")
            mine = {mark.sid.encode()} if replica is adopter else ({filler.encode()} if replica is picked else set())
            assert set(held) == mine, (replica.name, held)
            recovered = metric(httpx.get(f"{replica.url}/metrics", timeout=10).text, RECOVERED, cause="replica_lost")
            assert recovered == (1.0 if replica is adopter else 0.0), (replica.name, recovered)
        _, chunks = grabs[pool.kind]
        indices = [chunk["index"] for chunk in chunks]
        went_back = [c for i, c in enumerate(indices) if i and c < max(indices[:i])]
        assert all(c >= mark.next_chunk for c in went_back), (pool.kind, indices, mark.next_chunk)
        after = indices[mark.chunks_at_kill :]
        assert max(after) > mark.next_chunk, (pool.kind, indices, mark.next_chunk)
        # A chunk read after the kill below the checkpoint's next chunk can only be the lost replica's, in flight.
        assert all(c > max(indices[: mark.chunks_at_kill]) for c in after if c < mark.next_chunk), (pool.kind, indices)
    # Page A never left its room (the same participant throughout: no new join); page B joined the adopter on a new
    # peer connection.
    assert server.participants(room)[identity].sid == in_room
    assert seen["livekit"].page.evaluate("window.lingstream.generation") == seen["livekit"].generation_at_kill
    assert seen["embedded"].page.evaluate("window.lingstream.generation") > seen["embedded"].generation_at_kill
    assert seen["embedded"].page.evaluate(VIDEO_TRACK_JS) != seen["embedded"].track_at_kill
    # Page B's new peer connection is the adopter's, reached through the survivor its front door picked, which
    # forwarded the offer (the answer of every forwarded request counted there; the adopter forwarded nothing).
    assert adopters["embedded"] == adopter_to_be.name
    forwarded = {
        replica.name: metric(httpx.get(f"{replica.url}/metrics", timeout=10).text, FORWARDED, route="webrtc")
        for replica in (picked, adopter_to_be)
    }
    answered = metric(httpx.get(f"{picked.url}/metrics", timeout=10).text, FORWARDED, outcome="answered")
    assert answered >= 1, forwarded
    assert forwarded[adopter_to_be.name] == 0, forwarded

    # The picture: what each page shows now is the uninterrupted render's frame at its chunk.
    figures: dict[str, dict[str, float]] = {}
    for pool in (livekit, embedded):
        mark = seen[pool.kind]
        picture, chunks = grabs[pool.kind]
        body = httpx.get(f"{pool.door.url}/v1/sessions/{mark.sid}", timeout=10).json()
        config = LingBotSessionConfig.from_mapping({k: v for k, v in body["config"].items() if v is not None})
        figures[pool.kind] = _against_the_reference(config, chunks, picture, mark)

    for pool in (livekit, embedded):
        page = seen[pool.kind].page
        page.bring_to_front()
        page.click("#stop")
        page.wait_for_function("window.lingstream.done === 'client_stop'", polling=100)
    assert errors == []
    print(
        f"frames of a later chunk after the kill (TTL {TTL_S} s): LiveKit {recovered_s['livekit']:.2f} s, "
        f"embedded {recovered_s['embedded']:.2f} s; the picture against the reference (mean |grey| difference): "
        f"{figures}; adopted by {adopters}; requests forwarded by {picked.name}: {forwarded}"
    )
    for pool in (livekit, embedded):
        for replica in pool.replicas[1:]:
            assert "Traceback" not in replica.output(), replica.name


def _status_is(url: str, status: str) -> bool:
    body = httpx.get(url, timeout=10).json()
    return bool(body["status"] == status)


def _paused_session(replica: Replica) -> str:
    """A session created on `replica` itself (admitted there at once, onto its one slot), then paused: it holds the
    slot and generates nothing."""
    created = httpx.post(f"{replica.url}/v1/sessions", json={"config": {"width": 64, "height": 48}}, timeout=30)
    assert created.status_code == 201, created.text
    sid: str = created.json()["id"]
    running = functools.partial(_status_is, f"{replica.url}/v1/sessions/{sid}", "running")
    _until(running, "the filler session to run", 30)
    paused = httpx.post(f"{replica.url}/v1/sessions/{sid}/pause", timeout=30)
    assert (paused.status_code, paused.json()["status"]) == (200, "paused"), paused.text
    return sid


def _what_it_saw(page: Page) -> dict[str, Any]:
    seen: dict[str, Any] = page.evaluate(
        """() => ({ state: window.lingstream.state, connection: window.lingstream.connection,
                   chunks: window.lingstream.chunks.map((c) => c.index), errors: window.lingstream.session.errors })"""
    )
    return seen


def _released_and_settled(page: Page) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """Let go of `l`, wait until a chunk applied that, and until the picture stops changing (the session idles on
    that chunk's last frame, repeated); the picture then, and every chunk status the page got. The page sends the
    release once, lossy; it is resent (reliable, a new seq each time) until a chunk applies it, as a page resends
    what it holds: a lost release would leave `l` held on the service."""
    page.bring_to_front()
    page.focus("#stage")
    page.keyboard.up("l")
    page.wait_for_function("window.lingstream.lastSent.keys.length === 0", polling=100)
    page.evaluate(
        """(seq) => new Promise((resolve) => {
          const tick = () => {
            const chunk = window.lingstream.lastChunk;
            if (chunk.applied_seq >= seq && chunk.keys.length === 0) return resolve();
            window.lingstream.send({v: 1, type: "control_state", seq: Math.max(seq, Date.now()), keys: []}, true);
            setTimeout(tick, 500);
          };
          tick();
        })""",
        page.evaluate("window.lingstream.lastSent.seq"),
    )
    page.evaluate(SETTLED_JS, 800)
    picture, _ = grab(page, wait=False)
    chunks: list[dict[str, Any]] = page.evaluate("window.lingstream.chunks")
    return picture, chunks


def _against_the_reference(
    config: LingBotSessionConfig, chunks: Sequence[dict[str, Any]], picture: np.ndarray, mark: Seen
) -> dict[str, float]:
    """Render the session uninterrupted (chunk 0 up to the page's last chunk, each with the keys its status reports;
    the chunks the page never saw held `l`, as the page did throughout), check the
    checkpoint's pose and compare the picture with the last chunk's frame and with the pictures one chunk's turn
    away; returns the figures."""
    assert len(chunks) < HISTORY, "the page keeps its last 64 chunk statuses: the first turns would be unknown"
    keys = {chunk["index"]: tuple(chunk["keys"]) for chunk in chunks}
    last = max(keys)
    assert keys[last] == (), keys[last]
    first_turn = min(index for index, held in keys.items() if held == ("l",))
    released = min(index for index, held in keys.items() if index > first_turn and held == ())
    # The page held `l` from `first_turn` until `released`: every chunk it saw between applied it, and the service
    # applies the newest snapshot (the adopter the checkpoint's, until the page's next one reaches it), so the chunks
    # it never saw there applied it too: no longer the lost replica's generated and undelivered ones (its checkpoint
    # is published only once a chunk was sent: docs/continuity.md, "What the client was sent"), but a LiveKit
    # adopter's first frames after the track switch, and any status the page missed; before `first_turn` nothing was
    # held (chunk 0 may go out before a LiveKit page follows the data). The picture comparison below fails if any of
    # them turned otherwise.
    assert all(keys[index] == ("l",) for index in keys if first_turn <= index < released), keys
    assert all(index in keys for index in range(released, last + 1)), sorted(keys)
    trace = [keys.get(index, ("l",) if index >= first_turn else ()) for index in range(last + 1)]
    unseen = [index for index in range(last + 1) if index not in keys]

    model = ReferenceWorldModel()
    camera = open_session(model, "reference", config)
    frames: list[np.ndarray] = []
    poses: list[CameraPose] = []
    for index, held in enumerate(trace):
        frames.append(gray(generate_chunk(model, "reference", camera, index, held, config.chunk_size)[-1]))
        poses.append(camera.pose)
    # one chunk's turn further: the picture had the hiccup added a turn
    further = gray(generate_chunk(model, "reference", camera, last + 1, ("l",), config.chunk_size)[-1])
    close_session(model, "reference")

    pose = poses[mark.next_chunk - 1]
    for name in ("x", "y", "z", "yaw", "pitch"):  # the pose the adopter went on from: the unbroken session's
        assert getattr(mark.pose, name) == pytest.approx(getattr(pose, name), abs=1e-6), (name, mark.pose, pose)
    # From `released` on nothing turns: the picture is the pose after `released - 1`, the last chunk that held `l`.
    # More than one released chunk is normal: a resent release (a new seq) that crossed the status of the chunk that
    # applied the first one makes the idle session generate one more chunk, with the same pose.
    assert trace[released - 1] == ("l",), trace
    assert all(held == () for held in trace[released:]), trace

    same = _difference(picture, frames[last])
    behind = _difference(picture, frames[released - 2])  # the pose one chunk's turn before
    ahead = _difference(picture, further)  # one chunk's turn after
    figures = {
        "chunk": last,
        "unseen_chunks": len(unseen),
        "same": round(same, 2),
        "one_turn_behind": round(behind, 2),
        "one_turn_ahead": round(ahead, 2),
    }
    assert same < BOUND < min(behind, ahead), figures
    return figures


def _difference(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.mean(np.abs(a - b)))
