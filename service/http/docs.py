"""The API reference page: `/docs` (Swagger UI over `/openapi.json`) and `/vendor/swagger-ui/…` (its three files).

FastAPI's built-in page loads Swagger UI from a public CDN and its favicon from FastAPI's site, so offline it is
blank. This one serves the same page with every file from the service itself: Swagger UI's script, stylesheet and
favicon come from the npm package `swagger-ui-dist`, which `scripts/setup.sh` installs into
`web/node_modules/swagger-ui-dist/` (pinned in `web/package.json`) and the container images copy to the directory
`DOCS_VENDOR_DIR` names. When the files are absent `/docs` answers a short page that says what to install instead
of a blank one; `/openapi.json` is unaffected. There is no ReDoc page (its files are not shipped). None of these
routes needs an API key and none is in the OpenAPI document.
"""

from __future__ import annotations

import html
import logging
from pathlib import Path

from fastapi import FastAPI, HTTPException
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

__all__ = ["DOCS_PATH", "SWAGGER_UI_FILES", "install_docs", "swagger_ui_dir"]

logger = logging.getLogger(__name__)

DOCS_PATH = "/docs"
SWAGGER_UI_FILES = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")
"""What the page loads from `swagger-ui-dist`: the script, the stylesheet, the favicon."""
_CHECKOUT_VENDOR = Path(__file__).resolve().parents[2] / "web" / "node_modules" / "swagger-ui-dist"
_VENDOR_PREFIX = "/vendor/swagger-ui"
_MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8", ".png": "image/png"}
_NO_CACHE = {"Cache-Control": "no-cache"}
# Swagger UI's defaults include an online validator (a badge fetched from a public host); null turns it off.
_SWAGGER_UI_PARAMETERS = {"validatorUrl": None}


def swagger_ui_dir(configured: Path | None) -> Path | None:
    """The directory holding every file of `SWAGGER_UI_FILES`: `configured` (DOCS_VENDOR_DIR) if given, else the
    checkout's npm install; None (with a warning naming what is missing) when they are not all there."""
    candidate = configured if configured is not None else _CHECKOUT_VENDOR
    missing = [name for name in SWAGGER_UI_FILES if not (candidate / name).is_file()]
    if not missing:
        return candidate.resolve()
    where = f"LINGSTREAM_DOCS_VENDOR_DIR={configured}" if configured is not None else str(candidate)
    logger.warning(
        "%s lacks %s: %s explains what to install instead of showing the API reference",
        where,
        ", ".join(missing),
        DOCS_PATH,
    )
    return None


def install_docs(app: FastAPI, *, vendor_dir: Path | None, openapi_url: str | None) -> None:
    """Add `/docs` and its files to `app` (create the app with `docs_url=None, redoc_url=None`)."""
    if openapi_url is None:
        return
    vendor = swagger_ui_dir(vendor_dir)
    if vendor is None:
        page = _missing_page(vendor_dir, openapi_url)

        @app.get(DOCS_PATH, include_in_schema=False)
        async def docs_unavailable() -> HTMLResponse:
            # 200, not an error body: the answer to a person's browser is this help page; the API is unaffected.
            return HTMLResponse(page, headers=_NO_CACHE)

        return

    files = {name: vendor / name for name in SWAGGER_UI_FILES}
    script, stylesheet, favicon = (f"{_VENDOR_PREFIX}/{name}" for name in SWAGGER_UI_FILES)
    title = f"{app.title} - API reference"

    @app.get(DOCS_PATH, include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=title,
            swagger_js_url=script,
            swagger_css_url=stylesheet,
            swagger_favicon_url=favicon,
            oauth2_redirect_url=None,
            swagger_ui_parameters=_SWAGGER_UI_PARAMETERS,
        )

    @app.get(f"{_VENDOR_PREFIX}/{{name}}", include_in_schema=False)
    async def swagger_ui_file(name: str) -> FileResponse:
        path = files.get(name)
        if path is None:
            raise HTTPException(404, f"{_VENDOR_PREFIX}/ serves only {', '.join(SWAGGER_UI_FILES)}")
        return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_NO_CACHE)


def _missing_page(configured: Path | None, openapi_url: str) -> str:
    where = (
        f"<code>LINGSTREAM_DOCS_VENDOR_DIR</code> is <code>{html.escape(str(configured))}</code>, which does not hold"
        if configured is not None
        else f"<code>{html.escape(str(_CHECKOUT_VENDOR))}</code> does not hold"
    )
    files = ", ".join(f"<code>{name}</code>" for name in SWAGGER_UI_FILES)
    openapi = html.escape(openapi_url)
    return f"""<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>API reference unavailable</title><link rel="icon" href="data:,"></head>
<body>
<h1>The API reference page is not installed</h1>
<p>This page shows the API with Swagger UI, served by this service from the npm package
<code>swagger-ui-dist</code> (nothing is fetched from the internet). {where} its files ({files}).</p>
<p>To install it: run <code>bash scripts/setup.sh</code> in the checkout (it runs <code>npm ci</code> in
<code>web/</code>), or point <code>LINGSTREAM_DOCS_VENDOR_DIR</code> at a directory with those files
(the container images set it) and restart the service.</p>
<p>The API itself works without it; its OpenAPI document is at <a href="{openapi}">{openapi}</a>.</p>
</body>
</html>
"""
