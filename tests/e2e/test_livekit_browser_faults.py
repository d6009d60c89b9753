"""The service participant over LiveKit when its room connection breaks in ways only the LiveKit-signalling stand-in
(`tests/support/livekit_server/`) can be made to break it from outside: real headless Chromium running the page's
livekit-client and a real `lingstream serve` (its service participant on the real `livekit` Python SDK), inside a
private network namespace with no way out. Every other LiveKit browser test runs against the real livekit-server
(test_livekit_browser.py), the page's own reconnects included.

Which faults, and why the real server cannot be made to inject them here: the service participant's signal websocket
dropped while the server keeps the participant for a resume; dropped with the participant gone, so that its resume is
refused; and a `LeaveRequest` for a reason that is not final (SERVER_SHUTDOWN). A real server does each of these to
one participant only when that participant asks for it itself (`SimulateScenario` on its own signal connection), or
when the whole server shuts down (which ends every room); the service participant is the SDK inside `lingstream
serve`, which a test cannot ask, and nothing here may break the namespace's network for one participant. The
stand-in injects them from outside (`stack.standin.drop`, `.leave`). The same three breaks on the real server, asked
for by the service participant's own SDK room, are tested one level down, on the real `LiveKitTransport`
(tests/unit/transport/livekit/test_live.py); the page's own breaks are on the real server (test_livekit_browser.py).
The test checks the mission's rule: *reconnects rebind the transport, never the actor state* (chunk indices go on,
one session, no second worker state). Skipped, with the reason, where the namespace cannot be made (not root, no
`unshare`) or Chromium is missing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.browser.livekit_pages import (
    open_pages,
    reconnects,
    start,
    stop,
)
from tests.support.browser.pages import (
    reference_texture,
)
from tests.support.livekit_stack import LiveKitStack, standin_stack
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
    pytest.mark.skipif(
        LiveKitStack.skip_reason(standin=True) is not None, reason=str(LiveKitStack.skip_reason(standin=True))
    ),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveKitStack]:
    workdir = tmp_path_factory.mktemp("livekit-browser-faults")
    with standin_stack(
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

    with open_pages(browser, stack, timeout_ms=WAIT_MS) as opener:
        yield opener


@pytest.fixture(scope="module")
def reference_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_texture(tmp_path_factory.mktemp("image") / "reference.png", WIDTH, HEIGHT)


def _joins(stack: LiveKitStack, identity: str) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = stack.standin.state()["history"]
    return [entry for entry in history if entry["event"] == "join" and entry.get("identity") == identity]


def test_the_service_participant_recovers_its_room_connection_every_way_it_can_break(
    open_page: Callable[..., Page], stack: LiveKitStack
) -> None:
    page = open_page()
    session = start(page, WIDTH, HEIGHT)
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
        return reconnects(stack)

    before = reconnects(stack)
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
    stop(page)
