"""The page with tokens only (issue #35), in a real headless Chromium against a real `lingstream serve` (the reference
model, embedded WebRTC on loopback) configured with API keys, a token secret and `LINGSTREAM_PAGE_TOKEN_URL`.

No page ever holds the API key: the controller page asks the app's token endpoint (`tests/support/token_endpoint.py`,
the pattern of docs/integrate.md) for a client token, creates with it, runs and stops the session with the create's
session token, and shares it; a second page watches through the share link (its watch token). A page opened with
`?token=` creates with that client token. The service's log (uvicorn's access lines included) holds no token.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.browser.pages import hold_until_applied, page_opener, start_session, wait_frames
from tests.support.serving import Served, serve
from tests.support.token_endpoint import TokenEndpoint, token_endpoint

with contextlib.suppress(ImportError):  # the dev extra installs it; BROWSER_SKIPS says why when it is absent
    from playwright.sync_api import Browser, Page

API_KEY = "app-backend-key-0123456789abcdef"
TOKEN_SECRET = "browser-test-token-secret-0123456789abcdef"
WIDTH, HEIGHT = 128, 96
WAIT_MS = 20_000

pytestmark = [pytest.mark.browser, *BROWSER_SKIPS]


@dataclass
class Deployment:
    service: Served
    endpoint: TokenEndpoint


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with token_endpoint(API_KEY) as endpoint:
        settings = {
            "LINGSTREAM_API_KEYS": API_KEY,
            "LINGSTREAM_TOKEN_SECRET": TOKEN_SECRET,
            "LINGSTREAM_PAGE_TOKEN_URL": endpoint.url,
            "LINGSTREAM_HOST": "127.0.0.1",
            "LINGSTREAM_TORCH_THREADS": "1",
            "LINGSTREAM_QUEUE_SIZE": "2",
            "LINGSTREAM_LOG_FORMAT": "text",
        }
        with serve(tmp_path_factory.mktemp("serve"), factory=None, **settings) as service:
            endpoint.target = service.url
            service.wait_until_ready()
            yield Deployment(service, endpoint)


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with launch_chromium() as chromium:
        yield chromium


@pytest.fixture
def open_page(browser: Browser, deployment: Deployment) -> Iterator[Callable[..., Page]]:
    def cancel(sessions: list[str]) -> None:  # the app's backend ends what is left, with its key
        with httpx.Client(base_url=deployment.service.url, timeout=10.0) as client:
            for session in sessions:
                client.delete(f"/v1/sessions/{session}", params={"mode": "cancel"}, headers=_key())

    with page_opener(browser, deployment.service.url, cancel, timeout_ms=WAIT_MS) as opener:
        yield opener


def _said(page: Page) -> str:
    """What the page told its user (for a failure's message)."""
    return str(page.evaluate("document.getElementById('message').textContent"))


def _key() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}


def test_a_page_starts_shares_and_stops_a_session_with_tokens_only(
    open_page: Callable[..., Page], deployment: Deployment
) -> None:
    controller = open_page()
    assert controller.is_hidden("#api-key-row")  # a token endpoint is configured: no API key is ever asked for
    start_session(controller, WIDTH, HEIGHT)
    controller.wait_for_function("window.lingstream.sessionId !== null || window.lingstream.state === 'idle'")
    assert controller.evaluate("window.lingstream.sessionId") is not None, _said(controller)
    wait_frames(controller, 5)
    assert controller.evaluate("window.lingstream.credential") == "session_token"
    assert deployment.endpoint.minted == 1
    controller.wait_for_function("window.lingstream.shareUrl !== null")
    share_url = controller.evaluate("window.lingstream.shareUrl")
    assert controller.get_attribute("#watch-link", "href") == share_url
    session = controller.evaluate("window.lingstream.sessionId")
    watch_token = share_url.rsplit("token=", 1)[1]
    hold_until_applied(controller, "w")  # held: the session keeps generating while the viewer joins

    viewer = open_page(share_url)
    viewer.wait_for_function("window.lingstream.role === 'viewer' && window.lingstream.frames > 5")
    assert viewer.evaluate("window.lingstream.credential") == "watch_token"
    assert viewer.evaluate("window.lingstream.videoSize") == {"width": WIDTH, "height": HEIGHT}
    assert viewer.is_hidden("#control-buttons")

    controller.keyboard.up("w")
    controller.click("#stop")
    controller.wait_for_function("window.lingstream.state === 'closed' && window.lingstream.ended")
    viewer.wait_for_function("window.lingstream.state === 'closed' && window.lingstream.ended")
    with httpx.Client(base_url=deployment.service.url, timeout=10.0) as client:
        assert client.get(f"/v1/sessions/{session}", headers=_key()).json()["reason"] == "client_stop"
    log = deployment.service.output()
    assert watch_token not in log
    assert "token=[redacted]" in log  # the viewer page's request for `/?watch=…&token=…` was logged, redacted


def test_a_page_opened_with_a_client_token_creates_with_it(
    open_page: Callable[..., Page], deployment: Deployment
) -> None:
    with httpx.Client(base_url=deployment.service.url, timeout=10.0) as client:
        minted = client.post(
            "/v1/client_tokens", json={"max_seconds": 120, "origins": [deployment.service.url]}, headers=_key()
        )
        assert minted.status_code == 201, minted.text
    page = open_page(f"/?token={minted.json()['token']}")
    assert "token=" not in page.url  # taken out of the address bar
    start_session(page, WIDTH, HEIGHT)
    page.wait_for_function("window.lingstream.sessionId !== null || window.lingstream.state === 'idle'")
    assert page.evaluate("window.lingstream.sessionId") is not None, _said(page)
    wait_frames(page, 3)
    assert page.evaluate("window.lingstream.credential") == "session_token"
    session = page.evaluate("window.lingstream.sessionId")
    with httpx.Client(base_url=deployment.service.url, timeout=10.0) as client:
        assert client.get(f"/v1/sessions/{session}", headers=_key()).json()["max_seconds"] == 120
    page.click("#stop")
    page.wait_for_function("window.lingstream.state === 'closed' && window.lingstream.ended")


def test_the_service_log_carries_no_api_key(deployment: Deployment) -> None:
    assert API_KEY not in deployment.service.output()
    assert TOKEN_SECRET not in Path(deployment.service.log).read_text(errors="replace")
