"""LiveKit sessions outlive their replica and a deploy (issue #33; docs/continuity.md): real `lingstream serve`
replicas on one real redis-server and one real `livekit-server`, inside a private network namespace, the reference
model on threads. A Python client (`tests/support/livekit_client.py` `follow`, a process of its own: never
`livekit.rtc` in the pytest process) is in the session's room. The replica running the session is SIGKILLed, or
drained with hand-off (SIGTERM, `LINGSTREAM_DRAIN_MODE=hand_off`); another adopts it from its Redis checkpoint, joins
the same room (the service's own, or the caller's) as the same service participant and publishes; the client, still
in the room, without a new create nor a new join, switches to the new track and gets frames of the chunks after the
checkpoint. A session paused when its replica is drained (or killed) goes on paused on the adopter, for the Python
client (`livekit_client.py` `paused`) and for a page in Chromium (through a front door), and plays again once resumed.

Its own module: it composes its own stack (Redis must be up, inside the namespace, before the replicas start). One
namespace, Redis and LiveKit server for the module; each test takes the two oldest live replicas (the first runs the
session, the second adopts it) and starts only those it lacks: the replica a test killed or drained is replaced by
one new replica, not a new stack."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis import Redis

from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.browser.pages import start_session, wait_frames
from tests.support.fakes.redis_server import NEEDS_REDIS_SERVER, RedisServer
from tests.support.front_door import ThreadedFrontDoor
from tests.support.livekit_server_real import LiveKitServerProcess
from tests.support.livekit_stack import LiveKitStack, metric, serve_replica
from tests.support.netns import HOST_A, PrivateNetwork
from tests.support.serving import ROOT, free_port

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(240),
    pytest.mark.skipif(LiveKitStack.skip_reason() is not None, reason=str(LiveKitStack.skip_reason())),
    NEEDS_REDIS_SERVER,
]

TTL_S = 1.5
PREFIX = "lingstream:admission:"
CONFIG = {"width": 128, "height": 96, "chunk_size": 1, "hud": False, "seed": 11}  # the LiveKit tests' size
CLIENT_S = 150.0
RECOVERED = "lingstream_sessions_recovered_total"


def _until(check: Any, what: str, within: float) -> Any:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)  # polling Redis and other processes against a deadline
    pytest.fail(f"{what}: not within {within} s")


@dataclass
class Replicas:
    """The module's Redis and LiveKit server, and its replicas: `pair()` gives the two oldest live ones."""

    raw: Redis
    server: LiveKitServerProcess
    workdir: Path
    settings: dict[str, str]
    stack: contextlib.ExitStack
    live: list[tuple[str, LiveKitStack]] = field(default_factory=list)
    started: int = 0

    def pair(self) -> tuple[tuple[str, LiveKitStack], tuple[str, LiveKitStack]]:
        self.live = [(name, replica) for name, replica in self.live if replica.process.poll() is None]
        while len(self.live) < 2:
            self.started += 1
            name = f"r{self.started}"
            log = self.workdir / f"{name}.log"
            replica = self.stack.enter_context(
                serve_replica(self.server, log, LINGSTREAM_REPLICA_ID=name, **self.settings)
            )
            self.live.append((name, replica))
        return self.live[0], self.live[1]

    def logs(self) -> str:
        return "".join(
            f"--- {log.name}\n{log.read_text(errors='replace')[-6000:]}\n"
            for log in sorted(self.workdir.glob("r*.log"))
        )


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replicas]:
    workdir = tmp_path_factory.mktemp("livekit-adoption")
    with PrivateNetwork(), RedisServer(workdir) as redis:
        settings = {
            "LINGSTREAM_ADMISSION_BACKEND": "redis",
            "LINGSTREAM_REDIS_URL": redis.url,
            "LINGSTREAM_REPLICA_TTL": str(TTL_S),
            "LINGSTREAM_MAX_SESSIONS_PER_WORKER": "1",
            "LINGSTREAM_DRAIN_MODE": "hand_off",
            "LINGSTREAM_DRAIN_TIMEOUT": "20",
        }
        raw = Redis.from_url(redis.url)
        with (
            LiveKitServerProcess(HOST_A, free_port(), free_port(), workdir / "livekit-server.log") as server,
            contextlib.ExitStack() as stack,
        ):
            try:
                yield Replicas(raw, server, workdir, settings, stack)
            finally:
                raw.close()


