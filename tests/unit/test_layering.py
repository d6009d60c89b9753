"""The house rules on imports that hold across packages: no module imports another module's `_private` names, and
the light packages (`pipeline`, `transport`'s codec, `admission`) load no torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OURS = ("pipeline", "admission", "transport", "service", "tests", "bench")


def _private_imports(path: Path) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = "." * node.level + (node.module or "")
        ours = node.level > 0 or module.split(".")[0] in OURS
        found.extend(
            f"{path.relative_to(ROOT)}:{node.lineno}: from {module} import {alias.name}"
            for alias in node.names
            if ours and alias.name.startswith("_") and not alias.name.startswith("__")
        )
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    sources = sorted(path for package in OURS for path in (ROOT / package).rglob("*.py"))
    assert len(sources) > 100  # the scan saw the tree
    offenders = [line for path in sources for line in _private_imports(path)]
    assert offenders == [], "make these public (in a private module if need be) or move the code:\n" + "\n".join(
        offenders
    )


@pytest.mark.parametrize("module", ["pipeline", "transport", "transport.protocol", "transport.client", "admission"])
def test_importing_a_light_package_loads_no_torch(module: str) -> None:
    probe = (
        f"import sys, {module}; loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'torch'); print(loaded)"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"import {module} loaded torch"


def test_the_python_client_loads_neither_the_service_nor_the_livekit_ffi() -> None:
    """`transport.client` is a library for other programs: it imports nothing of `service`, and the LiveKit SDK's
    native library only when a LiveKit session is joined (a process that forks must not have it loaded)."""
    probe = (
        "import sys, transport.client; "
        "print(sorted(m for m in sys.modules\n"
        "    if m.split('.')[0] in ('torch', 'service') or m.startswith('livekit.rtc')))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"import transport.client loaded {result.stdout.strip()}"
