"""Keep-warm on the embedded transport, seen by the page in a real headless Chromium: while the session is idle the
service sends its last frame again (`LINGSTREAM_IDLE_FRAME_INTERVAL_MS`), those repeats reach the browser's
compositor, and the page's HUD does not count them as frames (they lie off the frame grid: `REPEAT_PTS_OFFSET`);
generated frames, once a key is held, are counted again. A page that reconnects while the session is paused, and so
may learn the stream's RTP offset from a repeat, still counts exactly the generated frames.

The unit tests (tests/unit/transport/session/test_pacing_keepwarm.py) prove the pacer's side; this module proves the
page's
`isRepeat` on what Chromium really hands to requestVideoFrameCallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.browser.chromium import BROWSER_SKIPS
from tests.support.browser.fixtures import embedded_browser_fixtures
from tests.support.browser.pages import hold_until_applied, start_session, wait_frames
from tests.support.service_harness import metric
from tests.support.serving import Served
from transport.session.pacing import REPEAT_PTS_OFFSET, VIDEO_CLOCK_RATE

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

WIDTH, HEIGHT = 128, 96
INTERVAL_MS = 150
WAIT_MS = 30_000  # generous: a loaded 2-core CI machine; every wait ends as soon as its condition holds
WINDOW_MS = 1_500  # the measured idle window: about ten repeats at 150 ms
JITTER_MS = 600  # the page shows its video this late: repeats sent before a chunk come after its status

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    *BROWSER_SKIPS,
]

# Resolves true once the page's own frame count has not moved for `quiet` ms (the session went idle and its last
# generated frames played out), false if it still moves after `limit` ms (e.g. repeats counted as frames).
COUNT_SETTLED_JS = """
([quiet, limit]) => new Promise((resolve) => {
  const start = performance.now();
  let last = window.lingstream.frames;
  let since = start;
  const check = () => {
    const now = performance.now();
    if (window.lingstream.frames !== last) { last = window.lingstream.frames; since = now; }
    if (now - since >= quiet) resolve(true);
    else if (now - start >= limit) resolve(false);
    else setTimeout(check, 50);
  };
  check();
})
"""

# Over `ms` of wall time: frames the compositor presented (requestVideoFrameCallback's own `presentedFrames`, so a
# callback skipped under load still counts) and frames the page counted in its HUD.
IDLE_WINDOW_JS = """
(ms) => new Promise((resolve) => {
  const video = document.getElementById("video");
  const counted = window.lingstream.frames;
  let first = null;
  let last = null;
  let done = false;
  const onFrame = (now, meta) => {
    if (first === null) first = meta.presentedFrames;
    last = meta.presentedFrames;
    if (!done) video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
  setTimeout(() => {
    done = true;
    resolve({ presented: first === null ? 0 : last - first, counted: window.lingstream.frames - counted });
  }, ms);
})
"""


# From now on, every presented frame's RTP timestamp and whether a stamped chunk status of peer connection
# `generation` had arrived by then; returns the page's frame count at the start.
RECORD_JS = """
(generation) => {
  const video = document.getElementById("video");
  window.recorded = [];
  const onFrame = (now, meta) => {
    const stamped = window.lingstream.chunks.some(
      (chunk) => chunk.generation === generation && typeof chunk.first_frame_pts === "number",
    );
    window.recorded.push({ rtp: meta.rtpTimestamp, stamped });
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
  return window.lingstream.frames;
}
"""


service, browser, open_page = embedded_browser_fixtures(
    wait_ms=WAIT_MS, settings=lambda _: {"LINGSTREAM_IDLE_FRAME_INTERVAL_MS": str(INTERVAL_MS)}
)


def test_repeats_reach_the_browser_while_idle_and_the_page_does_not_count_them(
    open_page: Callable[..., Page], service: Served
) -> None:
    page = open_page()
    start_session(page, WIDTH, HEIGHT)
    page.wait_for_function("window.lingstream.lastChunk !== null")
    # No key held: the reference model rests after its first chunks, and the HUD's count stops.
    assert page.evaluate(COUNT_SETTLED_JS, [1_000, 15_000]), "the page kept counting frames while the session idled"
    chunks = page.evaluate("window.lingstream.chunks.length")

    idle: dict[str, Any] = page.evaluate(IDLE_WINDOW_JS, WINDOW_MS)
    assert idle["presented"] >= 4, idle  # repeats came every 150 ms and Chromium presented them
    assert idle["counted"] == 0, idle  # ... and the HUD took none of them for a frame
    assert page.evaluate("window.lingstream.chunks.length") == chunks  # nothing was generated meanwhile
    with httpx.Client(base_url=service.url, timeout=10.0) as client:
        text = client.get("/metrics").text
    assert metric(text, "lingstream_transport_idle_frames_sent_total") >= idle["presented"]

    # A key held: generated frames flow and are counted again.
    before = page.evaluate("window.lingstream.frames")
    page.focus("#stage")
    hold_until_applied(page, "w")
    wait_frames(page, before + 12)
    page.keyboard.up("w")
    page.click("#stop")
    page.wait_for_function("window.lingstream.ended")


def test_a_page_that_reconnects_while_the_session_is_paused_counts_generated_frames_and_not_repeats(
    open_page: Callable[..., Page], service: Served
) -> None:
    """The page learns the stream's RTP offset, per peer connection, from the first frame presented after a stamped
    chunk status. A page that reconnects while the session is paused gets only repeats on its new connection; with
    its video held back (a jitter buffer target), the first frame it presents after the next chunk status is a
    repeat sent before that chunk's first frame, 90 ticks off the grid. The page must count exactly the generated
    frames (and the repeats presented before any stamped status, which it cannot tell yet), and no repeat once the
    session idles again."""
    page = open_page(f"/?jitter_ms={JITTER_MS}")
    start_session(page, WIDTH, HEIGHT)
    page.wait_for_function("window.lingstream.lastChunk !== null")
    assert page.evaluate(COUNT_SETTLED_JS, [1_000, 15_000]), "the page kept counting frames while the session idled"
    session = page.evaluate("window.lingstream.sessionId")
    with httpx.Client(base_url=service.url, timeout=10.0) as client:
        ticks = round(VIDEO_CLOCK_RATE / float(client.get(f"/v1/sessions/{session}").json()["config"]["fps"]))

    page.click("#pause")
    page.wait_for_function("window.lingstream.state === 'paused'")
    generation = page.evaluate("window.lingstream.generation")
    page.evaluate("window.lingstream.reconnect()")
    page.wait_for_function("(g) => window.lingstream.generation > g", arg=generation)
    page.wait_for_function("window.lingstream.jitterBufferTarget !== null")
    before = page.evaluate(RECORD_JS, generation + 1)
    page.wait_for_function("window.lingstream.framesThisConnection >= 2")  # repeats flow on the new connection
    page.click("#pause")  # Resume
    page.wait_for_function("window.lingstream.state === 'running'")
    page.focus("#stage")
    hold_until_applied(page, "w")
    wait_frames(page, before + 12)  # generated frames are counted
    page.keyboard.up("w")
    page.wait_for_function("window.lingstream.lastChunk.keys.length === 0")
    assert page.evaluate(COUNT_SETTLED_JS, [1_000, 15_000]), "the page kept counting frames while the session idled"

    # Every frame presented since the reconnect, told apart by its RTP timestamp: repeats lie 90 ticks after the
    # grid of generated frames. The page counts the generated ones and the repeats before the first stamped status.
    recorded: list[dict[str, Any]] = page.evaluate("window.recorded")
    first = next(frame["rtp"] for frame in recorded if frame["rtp"] is not None)
    # Each frame's place within a frame interval, from its signed distance (RTP timestamps wrap at 2^32) to the first.
    phases = [
        None if frame["rtp"] is None else ((frame["rtp"] - first + 2**31) % 2**32 - 2**31) % ticks for frame in recorded
    ]
    seen = sorted({phase for phase in phases if phase is not None})
    assert len(seen) == 2, seen  # generated frames and repeats
    on_grid = next(phase for phase in seen if (phase + REPEAT_PTS_OFFSET) % ticks in seen)
    expected = sum(
        1
        for phase, frame in zip(phases, recorded, strict=True)
        if phase is None or phase == on_grid or not frame["stamped"]
    )
    assert page.evaluate("window.lingstream.frames") - before == expected

    # Idle again: the compositor presents the repeats, and the HUD counts none of them.
    idle: dict[str, Any] = page.evaluate(IDLE_WINDOW_JS, WINDOW_MS)
    assert idle["presented"] >= 4, idle
    assert idle["counted"] == 0, idle
    page.click("#stop")
    page.wait_for_function("window.lingstream.ended")
