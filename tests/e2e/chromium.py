"""How the browser tests launch Debian's Chromium through Playwright (one place for the path and the flags)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["CHROMIUM", "CHROMIUM_ARGS"]

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
