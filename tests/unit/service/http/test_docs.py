"""`/docs` in-process: Swagger UI served entirely by the service (the page and everything it references, found by
parsing it), a help page when swagger-ui-dist is absent, and nothing else from the vendor directory."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httpx
import pytest

from service.http.docs import SWAGGER_UI_FILES, swagger_ui_dir
from tests.support.service_harness import running_service

CHECKOUT_SWAGGER_UI = Path(__file__).resolve().parents[4] / "web" / "node_modules" / "swagger-ui-dist"
_CSS_URL = re.compile(r"""url\(\s*(['"]?)(.*?)\1\s*\)|@import\s+(['"])(.*?)\3""", re.DOTALL)
# The URL FastAPI's page hands to SwaggerUIBundle (the OpenAPI document it renders).
_SCRIPT_URL = re.compile(r"""\burl:\s*(['"])(.*?)\1""")


class _References(HTMLParser):
    """Every src/href/srcset/poster/data attribute of a page, and the URLs its inline scripts and styles name."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self._inline: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if value is None:
                continue
            if name in {"src", "href", "poster", "data", "action"}:
                self.urls.append(value)
            elif name == "srcset":
                self.urls.extend(part.split()[0] for part in value.split(",") if part.strip())
            elif name == "style":
                self.urls.extend(css_references(value))
        self._inline = tag if tag in {"script", "style"} else None

    def handle_endtag(self, tag: str) -> None:
        self._inline = None

    def handle_data(self, data: str) -> None:
        if self._inline == "script":
            self.urls.extend(match.group(2) for match in _SCRIPT_URL.finditer(data))
        elif self._inline == "style":
            self.urls.extend(css_references(data))


def css_references(css: str) -> list[str]:
    return [match.group(2) or match.group(4) for match in _CSS_URL.finditer(css)]


def is_inline(url: str) -> bool:
    return urlsplit(url).scheme in {"data", "blob", "about"} or url.startswith("#")


def is_external(url: str) -> bool:
    """An absolute URL (a scheme or a network location, `//host/...` included): anything not served from here."""
    parts = urlsplit(url.strip())
    return bool(parts.scheme or parts.netloc)


async def crawl(client: httpx.AsyncClient, start: str) -> dict[str, httpx.Response]:
    """Fetch `start` and, transitively, every same-origin file it references (HTML attributes and inline
    scripts, CSS `url()` and `@import`); an absolute URL anywhere fails the test."""
    fetched: dict[str, httpx.Response] = {}
    pending = [start]
    while pending:
        path = pending.pop()
        if path in fetched:
            continue
        response = await client.get(path)
        assert response.status_code == 200, (path, response.status_code, response.text[:200])
        assert response.content, f"{path} is empty"
        fetched[path] = response
        kind = response.headers["content-type"]
        if kind.startswith("text/html"):
            parser = _References()
            parser.feed(response.text)
            urls = parser.urls
        elif kind.startswith("text/css"):
            urls = css_references(response.text)
        else:
            continue
        for url in urls:
            if is_inline(url):
                continue
            assert not is_external(url), f"{path} references {url}, which is not served by the service"
            pending.append(urlsplit(urljoin(path, url)).path)
    return fetched


def test_the_reference_parser_sees_every_kind_of_reference() -> None:
    parser = _References()
    parser.feed(
        '<link href="//cdn.example/a.css"><img srcset="/x.png 1x, https://h/y.png 2x" style="background: url(z.png)">'
        "<script>SwaggerUIBundle({url: '/openapi.json'})</script><style>@import 'i.css';</style>"
    )
    assert parser.urls == ["//cdn.example/a.css", "/x.png", "https://h/y.png", "z.png", "/openapi.json", "i.css"]
    assert [is_external(url) for url in parser.urls] == [True, False, True, False, False, False]
    assert css_references("a{b:url(\"data:image/svg+xml,<svg xmlns='http://www.w3.org/2000/svg'/>\")}") == [
        "data:image/svg+xml,<svg xmlns='http://www.w3.org/2000/svg'/>"
    ]
    assert is_inline(css_references("a{b:url('data:,x')}")[0])


async def test_docs_and_everything_they_reference_come_from_the_service() -> None:
    if swagger_ui_dir(CHECKOUT_SWAGGER_UI) is None:
        pytest.skip("web/node_modules has no swagger-ui-dist (scripts/setup.sh installs it with npm)")
    async with running_service(docs_vendor_dir=str(CHECKOUT_SWAGGER_UI)) as svc:
        fetched = await crawl(svc.client, "/docs")
    assert set(fetched) == {"/docs", "/openapi.json", *(f"/vendor/swagger-ui/{name}" for name in SWAGGER_UI_FILES)}
    page = fetched["/docs"].text
    assert "SwaggerUIBundle" in page
    assert "validatorUrl" in page  # the online validator badge (a public host) is switched off
    assert fetched["/vendor/swagger-ui/swagger-ui-bundle.js"].headers["content-type"].startswith("text/javascript")
    assert fetched["/vendor/swagger-ui/swagger-ui.css"].headers["content-type"].startswith("text/css")
    assert fetched["/vendor/swagger-ui/favicon-32x32.png"].headers["content-type"] == "image/png"
    assert "/v1/sessions" in fetched["/openapi.json"].json()["paths"]


async def test_the_swagger_files_come_from_the_configured_dir_and_nothing_else_does(tmp_path: Path) -> None:
    for name in SWAGGER_UI_FILES:
        (tmp_path / name).write_text(f"/* {name} */\n")
    (tmp_path / "package.json").write_text("{}")
    async with running_service(docs_vendor_dir=str(tmp_path)) as svc:
        for name in SWAGGER_UI_FILES:
            response = await svc.client.get(f"/vendor/swagger-ui/{name}")
            assert response.status_code == 200
            assert response.text == f"/* {name} */\n"
        for path in ("/vendor/swagger-ui/package.json", "/vendor/swagger-ui/..%2Fpackage.json", "/redoc"):
            response = await svc.client.get(path)
            assert response.status_code == 404, path
            assert response.json()["error"]["code"] == "not_found"
        schema = (await svc.client.get("/openapi.json")).json()
        assert not any(path.startswith(("/docs", "/vendor")) for path in schema["paths"])


async def test_without_swagger_ui_docs_says_what_to_install(tmp_path: Path) -> None:
    (tmp_path / "swagger-ui.css").write_text("")  # a partial copy counts as absent
    async with running_service(docs_vendor_dir=str(tmp_path)) as svc:
        response = await svc.client.get("/docs")
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/html")
        text = response.text
        for needed in ("swagger-ui-dist", "scripts/setup.sh", "LINGSTREAM_DOCS_VENDOR_DIR", str(tmp_path)):
            assert needed in text, needed
        assert "<script" not in text
        fetched = await crawl(svc.client, "/docs")  # the help page too references nothing outside the service
        assert set(fetched) == {"/docs", "/openapi.json"}
        missing = await svc.client.get("/vendor/swagger-ui/swagger-ui.css")
        assert missing.status_code == 404
