"""The tiny random LingBot-World-Fast model the end-to-end tests serve, written by `lingstream tiny-checkpoint DIR`
(the documented command, not a test-only path). Shared by the Python client's test (test_lingbot_fast.py) and the
browser's (test_browser_lingbot_fast.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.serving import ROOT, environment, lingstream

__all__ = ["write_tiny_checkpoint"]


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
