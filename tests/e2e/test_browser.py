"""The page in a real headless Chromium (Debian's, driven by Playwright) against a real `lingstream serve` running the
reference LingBot model, over the embedded WebRTC transport on loopback.

One service process serves the whole module (one model worker, one session per worker, so the tests also cover
the queue); every test opens fresh browser contexts and ends its sessions. The page is driven like a user drives it
(form fields, the start and stop buttons, the keyboard) and observed through `window.lingstream`, its testing hook.
Waits are on conditions (`wait_for_function`), never fixed sleeps; the two fixed windows below are measurements.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from service.http.docs import swagger_ui_dir
from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.browser.pages import FRAMES_IN_WINDOW_JS as _FRAMES_IN_WINDOW_JS
from tests.support.browser.pages import SETTLED_JS as _SETTLED_JS
from tests.support.browser.pages import best_shift as _best_shift
from tests.support.browser.pages import (
    cancel_over_http,
    hold_until_applied,
    page_opener,
    reference_texture,
    start_session,
)
from tests.support.browser.pages import grab as _grab
from tests.support.browser.pages import wait_frames as _wait_frames
from tests.support.sdk import play_react_example, sdk_toolchain_missing, served_example
from tests.support.serving import ROOT, free_port, lingstream, wait_until_ready

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

WIDTH, HEIGHT = 128, 96
STARTUP_S = 60.0
WAIT_MS = 20_000  # generous: a loaded 2-core CI machine; every wait ends as soon as its condition holds

pytestmark = [
    pytest.mark.browser,
    *BROWSER_SKIPS,
]


@dataclass
class Service:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="module")
def example_port() -> int:
    """The port the React example is served on (another origin than the service's: the service allows it by CORS)."""
    return free_port()


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, example_port: int) -> Iterator[Service]:
    """A real `lingstream serve` (LingBotService, embedded transport, loopback) with one session slot."""
    cors = f"http://127.0.0.1:{example_port}"
    with _serve(tmp_path_factory.mktemp("serve") / "serve.log", LINGSTREAM_CORS_ORIGINS=cors) as running:
        yield running


@pytest.fixture(scope="module")
def example_app(tmp_path_factory: pytest.TempPathFactory, example_port: int) -> Iterator[str]:
    """web/examples/react-world built from the packed SDK packages, on its own origin (`served_example`)."""
    missing = sdk_toolchain_missing()
    if missing is not None:
        pytest.skip(missing)
    with served_example(tmp_path_factory.mktemp("example"), "127.0.0.1", example_port) as origin:
        yield origin


