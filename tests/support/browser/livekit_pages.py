"""What the LiveKit browser tests (tests/e2e/test_livekit_browser.py on the real livekit-server,
test_livekit_browser_faults.py on the stand-in) do with a page beyond `pages.py`: start a session and wait for its
first frame, read its join details, stop it, turn and settle, ask for one more chunk, read the reconnect counters.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tests.support.browser.pages import SETTLED_JS, grab, page_opener, start_session, wait_frames
from tests.support.livekit_stack import LiveKitStack, metric

if TYPE_CHECKING:  # playwright is a dev extra; the tests that use these skip without it
    from playwright.sync_api import Browser, Page

__all__ = [
    "RECONNECTS",
    "one_more_chunk",
    "open_pages",
    "reconnects",
    "session_of",
    "start",
    "stop",
    "turned_and_settled",
]

RECONNECTS = "lingstream_transport_reconnects_total"


def start(page: Page, width: int, height: int, image: Path | None = None) -> dict[str, Any]:
    """Start a session from the page, wait for its first frame; its join details (from the service)."""
    start_session(page, width, height, image=image)
    wait_frames(page)
    return session_of(page)


def session_of(page: Page) -> dict[str, Any]:
    session: dict[str, Any] = page.evaluate(
        "fetch(`/v1/sessions/${window.lingstream.sessionId}`).then((r) => r.json())"
    )
    return session


def stop(page: Page) -> None:
    """Click Stop and wait until the page has ended (polled on a timer: a page that is not in front may get no
    animation frames to poll on)."""
    page.click("#stop")
    page.wait_for_function("window.lingstream.ended", polling=100)


def reconnects(stack: LiveKitStack) -> dict[str, float]:
    text = stack.metrics()
    return {kind: metric(text, RECONNECTS, kind=kind) for kind in ("sdk_resume", "rejoin", "controller_return")}


def turned_and_settled(page: Page) -> tuple[np.ndarray, int]:
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


def one_more_chunk(page: Page, after: int) -> np.ndarray:
    """Send a snapshot of no keys (a new snapshot makes the session generate one chunk), wait for that chunk's
    frames; the picture then."""
    page.evaluate("window.lingstream.send({v: 1, type: 'control_state', seq: Date.now(), keys: []}, false)")
    page.wait_for_function("(i) => window.lingstream.lastChunk.index > i", arg=after)
    page.evaluate(SETTLED_JS, 500)
    picture, _ = grab(page, wait=False)
    return picture


@contextlib.contextmanager
def open_pages(browser: Browser, stack: LiveKitStack, *, timeout_ms: int) -> Iterator[Callable[..., Page]]:
    """`page_opener` on a LiveKit stack's service: at the end the sessions the pages started are cancelled over REST,
    the contexts closed and every page checked for JavaScript errors (the `open_page` fixture of the LiveKit browser
    modules)."""

    def cancel(sessions: list[str]) -> None:
        with stack.client() as client:
            for session in sessions:
                client.delete(f"/v1/sessions/{session}", params={"mode": "cancel"})

    with page_opener(browser, stack.url, cancel, timeout_ms=timeout_ms) as opener:
        yield opener
