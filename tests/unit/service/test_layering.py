"""Dependencies point one way: the base of the service never loads the scale-out code (or its Redis client).

leaves (errors, logs, settings) <- runtime <- scaleout, telemetry <- http <- app <- cli. Each base module is
imported in a fresh interpreter, one after the other, and `sys.modules` is read after each import, so the first
module that pulls in `service.scaleout` or `redis` is the one named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
FORBIDDEN = ("service.scaleout", "redis")


def _base_modules() -> list[str]:
    modules = ["service.errors", "service.logs", "service.settings", "service.runtime"]
    for path in sorted((ROOT / "service" / "runtime").glob("*.py")):
        if path.stem != "__init__":
            modules.append(f"service.runtime.{path.stem}")
    return modules


_PROBE = """
import importlib, json, sys
forbidden = tuple(sys.argv[2:])
found = {}
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
    loaded = sorted(m for m in sys.modules if any(m == f or m.startswith(f + ".") for f in forbidden))
    if loaded:
        found[name] = loaded
        break
print(json.dumps(found))
"""


def test_no_base_module_imports_the_scaleout_package_or_redis() -> None:
    modules = _base_modules()
    assert "service.runtime.runtime" in modules
    result = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(modules), *FORBIDDEN],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {}, f"a base module loads scale-out code: {found}"
