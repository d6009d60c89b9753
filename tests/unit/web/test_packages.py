"""The TypeScript SDK packages in web/packages/ (issue #36): @lingstream/client's unit tests under Node's own test
runner, the page's committed build of it equal to a fresh build, both packages type-checked, built and packed with
their versions tied to the service's. They need Node and the toolchain `scripts/setup.sh` installs into
web/node_modules (TypeScript, esbuild); without them they skip with the reason.
"""

from __future__ import annotations

import json
import tarfile
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.sdk import WEB, BuiltPackages, built_packages, run, sdk_toolchain_missing

ROOT = WEB.parent
CLIENT = WEB / "packages" / "client"
REACT = WEB / "packages" / "react"
PAGE_BUILD = ROOT / "service" / "http" / "web" / "lingstream-client.js"

pytestmark = pytest.mark.skipif(sdk_toolchain_missing() is not None, reason=str(sdk_toolchain_missing()))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltPackages]:
    with built_packages(tmp_path_factory.mktemp("packed")) as packages:
        yield packages


def test_the_client_unit_tests_pass_under_nodes_test_runner(built: BuiltPackages) -> None:
    tests = sorted(str(path.relative_to(built.client)) for path in (built.client / "test").glob("*.test.mjs"))
    assert tests, "no test files"
    done = run(["node", "--test", "--test-timeout=20000", *tests], built.client)
    assert "# fail 0" in done, done[-3000:]
    passed = int(done.rsplit("# pass ", 1)[1].split()[0])
    assert passed >= 10, done[-3000:]


def test_the_pages_committed_client_equals_a_fresh_build(tmp_path: Path) -> None:
    fresh = tmp_path / "lingstream-client.js"
    run(["node", "scripts/build-page.mjs", str(fresh)], WEB)
    assert PAGE_BUILD.read_text() == fresh.read_text(), (
        "service/http/web/lingstream-client.js is stale: run `npm run build:page` in web/ and commit it"
    )


def test_the_packages_versions_are_the_services() -> None:
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    client = json.loads((CLIENT / "package.json").read_text())
    react = json.loads((REACT / "package.json").read_text())
    assert client["version"] == version
    assert react["version"] == version
    assert react["peerDependencies"]["@lingstream/client"] == version
    assert f'VERSION = "{version}"' in (CLIENT / "src" / "version.ts").read_text()
    assert f'VERSION = "{version}"' in (REACT / "src" / "index.ts").read_text()


def test_both_packages_pack_with_their_built_module_and_declarations(built: BuiltPackages) -> None:
    version = json.loads((CLIENT / "package.json").read_text())["version"]
    for tarball, name in ((built.client_tarball, "lingstream-client"), (built.react_tarball, "lingstream-react")):
        assert tarball.name == f"{name}-{version}.tgz"
        with tarfile.open(tarball) as tar:
            names = set(tar.getnames())
        assert {"package/package.json", "package/dist/index.js", "package/dist/index.d.ts"} <= names, names
        assert not any("/src/" in entry or "/test/" in entry for entry in names), names
    with tarfile.open(built.client_tarball) as tar:
        assert "package/dist/openapi.gen.d.ts" in tar.getnames(), "the generated API types ship with the client"
