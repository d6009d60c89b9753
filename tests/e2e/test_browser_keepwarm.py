"""Keep-warm on the embedded transport, seen by the page in a real headless Chromium: while the session is idle the
service sends its last frame again (`LINGSTREAM_IDLE_FRAME_INTERVAL_MS`), those repeats reach the browser's
compositor, and the page's HUD does not count them as frames (they lie off the frame grid: `REPEAT_PTS_OFFSET`);
generated frames, once a key is held, are counted again.

The unit tests (tests/unit/transport/test_pacing_keepwarm.py) prove the pacer's side; this module proves the page's
`isRepeat` on what Chromium really hands to requestVideoFrameCallback.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.e2e.browser_fixtures import embedded_browser_fixtures
from tests.e2e.chromium import CHROMIUM
from tests.e2e.pages import hold_until_applied, start_session, wait_frames
from tests.serving import Served
from tests.unit.service.helpers import metric

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

WIDTH, HEIGHT = 128, 96
INTERVAL_MS = 150
WAIT_MS = 30_000  # generous: a loaded 2-core CI machine; every wait ends as soon as its condition holds
WINDOW_MS = 1_500  # the measured idle window: about ten repeats at 150 ms

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(sync_playwright is None, reason="needs playwright (python): pip install -e '.[dev]'"),
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"needs Chromium at {CHROMIUM} (scripts/setup.sh --dev)"),
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
