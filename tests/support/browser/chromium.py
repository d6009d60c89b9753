"""How the browser tests launch Debian's Chromium through Playwright: the one place for the path and the flags, which
the browser benches (bench/_common.py) import too."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # playwright is a dev extra; the tests that use it skip without it
    from playwright.sync_api import Browser

__all__ = ["BROWSER_SKIPS", "CHROMIUM", "CHROMIUM_ARGS", "launch_chromium"]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # Host candidates with real addresses instead of mDNS names, so ICE can pair with the service on loopback.
    "--disable-features=WebRtcHideLocalIpsWithMdns",
]

BROWSER_SKIPS = [
    pytest.mark.skipif(
        importlib.util.find_spec("playwright") is None,
        reason="needs playwright (python): pip install -e '.[dev]'",
    ),
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"needs Chromium at {CHROMIUM} (scripts/setup.sh --dev)"),
]
"""What every browser test module skips for, with the reason: no playwright, or no Chromium where it is looked for."""


@contextlib.contextmanager
def launch_chromium() -> Iterator[Browser]:
    """Chromium through Playwright's sync API, closed at the end. Playwright gives every launch a fresh temporary
    user data dir. Launch it in the network namespace the test runs in (after entering it)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()