@contextlib.contextmanager
def _logs_on_failure(replicas: Replicas) -> Iterator[None]:
    """The replicas' logs, printed when the test fails (pytest does not throw a test's failure into its fixture); and
    the sessions a failed test left stopped, so that the module's next test finds free slots (one per replica)."""
    try:
        yield
    except BaseException:
        print(replicas.logs())
        _stop_all(replicas)
        raise


def _stop_all(replicas: Replicas) -> None:
    for _, replica in replicas.live:
        if replica.process.poll() is not None:
            continue
        with contextlib.suppress(httpx.HTTPError), httpx.Client(base_url=replica.url, timeout=10.0) as client:
            for body in client.get("/v1/sessions").json()["sessions"]:
                if body["status"] in ("queued", "admitted", "running", "paused", "recovering"):
                    client.delete(f"/v1/sessions/{body['id']}")


def _streaming(replica: LiveKitStack, sid: str) -> dict[str, Any] | None:
    with httpx.Client(base_url=replica.url, timeout=10.0) as client:
        body = client.get(f"/v1/sessions/{sid}").json()
    transport: dict[str, Any] | None = body.get("transport")
    return transport if body.get("status") == "running" and transport else None


def _deleted(server: LiveKitServerProcess, room: str) -> bool:
    """Whether anyone deleted the room through the RoomService (the server logs each call)."""
    lines = server.log.read_text(errors="replace").splitlines()
    return any('"method": "DeleteRoom"' in line and f'"room": "{room}"' in line for line in lines)


@dataclass
class Followed:
    """What a test saw of a session followed across its adoption."""

    sid: str
    details: dict[str, Any]
    adopted: dict[str, Any]
    checkpoint: dict[str, Any]
    report: dict[str, Any]


