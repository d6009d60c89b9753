"""Regenerate the TypeScript types of the REST API and the control protocol from the service's OpenAPI document.

    .venv/bin/python -m scripts.openapi_types            # rewrite web/openapi/openapi.json and lingstream.d.ts
    .venv/bin/python -m scripts.openapi_types --check    # exit 1, naming the files, when the committed ones differ
    .venv/bin/python -m scripts.openapi_types --out DIR  # write both into DIR instead

The document is the one `/openapi.json` serves, built from a default configuration (every `LINGSTREAM_*` and `LIVEKIT_*`
variable of the caller's environment is ignored, so the output does not depend on who runs it) and written with
two-space indents. The types come from `openapi-typescript` (pinned in web/package.json's devDependencies;
`scripts/setup.sh` installs it into web/node_modules) run with Node: `paths`, `operations` (named after the routes:
`create_session`, ...) and `components`, and every schema also exported by its own name (`SessionBody`, `LiveKitJoin`,
`ControlStatus`, ...). Both files are committed; `tests/unit/service/http/test_openapi_types.py` regenerates them into a
temporary directory and fails when they differ, so an API change that forgets the SDK fails CI.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WEB = ROOT / "web"
COMMITTED = WEB / "openapi"
DOCUMENT = "openapi.json"
TYPES = "lingstream.d.ts"
CLI = WEB / "node_modules" / "openapi-typescript" / "bin" / "cli.js"
OPTIONS = ("--root-types", "--root-types-no-schema-prefix")
"""`--root-types`: each schema exported by its name as well (`import type { SessionBody } from ...`)."""


class GeneratorMissingError(RuntimeError):
    """Node or openapi-typescript is not installed (`bash scripts/setup.sh` installs openapi-typescript)."""


def document() -> dict[str, Any]:
    """The OpenAPI document of a service with the default configuration (the caller's LINGSTREAM_* and LIVEKIT_*
    variables ignored)."""
    from service.app import create_app
    from service.settings import ENV_PREFIX, load_settings

    environ = os.environ  # noqa: TID251 - a script, not a library
    saved = {name: value for name, value in environ.items() if name.startswith((ENV_PREFIX, "LIVEKIT_"))}
    for name in saved:
        del environ[name]
    try:
        # The workers are built, never started: the document needs the routes only.
        return create_app(load_settings()).openapi()
    finally:
        environ.update(saved)


def generator() -> list[str]:
    """The command that runs openapi-typescript (`GeneratorMissingError` when it cannot run here)."""
    node = shutil.which("node")
    if node is None:
        raise GeneratorMissingError("node is not installed (openapi-typescript runs on Node)")
    if not CLI.is_file():
        raise GeneratorMissingError(f"{CLI.relative_to(ROOT)} is missing: run `bash scripts/setup.sh`")
    return [node, str(CLI)]


def write(out: Path, spec: dict[str, Any] | None = None) -> list[Path]:
    """Write the document and its TypeScript types into `out`; the two paths."""
    out.mkdir(parents=True, exist_ok=True)
    source = out / DOCUMENT
    source.write_text(json.dumps(spec if spec is not None else document(), indent=2, ensure_ascii=False) + "\n")
    target = out / TYPES
    done = subprocess.run(
        [*generator(), str(source), "--output", str(target), *OPTIONS],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"openapi-typescript failed ({done.returncode}): {done.stderr.strip() or done.stdout}")
    return [source, target]


def differences(committed: Path = COMMITTED, spec: dict[str, Any] | None = None) -> list[str]:
    """The committed files that differ from a fresh generation (empty: up to date)."""
    with tempfile.TemporaryDirectory() as scratch:
        fresh = write(Path(scratch), spec)
        return [
            str((committed / path.name).relative_to(ROOT) if committed.is_relative_to(ROOT) else committed / path.name)
            for path in fresh
            if not (committed / path.name).is_file() or (committed / path.name).read_bytes() != path.read_bytes()
        ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true", help="compare with the committed files; exit 1 if they differ")
    mode.add_argument("--out", type=Path, help="write into this directory instead of web/openapi/")
    args = parser.parse_args(argv)
    if args.check:
        stale = differences()
        if stale:
            print(f"out of date: {', '.join(stale)}; run `python -m scripts.openapi_types`", file=sys.stderr)
            return 1
        print("web/openapi/ is up to date")
        return 0
    for path in write(args.out if args.out is not None else COMMITTED):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
