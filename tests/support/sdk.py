"""The TypeScript SDK packages (web/packages/, issue #36) built and packed for a test, in a private copy: the suite runs
modules on several pytest-xdist workers, and two modules building into the packages' own dist/ at once would race.
The copy lives under web/.build/ (ignored by git) so that TypeScript and esbuild find web/node_modules by walking up.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import shutil
import subprocess
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tests.support.serving import ROOT

if TYPE_CHECKING:  # playwright is a dev extra
    from playwright.sync_api import Page

__all__ = ["WEB", "BuiltPackages", "built_packages", "play_react_example", "sdk_toolchain_missing", "served_example"]

WEB = ROOT / "web"
_TSC = WEB / "node_modules" / ".bin" / "tsc"


def sdk_toolchain_missing() -> str | None:
    """Why the SDK packages cannot be built here, or None."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "needs node and npm"
    if not _TSC.exists():
        return "needs the SDK toolchain in web/node_modules (scripts/setup.sh installs it)"
    return None


def run(args: list[str], cwd: Path, timeout: float = 180) -> str:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done.stdout


@dataclass(frozen=True, slots=True)
class BuiltPackages:
    client: Path  # the built copy of web/packages/client (with dist/)
    react: Path
    client_tarball: Path
    react_tarball: Path


@contextlib.contextmanager
def built_packages(pack_into: Path) -> Iterator[BuiltPackages]:
    """Both packages type-checked and built by tsc (the client against the types generated from the OpenAPI document)
    in a private copy, and `npm pack`ed into `pack_into`; the copy is removed afterwards."""
    stage = WEB / ".build" / uuid.uuid4().hex
    try:
        for name in ("client", "react"):
            shutil.copytree(WEB / "packages" / name, stage / name, ignore=shutil.ignore_patterns("dist", "*.gen.d.ts"))
        client, react = stage / "client", stage / "react"
        run(["node", "scripts/openapi-types.mjs", str(client)], WEB)
        run([str(_TSC), "-p", str(client / "tsconfig.json")], WEB)
        run(["node", "scripts/openapi-types.mjs", "--dist", str(client)], WEB)
        run([str(_TSC), "-p", str(react / "tsconfig.json")], WEB)
        tarballs = []
        for package in (client, react):
            packed = run(["npm", "pack", "--json", "--pack-destination", str(pack_into)], package)
            tarballs.append(pack_into / json.loads(packed)[0]["filename"])
        yield BuiltPackages(client, react, tarballs[0], tarballs[1])
    finally:
        shutil.rmtree(stage, ignore_errors=True)


@contextlib.contextmanager
def served_example(work: Path, host: str, port: int) -> Iterator[str]:
    """web/examples/react-world built under `work` from the *packed* SDK packages (`npm pack` of @lingstream/client
    and @lingstream/react, each built by tsc first) and served on its own origin, `http://host:port`, by a static file
    server on a thread (its socket made here: in the caller's network namespace). Yields the origin."""
    out = work / "site"
    with built_packages(work) as packages:
        run(
            [
                "node",
                "examples/react-world/build.mjs",
                str(packages.client_tarball),
                str(packages.react_tarball),
                str(out),
            ],
            WEB,
        )

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer((host, port), functools.partial(Quiet, directory=out))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def play_react_example(
    page: Page,
    origin: str,
    service_url: str,
    size: tuple[int, int],
    started: list[str],
    joined: Callable[[str], None] | None = None,
) -> None:
    """Drive the served example app (`origin`) against the service at `service_url` end to end: running, video of
    `size`, `joined(session_id)` (the transport's own checks), a held key applied, pause, and the stop's reason
    `client_stop`. The session's id goes into `started` as soon as it is known (the caller cancels it on failure)."""
    width, height = size
    page.goto(f"{origin}/?service={service_url}&width={width}&height={height}")
    page.wait_for_function("window.world && window.world.status === 'running'")
    session_id: str = page.evaluate("window.world.session.id")
    started.append(session_id)
    page.wait_for_function("window.world.stats && window.world.stats.frames > 0")
    shown = page.evaluate(
        "(() => { const v = document.getElementById('world'); return [v.videoWidth, v.videoHeight]; })()"
    )
    assert shown == [width, height]
    if joined is not None:
        joined(session_id)
    page.dispatch_event("#forward", "pointerdown")
    page.wait_for_function("(window.world.session.lastChunk || {keys: []}).keys.includes('w')")
    page.dispatch_event("#forward", "pointerup")
    page.click("#pause")
    page.wait_for_function("window.world.status === 'paused'")
    assert page.inner_text("#status") == "paused"
    page.click("#stop")
    page.wait_for_function("window.world.done !== null")
    assert page.evaluate("window.world.done") == "client_stop"
    assert "client_stop" in page.inner_text("#done")
