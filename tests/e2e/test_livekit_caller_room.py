"""Sessions in a caller's LiveKit room, end to end: `lingstream serve` (the reference model, its service participant
on the real `livekit` SDK), the LiveKit-signalling stand-in, and `lingstream play` as the caller's client (the Python
client's LiveKit link, also on the real SDK), inside a private network namespace.

The caller makes its room itself (as a voice agent's or a lobby's room exists before any session); the create names
it; the service joins it with its own identity, publishes its video there, is steered by the controller (one the
service minted a token for, or the identity the caller named and tokened: play's prompt, pose reset and stop reach
the service as RPC calls, never as packets, by `lingstream_transport_controls_total`), and leaves the room, which
stays. A room that does not exist is `room_not_found` before anything takes a place. Skipped, with the reason, where
the namespace cannot be made (not root, no `unshare`) or livekit-server is not installed.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from livekit import api

from tests.support.livekit_stack import LiveKitStack, another_replica, livekit_stack, metric
from tests.support.serving import run_lingstream

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LiveKitStack.skip_reason() is not None, reason=str(LiveKitStack.skip_reason())),
]

PLAY_S = 180.0
CONFIG = '{"width": 128, "height": 96}'
# Every change holds a key: the reference model rests while nothing is held, and each change must reach a frame. The
# prompt and the pose reset are discrete commands: `lingstream play` sends them (and its final stop) as RPC calls.
TRACE = """\
{"chunk": 0, "keys": ["w"]}
{"chunk": 2, "keys": ["w", "l"]}
{"chunk": 2, "prompt": "a foggy street"}
{"chunk": 4, "keys": ["j"]}
{"chunk": 4, "reset_pose": true}
"""
COMMANDS = ("prompt", "reset_pose", "stop")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveKitStack]:
    workdir = tmp_path_factory.mktemp("livekit-caller-room")
    with livekit_stack(workdir) as running:
        yield running
    assert "Traceback" not in running.output(), running.output()[-4000:]
    assert "panic" not in running.server.output(), running.server.output()[-4000:]


def _play(stack: LiveKitStack, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    trace = tmp_path / "trace.jsonl"
    trace.write_text(TRACE, encoding="utf-8")
    return run_lingstream(
        "play",
        "--url",
        stack.url,
        "--controls",
        str(trace),
        "--out",
        str(tmp_path / "received.mp4"),
        "--config",
        CONFIG,
        "--tail",
        "1",
        *extra,
        timeout=PLAY_S,
    )


def _report(run: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert run.returncode == 0, run.stderr[-4000:]
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    return report


def _controls(metrics: str) -> Counter[tuple[str, str]]:
    """`lingstream_transport_controls_total` by (via, type): the controllers' messages the sessions took."""
    return Counter(
        {
            (via, kind): int(metric(metrics, "lingstream_transport_controls_total", via=via, type=kind))
            for via in ("rpc", "packet")
            for kind in ("control_state", *COMMANDS)
        }
    )


def _never_waited(run: subprocess.CompletedProcess[str]) -> None:
    """Every chunk entry of the trace found the chunk before it generated: no `--wait` (10 s) ran out. A key press
    lost (the first one, before docs/livekit.md's gap was closed) leaves the reference model resting, and the next
    entry waits the whole 10 s for a chunk that never comes."""
    assert "no status of chunk" not in run.stderr, run.stderr[-4000:]


def _room_left_by_the_service(stack: LiveKitStack, room: str, within: float = 20.0) -> None:
    """Returns once no service participant is in the room (fails if the room is gone meanwhile)."""
    deadline = time.monotonic() + within
    while True:
        rooms = stack.real.rooms()
        assert room in rooms, f"the caller's room {room} was closed: {sorted(rooms)}"
        participants = stack.real.participants(room)
        if not any(identity.startswith("svc-") for identity in participants):
            return
        assert time.monotonic() < deadline, f"the service is still in {room}: {sorted(participants)}"
        time.sleep(0.1)  # polling another process against a deadline


def _deleted(stack: LiveKitStack, room: str) -> bool:
    """Whether the room was deleted through the RoomService (the server logs each call)."""
    return any(
        '"method": "DeleteRoom"' in line and f'"room": "{room}"' in line for line in stack.real.output().splitlines()
    )


def test_a_session_is_published_into_the_callers_room_steered_and_the_room_is_left_standing(
    stack: LiveKitStack, tmp_path: Path
) -> None:
    assert stack.real.create_room("lobby-7") == 200
    before = _controls(stack.metrics())
    run = _play(stack, tmp_path, "--livekit-room", "lobby-7")
    report = _report(run)
    assert report["transport"] == "livekit"
    assert report["done_reason"] == "client_stop"
    assert report["frames"] > 0
    assert (report["width"], report["height"]) == (128, 96)
    # The trace changed the keys three times; the chunk statuses say each change reached a generated frame.
    assert report["control_to_photon_count"] == 3, report
    assert report["controls_unseen"] == 0
    assert report["labels"] == "exact", report  # every frame matched to its chunk by its frame id
    assert report["errors"] == [], report  # no command refused
    with stack.client() as client:
        session = client.get(f"/v1/sessions/{report['session_id']}").json()
    assert (session["status"], session["reason"]) == ("closed", "client_stop")
    # The service took each discrete command once, as an RPC call and never as a packet (the client's fallback for a
    # service or server without RPC). The session has ended: its counts are in.
    taken = _controls(stack.metrics()) - before
    assert {(via, kind): taken[via, kind] for via in ("rpc", "packet") for kind in COMMANDS} == {
        **{("rpc", kind): 1 for kind in COMMANDS},
        **{("packet", kind): 0 for kind in COMMANDS},
    }, taken
    # The key snapshots came as packets, all three: the one play sends at once on joining used to reach the service
    # before its SDK knew the sender, and was dropped as foreign; the client's first packet now waits for the service
    # to show it knows it (its `state` on our joining, docs/livekit.md). So the first key press moved the camera at
    # once: play never waited for a chunk.
    assert taken["packet", "control_state"] == 3, taken
    _never_waited(run)
    assert session["transport"]["room"] == "lobby-7"
    assert session["transport"]["room_owner"] == "caller"
    _room_left_by_the_service(stack, "lobby-7")
    assert not _deleted(stack, "lobby-7")


