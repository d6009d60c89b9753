"""The page over LiveKit, end to end: real headless Chromium running the page's livekit-client and a real `lingstream
serve` whose service participant is the real `livekit` Python SDK meet through the LiveKit-signalling stand-in
(`tests/support/livekit_server/`), all inside a private network namespace with no way out.

One stand-in and one service (reference model, one worker with two session slots, a 6 s reconnect grace) serve the
module; every test opens fresh browser contexts and ends its sessions. Connections are broken on purpose through
the stand-in's test controls — a signal websocket dropped (the participant kept for a resume, or gone so that the
resume is refused as the real server refuses it), a `LeaveRequest` (a server shutdown), joins refused for a while,
the room deleted through the RoomService — and the tests check the mission's rule: *reconnects rebind the
transport, never the actor state* (chunk indices and the pose carry on, one session, no second worker state).
Skipped, with the reason, where the namespace cannot be made (not root, no `unshare`) or Chromium is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.browser.pages import (
    SETTLED_JS,
    best_shift,
    grab,
    hold_until_applied,
    page_opener,
    reference_texture,
    start_session,
    wait_frames,
)
from tests.support.livekit_stack import LiveKitStack, livekit_stack, metric
from tests.support.waits import until_sync

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

WIDTH, HEIGHT = 128, 96
GRACE_S = 6.0  # long enough for a full reconnect on a loaded machine, short for the test that outwaits it
WAIT_MS = 30_000  # generous: a loaded 2-core machine; every wait ends as soon as its condition holds
RECONNECTS = "lingstream_transport_reconnects_total"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    *BROWSER_SKIPS,
    pytest.mark.skipif(LiveKitStack.skip_reason() is not None, reason=str(LiveKitStack.skip_reason())),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveKitStack]:
    workdir = tmp_path_factory.mktemp("livekit-browser")
    with livekit_stack(
        workdir,
        LINGSTREAM_MAX_SESSIONS_PER_WORKER="2",
        LINGSTREAM_QUEUE_SIZE="4",
        LINGSTREAM_RECONNECT_GRACE=str(GRACE_S),
    ) as running:
        yield running
    assert "Traceback" not in running.output(), running.output()[-4000:]
    assert "Traceback" not in running.standin.output(), running.standin.output()[-4000:]


@pytest.fixture(scope="module")
def browser(stack: LiveKitStack) -> Iterator[Browser]:
    """Chromium, started inside the namespace (after the stack, which entered it)."""
    with launch_chromium() as chromium:
        yield chromium


@pytest.fixture
def open_page(browser: Browser, stack: LiveKitStack) -> Iterator[Callable[..., Page]]:
    """Opens the page (optionally at `path`, e.g. `/?watch=ID`) in a fresh context; at the end, cancels the
    sessions the pages started and checks for JavaScript errors."""

    def cancel(sessions: list[str]) -> None:
        with stack.client() as client:
            for session in sessions:
                client.delete(f"/v1/sessions/{session}", params={"mode": "cancel"})

    with page_opener(browser, stack.url, cancel, timeout_ms=WAIT_MS) as opener:
        yield opener


@pytest.fixture(scope="module")
def reference_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_texture(tmp_path_factory.mktemp("image") / "reference.png", WIDTH, HEIGHT)


def _start(page: Page, image: Path | None = None) -> dict[str, Any]:
    """Start a session from the page, wait for its first frame; its join details (from the service)."""
    start_session(page, WIDTH, HEIGHT, image=image)
    wait_frames(page)
    return _session(page)


def _session(page: Page) -> dict[str, Any]:
    session: dict[str, Any] = page.evaluate(
        "fetch(`/v1/sessions/${window.lingstream.sessionId}`).then((r) => r.json())"
    )
    return session


def _stop(page: Page) -> None:
    page.click("#stop")
    page.wait_for_function("window.lingstream.ended")


def _reconnects(stack: LiveKitStack) -> dict[str, float]:
    text = stack.metrics()
    return {kind: metric(text, RECONNECTS, kind=kind) for kind in ("sdk_resume", "rejoin", "controller_return")}


def _joins(stack: LiveKitStack, identity: str) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = stack.standin.state()["history"]
    return [entry for entry in history if entry["event"] == "join" and entry.get("identity") == identity]


_until = functools.partial(until_sync, within=20.0)  # the stack's processes answer within seconds


def _turned_and_settled(page: Page) -> tuple[np.ndarray, int]:
    """Turn right for two chunks, release, wait until generation idles: the picture and the last chunk index."""
    page.focus("#stage")
    page.keyboard.down("l")
    page.wait_for_function("window.lingstream.chunks.filter((c) => c.keys.includes('l')).length >= 2")
    page.keyboard.up("l")
    page.wait_for_function("window.lingstream.lastSent.keys.length === 0")
    released = page.evaluate("window.lingstream.lastSent.seq")
    page.wait_for_function(
        "(seq) => window.lingstream.lastChunk.applied_seq >= seq && window.lingstream.lastChunk.keys.length === 0",
        arg=released,
    )
    page.evaluate(SETTLED_JS, 500)
    picture, _ = grab(page, wait=False)
    return picture, int(page.evaluate("window.lingstream.lastChunk.index"))


def _one_more_chunk(page: Page, after: int) -> np.ndarray:
    """Send a snapshot of no keys (a new snapshot makes the session generate one chunk), wait for that chunk's
    frames; the picture then."""
    page.evaluate("window.lingstream.send({v: 1, type: 'control_state', seq: Date.now(), keys: []}, false)")
    page.wait_for_function("(i) => window.lingstream.lastChunk.index > i", arg=after)
    page.evaluate(SETTLED_JS, 500)
    picture, _ = grab(page, wait=False)
    return picture


def test_the_page_streams_steers_and_stops_through_livekit(
    open_page: Callable[..., Page], stack: LiveKitStack, reference_image: Path
) -> None:
    page = open_page()
    assert "LiveKit" in page.inner_text("#transport-info")
    session = _start(page, reference_image)
    details = session["transport"]
    assert page.evaluate("window.lingstream.transport") == "livekit"
    assert page.evaluate("window.lingstream.videoSize") == {"width": WIDTH, "height": HEIGHT}
    members = stack.standin.participants(details["room"])
    assert set(members) == {details["identity"], details["service_identity"]}
    (track,) = members[details["service_identity"]]["tracks"]
    assert members[details["identity"]]["subscribed"] == [track]  # the page receives the service's one track
    assert members[details["identity"]]["tracks"] == []  # and publishes none

    page.focus("#stage")
    hold_until_applied(page, "l")
    assert page.inner_text("#hud-applied") == "l"
    wait_frames(page, page.evaluate("window.lingstream.frames") + 12)  # frames queued before the turn play out
    before, after = grab(page, gap=4)
    page.keyboard.up("l")
    assert best_shift(before, after) >= 3, "turning right should move the content left"

    _stop(page)
    # The end is deterministic: the final `done` status arrives over LiveKit data before the page lets go.
    assert page.evaluate("window.lingstream.done") == "closed"
    assert page.evaluate("window.lingstream.state") == "closed"
    assert "client_stop" in page.inner_text("#message")
    _until(lambda: details["room"] not in stack.standin.state()["rooms"], "the room is deleted")
    # The stand-in drops the room from its state as the close begins and sends `room_finished` after everyone has
    # been removed (awaited), so the webhook may follow the room's disappearance by a moment.
    _until(lambda: "room_finished" in stack.standin.state()["webhooks"], "the room_finished webhook")
    state = stack.standin.state()
    assert state["counters"]["twirp_DeleteRoom"] >= 1
    assert {"room_started", "participant_joined", "participant_left", "room_finished"} <= set(state["webhooks"])
    assert state["counters"].get("webhooks_failed", 0) == 0  # the service verified every webhook


def test_two_sessions_have_their_own_rooms_and_a_third_waits_its_turn(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    first, second = open_page(), open_page()
    rooms = {_start(first)["transport"]["room"], _start(second)["transport"]["room"]}
    assert len(rooms) == 2
    assert rooms <= set(stack.standin.state()["rooms"])
    third = open_page()
    start_session(third, WIDTH, HEIGHT)
    third.wait_for_function("window.lingstream.state === 'queued'")
    assert third.inner_text("#queue-position") == "1"
    _stop(first)
    third.wait_for_function("window.lingstream.state === 'running' && window.lingstream.frames > 0")
    assert third.is_hidden("#queue")
    assert _session(third)["transport"]["room"] not in rooms
    _stop(second)
    _stop(third)


def test_a_viewer_watches_the_same_video_and_its_control_goes_nowhere(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    controller = open_page()
    session = _start(controller)
    controller.focus("#stage")
    controller.keyboard.down("w")  # an idle session sends no frames: keep it generating while the viewer joins
    viewer = open_page(f"/?watch={session['id']}")
    wait_frames(viewer, 5)
    controller.keyboard.up("w")
    assert viewer.evaluate("window.lingstream.role") == "viewer"
    assert viewer.evaluate("window.lingstream.videoSize") == {"width": WIDTH, "height": HEIGHT}
    assert viewer.is_disabled("#stop")
    members = stack.standin.participants(session["transport"]["room"])
    (viewer_identity,) = [identity for identity in members if identity.startswith("view-")]
    assert members[viewer_identity]["subscribed"] == members[session["transport"]["service_identity"]]["tracks"]

    controller.wait_for_function("window.lingstream.lastSent.keys.length === 0")
    released = controller.evaluate("window.lingstream.lastSent.seq")
    controller.wait_for_function("(seq) => window.lingstream.lastChunk.applied_seq >= seq", arg=released)
    last = controller.evaluate("window.lingstream.lastChunk.index")
    for step in range(3):
        sent = viewer.evaluate(
            "(seq) => window.lingstream.send({v: 1, type: 'control_state', seq, keys: ['l']}, true)",
            2**52 + step,
        )
        assert sent
    # A viewer's token has no data rights: the server drops its packets (counted there), the session never sees them.
    room = session["transport"]["room"]
    _until(lambda: stack.standin.participants(room)[viewer_identity]["data_refused"] >= 3, "the packets are refused")
    controller.evaluate("window.lingstream.send({v: 1, type: 'control_state', seq: Date.now(), keys: []}, false)")
    controller.wait_for_function("(i) => window.lingstream.lastChunk.index > i", arg=last)
    assert all("l" not in chunk["keys"] for chunk in controller.evaluate("window.lingstream.chunks"))

    _stop(controller)
    viewer.wait_for_function("window.lingstream.ended")  # the viewer learns the end too, and leaves nothing behind
    assert viewer.evaluate("window.lingstream.done") == "closed"


@pytest.mark.parametrize("resume", [True, False], ids=["resumed", "resume-refused"])
def test_the_pages_signal_drop_rebinds_and_the_session_carries_on(
    open_page: Callable[..., Page], stack: LiveKitStack, reference_image: Path, resume: bool
) -> None:
    page = open_page()
    session = _start(page, reference_image)
    start_view, _ = grab(page)
    identity = session["transport"]["identity"]
    turned, last = _turned_and_settled(page)
    joins = len(_joins(stack, identity))
    reconnects = _reconnects(stack)

    stack.standin.drop(identity, resume=resume)
    if resume:  # the same participant resumes its signal connection; its peer connections never broke
        _until(lambda: stack.standin.counters().get("resumes", 0) >= 1, "the page resumed")
    else:  # the real server refuses the resume of a participant it lost: livekit-client joins afresh
        _until(lambda: len(_joins(stack, identity)) == joins + 1, "the page joined again")
    page.wait_for_function("window.lingstream.connection === 'LiveKit connected'")
    after = _one_more_chunk(page, last)

    indices = [chunk["index"] for chunk in page.evaluate("window.lingstream.chunks")]
    assert indices == sorted(indices)
    assert indices[-1] > last  # chunk indices go on, never from 0 again
    to_turned = float(np.mean(np.abs(after - turned)))
    to_start = float(np.mean(np.abs(after - start_view)))
    assert to_turned < 0.5 * to_start, (to_turned, to_start)  # the pose carried on
    with stack.client() as client:
        mine = [s for s in client.get("/v1/sessions").json()["sessions"] if s["status"] == "running"]
    assert [s["id"] for s in mine] == [session["id"]]  # one session, not a second one
    now = _reconnects(stack)
    assert now["controller_return"] == reconnects["controller_return"] + (0 if resume else 1)
    assert now["rejoin"] == reconnects["rejoin"]
    _stop(page)


def test_a_controller_away_longer_than_the_grace_ends_the_session_and_frees_its_slot(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    page = open_page()
    session = _start(page)
    identity = session["transport"]["identity"]
    stack.standin.block(identity, 3 * GRACE_S)  # it cannot come back in time
    stack.standin.drop(identity, resume=False)
    page.wait_for_function("window.lingstream.ended", timeout=int((3 * GRACE_S + 10) * 1000))
    with stack.client() as client:
        ended = client.get(f"/v1/sessions/{session['id']}").json()
        assert ended["status"] == "closed", ended
        assert ended["reason"] == "client_gone: the controller left"
        again = client.post("/v1/sessions", json={"config": {"width": WIDTH, "height": HEIGHT}})
        assert again.status_code == 201, again.text  # the slot was freed
        client.delete(f"/v1/sessions/{again.json()['id']}", params={"mode": "cancel"})
    stack.standin.block(identity, 0)


def test_the_service_participant_recovers_its_room_connection_every_way_it_can_break(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    page = open_page()
    session = _start(page)
    service = session["transport"]["service_identity"]
    page.focus("#stage")
    page.keyboard.down("w")  # keep generating throughout
    page.wait_for_function("window.lingstream.lastChunk !== null && window.lingstream.lastChunk.keys.includes('w')")
    first_join = _joins(stack, service)[-1]

    def recovers(step: str) -> dict[str, float]:
        frames = page.evaluate("window.lingstream.frames")
        index = page.evaluate("window.lingstream.lastChunk.index")
        page.wait_for_function(
            "([f, i]) => window.lingstream.frames >= f + 16 && window.lingstream.lastChunk.index > i + 2",
            arg=[frames, index],
        )
        assert page.evaluate("window.lingstream.state") == "running", step
        return _reconnects(stack)

    before = _reconnects(stack)
    # 1. The signal websocket breaks, the participant is kept: the SDK resumes by itself, nothing is republished.
    stack.standin.drop(service, resume=True)
    _until(lambda: stack.standin.counters().get("resumes", 0) >= 1, "the service resumed")
    after_resume = recovers("resume")
    assert after_resume["sdk_resume"] == before["sdk_resume"] + 1
    assert after_resume["rejoin"] == before["rejoin"]
    assert len(_joins(stack, service)) == 1

    # 2. The participant is lost, so its resume is refused (LeaveRequest STATE_MISMATCH/RECONNECT, as the real server
    # answers): the SDK joins afresh and republishes by itself; the page subscribes to the new track.
    stack.standin.drop(service, resume=False)
    _until(lambda: len(_joins(stack, service)) == 2, "the SDK joined again")
    after_refusal = recovers("full reconnect")
    assert after_refusal["sdk_resume"] == after_resume["sdk_resume"] + 1
    assert after_refusal["rejoin"] == after_resume["rejoin"]
    assert after_refusal["controller_return"] == before["controller_return"]  # the controller never left

    # 3. The server sends the participant away for a reason that is not final (a shutdown): the SDK gives up, the
    # binding rejoins as the same identity with a fresh token and publishes again.
    stack.standin.leave(service, "SERVER_SHUTDOWN")
    _until(lambda: len(_joins(stack, service)) == 3, "the binding rejoined")
    after_rejoin = recovers("rejoin")
    assert after_rejoin["rejoin"] == after_refusal["rejoin"] + 1
    assert _joins(stack, service)[-1]["expires"] > first_join["expires"]  # a token minted for the rejoin
    members = stack.standin.participants(session["transport"]["room"])
    assert members[session["transport"]["identity"]]["subscribed"][-1] == members[service]["tracks"][0]
    page.keyboard.up("w")
    with stack.client() as client:
        running = [s for s in client.get("/v1/sessions").json()["sessions"] if s["status"] == "running"]
    assert [s["id"] for s in running] == [session["id"]]
    _stop(page)


def test_a_room_deleted_behind_the_services_back_ends_the_session_and_frees_its_slot(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    page = open_page()
    session = _start(page)

    assert stack.standin.delete_room(session["transport"]["room"]) == 200  # not by the service: behind its back
    page.wait_for_function("window.lingstream.ended")
    with stack.client() as client:
        ended = client.get(f"/v1/sessions/{session['id']}").json()
        assert ended["status"] == "closed", ended
        # Whichever comes first ends it: the service participant's disconnect (ROOM_DELETED) or the signed
        # room_finished webhook (the two race here as they do with a real server).
        assert "ROOM_DELETED" in ended["reason"] or ended["reason"] == "client_gone: the room finished", ended
        again = client.post("/v1/sessions", json={"config": {"width": WIDTH, "height": HEIGHT}})
        assert again.status_code == 201, again.text
        client.delete(f"/v1/sessions/{again.json()['id']}", params={"mode": "cancel"})
