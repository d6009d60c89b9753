"""No bare `KeyError` across a seam in `service/` and `transport/`: a lookup that misses raises the package's own
error (`SessionNotFoundError`, `SessionNotAttachedError`, ...), and nothing waits for a `KeyError` from a package
below (`pipeline` and `admission` raise their own errors too, e.g. `UnknownSessionError`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Catching KeyError is fine where a module reads a JSON document it parsed itself and translates the miss into its
# own error (`raise ... from exc`): the Python client reading the service's answers.
_PARSES_JSON = {"transport/client/api.py"}


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return set()
    if isinstance(node, ast.Tuple):
        return {name for element in node.elts for name in _names(element)}
    if isinstance(node, ast.Call):
        return _names(node.func)
    return {node.id} if isinstance(node, ast.Name) else set()


def _key_errors(path: Path, relative: str) -> list[str]:
    found: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=relative)):
        if isinstance(node, ast.Raise) and "KeyError" in _names(node.exc):
            found.append(f"{relative}:{node.lineno}: raise KeyError")
        if isinstance(node, ast.ExceptHandler) and "KeyError" in _names(node.type) and relative not in _PARSES_JSON:
            found.append(f"{relative}:{node.lineno}: except KeyError")
    return found


def test_service_and_transport_neither_raise_nor_wait_for_a_bare_key_error() -> None:
    found = [
        line
        for package in ("service", "transport")
        for path in sorted((ROOT / package).rglob("*.py"))
        for line in _key_errors(path, path.relative_to(ROOT).as_posix())
    ]
    assert found == [], (
        "a bare KeyError crosses a seam here; raise (or catch) the package's own error instead, e.g. "
        f"SessionNotFoundError or pipeline's UnknownSessionError: {found}"
    )


def test_the_rule_sees_a_raise_and_a_handler_but_lets_the_json_reader_catch(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("try:\n    pass\nexcept (ValueError, KeyError):\n    raise KeyError('x')\n", encoding="utf-8")
    found = sorted(line.split(": ", 1)[1] for line in _key_errors(probe, "service/probe.py"))
    assert found == ["except KeyError", "raise KeyError"]
    assert _key_errors(probe, "transport/client/api.py") == ["transport/client/api.py:4: raise KeyError"]
