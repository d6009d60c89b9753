"""The tiny random LingBot-World-Fast model the end-to-end tests serve, written by `lingstream tiny-checkpoint DIR`
(the documented command, not a test-only path). Shared by the Python client's test (test_lingbot_fast.py) and the
browser's (test_browser_lingbot_fast.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.serving import run_lingstream

__all__ = ["write_tiny_checkpoint"]


def write_tiny_checkpoint(directory: Path) -> Path:
    """`lingstream tiny-checkpoint DIRECTORY`, checked: it succeeds and writes the layout's five parts."""
    done = run_lingstream("tiny-checkpoint", str(directory), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "wrote a tiny random LingBot-World-Fast model" in done.stdout
    assert sorted(path.name for path in directory.iterdir()) == [
        "dit",
        "text_encoder",
        "tiny_decoder",
        "tokenizer",
        "vae",
    ]
    return directory
