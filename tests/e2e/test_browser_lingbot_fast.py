"""The page in a real headless Chromium against `lingstream serve` with `LINGSTREAM_MODEL=lingbot-fast` on a tiny
random checkpoint written by `lingstream tiny-checkpoint`: the real model's stages (our DiT, the streamed Wan VAE,
umt5) behind the service, video over the embedded WebRTC transport on loopback.

The picture is noise (random weights); what is checked is the plumbing: every presented frame has the session's
size, and the frames the page presents add up chunk by chunk to the frame contract, 4 x (chunk_size - 1) + 1 for
the first chunk and 4 x chunk_size after. An idle session generates one chunk per new prompt, so the test steps it
chunk by chunk and counts the frames presented between chunk statuses. Frames are counted with the compositor's own
`presentedFrames` (requestVideoFrameCallback's metadata), so a callback the page skipped under load still counts.
Waits are on conditions; each step waits for its frames, then for the video to fall quiet, and only then compares.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.support.browser.chromium import BROWSER_SKIPS
from tests.support.browser.fixtures import embedded_browser_fixtures
from tests.support.browser.pages import SETTLED_JS, start_session
from tests.support.serving import Served
from tests.support.tiny_model import write_tiny_checkpoint

try:
    from playwright.sync_api import Page, sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")

WIDTH, HEIGHT = 64, 32
WAIT_MS = 60_000  # the tiny model's first chunk encodes the reference prefix: seconds on a loaded 2-core machine
QUIET_MS = 800  # no frame for this long after a chunk's frames arrived: the chunk has played out (16 fps: 62 ms apart)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    *BROWSER_SKIPS,
]

# Every presented frame's compositor count, size and RTP timestamp, from requestVideoFrameCallback on the page's
# <video> (installed before the session starts; the page's own callback keeps running beside it). `count` adds the
# frames the player dropped (two frames due in one vsync present one: seen with the suite on 2 workers, the count
# then never reached the promise); every frame the chunks promise is counted once, presented or dropped.
PRESENTED_JS = """
() => {
  const video = document.getElementById("video");
  window.presented = [];
  const onFrame = (now, meta) => {
    const dropped = video.getVideoPlaybackQuality().droppedVideoFrames;
    window.presented.push({ count: meta.presentedFrames + dropped, dropped, width: meta.width, height: meta.height });
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
}
"""
PRESENTED_COUNT_JS = "() => window.presented.length ? window.presented[window.presented.length - 1].count : 0"


def _tiny_model(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    checkpoint = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model")
    return {"LINGSTREAM_MODEL": "lingbot-fast", "LINGSTREAM_MODEL_PATH": str(checkpoint)}


service, browser, open_page = embedded_browser_fixtures(wait_ms=WAIT_MS, settings=_tiny_model)


def _played_out(page: Page, first: int, later: int) -> tuple[int, int]:
    """Wait until the compositor presented the frames the chunk statuses so far promise (`first`, then `later` per
    chunk) and the video fell quiet; then (chunk statuses, frames presented)."""
    page.wait_for_function(
        f"([first, later]) => ({PRESENTED_COUNT_JS})() >= first + later * (window.lingstream.chunks.length - 1)",
        arg=[first, later],
    )
    page.evaluate(SETTLED_JS, QUIET_MS)
    chunks: int = page.evaluate("window.lingstream.chunks.length")
    presented: int = page.evaluate(PRESENTED_COUNT_JS)
    return chunks, presented


def test_the_page_gets_the_tiny_models_frames_at_the_sessions_size_chunk_by_chunk(
    open_page: Callable[..., Page], service: Served
) -> None:
    page = open_page()
    page.evaluate(PRESENTED_JS)
    page.fill("#prompt", "a stone bridge")
    start_session(page, WIDTH, HEIGHT)
    page.wait_for_function("window.lingstream.lastChunk !== null")
    session = page.evaluate("window.lingstream.sessionId")
    with httpx.Client(base_url=service.url, timeout=10.0) as client:
        config: dict[str, Any] = client.get(f"/v1/sessions/{session}").json()["config"]
    assert (config["width"], config["height"]) == (WIDTH, HEIGHT)
    chunk_size = int(config["chunk_size"])
    first, later = 4 * (chunk_size - 1) + 1, 4 * chunk_size

    # The session streams chunk 0 at once (and one more for the page's first, idle, control snapshot); then it
    # idles, holding its picture, until something new arrives: each new prompt makes it generate one more chunk.
    steps = [_played_out(page, first, later)]
    for text in ("a dark night", "a sunny day"):
        page.fill("#prompt-live", text)
        page.press("#prompt-live", "Enter")
        page.wait_for_function("(text) => window.lingstream.lastChunk.prompt === text", arg=text)
        steps.append(_played_out(page, first, later))
    promised = [(chunks, first + later * (chunks - 1)) for chunks, _ in steps]
    assert steps == promised, f"(chunk statuses, frames presented) after each step; chunk_size {chunk_size}"
    assert [chunks for chunks, _ in steps[1:]] == [steps[0][0] + 1, steps[0][0] + 2]  # one chunk per prompt
    chunks = page.evaluate("window.lingstream.chunks")
    assert [chunk["index"] for chunk in chunks] == list(range(len(chunks)))
    assert [chunk["prompt"] for chunk in chunks][-3:] == ["a stone bridge", "a dark night", "a sunny day"]

    presented = page.evaluate("window.presented")
    assert {(frame["width"], frame["height"]) for frame in presented} == {(WIDTH, HEIGHT)}
    assert page.evaluate("window.lingstream.videoSize") == {"width": WIDTH, "height": HEIGHT}
    page.click("#stop")
    page.wait_for_function("window.lingstream.ended")
    assert page.evaluate("window.lingstream.done") == "client_stop"
    assert page.evaluate("window.lingstream.errors") == []
