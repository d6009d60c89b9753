"""The fixtures of a browser test module that drives the page against one `lingstream serve` of its own (a real model,
the embedded transport on loopback, one worker with one session slot): the service, a Chromium, and a page opener
that ends the sessions its pages started and checks that no page threw.

A module names what differs (its service settings, how long a page waits) and binds the three fixtures to its own
names, which is how pytest finds them:

    service, browser, open_page = embedded_browser_fixtures(
        wait_ms=30_000, settings=lambda tmp: {"LINGSTREAM_IDLE_FRAME_INTERVAL_MS": "150"}
    )
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

import pytest

from tests.support.browser.chromium import launch_chromium
from tests.support.browser.pages import cancel_over_http, page_opener
from tests.support.serving import STARTUP_DEADLINE_S, Served, serve, wait_until_ready

if TYPE_CHECKING:  # playwright is a dev extra; the tests that use these skip without it
    from _pytest.fixtures import FixtureFunctionDefinition
    from playwright.sync_api import Browser, Page

__all__ = ["BASE_SETTINGS", "BrowserFixtures", "embedded_browser_fixtures"]

# One model worker with one session slot, on loopback, one torch thread (the 2-core CI machine), a short drain.
BASE_SETTINGS: Mapping[str, str] = {
    "LINGSTREAM_HOST": "127.0.0.1",
    "LINGSTREAM_TORCH_THREADS": "1",
    "LINGSTREAM_NUM_WORKERS": "1",
    "LINGSTREAM_MAX_SESSIONS_PER_WORKER": "1",
    "LINGSTREAM_DRAIN_TIMEOUT": "5",
}


class BrowserFixtures(NamedTuple):
    service: FixtureFunctionDefinition  # module scope: the `Served` service
    browser: FixtureFunctionDefinition  # module scope: Chromium
    open_page: FixtureFunctionDefinition  # per test: `open_page(path="/") -> Page`, in a fresh context each time


def embedded_browser_fixtures(
    *,
    wait_ms: int,
    settings: Callable[[pytest.TempPathFactory], Mapping[str, str]],
    ready_within_s: float = STARTUP_DEADLINE_S,
) -> BrowserFixtures:
    """The three fixtures, the service started with `BASE_SETTINGS` updated by `settings(tmp_path_factory)` (called
    once, at the service's start: it may write files, e.g. a checkpoint) and the real model (no worker factory), ready
    within `ready_within_s`;
    every page waits up to `wait_ms` for what it is asked to wait for. Leaving the module checks that the service
    logged no traceback."""

    @pytest.fixture(scope="module")
    def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
        merged = {**BASE_SETTINGS, **settings(tmp_path_factory)}
        with serve(tmp_path_factory.mktemp("serve"), factory=None, **merged) as served:
            wait_until_ready(served.url, served.process, served.output, within_s=ready_within_s)
            yield served
        assert "Traceback" not in served.output(), served.output()[-4000:]

    @pytest.fixture(scope="module")
    def browser() -> Iterator[Browser]:
        with launch_chromium() as chromium:
            yield chromium

    @pytest.fixture
    def open_page(browser: Browser, service: Served) -> Iterator[Callable[..., Page]]:
        with page_opener(browser, service.url, cancel_over_http(service.url), timeout_ms=wait_ms) as opener:
            yield opener

    return BrowserFixtures(service, browser, open_page)
