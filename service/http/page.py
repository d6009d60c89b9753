"""The browser page: `/` (the page), `/static/…` (its ES modules and stylesheet), `/vendor/livekit-client/…` (the
livekit-client bundle) and `/page-config.json` (what the page needs to know before it creates a session).

The page's files live in `service/http/web/` and ship with the package (setuptools package data): `app.js` over
`lingstream-client.js`, the committed build of `@lingstream/client` (web/packages/client, docs/typescript.md), so
serving needs no build step; nothing is fetched from a CDN at run time. The livekit-client bundle is served from
`WEB_VENDOR_DIR` when it is set (the container images copy the npm package's `dist/` there), else from the checkout's
`web/node_modules/livekit-client/dist/` when `scripts/setup.sh` installed it. Without either the page still works on
the embedded transport and says that LiveKit is unavailable. None of these routes needs an API key: they serve the
same static files to everyone. The page creates with a client token when it has one (`?token=`, or from
`token_url`, the app's own token endpoint: docs/integrate.md) and then uses the create's session token; it asks for
an API key only without either, when the API answers 401. `?watch=<id>&token=<watch token>` is a share link.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from transport.base import Transport

__all__ = ["LIVEKIT_BUNDLE", "WEB_DIR", "install_page", "livekit_vendor_dir"]

logger = logging.getLogger(__name__)

WEB_DIR = Path(__file__).resolve().parent / "web"
"""The page's own static files (package data)."""
LIVEKIT_BUNDLE = "livekit-client.esm.mjs"
"""The ES module build of livekit-client the page imports."""
_CHECKOUT_VENDOR = Path(__file__).resolve().parents[2] / "web" / "node_modules" / "livekit-client" / "dist"
_VENDOR_PREFIX = "/vendor/livekit-client"
_NO_CACHE = {"Cache-Control": "no-cache"}


def livekit_vendor_dir(configured: Path | None) -> Path | None:
    """The directory holding `livekit-client.esm.mjs`: `configured` (WEB_VENDOR_DIR) if given, else the checkout's
    npm install; None (with a warning for a configured one) when the bundle is not there."""
    candidate = configured if configured is not None else _CHECKOUT_VENDOR
    if (candidate / LIVEKIT_BUNDLE).is_file():
        return candidate.resolve()
    if configured is not None:
        logger.warning(
            "LINGSTREAM_WEB_VENDOR_DIR=%s has no %s: the page cannot use LiveKit", configured, LIVEKIT_BUNDLE
        )
    return None


def install_page(
    app: FastAPI, *, transport: Transport | None, vendor_dir: Path | None, api_keys: bool, token_url: str | None = None
) -> None:
    """Add the page's routes to `app` (none of them in the OpenAPI document). `token_url`: where the page asks the
    app's backend for a client token (`LINGSTREAM_PAGE_TOKEN_URL`); set, it never asks for an API key."""
    if not (WEB_DIR / "index.html").is_file():
        logger.warning("the page's files are not installed (%s): the service runs without its browser page", WEB_DIR)
        return
    vendor = livekit_vendor_dir(vendor_dir)
    config = {
        "transport": transport.kind if transport is not None else None,
        "livekit_client": f"{_VENDOR_PREFIX}/{LIVEKIT_BUNDLE}" if vendor is not None else None,
        "api_keys": api_keys,
        "token_url": token_url,
    }
    if transport is not None and transport.kind == "livekit" and vendor is None:
        logger.warning("LiveKit is configured but no livekit-client bundle is available: the page cannot join")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(WEB_DIR / "index.html", media_type="text/html; charset=utf-8", headers=_NO_CACHE)

    @app.get("/page-config.json", include_in_schema=False)
    async def page_config() -> JSONResponse:
        return JSONResponse(config, headers=_NO_CACHE)

    app.mount("/static", StaticFiles(directory=WEB_DIR), name="static")
    if vendor is not None:
        app.mount(_VENDOR_PREFIX, StaticFiles(directory=vendor), name="vendor-livekit-client")
