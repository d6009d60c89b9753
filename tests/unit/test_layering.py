"""The house rules on imports that hold across packages: no module imports another module's `_private` names; the
light packages (`pipeline`, `transport`'s seam and codec, `admission`) load no torch, and the transport seam loads
none of the foreign SDKs (aiortc, av, livekit) it wraps; and tests and benches share helpers only through
`tests.support`."""

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


def _loaded(module: str, roots: tuple[str, ...]) -> list[str]:
    """The modules under `roots` that a fresh interpreter holds after `import module`."""
    probe = f"import sys, {module}; print(sorted(m for m in sys.modules if m.split('.')[0] in {roots!r}))"
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    loaded: list[str] = ast.literal_eval(result.stdout.strip())
    return loaded


@pytest.mark.parametrize(
    "module",
    [
        "pipeline",
        "pipeline.lingbot.errors",
        "pipeline.lingbot.chunks",
        "transport",
        "transport.protocol",
        "transport.errors",
        "transport.client",
        "admission",
    ],
)
def test_importing_a_light_package_loads_no_torch(module: str) -> None:
    assert _loaded(module, ("torch",)) == [], f"import {module} loaded torch: import it where it is used"


@pytest.mark.parametrize(
    ("module", "sdks"),
    [
        ("transport", ("aiortc", "av", "livekit")),
        ("transport.protocol", ("aiortc", "av", "livekit")),
        ("transport.errors", ("aiortc", "av", "livekit")),
        # The client's stream is an aiortc peer (it needs aiortc and av); LiveKit only when a LiveKit session is joined.
        ("transport.client", ("livekit",)),
    ],
)
def test_the_transport_seam_loads_no_foreign_sdk(module: str, sdks: tuple[str, ...]) -> None:
    loaded = sorted({name.split(".")[0] for name in _loaded(module, sdks)})
    assert loaded == [], f"import {module} loaded {loaded}: the SDKs load in transport's role folders, where used"


def test_the_scheduling_core_imports_nothing_above_it_in_pipeline() -> None:
    """`pipeline.core` is the bottom of the pipeline's stack: the model-worker seam (`pipeline.bidirectional`), the
    orchestrator and the LingBot and process layers import it, never the reverse (this was a circle once:
    `CloseMode` now lives in `pipeline.core.records`, and `pipeline.bidirectional` re-exports it)."""
    above = ("pipeline.bidirectional", "pipeline.orchestrator", "pipeline.lingbot", "pipeline.process")
    sources = sorted((ROOT / "pipeline" / "core").glob("*.py"))
    assert len(sources) >= 5  # the scan saw the package
    offenders: list[str] = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                names = [node.module]
            else:
                continue
            offenders.extend(
                f"{path.relative_to(ROOT)}:{node.lineno}: {name}"
                for name in names
                if name == "pipeline" or name.startswith(tuple(f"{module}." for module in above)) or name in above
            )
    assert offenders == [], "pipeline.core must not import the layers above it (move the shared name down):\n" + (
        "\n".join(offenders)
    )


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


def _test_imports(path: Path) -> list[tuple[int, str]]:
    """Each `tests.<...>` module that `path` imports (relative imports resolved), with its line."""
    package = path.relative_to(ROOT).parent.parts
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else ()
            found.append((node.lineno, ".".join([*base, *(node.module or "").split(".")]).strip(".")))
    return [(line, module) for line, module in found if module.startswith("tests.")]


def _cross_folder_test_imports(path: Path) -> list[str]:
    """The imports of `tests.<x>...` other than `tests.support...` from outside the imported module's own folder."""
    offenders: list[str] = []
    for line, module in _test_imports(path):
        parts = module.split(".")
        if parts[1] == "support":
            continue
        folder = ROOT.joinpath(*parts)
        if not folder.is_dir():
            folder = folder.parent
        if not path.is_relative_to(folder):
            offenders.append(f"{path.relative_to(ROOT)}:{line}: imports {module}")
    return offenders


def test_tests_and_benches_share_helpers_only_through_tests_support() -> None:
    sources = sorted(path for folder in ("tests", "bench") for path in (ROOT / folder).rglob("*.py"))
    assert len(sources) > 100  # the scan saw the tree
    offenders = [line for path in sources for line in _cross_folder_test_imports(path)]
    assert offenders == [], (
        "a helper used outside its own folder belongs in tests/support/ (a test may import one of its own folder):\n"
        + "\n".join(offenders)
    )


def test_the_agents_integration_imports_livekit_agents_only_where_its_tools_are_made() -> None:
    """`transport.livekit.agents` is importable without `livekit-agents` (the `agents` extra; it pins livekit 1.1, so
    the service's environment does not have it): every import of it sits inside a function. The import-time check
    in the Agents environment itself is tests/unit/transport/livekit/test_agents.py."""
    path = ROOT / "transport" / "livekit" / "agents.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    functions = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]
    inside = {id(inner) for function in functions for inner in ast.walk(function)}
    top_level = [
        node.lineno
        for node in ast.walk(tree)
        if id(node) not in inside
        and (
            (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("livekit.agents"))
            or (isinstance(node, ast.Import) and any(a.name.startswith("livekit.agents") for a in node.names))
        )
    ]
    assert top_level == [], f"{path.relative_to(ROOT)} imports livekit.agents at module level (lines {top_level})"
    assert len(functions) > 10  # the scan saw the module
    assert _loaded("transport.livekit.agents", ("torch",)) == []