@contextlib.contextmanager
def _serve(log: Path, **extra: str) -> Iterator[Service]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        LINGSTREAM_HOST="127.0.0.1",
        LINGSTREAM_TORCH_THREADS="1",
        LINGSTREAM_NUM_WORKERS="1",
        LINGSTREAM_MAX_SESSIONS_PER_WORKER="1",
        LINGSTREAM_QUEUE_SIZE="4",
        LINGSTREAM_DRAIN_TIMEOUT="5",
    )
    env.update(extra)
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*lingstream(), "serve", "--port", str(port)], cwd=ROOT, env=env, stdout=sink, stderr=sink
        )
    running = Service(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_until_ready(running.url, running.process, running.output, within_s=STARTUP_S)
        yield running
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    assert "Traceback" not in running.output(), running.output()[-4000:]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launch_chromium() as chromium:
        yield chromium


@pytest.fixture
def open_page(browser: Browser, service: Service) -> Iterator[Callable[..., Page]]:
    """Opens the page in a fresh browser context; at the end, ends what the pages started and checks for JS errors."""

    with page_opener(browser, service.url, cancel_over_http(service.url), timeout_ms=WAIT_MS) as opener:
        yield opener


def _start(page: Page, *, image: Path | None = None, hud: bool = False) -> None:
    start_session(page, WIDTH, HEIGHT, image=image, hud=hud)


@pytest.fixture(scope="module")
def reference_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return reference_texture(tmp_path_factory.mktemp("image") / "reference.png", WIDTH, HEIGHT)


def test_the_page_streams_video_of_the_requested_size_while_keys_are_held(open_page: Callable[[], Page]) -> None:
    page = open_page()
    assert "embedded" in page.inner_text("#transport-info")
    _start(page)
    _wait_frames(page)
    assert page.evaluate("window.lingstream.videoSize") == {"width": WIDTH, "height": HEIGHT}
    assert page.evaluate("window.lingstream.pc.connectionState") == "connected"
    assert page.evaluate("window.lingstream.transport") == "embedded"

    page.focus("#stage")
    page.keyboard.down("w")  # generation runs while a key is held (an idle session only renders its first chunk)
    page.wait_for_function("window.lingstream.lastChunk && window.lingstream.lastChunk.keys.includes('w')")
    shown = page.evaluate(_FRAMES_IN_WINDOW_JS, 2000)
    page.keyboard.up("w")
    assert shown >= 16, f"{shown} frames in 2 s at 16 fps"  # at least half the nominal rate on a loaded machine
    assert page.evaluate("window.lingstream.fps") > 0
    assert "fps" in page.inner_text("#hud-fps")
    page.click("#stop")
    page.wait_for_function("window.lingstream.ended")
    assert page.evaluate("window.lingstream.state") == "closed"
    # The end is deterministic: the final `done` status (data channel) is in before the page lets go of the link,
    # whichever of it and the event stream's `closed` came first (issue #14).
    assert page.evaluate("window.lingstream.done") == "client_stop"
    assert "client_stop" in page.inner_text("#message")


def test_the_vendored_livekit_client_loads_as_an_es_module(open_page: Callable[[], Page]) -> None:
    page = open_page()
    bundle = page.evaluate("fetch('/page-config.json').then((r) => r.json()).then((c) => c.livekit_client)")
    if bundle is None:
        assert "LiveKit is unavailable" in page.inner_text("#transport-info")
        pytest.skip("no livekit-client bundle (scripts/setup.sh installs it with npm)")
    exported = page.evaluate(
        "(url) => import(url).then((lk) => [typeof lk.Room, lk.Track.Kind.Video, lk.RoomEvent.DataReceived])", bundle
    )
    assert exported == ["function", "video", "dataReceived"]


def test_the_api_reference_renders_from_the_services_own_files(
    browser: Browser, service: Service, tmp_path: Path
) -> None:
    if swagger_ui_dir(None) is None:
        pytest.skip("no swagger-ui-dist in web/node_modules (scripts/setup.sh installs it with npm)")
    context = browser.new_context()
    requests: list[str] = []
    errors: list[str] = []
    context.on("request", lambda request: requests.append(request.url))
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{service.url}/docs")
        page.locator(".opblock-summary-path", has_text="/v1/sessions").first.wait_for()
        paths = {text.replace("\u200b", "").strip() for text in page.locator(".opblock-summary-path").all_inner_texts()}
        page.screenshot(path=str(tmp_path / "docs.png"), full_page=True)
    finally:
        context.close()
    assert {"/v1/sessions", "/v1/sessions/{session_id}", "/v1/sessions/{session_id}/events", "/readyz"} <= paths
    assert "/internal/drain" not in paths
    assert (tmp_path / "docs.png").stat().st_size > 0
    assert f"{service.url}/vendor/swagger-ui/swagger-ui-bundle.js" in requests
    assert [url for url in requests if not url.startswith(f"{service.url}/")] == []
    assert not errors, errors


def test_held_keys_are_applied_and_turning_right_pans_the_view_left(
    open_page: Callable[[], Page], reference_image: Path
) -> None:
    page = open_page()
    _start(page, image=reference_image)
    _wait_frames(page)
    page.focus("#stage")
    hold_until_applied(page, "l")
    assert page.inner_text("#hud-applied") == "l"
    latency = page.evaluate("window.lingstream.latencyMs")
    assert latency is not None
    assert 0 < latency < 10_000

    # The status of a chunk arrives when it is generated, its frames over the next chunk period: let the frames
    # already queued (at most a chunk, 12 frames) play out, so both snapshots show the turn.
    _wait_frames(page, page.evaluate("window.lingstream.frames") + 12)
    before, after = _grab(page, gap=4)  # 4 frames at 2 degrees each: about 11 pixels at 90 degrees over 128
    page.keyboard.up("l")
    shift = _best_shift(before, after)
    assert shift >= 3, f"turning right should move the content left; best shift {shift}"


def test_a_new_offer_rebinds_and_the_session_carries_on_where_it_was(
    open_page: Callable[[], Page], reference_image: Path, service: Service
) -> None:
    page = open_page()
    _start(page, image=reference_image)
    _wait_frames(page)
    start_view, _ = _grab(page)
    session = page.evaluate("window.lingstream.sessionId")

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
    page.evaluate(_SETTLED_JS, 500)  # generation idles: the picture holds the turned pose
    turned, _ = _grab(page, wait=False)
    last_index = page.evaluate("window.lingstream.lastChunk.index")
    generation = page.evaluate("window.lingstream.generation")

    page.evaluate("window.lingstream.reconnect()")
    page.wait_for_function(
        "(g) => window.lingstream.generation === g && window.lingstream.pc.connectionState === 'connected'"
        " && window.lingstream.framesThisConnection >= 2",
        arg=generation + 1,
    )
    after_rebind, _ = _grab(page)
    chunks = page.evaluate("window.lingstream.chunks")
    rebound = [chunk["index"] for chunk in chunks if chunk["generation"] == generation + 1]
    assert rebound, "no chunk status arrived on the new peer connection"
    assert rebound[0] == last_index + 1, (last_index, rebound)  # the chunk index carries on, not from 0
    assert rebound == sorted(rebound)

    to_turned = float(np.mean(np.abs(after_rebind - turned)))
    to_start = float(np.mean(np.abs(after_rebind - start_view)))
    assert to_turned < 0.5 * to_start, (to_turned, to_start)  # the pose carried on; no jump back to the start view
    with httpx.Client(base_url=service.url, timeout=10.0) as client:
        assert client.get(f"/v1/sessions/{session}").json()["status"] == "running"


def test_a_second_page_waits_in_the_queue_and_is_admitted_when_the_first_stops(
    open_page: Callable[[], Page],
) -> None:
    first = open_page()
    _start(first)
    _wait_frames(first)
    second = open_page()
    _start(second)
    second.wait_for_function("window.lingstream.state === 'queued'")
    assert second.is_visible("#queue")
    assert second.inner_text("#queue-position") == "1"
    assert second.get_attribute("#queue", "aria-live") == "polite"

    first.click("#stop")
    first.wait_for_function("window.lingstream.state === 'closed'")
    second.wait_for_function("window.lingstream.state === 'running' && window.lingstream.frames > 0")
    assert second.is_hidden("#queue")
    second.click("#stop")
    second.wait_for_function("window.lingstream.state === 'closed'")


def test_a_second_page_watches_the_session_the_first_controls(open_page: Callable[..., Page]) -> None:
    controller = open_page()
    _start(controller)
    _wait_frames(controller)
    controller.wait_for_function("!document.getElementById('watch-link').hidden")
    link = controller.get_attribute("#watch-link", "href")
    session = controller.evaluate("window.lingstream.sessionId")
    assert link == f"/?watch={session}"
    hold_until_applied(controller, "w")  # held: the session keeps generating while the viewer joins

    viewer = open_page(link)
    viewer.wait_for_function("window.lingstream.role === 'viewer' && window.lingstream.frames > 5")
    assert viewer.evaluate("window.lingstream.sessionId") == session
    assert viewer.evaluate("window.lingstream.videoSize") == {"width": WIDTH, "height": HEIGHT}
    # The viewer's status shows what the controller holds.
    viewer.wait_for_function("window.lingstream.chunks.some((chunk) => chunk.keys.includes('w'))")
    # No controls: the form, the buttons, the key help and the watch link are hidden, and its keys steer nothing.
    for hidden in ("#setup", "#control-buttons", "#prompt-form", "#controls-help", "#watch-link"):
        assert viewer.is_hidden(hidden), hidden
    viewer.focus("#stage")
    viewer.keyboard.down("l")
    seen = viewer.evaluate("window.lingstream.chunks.length")
    viewer.wait_for_function("(seen) => window.lingstream.chunks.length >= seen + 3", arg=seen)
    viewer.keyboard.up("l")
    assert viewer.evaluate("window.lingstream.lastSent") is None
    assert not any("l" in chunk["keys"] for chunk in viewer.evaluate("window.lingstream.chunks"))

    controller.keyboard.up("w")
    controller.click("#stop")
    viewer.wait_for_function("window.lingstream.state === 'closed' && window.lingstream.ended")


def test_the_prompt_box_steers_the_picture_and_pause_holds_it(open_page: Callable[..., Page]) -> None:
    page = open_page()
    page.fill("#prompt", "a sunny day")  # the create form's prompt: the session starts from it
    _start(page)
    _wait_frames(page)
    page.wait_for_function("window.lingstream.lastChunk !== null")
    assert page.evaluate("window.lingstream.lastChunk.prompt") == "a sunny day"
    assert page.inner_text("#hud-prompt") == "a sunny day"
    page.evaluate(_SETTLED_JS, 400)  # idle after chunk 0: the picture stands still
    day, _ = _grab(page, wait=False)

    # The prompt box: Enter sends it on the link; the session (idle, no key held) generates the next chunk from it.
    page.fill("#prompt-live", "a dark night")
    page.press("#prompt-live", "Enter")
    page.wait_for_function("window.lingstream.lastChunk.prompt === 'a dark night'")
    sent = page.evaluate("window.lingstream.lastPrompt")
    assert sent["text"] == "a dark night"
    night_chunk = page.evaluate("window.lingstream.lastChunk")
    assert night_chunk["prompt_seq"] == sent["seq"]
    assert all(chunk["prompt"] == "a sunny day" for chunk in page.evaluate("window.lingstream.chunks")[:-1])
    page.evaluate(_SETTLED_JS, 400)
    night, _ = _grab(page, wait=False)
    assert night.mean() < day.mean() - 25, (day.mean(), night.mean())
    page.wait_for_function("document.getElementById('hud-prompt').textContent === 'a dark night'")

    # Too long for the protocol: the page says so and sends nothing.
    page.fill("#prompt-live", "é" * 300)
    page.press("#prompt-live", "Enter")
    assert "at most 512 bytes" in page.inner_text("#message")
    assert page.evaluate("window.lingstream.lastPrompt.seq") == sent["seq"]

    # Pause: with a key held nothing is generated (the picture holds its last frame); resume carries on.
    page.click("#pause")
    page.wait_for_function("window.lingstream.state === 'paused'")
    assert page.inner_text("#pause") == "Resume"
    last = page.evaluate("window.lingstream.lastChunk.index")
    page.focus("#stage")
    page.keyboard.down("w")
    page.wait_for_function("window.lingstream.lastSent && window.lingstream.lastSent.keys.includes('w')")
    page.evaluate(_SETTLED_JS, 1500)  # a running session with `w` held would never stop presenting frames
    held, _ = _grab(page, wait=False)
    assert page.evaluate(_FRAMES_IN_WINDOW_JS, 1000) == 0
    assert page.evaluate("window.lingstream.lastChunk.index") <= last + 1  # at most the chunk in flight
    still, _ = _grab(page, wait=False)
    assert np.array_equal(held, still)
    page.click("#pause")
    page.wait_for_function("window.lingstream.state === 'running'")
    page.wait_for_function("window.lingstream.lastChunk.keys.includes('w')")
    page.keyboard.up("w")
    page.click("#stop")
    page.wait_for_function("window.lingstream.ended")


def test_the_react_example_built_from_the_packed_packages_runs_a_session(
    browser: Browser, service: Service, example_app: str
) -> None:
    """The example React app (useLingstream + <WorldView/>), from another origin, runs a session end to end: queue and
    state, video of the requested size, a held key applied, pause, and the stop's reason (issue #36)."""
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    started: list[str] = []
    try:
        play_react_example(page, example_app, service.url, (WIDTH, HEIGHT), started)
        assert errors == []
    finally:
        context.close()
        if started:
            cancel_over_http(service.url)(started)
