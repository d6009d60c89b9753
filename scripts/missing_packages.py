"""What `scripts/setup.sh` still has to install: one line per missing or outdated package, nothing when all is there.

Run with the environment's own interpreter (`.venv/bin/python scripts/missing_packages.py [--dev]`). It reads the wishes
where they are written, so an edit there is seen at once: the `[project]` dependencies (and the `dev` extra with
`--dev`) in pyproject.toml, followed transitively through the installed distributions' own requirements; this checkout
installed editable with its console scripts; each dependency of web/package.json (devDependencies too) present in
web/node_modules at its pinned version; and with `--dev` the real LiveKit server the tests run, `livekit-server` in the
environment's bin at the version `[tool.lingstream.dev-tools]` pins. Lines start with the installer that provides the
package (`python ...`, `npm ...`, `go livekit-server VERSION`), torch first. It installs nothing and reaches no network;
the standard library plus the `packaging` copy that pip carries is all it needs, so it works in a fresh virtual
environment. Exit status 0 whatever it finds.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

try:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
except ImportError:  # a fresh virtual environment: only pip's own copy is there
    from pip._vendor.packaging.requirements import Requirement  # type: ignore[assignment]
    from pip._vendor.packaging.utils import canonicalize_name  # type: ignore[assignment]

ROOT = Path(__file__).resolve().parents[1]


def missing_python(project: dict[str, Any], extras: list[str]) -> list[str]:
    """Requirements (as written, one per distribution, torch first) that no installed distribution satisfies, after
    the project itself when this checkout is not installed."""
    distributions = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()}
    missing: list[str] = []
    name = str(project["name"])
    own = distributions.get(canonicalize_name(name))
    if own is None or not _is_editable_checkout(own) or not _has_scripts(own, project):
        missing.append(f"{name} (this checkout, editable)")
    optional = project.get("optional-dependencies", {})
    wanted = [*project.get("dependencies", []), *(text for extra in extras for text in optional[extra])]
    pending = [Requirement(str(text)) for text in wanted]
    seen: set[tuple[str, frozenset[str], str]] = set()
    unmet: dict[str, str] = {}
    while pending:
        requirement = pending.pop(0)
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras), str(requirement.specifier))
        if key in seen:
            continue
        seen.add(key)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        installed = distributions.get(key[0])
        if installed is None or not requirement.specifier.contains(installed.version, prereleases=True):
            unmet.setdefault(key[0], str(requirement))  # breadth first: the project's own wording wins
            continue
        for text in installed.requires or []:
            child = Requirement(text)
            active = {"", *requirement.extras}
            if child.marker is None or any(child.marker.evaluate({"extra": extra}) for extra in active):
                child.marker = None
                pending.append(child)
    return missing + [unmet[name] for name in sorted(unmet, key=lambda name: (name != "torch", name))]


def missing_npm(web: Path) -> list[str]:
    """`name@version` of each web/package.json dependency (devDependencies too: the build tools,
    openapi-typescript, TypeScript, esbuild, React) that web/node_modules lacks at that version."""
    manifest_json = json.loads((web / "package.json").read_text())
    wanted: dict[str, str] = {**manifest_json.get("dependencies", {}), **manifest_json.get("devDependencies", {})}
    missing = []
    for name, version in sorted(wanted.items()):
        manifest = web / "node_modules" / name / "package.json"
        try:
            installed = json.loads(manifest.read_text()).get("version")
        except (OSError, ValueError):
            installed = None
        if installed != version:
            missing.append(f"{name}@{version}")
    return missing


def missing_livekit_server(pinned: str, binary: Path) -> list[str]:
    """`livekit-server VERSION` when `binary` is absent or does not say it is that version, else nothing."""
    try:
        done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    except OSError:
        return [f"livekit-server {pinned}"]
    return [] if done.stdout.strip().endswith(f"version {pinned}") else [f"livekit-server {pinned}"]


def _is_editable_checkout(distribution: metadata.Distribution) -> bool:
    text = distribution.read_text("direct_url.json")
    if not text:
        return False
    direct = json.loads(text)
    url = urlsplit(direct.get("url", ""))
    editable = bool(direct.get("dir_info", {}).get("editable"))
    return editable and url.scheme == "file" and Path(unquote(url.path)).resolve() == ROOT


def _has_scripts(distribution: metadata.Distribution, project: dict[str, Any]) -> bool:
    scripts = project.get("scripts", {})
    installed = {point.name for point in distribution.entry_points if point.group == "console_scripts"}
    return set(scripts) <= installed and all((Path(sys.prefix) / "bin" / name).exists() for name in scripts)


def main(argv: list[str]) -> int:
    unknown = [arg for arg in argv if arg != "--dev"]
    if unknown:
        print(f"usage: missing_packages.py [--dev] (not {' '.join(unknown)})", file=sys.stderr)
        return 2
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for line in missing_python(pyproject["project"], ["dev"] if "--dev" in argv else []):
        print(f"python {line}")
    for line in missing_npm(ROOT / "web"):
        print(f"npm {line}")
    if "--dev" in argv:
        pinned = str(pyproject["tool"]["lingstream"]["dev-tools"]["livekit-server"])
        for line in missing_livekit_server(pinned, Path(sys.prefix) / "bin" / "livekit-server"):
            print(f"go {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
