"""What the browser tests do with the page and read from it: start a session through the form, wait for frames,
grab the picture as grey levels, and tell how far it moved. Shared by the embedded (test_browser.py) and the
LiveKit (test_livekit_browser.py) browser tests.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
from PIL import Image

if TYPE_CHECKING:  # playwright is a dev extra; the tests that use these skip without it
    from playwright.sync_api import Browser, Page

__all__ = [
    "FRAMES_IN_WINDOW_JS",
    "GRAB_JS",
    "SETTLED_JS",
    "best_shift",
    "cancel_over_http",
    "grab",
    "hold_until_applied",
    "page_opener",
    "reference_texture",
    "start_session",
    "wait_frames",
]

# Two snapshots of the <video> as grey levels (drawn onto a canvas in the page): the next presented frame (or the
# one on screen now, without `wait`) and the one `gap` presented frames later.
GRAB_JS = """
async ({ gap, wait }) => {
  const video = document.getElementById("video");
  const canvas = document.createElement("canvas");
  canvas.width = video.videoWidth;
  canvas.height = video.videoHeight;
  const context = canvas.getContext("2d", { willReadFrequently: true });
  const nextFrame = () => new Promise((resolve) => video.requestVideoFrameCallback(() => resolve()));
  const grab = () => {
    context.drawImage(video, 0, 0);
    const rgba = context.getImageData(0, 0, canvas.width, canvas.height).data;
    const grey = new Array(canvas.width * canvas.height);
    for (let i = 0; i < grey.length; i++) {
      grey[i] = (299 * rgba[4 * i] + 587 * rgba[4 * i + 1] + 114 * rgba[4 * i + 2]) / 1000;
    }
    return grey;
  };
  if (wait) await nextFrame();
  const first = grab();
  for (let i = 0; i < gap; i++) await nextFrame();
  return { width: canvas.width, height: canvas.height, first, second: gap > 0 ? grab() : first };
}
"""

# Resolves once no new frame has been presented for `quiet` ms: the picture the page shows when generation idles.
SETTLED_JS = """
(quiet) => new Promise((resolve) => {
  // Settled: `quiet` ms without a presented frame that changes the picture. Keep-warm repeats (the last frame sent
  // again while the session idles; LiveKit's default, where the page cannot tell them apart) keep frames coming
  // without changing it: each frame is compared with the one before on a 32x18 thumbnail (codec noise stays far
  // below a mean of 1 level, a generated frame of a moving camera far above).
  const video = document.getElementById("video");
  const canvas = document.createElement("canvas");
  canvas.width = 32;
  canvas.height = 18;
  const context = canvas.getContext("2d", { willReadFrequently: true });
  let previous = null;
  let since = performance.now();
  let done = false;
  const onFrame = () => {
    if (done) return;
    context.drawImage(video, 0, 0, canvas.width, canvas.height);
    const data = context.getImageData(0, 0, canvas.width, canvas.height).data;
    let diff = 0;
    if (previous !== null) {
      for (let i = 0; i < data.length; i++) if (i % 4 !== 3) diff += Math.abs(data[i] - previous[i]);
    }
    if (previous === null || diff / (canvas.width * canvas.height * 3) > 1.0) since = performance.now();
    previous = data;
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
  const check = () => {
    if (performance.now() - since >= quiet) {
      done = true;
      resolve(window.lingstream.frames);
    } else {
      setTimeout(check, 50);
    }
  };
  check();
})
"""

# Frames presented during a window of `ms` milliseconds (a measurement, so a fixed window is the point).
FRAMES_IN_WINDOW_JS = """
(ms) => new Promise((resolve) => {
  const start = window.lingstream.frames;
  setTimeout(() => resolve(window.lingstream.frames - start), ms);
})
"""


def start_session(page: Page, width: int, height: int, *, image: Path | None = None, hud: bool = False) -> None:
    """Fill the form (size, image, HUD overlay) and press Start."""
    page.fill("#width", str(width))
    page.fill("#height", str(height))
    if not hud:
        page.uncheck("#hud")
    if image is not None:
        page.set_input_files("#image", str(image))
    page.click("#start")


def wait_frames(page: Page, count: int = 1) -> None:
    """`count` frames presented, and on a controller's page its controls live (the first control state sent, on its
    link's open): a key pressed before that is dropped by the page, and Playwright's held key repeats nothing (the
    data channel can open after the video flows on a loaded machine: bench.latency lost its first press so in CI)."""
    page.wait_for_function(
        """(n) => window.lingstream.frames >= n
           && (window.lingstream.role !== "controller" || window.lingstream.lastSent !== null)""",
        arg=count,
    )


def grab(page: Page, gap: int = 0, *, wait: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The picture now (the next presented frame with `wait`) and `gap` presented frames later, as grey levels."""
    data = page.evaluate(GRAB_JS, {"gap": gap, "wait": wait})
    shape = (data["height"], data["width"])
    first = np.asarray(data["first"], dtype=np.float64).reshape(shape)
    return first, np.asarray(data["second"], dtype=np.float64).reshape(shape)


def best_shift(before: np.ndarray, after: np.ndarray, limit: int = 24) -> int:
    """The horizontal shift s that best explains `after[:, x] = before[:, x + s]`: s > 0 means the content moved
    left by s pixels."""
    width = before.shape[1]
    errors = {}
    for shift in range(-limit, limit + 1):
        if shift >= 0:
            diff = after[:, : width - shift] - before[:, shift:]
        else:
            diff = after[:, -shift:] - before[:, : width + shift]
        errors[shift] = float(np.mean(np.abs(diff)))
    return min(errors, key=lambda shift: errors[shift])


def reference_texture(path: Path, width: int, height: int) -> Path:
    """A smooth random texture (features big enough to survive the 8x latent and VP8), so a pan is unambiguous."""
    rng = np.random.default_rng(7)
    coarse = Image.fromarray(rng.integers(0, 256, (6, 8, 3), dtype=np.uint8), "RGB")
    coarse.resize((width, height), Image.Resampling.BICUBIC).save(path)
    return path


def hold_until_applied(page: Page, key: str) -> int:
    """Press `key` (kept held) and wait until a chunk reports it applied from a snapshot at least as new as the
    one that carried it; returns that snapshot's seq."""
    page.keyboard.down(key)
    page.wait_for_function(
        "(key) => window.lingstream.lastSent && window.lingstream.lastSent.keys.includes(key)", arg=key
    )
    seq = int(page.evaluate("window.lingstream.lastSent.seq"))
    page.wait_for_function(
        "([key, seq]) => { const c = window.lingstream.lastChunk;"
        " return c !== null && c.keys.includes(key) && c.applied_seq >= seq; }",
        arg=[key, seq],
    )
    return seq


def cancel_over_http(base_url: str) -> Callable[[list[str]], None]:
    """A `page_opener` canceller that ends the sessions with `DELETE ...?mode=cancel` on the service at `base_url`."""

    def cancel(sessions: list[str]) -> None:
        with httpx.Client(base_url=base_url, timeout=10.0) as client:
            for session in sessions:
                client.delete(f"/v1/sessions/{session}", params={"mode": "cancel"})

    return cancel


@contextlib.contextmanager
def page_opener(
    browser: Browser, base_url: str, cancel: Callable[[list[str]], None], *, timeout_ms: int
) -> Iterator[Callable[..., Page]]:
    """Opens the page (at `path`, e.g. `/?watch=ID`) in a fresh context each time; at the end, hands `cancel` the
    sessions the controller pages started, closes the contexts and checks that no page threw."""
    contexts: list[Any] = []
    pages: list[Page] = []
    errors: list[str] = []

    def opener(path: str = "/") -> Page:
        context = browser.new_context()
        contexts.append(context)
        page = context.new_page()
        page.set_default_timeout(timeout_ms)
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(f"{base_url}{path}")
        page.wait_for_function("window.lingstream !== undefined")
        pages.append(page)
        return page

    yield opener
    started = [
        page.evaluate("window.lingstream.sessionId")
        for page in pages
        if page.evaluate("window.lingstream.role") == "controller"
    ]
    cancel([session for session in started if session])
    for context in contexts:
        context.close()
    assert not errors, errors
