"""The example React app (web/examples/react-world, `useLingstream` + `<WorldView/>`), built from the *packed* SDK
packages, runs a session end to end over LiveKit: real headless Chromium, a real `lingstream serve` (reference
model) and the real `livekit-server`, inside a private network namespace with no way out; the app is served from
its own origin there (the service allows it by CORS). Its embedded-transport twin is in test_browser.py. Skipped,
with the reason, where the namespace cannot be made, livekit-server is not installed, Chromium is missing or the
SDK toolchain is not in web/node_modules.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.livekit_stack import LiveKitStack, livekit_stack
from tests.support.netns import HOST_A
from tests.support.sdk import play_react_example, sdk_toolchain_missing, served_example
from tests.support.serving import free_port

if TYPE_CHECKING:  # playwright is a dev extra; BROWSER_SKIPS skips the module without it
    from playwright.sync_api import Browser

WIDTH, HEIGHT = 128, 96
WAIT_MS = 30_000  # generous: a loaded 2-core machine; every wait ends as soon as its condition holds

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    *BROWSER_SKIPS,
    pytest.mark.skipif(LiveKitStack.skip_reason() is not None, reason=str(LiveKitStack.skip_reason())),
    pytest.mark.skipif(sdk_toolchain_missing() is not None, reason=str(sdk_toolchain_missing())),
]


@pytest.fixture(scope="module")
def example_origin() -> str:
    """Where the example is served inside the namespace (a fresh namespace: nothing else holds the port)."""
    return f"http://{HOST_A}:{free_port()}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, example_origin: str) -> Iterator[LiveKitStack]:
    with livekit_stack(tmp_path_factory.mktemp("livekit-react"), LINGSTREAM_CORS_ORIGINS=example_origin) as running:
        yield running
    assert "Traceback" not in running.output(), running.output()[-4000:]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory, stack: LiveKitStack, example_origin: str) -> Iterator[str]:
    """The example's static server, made after the stack (which entered the namespace): its socket is in there."""
    port = int(example_origin.rsplit(":", 1)[1])
    with served_example(tmp_path_factory.mktemp("example"), HOST_A, port) as origin:
        yield origin


@pytest.fixture(scope="module")
def browser(stack: LiveKitStack) -> Iterator[Browser]:
    with launch_chromium() as chromium:
        yield chromium


def test_the_react_example_built_from_the_packed_packages_runs_a_session_over_livekit(
    browser: Browser, stack: LiveKitStack, example: str
) -> None:
    context = browser.new_context()
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    started: list[str] = []

    def joined(session_id: str) -> None:
        assert page.evaluate("window.world.session.transport") == "livekit"
        with stack.client() as client:
            details = client.get(f"/v1/sessions/{session_id}").json()["transport"]
        members = stack.real.participants(details["room"])
        assert details["service_identity"] in members  # the service publishes into the room the app joined
        assert len(members) == 2, members

    try:
        play_react_example(page, example, stack.url, (WIDTH, HEIGHT), started, joined)
        assert errors == []
    finally:
        context.close()
        with stack.client() as client:
            for session_id in started:
                client.delete(f"/v1/sessions/{session_id}", params={"mode": "cancel"})