def test_the_identity_the_caller_named_steers_with_the_callers_own_token(stack: LiveKitStack, tmp_path: Path) -> None:
    assert stack.real.create_room("lobby-8") == 200
    # The caller (e.g. a LiveKit Agents worker) tokens its own user; the service never mints one for that identity.
    token = (
        api.AccessToken(stack.real.api_key, stack.real.api_secret)
        .with_identity("user-42")
        .with_grants(api.VideoGrants(room_join=True, room="lobby-8", can_subscribe=True, can_publish_data=True))
        .with_ttl(datetime.timedelta(minutes=5))
        .to_jwt()
    )
    run = _play(stack, tmp_path, "--livekit-room", "lobby-8", "--livekit-identity", "user-42", "--livekit-token", token)
    report = _report(run)
    assert report["done_reason"] == "client_stop"
    assert report["control_to_photon_count"] == 3, report
    _never_waited(run)  # its first key press, sent at once on joining, was taken
    with stack.client() as client:
        session = client.get(f"/v1/sessions/{report['session_id']}").json()
    assert session["transport"]["identity"] == "user-42"
    assert session["transport"]["token"] is None
    assert session["reason"] == "client_stop"  # the stop came from user-42: the only identity listened to
    _room_left_by_the_service(stack, "lobby-8")
    assert not _deleted(stack, "lobby-8")


def test_a_room_that_does_not_exist_is_room_not_found_and_takes_no_place(stack: LiveKitStack, tmp_path: Path) -> None:
    with stack.client() as client:
        before = len(client.get("/v1/sessions").json()["sessions"])
    run = _play(stack, tmp_path, "--livekit-room", "lobby-404")
    assert run.returncode == 1
    assert "room_not_found" in run.stderr
    assert "RoomNotFoundError" in run.stderr  # the client's typed exception for the code
    with stack.client() as client:
        assert len(client.get("/v1/sessions").json()["sessions"]) == before
    assert "lobby-404" not in stack.real.rooms()  # the service never creates a caller's room


def _services_in(stack: LiveKitStack, room: str) -> list[str]:
    return [identity for identity in stack.real.participants(room) if identity.startswith("svc-")]


def test_two_replicas_never_both_publish_into_one_callers_room(stack: LiveKitStack, tmp_path: Path) -> None:
    """Each replica knows only its own sessions; the LiveKit server's participant list is what they share. A room
    holding another replica's session is `room_in_use` there, and two creates sent to both at once leave exactly one
    service participant in the room (the later joiner leaves again, its session `failed` with `room_in_use`)."""
    with another_replica(stack, tmp_path) as other:
        assert stack.real.create_room("lobby-9") == 200
        with stack.client() as client:
            first = client.post("/v1/sessions", json={"livekit": {"room": "lobby-9"}})
        assert first.status_code == 201, first.text
        assert first.json()["status"] == "running"
        assert len(_services_in(stack, "lobby-9")) == 1
        with other.client() as client:
            refused = client.post("/v1/sessions", json={"livekit": {"room": "lobby-9"}})
            assert (refused.status_code, refused.json()["error"]["code"]) == (409, "room_in_use"), refused.text
            assert client.get("/v1/sessions").json()["sessions"] == []  # nothing took a place there
        _cancel(stack, first.json()["id"])  # one model worker, one place: free it for the race
        _room_left_by_the_service(stack, "lobby-9")

        # Both at once, into a fresh room: whichever way the checks and joins interleave, one session stays; the
        # other create is refused by the check, or joined later than the first and left again (409 either way).
        assert stack.real.create_room("lobby-10") == 200

        def create(replica: LiveKitStack) -> httpx.Response:
            with replica.client() as client:
                return client.post("/v1/sessions", json={"livekit": {"room": "lobby-10"}})

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(create, (stack, other)))
        codes = sorted(answer.status_code for answer in answers)
        assert codes == [201, 409], [answer.text for answer in answers]
        (kept,) = (
            (replica, answer)
            for replica, answer in zip((stack, other), answers, strict=True)
            if answer.status_code == 201
        )
        assert kept[1].json()["status"] == "running"
        assert [a.json()["error"]["code"] for a in answers if a.status_code == 409] == ["room_in_use"]
        assert len(_services_in(stack, "lobby-10")) == 1, _services_in(stack, "lobby-10")
        _cancel(kept[0], kept[1].json()["id"])


def _cancel(replica: LiveKitStack, session_id: str) -> None:
    with replica.client() as client:
        assert client.delete(f"/v1/sessions/{session_id}", params={"mode": "cancel"}).status_code in (200, 202)
