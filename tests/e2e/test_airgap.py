"""Nothing in the product reaches the internet at run time: `lingstream serve` (the reference model, the embedded
WebRTC transport) and a real headless Chromium session (the page, live video, `/docs`) run in private network
namespaces joined to each other only: the service's has a trap as its only way out, which records every packet sent
there; the browser's has no way out at all, and Playwright records every request the page makes. Nothing the
product does may try to leave.

`tests/e2e/airgap_session.py` is the inside (it builds the network and says how the trap works); this test starts it
with `unshare` (as root, or as the root of a new user namespace where unprivileged ones are allowed) and judges its
report. A host that permits neither is skipped with the reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.browser.chromium import BROWSER_SKIPS
from tests.support.netns import unshare_prefix
from tests.support.serving import ROOT

RUN_S = 240


pytestmark = [pytest.mark.browser, *BROWSER_SKIPS]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    prefix = unshare_prefix()
    if isinstance(prefix, str):
        pytest.skip(prefix)
    workdir = tmp_path_factory.mktemp("airgap")
    path = workdir / "report.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [*prefix, "--", sys.executable, "-m", "tests.e2e.airgap_session", str(path), str(workdir)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_S,
        check=False,
    )
    assert path.is_file(), f"no report (exit {run.returncode}):\n{run.stdout}\n{run.stderr}"
    loaded: dict[str, Any] = json.loads(path.read_text())
    log = Path(loaded.get("service_log") or workdir / "serve.log")
    tail = log.read_text(errors="replace")[-4000:] if log.is_file() else ""
    assert loaded["error"] is None, f"{loaded['error']}\n--- service log ---\n{tail}\n{run.stderr[-2000:]}"
    return loaded


@pytest.mark.timeout(RUN_S + 30)
def test_neither_namespace_has_a_way_out_and_the_trap_sees_what_leaves(report: dict[str, Any]) -> None:
    assert report["interfaces"] == {"service": ["lo", "svc0", "trap0"], "browser": ["lo", "web0"]}
    assert report["probes"]["datagram"], "the trap did not see a datagram sent to a documentation address"
    assert report["probes"]["lookup"], "the trap did not see a name lookup"
    # Every packet the trap transmitted was read and classified: the probes, the kernel's link chatter, the rest.
    accounted = report["probes"]["packets"] + sum(report["housekeeping"].values()) + len(report["packets"])
    assert report["trap_tx_packets"] == accounted


@pytest.mark.timeout(30)
def test_a_browser_session_streams_video_and_shows_the_api_reference_with_no_network(report: dict[str, Any]) -> None:
    assert report["transport"] == "embedded"
    assert report["connection"] == "connected"
    assert report["video_size"] == {"width": 128, "height": 96}
    assert report["frames"] >= 24
    assert report["docs_operations"] > 0
    assert Path(report["docs_screenshot"]).stat().st_size > 0
    assert report["service_exit"] == 0
    assert not report["service_traceback"]


@pytest.mark.timeout(30)
def test_nothing_tries_to_reach_a_non_local_address(report: dict[str, Any]) -> None:
    origin = report["url"]
    assert any(url.startswith(f"{origin}/vendor/swagger-ui/") for url in report["requests"])
    assert report["foreign_requests"] == [], f"the page asked for what {origin} does not serve"
    assert report["ice_servers"] == [], "the page configured STUN/TURN servers"
    attempts = [
        f"{a['event']} {a['target']} (pid {a['pid']})\n{''.join(a['stack'])}" for a in report["python_attempts"]
    ]
    assert not attempts, "the service's Python code tried the network:\n" + "\n".join(attempts)
    assert report["packets"] == [], "the service's processes sent packets towards non-local addresses"
