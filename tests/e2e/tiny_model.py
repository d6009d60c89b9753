"""The tiny random LingBot-World-Fast model the end-to-end tests serve: written by `lingstream tiny-checkpoint DIR`
(the documented command, not a test-only path), then `lingstream serve` on it until `/readyz` says ready. Shared by
the Python client's test (test_lingbot_fast.py) and the browser's (test_browser_lingbot_fast.py)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path

import httpx

from tests.serving import ROOT, STARTUP_DEADLINE_S, Served, environment, lingstream

__all__ = ["wait_ready", "write_tiny_checkpoint"]


def write_tiny_checkpoint(directory: Path) -> Path:
    """`lingstream tiny-checkpoint DIRECTORY`, checked: it succeeds and writes the four parts of the layout."""
    done = subprocess.run(
        [*lingstream(), "tiny-checkpoint", str(directory)],
        cwd=ROOT,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote a tiny random LingBot-World-Fast model" in done.stdout
    assert sorted(path.name for path in directory.iterdir()) == ["dit", "text_encoder", "tokenizer", "vae"]
    return directory


def wait_ready(served: Served) -> None:
    """Poll `/readyz` until 200; fails with the service's output if it exits or is not ready in time."""
    deadline = time.monotonic() + STARTUP_DEADLINE_S
    with httpx.Client(timeout=5.0) as client:
        while True:
            assert served.process.poll() is None, served.output()
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{served.url}/readyz").status_code == 200:
                    return
            assert time.monotonic() < deadline, served.output()
            time.sleep(0.05)  # polling another process against a deadline
