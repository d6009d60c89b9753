"""The page over LiveKit, end to end: real headless Chromium running the page's livekit-client and a real `lingstream
serve` whose service participant is the real `livekit` Python SDK meet through a real `livekit-server` (the release
scripts/setup.sh --dev builds), all inside a private network namespace with no way out.

One server and one service (reference model, one worker with two session slots, a 6 s reconnect grace) serve the
module; every test opens fresh browser contexts and ends its sessions. The page streams, steers and stops (the room
deleted, the webhooks verified); a third session queues; a viewer watches and its data goes nowhere; the page's
connection breaks (resumed, or its resume refused) and the session carries on; a controller away longer than the
grace ends its session; a room deleted behind the service's back ends its session. The service participant's breaks
inside `lingstream serve`, which only the stand-in can inject from outside, are in test_livekit_browser_faults.py.
Skipped, with the reason, where the namespace cannot be made (not root, no `unshare`), livekit-server is not
installed or Chromium is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.browser.livekit_pages import (
    one_more_chunk,
    open_pages,
    reconnects,
    session_of,
    start,
    stop,
    turned_and_settled,
)
from tests.support.browser.pages import (
    best_shift,
    grab,
    hold_until_applied,
    reference_texture,
    start_session,
    wait_frames,
)
from tests.support.livekit_stack import LiveKitStack, livekit_stack
from tests.support.waits import until_sync

if TYPE_CHECKING:  # playwright is a dev extra; BROWSER_SKIPS skips the module without it
    from playwright.sync_api import Browser, Page

WIDTH, HEIGHT = 128, 96
GRACE_S = 6.0  # long enough for a full reconnect on a loaded machine, short for the test that outwaits it
WAIT_MS = 30_000  # generous: a loaded 2-core machine; every wait ends as soon as its condition holds
_until = functools.partial(until_sync, within=20.0)  # the stack's processes answer within seconds

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
    assert "panic" not in running.server.output(), running.server.output()[-4000:]


@pytest.fixture(scope="module")
def browser(stack: LiveKitStack) -> Iterator[Browser]:
    """Chromium, started inside the namespace (after the stack, which entered it)."""
    with launch_chromium() as chromium:
        yield chromium


@pytest.fixture
def open_page(browser: Browser, stack: LiveKitStack) -> Iterator[Callable[..., Page]]:
    """Opens the page (optionally at `path`, e.g. `/?watch=ID`) in a fresh context; at the end, cancels the
    sessions the pages started and checks for JavaScript errors."""

    with open_pages(browser, stack, timeout_ms=WAIT_MS) as opener:
        yield opener


@pytest.fixture(scope="module")
def reference_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_texture(tmp_path_factory.mktemp("image") / "reference.png", WIDTH, HEIGHT)


def test_the_page_streams_steers_and_stops_through_livekit(
    open_page: Callable[..., Page], stack: LiveKitStack, reference_image: Path
) -> None:
    page = open_page()
    assert "LiveKit" in page.inner_text("#transport-info")
    session = start(page, WIDTH, HEIGHT, reference_image)
    details = session["transport"]
    assert page.evaluate("window.lingstream.transport") == "livekit"
    assert page.evaluate("window.lingstream.videoSize") == {"width": WIDTH, "height": HEIGHT}
    members = stack.real.participants(details["room"])
    assert set(members) == {details["identity"], details["service_identity"]}
    (track,) = members[details["service_identity"]].tracks  # the service publishes one video track
    assert (track.width, track.height) == (WIDTH, HEIGHT)
    assert list(members[details["identity"]].tracks) == []  # the page publishes none
    assert not members[details["identity"]].permission.can_publish  # and may not

    page.focus("#stage")
    hold_until_applied(page, "l")
    assert page.inner_text("#hud-applied") == "l"
    wait_frames(page, page.evaluate("window.lingstream.frames") + 12)  # frames queued before the turn play out
    before, after = grab(page, gap=4)
    page.keyboard.up("l")
    assert best_shift(before, after) >= 3, "turning right should move the content left"

    # Pause, resume and stop are RPC calls to the service participant, each answered with the session's state.
    # Every frame is matched to its chunk by its LiveKit frame metadata (the service's frame id, read in
    # livekit-client's worker), and control-to-photon is measured on that exact frame.
    assert page.evaluate("window.lingstream.framesById") > 0
    assert page.evaluate("window.lingstream.photonsMs.length") > 0
    page.click("#pause")
    page.wait_for_function("window.lingstream.calls.length === 1", polling=100)
    # Paused: the keep-warm repeats (every 100 ms on LiveKit) are told apart by their frame ids.
    page.wait_for_function("window.lingstream.repeatsById > 0", polling=100)
    page.click("#pause")  # "Resume" now
    page.wait_for_function("window.lingstream.calls.length === 2", polling=100)
    stop(page)
    calls = page.evaluate("window.lingstream.calls")
    assert calls[:2] == [
        {"type": "pause", "state": "paused", "applied": True},
        {"type": "resume", "state": "running", "applied": True},
    ]
    # The stop's answer, unless the service left the room first and livekit-client heard of it (by signalling)
    # before the answer's data packet arrived: then the call ends "recipient disconnected", not listed as an answer.
    assert calls[2:] in ([{"type": "stop", "state": "draining", "applied": True}], []), calls
    # The end is deterministic: the final `done` status arrives over LiveKit data before the page lets go.
    assert page.evaluate("window.lingstream.done") == "client_stop"
    assert page.evaluate("window.lingstream.state") == "closed"
    assert "client_stop" in page.inner_text("#message")
    _until(lambda: details["room"] not in stack.real.rooms(), "the room is deleted")

    def room_hooks() -> list[dict[str, Any]]:
        return [hook for hook in stack.real.webhooks() if hook.get("room") == details["room"]]

    # The server sends `room_finished` as the room closes: the webhook may follow the room's disappearance.
    _until(lambda: any(hook["event"] == "room_finished" for hook in room_hooks()), "the room_finished webhook")
    assert {"room_started", "participant_joined", "participant_left", "room_finished"} <= {
        hook["event"] for hook in room_hooks()
    }
    # The service verified every signed webhook (else 401, and the server logs the send as failed).
    assert all(hook["sent"] and hook["statusCode"] == 200 for hook in room_hooks()), room_hooks()
    assert any(
        '"method": "DeleteRoom"' in line and details["room"] in line for line in stack.real.output().splitlines()
    )


def test_two_sessions_have_their_own_rooms_and_a_third_waits_its_turn(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    first, second = open_page(), open_page()
    rooms = {start(first, WIDTH, HEIGHT)["transport"]["room"], start(second, WIDTH, HEIGHT)["transport"]["room"]}
    assert len(rooms) == 2
    assert rooms <= set(stack.real.rooms())
    third = open_page()
    start_session(third, WIDTH, HEIGHT)
    third.wait_for_function("window.lingstream.state === 'queued'")
    assert third.inner_text("#queue-position") == "1"
    stop(first)
    # Polled on a timer: Chromium runs no animation frames for this page here (it is not the one in front).
    third.wait_for_function("window.lingstream.state === 'running' && window.lingstream.frames > 0", polling=100)
    assert third.is_hidden("#queue")
    assert session_of(third)["transport"]["room"] not in rooms
    stop(second)
    stop(third)


def test_a_viewer_watches_the_same_video_and_its_control_goes_nowhere(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    controller = open_page()
    session = start(controller, WIDTH, HEIGHT)
    controller.focus("#stage")
    # An idle session sends no new frames: keep it generating while the viewer joins (held until applied: the
    # server announces a controller that publishes nothing up to 3 s late, and its keys count only from then).
    hold_until_applied(controller, "w")
    viewer = open_page(f"/?watch={session['id']}")
    viewer.wait_for_function("window.lingstream.frames >= 5", polling=100)  # the controller's page is in front
    controller.keyboard.up("w")
    assert viewer.evaluate("window.lingstream.role") == "viewer"
    assert viewer.evaluate("window.lingstream.videoSize") == {"width": WIDTH, "height": HEIGHT}
    # A late joiner learns the session's state from the service participant's attributes, not a broadcast.
    attributes = viewer.evaluate("window.lingstream.serviceAttributes")
    assert attributes["lingstream.session_id"] == session["id"], attributes
    assert attributes["lingstream.state"] == "running", attributes
    assert viewer.evaluate("window.lingstream.state") == "running"
    assert viewer.is_disabled("#stop")
    members = stack.real.participants(session["transport"]["room"])
    (viewer_identity,) = [identity for identity in members if identity.startswith("view-")]
    assert not members[viewer_identity].permission.can_publish_data  # a watch-only token

    controller.wait_for_function("window.lingstream.lastSent.keys.length === 0")
    released = controller.evaluate("window.lingstream.lastSent.seq")
    controller.wait_for_function(
        "(seq) => window.lingstream.lastChunk !== null && window.lingstream.lastChunk.applied_seq >= seq", arg=released
    )
    last = controller.evaluate("window.lingstream.lastChunk.index")
    for step in range(3):
        sent = viewer.evaluate(
            "(seq) => window.lingstream.send({v: 1, type: 'control_state', seq, keys: ['l']}, true)",
            2**52 + step,
        )
        assert sent
    # A viewer's token has no data rights: the server drops its packets, the session never sees them.
    controller.evaluate("window.lingstream.send({v: 1, type: 'control_state', seq: Date.now(), keys: []}, false)")
    controller.wait_for_function("(i) => window.lingstream.lastChunk.index > i", arg=last)
    assert all("l" not in chunk["keys"] for chunk in controller.evaluate("window.lingstream.chunks"))

    stop(controller)
    viewer.wait_for_function("window.lingstream.ended")  # the viewer learns the end too, and leaves nothing behind
    assert viewer.evaluate("window.lingstream.done") == "client_stop"


@pytest.mark.parametrize("scenario", ["signal-reconnect", "node-failure"], ids=["resumed", "resume-refused"])
def test_the_pages_reconnect_rebinds_and_the_session_carries_on(
    open_page: Callable[..., Page], stack: LiveKitStack, reference_image: Path, scenario: str
) -> None:
    """The page's room connection breaks and comes back; the session carries on where it was (*reconnects rebind the
    transport, never the actor state*: chunk indices and the pose go on, one session). The breaks are livekit-client's
    own drill against the real server (`Room.simulateScenario`, through `window.lingstream.simulate`):
    `signal-reconnect` closes the page's signal connection, the server keeps the participant and the page resumes;
    `node-failure` has the server drop the participant without a word, as a failed node would, so the page's resume
    is refused and it joins afresh (a new participant of the same identity: the service sees its controller
    return)."""
    page = open_page()
    session = start(page, WIDTH, HEIGHT, reference_image)
    start_view, _ = grab(page)
    room, identity = session["transport"]["room"], session["transport"]["identity"]
    turned, last = turned_and_settled(page)
    sid, resumes = stack.real.participants(room)[identity].sid, stack.real.resumes(identity)
    before = reconnects(stack)

    assert page.evaluate("(scenario) => window.lingstream.simulate(scenario)", scenario)
    if scenario == "signal-reconnect":  # the same participant resumes its signal connection
        _until(lambda: stack.real.resumes(identity) == resumes + 1, "the page resumed")
    else:  # the server lost the participant: the resume is refused, livekit-client joins afresh
        _until(lambda: getattr(stack.real.participants(room).get(identity), "sid", sid) != sid, "the page rejoined")
        # The service sees its controller leave and return; until the server announces the new participant (up to
        # 3 s: it publishes nothing) the service would ignore its data, and the snapshot below would be lost.
        _until(lambda: reconnects(stack)["controller_return"] == before["controller_return"] + 1, "the return")
    page.wait_for_function("window.lingstream.connection === 'LiveKit connected'", polling=100)
    # One more chunk: a snapshot resent (reliable) until a chunk comes, as a page resends what it holds; a packet
    # sent right after a (re)join may be lost.
    page.evaluate(
        """(last) => new Promise((resolve) => {
          const tick = () => {
            if (window.lingstream.lastChunk.index > last) return resolve();
            window.lingstream.send({v: 1, type: "control_state", seq: Date.now(), keys: []}, true);
            setTimeout(tick, 500);
          };
          tick();
        })""",
        last,
    )
    after = one_more_chunk(page, last)

    indices = [chunk["index"] for chunk in page.evaluate("window.lingstream.chunks")]
    assert indices == sorted(indices)
    assert indices[-1] > last  # chunk indices go on, never from 0 again
    to_turned = float(np.mean(np.abs(after - turned)))
    to_start = float(np.mean(np.abs(after - start_view)))
    assert to_turned < 0.5 * to_start, (to_turned, to_start)  # the pose carried on
    with stack.client() as client:
        mine = [s for s in client.get("/v1/sessions").json()["sessions"] if s["status"] == "running"]
    assert [s["id"] for s in mine] == [session["id"]]  # one session, not a second one
    now = reconnects(stack)
    assert now["rejoin"] == before["rejoin"]  # the service participant kept its connection throughout
    if scenario == "signal-reconnect":
        assert now["controller_return"] == before["controller_return"]
        assert stack.real.participants(room)[identity].sid == sid
    stop(page)


def test_a_controller_away_longer_than_the_grace_ends_the_session_and_frees_its_slot(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    page = open_page()
    session = start(page, WIDTH, HEIGHT)
    # The controller is removed from the room (RoomService RemoveParticipant): its page takes PARTICIPANT_REMOVED as
    # final and never rejoins, so the service sees the controller leave and outwaits the grace.
    assert stack.real.remove_participant(session["transport"]["room"], session["transport"]["identity"]) == 200
    with stack.client() as client:
        _until(
            lambda: client.get(f"/v1/sessions/{session['id']}").json()["status"] == "closed",
            "the session ends",
            within=3 * GRACE_S + 10,
        )
        ended = client.get(f"/v1/sessions/{session['id']}").json()
        assert ended["reason"] == "client_gone: the controller left"
        again = client.post("/v1/sessions", json={"config": {"width": WIDTH, "height": HEIGHT}})
        assert again.status_code == 201, again.text  # the slot was freed
        client.delete(f"/v1/sessions/{again.json()['id']}", params={"mode": "cancel"})


def test_a_room_deleted_behind_the_services_back_ends_the_session_and_frees_its_slot(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    page = open_page()
    session = start(page, WIDTH, HEIGHT)

    assert stack.real.delete_room(session["transport"]["room"]) == 200  # not by the service: behind its back
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
