"""The page in a real headless Chromium against `lingstream serve` with `LINGSTREAM_STAGE_PLACEMENT=processes`: the
reference model's DiT sharded over two worker processes, VAE encode and decode in their own, latents between them
through shared memory; video over the embedded WebRTC transport on loopback.

Waits are on conditions (`wait_for_function`); the one fixed window is a measurement of the frame rate.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser.chromium import BROWSER_SKIPS, CHROMIUM, CHROMIUM_ARGS
from tests.support.browser.pages import hold_until_applied
from tests.support.process_tree import descendants
from tests.support.serving import ROOT, environment, free_port, lingstream, wait_until_ready

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - the dev extra installs it
    sync_playwright = None  # type: ignore[assignment]

WIDTH, HEIGHT = 128, 96
STARTUP_S = 90.0
WAIT_MS = 30_000

pytestmark = [
    pytest.mark.browser,
    *BROWSER_SKIPS,
]

_FRAMES_IN_WINDOW_JS = """
(ms) => new Promise((resolve) => {
  const start = window.lingstream.frames;
  setTimeout(() => resolve(window.lingstream.frames - start), ms);
})
"""


@contextlib.contextmanager
def _serve(log: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    port = free_port()
    env = environment(
        LINGSTREAM_HOST="127.0.0.1",
        LINGSTREAM_STAGE_PLACEMENT="processes",
        LINGSTREAM_DENOISE_RANKS="2",
        LINGSTREAM_TORCH_THREADS="1",
        LINGSTREAM_DRAIN_TIMEOUT="5",
        LINGSTREAM_LOG_FORMAT="text",
    )
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*lingstream(), "serve", "--port", str(port)], cwd=ROOT, env=env, stdout=sink, stderr=sink
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, process, lambda: log.read_text(errors="replace"), within_s=STARTUP_S)
        yield url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
    assert "Traceback" not in log.read_text(errors="replace")


def test_the_page_streams_and_steers_a_session_whose_stages_run_in_worker_processes(tmp_path: Path) -> None:
    assert sync_playwright is not None
    with _serve(tmp_path / "serve.log") as (url, process), sync_playwright() as playwright:
        assert len(descendants(process.pid)) >= 4  # encode, two DiT ranks, decode
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        errors: list[str] = []
        try:
            page = browser.new_context().new_page()
            page.set_default_timeout(WAIT_MS)
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(f"{url}/")
            page.wait_for_function("window.lingstream !== undefined")
            page.fill("#width", str(WIDTH))
            page.fill("#height", str(HEIGHT))
            page.click("#start")
            page.wait_for_function("window.lingstream.frames >= 1")
            assert page.evaluate("window.lingstream.videoSize") == {"width": WIDTH, "height": HEIGHT}

            page.focus("#stage")
            hold_until_applied(page, "l")
            shown = page.evaluate(_FRAMES_IN_WINDOW_JS, 2000)
            timings = page.evaluate("window.lingstream.lastChunk.timings")
            page.keyboard.up("l")
            assert shown >= 16, f"{shown} frames in 2 s at 16 fps"
            assert timings["latent_channel"] > 0  # the latent crossed from the DiT group to the decode group
            page.click("#stop")
            page.wait_for_function("window.lingstream.state === 'closed'")
        finally:
            browser.close()
        assert not errors, errors
