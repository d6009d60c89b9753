"""The TypeScript SDK packages in web/packages/ (issue #36): @lingstream/client's unit tests under Node's own test
runner, the page's committed build of it equal to a fresh build, both packages type-checked, built and packed with
their versions tied to the service's. They need Node and the toolchain `scripts/setup.sh` installs into
web/node_modules (TypeScript, esbuild); without them they skip with the reason.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
WEB = ROOT / "web"
CLIENT = WEB / "packages" / "client"
REACT = WEB / "packages" / "react"
TSC = WEB / "node_modules" / ".bin" / "tsc"
PAGE_BUILD = ROOT / "service" / "http" / "web" / "lingstream-client.js"

pytestmark = pytest.mark.skipif(
    shutil.which("node") is None or shutil.which("npm") is None or not TSC.exists(),
    reason="needs node, npm and the SDK toolchain in web/node_modules (scripts/setup.sh installs them)",
)


def _run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, (
        f"{' '.join(args)} exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    )
    return done


@pytest.fixture(scope="module")
def built() -> None:
    """Both packages type-checked and built into their dist/ (tsc: strict, declarations), the client against the types
    generated from the OpenAPI document (web/openapi/)."""
    _run(["npm", "run", "--silent", "build:client"], WEB)
    _run(["npm", "run", "--silent", "build:react"], WEB)


def test_the_client_unit_tests_pass_under_nodes_test_runner(built: None) -> None:
    tests = sorted(str(path.relative_to(CLIENT)) for path in (CLIENT / "test").glob("*.test.mjs"))
    assert tests, "no test files"
    done = _run(["node", "--test", "--test-timeout=20000", *tests], CLIENT)
    assert "# fail 0" in done.stdout, done.stdout[-3000:]
    passed = int(done.stdout.rsplit("# pass ", 1)[1].split()[0])
    assert passed >= 10, done.stdout[-3000:]


def test_the_pages_committed_client_equals_a_fresh_build(tmp_path: Path) -> None:
    fresh = tmp_path / "lingstream-client.js"
    _run(["node", "scripts/build-page.mjs", str(fresh)], WEB)
    assert PAGE_BUILD.read_text() == fresh.read_text(), (
        "service/http/web/lingstream-client.js is stale: run `npm run build:page` in web/ and commit it"
    )


def test_the_packages_versions_are_the_services(built: None) -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    client = json.loads((CLIENT / "package.json").read_text())
    react = json.loads((REACT / "package.json").read_text())
    assert client["version"] == version
    assert react["version"] == version
    assert react["peerDependencies"]["@lingstream/client"] == version
    assert f'VERSION = "{version}"' in (CLIENT / "src" / "version.ts").read_text()


def test_both_packages_pack_with_their_built_module_and_declarations(built: None, tmp_path: Path) -> None:
    for package, name in ((CLIENT, "lingstream-client"), (REACT, "lingstream-react")):
        done = _run(["npm", "pack", "--json", "--pack-destination", str(tmp_path)], package)
        filename = json.loads(done.stdout)[0]["filename"]
        with tarfile.open(tmp_path / filename) as tar:
            names = set(tar.getnames())
        assert filename == f"{name}-{json.loads((package / 'package.json').read_text())['version']}.tgz"
        assert {"package/package.json", "package/dist/index.js", "package/dist/index.d.ts"} <= names, names
        if package is CLIENT:
            assert "package/dist/openapi.gen.d.ts" in names, "the generated API types ship with the client"
        assert not any("/src/" in name or "/test/" in name for name in names), names