def _created_with_client(
    replicas: Replicas, replica: LiveKitStack, create: dict[str, Any], scenario: str
) -> tuple[str, dict[str, Any], str, subprocess.Popen[str]]:
    """A session created on `replica` (201) and the Python client `scenario` of tests/support/livekit_client.py
    started in its room, talking over stdin/stdout: (id, transport details, the room's server sid, the process)."""
    with replica.client() as client:
        created = client.post("/v1/sessions", json={"config": CONFIG, **create})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        details = client.get(f"/v1/sessions/{sid}").json()["transport"]
    room_sid = replicas.server.rooms()[details["room"]].sid
    process = subprocess.Popen(
        # `--`: a session id may begin with "-" (url-safe base64), which argparse would take for an option
        [sys.executable, "-m", "tests.support.livekit_client", scenario, "--", replica.url, sid],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return sid, details, room_sid, process


def _adopted_by(raw: Redis, sid: str, new_name: str) -> dict[str, int]:
    """Wait (30 s) until `new_name` holds the session; the checkpoint's `next_chunk` read last before the adoption
    (`before`) and at it (`at`). The adopter goes on from the last one written before it took the session (its own
    first comes only after its first chunk, well after the adoption); the lesser of the two is the safe one for a
    check: an earlier one only makes it weaker."""
    read: dict[str, int] = {}

    def adopted() -> bool:
        flipped = raw.hget(f"{PREFIX}t:{sid}", "replica") == new_name.encode()
        next_chunk = json.loads(raw.get(f"{PREFIX}ckpt:h:{sid}") or b"{}").get("next_chunk")
        if isinstance(next_chunk, int):
            read["at" if flipped else "before"] = next_chunk
        return flipped

    _until(adopted, f"the session adopted by {new_name}", within=30)
    return read


def _follow_across(
    replicas: Replicas, old: tuple[str, LiveKitStack], new: tuple[str, LiveKitStack], create: dict[str, Any], how: str
) -> Followed:
    """Create a session on `old`, follow it in its room with the Python client, end `old` (`how`: `kill`, SIGKILL;
    `drain`, SIGTERM with hand-off) and wait until `new` runs it; the client's report once it saw two later chunks
    and stopped the session."""
    raw = replicas.raw
    (old_name, first), (new_name, second) = old, new
    sid, details, room_sid, follower = _created_with_client(replicas, first, create, "follow")
    assert raw.hget(f"{PREFIX}t:{sid}", "replica") == old_name.encode()
    try:
        assert follower.stdout is not None
        assert follower.stdin is not None
        line = follower.stdout.readline()
        if json.loads(line or "{}") != {"joined": True}:
            follower.kill()
            _, err = follower.communicate(timeout=10)
            pytest.fail(f"the client did not join: {line}\n{err[-4000:]}")
        _until(lambda: raw.hget(f"{PREFIX}t:{sid}", "ad"), "the session marked adoptable", within=20)
        ended_at = time.monotonic()
        first.process.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
        follower.stdin.write(f"{ended_at}\n")
        follower.stdin.flush()
        read = _adopted_by(raw, sid, new_name)
        assert read, "no checkpoint was read"
        checkpoint = {"next_chunk": min(read.values()), "at_adoption": read.get("at")}
        follower.stdin.write(f"{checkpoint['next_chunk']}\n")  # the follower waits for the adopter's chunks from it
        follower.stdin.flush()
        running = _until(lambda: _streaming(second, sid), f"the session running on {new_name}", within=60)
        follower.stdin.write("\n")  # the follower may stop the session once it has two of the adopter's chunks
        follower.stdin.flush()
        if how == "drain":
            # Drained: it exits 0 once its session is handed off (its detach left the room, did not delete it).
            assert first.process.wait(timeout=30) == 0
        else:
            first.process.wait(timeout=10)
        assert not _deleted(replicas.server, str(details["room"])), "the room was deleted under the session"
        assert replicas.server.rooms()[details["room"]].sid == room_sid  # the very room, not one made again
        out, err = follower.communicate(timeout=CLIENT_S)
    finally:
        if follower.poll() is None:
            follower.kill()
            follower.wait(timeout=10)
    assert follower.returncode == 0, err[-4000:]
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    print(f"follow ({how}): {report}")
    return Followed(sid, details, running, checkpoint, report)


def skipped_and_repeated(before: list[int], sequence: list[int]) -> tuple[int, int]:
    """Across the end of the old replica: how many chunks the client never saw (the sequence jumped past them) and
    how far back it went at most (a chunk seen, partly or whole, generated again), from the chunks it saw before
    and the chunks it read after, in order."""
    newest = max(before) if before else -1
    skipped = back = 0
    for chunk in sequence:
        if chunk > newest + 1:
            skipped += chunk - newest - 1
        back = max(back, newest - chunk)
        newest = max(newest, chunk)
    return skipped, back


def unaccounted_frames(report: dict[str, Any]) -> int:
    """Frames of the session's video (by frame id: the stream clock the adopter continues) after the newest the client
    had before the end that it never got, less the frames it got without an id (the first frames of a new track may
    come without LiveKit's frame metadata: they can be counted, not named) between the ids around each gap."""
    return sum(gap for _, gap in frame_gaps(report))


def frame_gaps(report: dict[str, Any]) -> list[tuple[int, int]]:
    """Each run of frames the client never got after the newest it had before the end: (the id it got next, how many
    were missing before it), as `unaccounted_frames` counts them."""
    previous, unnamed, gaps = report["last_id_before"], 0, []
    if previous is None:
        return []
    for frame_id in report["ids_after"]:
        if frame_id is None:
            unnamed += 1
        elif frame_id > previous:
            if frame_id - previous - 1 - unnamed > 0:
                gaps.append((frame_id, frame_id - previous - 1 - unnamed))
            previous, unnamed = frame_id, 0
    return gaps


FRAMES_PER_CHUNK = 4  # CONFIG's chunk_size 1: one latent frame, four video frames (chunk 0: one)


def _went_on(followed: Followed, *, max_short: int = 2 * 16) -> None:
    """The client in the room went on with the adopter: the same room and participants, no new create nor join, one
    track switch, chunks after the checkpoint, never back past it, to the client's own stop; the frames the client
    never got are at most one run at the start of the adopter's track, at most `max_short` frames (below)."""
    report, details, adopted, checkpoint = followed.report, followed.details, followed.adopted, followed.checkpoint
    same = ("room", "identity", "service_identity", "room_owner")
    assert [adopted[k] for k in same] == [details[k] for k in same], (adopted, details)
    assert report["done_early"] is None, report  # the stream never ended: no `done` from the old replica
    assert len(report["after"]) >= 2, report
    # The chunks read after the end: the old replica's last frames, in flight at the kill (`tail`: before the
    # checkpoint, continuing what the client saw, never going back), then the adopter's from the checkpoint on, which
    # go back, if at all, no further than the checkpoint (one written a chunk before the last the client saw repeats
    # that chunk), never to chunk 0.
    sequence, next_chunk = report["sequence"], checkpoint["next_chunk"]
    tail = sequence[: next((i for i, c in enumerate(sequence) if c >= next_chunk), len(sequence))]
    assert tail == sorted(tail), (report, checkpoint)
    assert all(c >= max(report["before"]) for c in tail), (report, checkpoint)
    assert all(c >= next_chunk for c in sequence[len(tail) :]), (report, checkpoint)
    # The adopter goes on from the last chunk the old replica's pacer let go (docs/continuity.md, "What the client
    # was sent"), so the frames after the end (the old replica's last, then the adopter's) skip none: every frame id
    # the stream clock went through came. Before, the adopter went on after the last chunk generated and the two
    # chunks the old pacer held were lost: 8 frames, `sequence` [1, 4, 5].
    short = unaccounted_frames(report)
    skipped, back = skipped_and_repeated(report["before"], sequence)
    # What the recovery decides is exact (the adopter's first chunk follows the old replica's last sent one: the
    # checkpoint checks above, the drain test's `through`). What may still be lost is one run of frames at the start
    # of the adopter's track (docs/continuity.md, "The hand-off's remaining loss, found"): after a hand-off, 4 to 8
    # frames in every run before its three fixes, now none in most runs and the adopter's first frame in some (a
    # race in the SDK's source), 7 once; after a kill, also the old replica's frames in flight at the SIGKILL.
    gaps = frame_gaps(report)
    assert len(gaps) <= 1, (gaps, report, checkpoint)
    assert short <= max_short, (report, checkpoint)
    assert skipped <= 2 * 16 // FRAMES_PER_CHUNK, (report, checkpoint)
    assert back <= 1, (report, checkpoint)  # a chunk whose frames were on their way is generated again at most
    assert report["track_switches"] >= 1, report  # the adopter's track, in the same room
    assert report["done"] == "client_stop", report


def _ended_on(replica: LiveKitStack, sid: str) -> str:
    with httpx.Client(base_url=replica.url, timeout=10.0) as client:
        ended = client.get(f"/v1/sessions/{sid}").json()
    assert ended["status"] == "closed", ended
    assert "Traceback" not in replica.output()
    return replica.metrics()


def test_a_killed_replicas_livekit_session_is_adopted_into_the_same_room_and_its_client_follows_the_new_track(
    replicas: Replicas,
) -> None:
    old, new = replicas.pair()
    with _logs_on_failure(replicas):
        followed = _follow_across(replicas, old, new, {}, "kill")
        _went_on(followed)
        metrics = _ended_on(new[1], followed.sid)
    assert metric(metrics, RECOVERED, cause="replica_lost") == 1.0
    print(
        f"LiveKit: the first frame of a later chunk {followed.report['first_after_s']} s after the kill (TTL {TTL_S} s)"
    )


def test_a_draining_replica_hands_its_livekit_session_off_and_the_adopter_goes_on_in_the_same_room(
    replicas: Replicas,
) -> None:
    old, new = replicas.pair()
    (_, first), (_, second) = old, new
    with _logs_on_failure(replicas):
        followed = _follow_across(replicas, old, new, {}, "drain")
        _went_on(followed, max_short=16)  # one second at 16 fps: the 7 seen once, with room for a loaded machine
        # It delivered first: its last checkpoint, the adopter's, is the one of the last chunk it sent.
        through = re.search(r"hand-off after its chunks were sent \(through (\d+),", first.output())
        assert through is not None, "the old replica did not let its generated chunks out before the hand-off"
        assert followed.checkpoint["at_adoption"] == int(through.group(1)) + 1, (through.group(0), followed.checkpoint)
        # The old replica handed it off: no terminal status of its own (the client saw none: `done_early`), its room
        # left standing (never deleted nor made again: `_follow_across`), closed only by its client, on the adopter.
        assert "handed off" in first.output()
        assert "standing for the replica that it was handed to" in first.output()
        assert followed.report["sequence"] == sorted(followed.report["sequence"]), followed.report  # never back
        assert followed.report["track_switches"] == 1, followed.report  # one switch: the adopter's track
        metrics = _ended_on(second, followed.sid)
    assert metric(metrics, RECOVERED, cause="replica_draining") == 1.0
    assert metric(metrics, RECOVERED, cause="replica_lost") == 0.0
    print(f"LiveKit hand-off: the first frame of a later chunk {followed.report['first_after_s']} s after the SIGTERM")


def test_a_killed_replicas_session_in_a_callers_room_is_adopted_into_that_room_which_stands_after_the_stop(
    replicas: Replicas,
) -> None:
    old, new = replicas.pair()
    assert replicas.server.create_room("lobby-adopt") == 200
    with _logs_on_failure(replicas):
        followed = _follow_across(replicas, old, new, {"livekit": {"room": "lobby-adopt"}}, "kill")
        assert followed.details["room_owner"] == "caller"
        _went_on(followed)
        metrics = _ended_on(new[1], followed.sid)
    assert metric(metrics, RECOVERED, cause="replica_lost") == 1.0
    assert "lobby-adopt" in replicas.server.rooms()  # the caller's room stands after the session's end
    assert not _deleted(replicas.server, "lobby-adopt")
    print(f"LiveKit caller's room: a later chunk {followed.report['first_after_s']} s after the kill (TTL {TTL_S} s)")


def test_a_draining_replica_hands_a_paused_livekit_session_off_paused_and_its_client_resumes_it_in_the_same_room(
    replicas: Replicas,
) -> None:
    """A paused session handed off on LiveKit (docs/continuity.md, "A paused session is handed off paused"): its
    client in the room is told `paused` again by the adopter, never `running`, and no frame is generated until it
    resumes; the adopter counts the pause from its first pause; resumed, it plays chunks after the checkpoint in the
    same room, on the adopter's track, to the client's own stop."""
    _paused_across(replicas, "drain")


def test_a_killed_replicas_paused_livekit_session_is_adopted_paused_and_its_client_resumes_it_in_the_same_room(
    replicas: Replicas,
) -> None:
    """The same with the replica SIGKILLed (docs/continuity.md, "A paused session whose replica dies is adopted
    paused"): the pause its owner wrote with its status reaches the adopter through the reaper; the client is told
    `paused` by the adopter, never `running`, nothing is generated until it resumes (the kill's TTL and the adoption
    included), the pause counts from the first pause, and the resume plays from the checkpoint on."""
    _paused_across(replicas, "kill")


def _paused_across(replicas: Replicas, how: str) -> None:
    """Pause a session on the older replica, end that replica (`how`: `drain`, SIGTERM with hand-off; `kill`,
    SIGKILL) a second into the pause, and follow the session, paused, to the adopter, then resume it there."""
    (_, first), (new_name, second) = replicas.pair()
    raw = replicas.raw
    with _logs_on_failure(replicas):
        sid, details, room_sid, client_process = _created_with_client(replicas, first, {}, "paused")
        try:
            assert client_process.stdout is not None
            assert client_process.stdin is not None

            def told(line: str) -> None:
                client_process.stdin.write(line + "\n")  # type: ignore[union-attr]
                client_process.stdin.flush()  # type: ignore[union-attr]

            paused = json.loads(client_process.stdout.readline() or "{}")
            assert paused.get("paused") == "paused", paused
            _until(lambda: raw.hget(f"{PREFIX}t:{sid}", "ad"), "the session marked adoptable", within=20)
            # The pause lasts a second before the SIGTERM, so that a pause counted from the adopter's arrival (a
            # fraction of a second) cannot pass for one counted from the first pause.
            time.sleep(max(0.0, paused["paused_at"] + 1.0 - time.monotonic()))
            drained_at = time.monotonic()
            first.process.send_signal(signal.SIGKILL if how == "kill" else signal.SIGTERM)
            told(str(drained_at))
            read = _adopted_by(raw, sid, new_name)
            next_chunk = min(read.values())
            told(str(next_chunk))
            assert json.loads(client_process.stdout.readline() or "{}") == {"told_paused": True}
            with second.client() as client:
                body = _until(
                    lambda: (b := client.get(f"/v1/sessions/{sid}").json())["status"] == "paused" and b,
                    f"the session paused on {new_name}",
                    within=30,
                )
            assert {k: body["transport"][k] for k in ("room", "identity")} == {
                k: details[k] for k in ("room", "identity")
            }
            if how == "drain":
                assert first.process.wait(timeout=30) == 0  # handed off, it exits 0
                assert "handed off" in first.output()
            else:
                assert first.process.wait(timeout=10) == -signal.SIGKILL
            logged = re.search(r"goes on paused \(paused ([0-9.]+) s ago", second.output())
            assert logged is not None, second.output()[-4000:]
            before_sigterm = drained_at - paused["paused_at"]
            # From its first pause, not from its arrival; %.1f rounds down.
            assert float(logged.group(1)) >= before_sigterm - 0.1, (logged.group(0), before_sigterm)
            assert not _deleted(replicas.server, str(details["room"])), "the room was deleted under the session"
            assert replicas.server.rooms()[details["room"]].sid == room_sid  # the very room, not one made again
            told("resume")
            out, err = client_process.communicate(timeout=CLIENT_S)
        finally:
            if client_process.poll() is None:
                client_process.kill()
                client_process.wait(timeout=10)
        assert client_process.returncode == 0, err[-4000:]
        report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        print(f"paused {how}: {report}; the adopter counts {logged.group(1)} s of pause ({before_sigterm:.2f} s)")
        assert report["generated_while_paused"] == [], report  # paused on both: nothing generated, repeats only
        assert "running" not in report["states_while_paused"], report  # told paused, never running, until resumed
        assert report["states_while_paused"][-1] == "paused", report
        assert report["resumed"] == "running", report
        assert report["done_early"] is None, report
        assert report["errors"] == [], report
        assert len(report["after"]) >= 2, report
        assert min(report["sequence"]) >= next_chunk, (report, next_chunk)  # after the checkpoint, never back
        assert report["sequence"] == sorted(report["sequence"]), report
        assert report["track_switches"] >= 1, report  # the adopter's track, in the same room
        assert report["done"] == "client_stop", report
        metrics = _ended_on(second, sid)
    assert metric(metrics, RECOVERED, cause="replica_lost" if how == "kill" else "replica_draining") == 1.0


def _in_chromium(test: Callable[..., None]) -> Callable[..., None]:
    for mark in (pytest.mark.browser, *BROWSER_SKIPS):
        test = mark(test)
    return test


@_in_chromium
def test_a_page_follows_its_livekit_session_handed_off_paused_shows_it_paused_and_resumes_it(
    replicas: Replicas,
) -> None:
    """The page (Chromium, through one address in front of the replicas: `ThreadedFrontDoor`, as a Kubernetes
    Service) holds `w` and pauses its session; the replica running it is drained with hand-off. The page stays in the
    room with the adopter, shows `paused` (its button offers Resume), generates nothing, shows no error and makes no
    new session; its Resume plays chunks from the checkpoint on; its Stop ends the session on the adopter."""
    (old_name, first), (new_name, second) = replicas.pair()
    raw = replicas.raw
    errors: list[str] = []

    def port(replica: LiveKitStack) -> int:
        return int(replica.url.rsplit(":", 1)[1])

    with (
        _logs_on_failure(replicas),
        ThreadedFrontDoor([port(first)], host=HOST_A) as door,
        launch_chromium() as browser,
    ):
        page = browser.new_context().new_page()
        page.set_default_timeout(45_000)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(door.url)
        page.wait_for_function("window.lingstream !== undefined")
        start_session(page, CONFIG["width"], CONFIG["height"])
        wait_frames(page, 5)
        assert page.evaluate("window.lingstream.transport") == "livekit"
        sid = page.evaluate("window.lingstream.sessionId")
        assert raw.hget(f"{PREFIX}t:{sid}", "replica") == old_name.encode()
        page.focus("#stage")
        page.keyboard.down(
            "w"
        )  # held through the hand-off (the page resends it every 250 ms): paused, it moves nothing
        page.wait_for_function("window.lingstream.chunks.some((c) => c.keys.includes('w'))", polling=100)
        page.click("#pause")
        page.wait_for_function("window.lingstream.state === 'paused'", polling=100)
        _until(lambda: raw.hget(f"{PREFIX}t:{sid}", "ad"), "the session marked adoptable", within=20)
        page.evaluate(
            """() => { window.seenStates = [];
               window.lingstream.session.on("state", ({ state }) => window.seenStates.push(state)); }"""
        )
        at_drain = {"chunks": len(page.evaluate("window.lingstream.chunks"))}
        door.route([port(second)])  # the Service's endpoints: the draining pod leaves them
        first.process.send_signal(signal.SIGTERM)
        read = _adopted_by(raw, sid, new_name)
        next_chunk = min(read.values())
        assert first.process.wait(timeout=30) == 0  # handed off, it exits 0
        with second.client() as client:
            _until(lambda: client.get(f"/v1/sessions/{sid}").json()["status"] == "paused", "paused there", 30)
        seen = (
            "() => ({ states: window.seenStates, state: window.lingstream.state,"
            " errors: window.lingstream.session.errors, connection: window.lingstream.connection })"
        )
        try:
            # Told by the adopter: `recovering` while it moved, then `paused` again; never `running`.
            page.wait_for_function(
                "window.seenStates.includes('recovering') && window.lingstream.state === 'paused'", polling=100
            )
        except Exception:
            print(f"the page saw: {page.evaluate(seen)}")
            raise
        assert page.inner_text("#pause") == "Resume"
        assert page.is_enabled("#pause")
        saw = page.evaluate(seen)
        assert "running" not in saw["states"], saw
        # Paused: no chunk generated (each comes with its status). Not counted by frames: the page matches only some
        # presented frames to their ids, and the old replica's last frames may still be presented after the SIGTERM
        # (the Python client's `paused` scenario checks every frame's id).
        assert len(page.evaluate("window.lingstream.chunks")) == at_drain["chunks"], saw
        page.click("#pause")  # Resume
        try:
            page.wait_for_function(
                """([count, chunk]) => window.lingstream.state === "running"
                   && window.lingstream.chunks.length >= count + 2 && window.lingstream.lastChunk.index >= chunk + 1""",
                arg=[at_drain["chunks"], next_chunk],
                polling=100,
            )
        except Exception:
            print(f"the page saw: {page.evaluate(seen)}")
            raise
        after = [c["index"] for c in page.evaluate("window.lingstream.chunks")[at_drain["chunks"] :]]
        assert after == sorted(after), after
        assert min(after) >= next_chunk, (after, next_chunk)  # from the checkpoint on
        page.keyboard.up("w")
        assert page.evaluate("window.lingstream.sessionId") == sid
        assert page.evaluate("window.lingstream.session.errors") == []
        assert not page.evaluate("document.getElementById('message').classList.contains('error')")
        with second.client() as client:
            live = [b["id"] for b in client.get("/v1/sessions").json()["sessions"] if b["status"] != "closed"]
        assert live == [sid], live  # the page made no new session
        page.click("#stop")
        page.wait_for_function("window.lingstream.done === 'client_stop'", polling=100)
        print(f"page, paused hand-off: states {page.evaluate('window.seenStates')}, chunks after the resume {after}")
    assert errors == []
    metrics = _ended_on(second, sid)
    assert metric(metrics, RECOVERED, cause="replica_draining") == 1.0
