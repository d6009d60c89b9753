"""Every reliability test starts from an environment without LINGSTREAM_* / LIVEKIT_* / REDIS variables."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.upper().startswith(("LINGSTREAM_", "LIVEKIT_", "OTEL_")):
            monkeypatch.delenv(name)
