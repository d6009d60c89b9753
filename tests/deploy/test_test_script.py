"""scripts/test.sh (what `.ci/run` calls): each check that fails fails the run, and nothing after it runs.

The script runs in a scratch copy of `scripts/` whose `setup.sh` does nothing and whose `.venv/bin` holds stand-ins
for ruff, mypy and pytest that log their call and fail when told to. It once joined the two ruff checks with `&&`,
which `set -e` does not stop on: an unformatted file passed CI.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
[ "$FAIL" = "$(basename "$0") $1" ] && exit 3
exit 0
"""


PYTEST = "pytest -n 2 --dist loadfile -q"  # the default: 2 workers, a module to a worker, then the caller's arguments


def _run(tmp_path: Path, fail: str, **env: str) -> tuple[int, list[str]]:
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    (tmp_path / "scripts" / "setup.sh").write_text("exit 0\n")
    bin_dir = tmp_path / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for name in ("ruff", "mypy", "pytest"):
        (bin_dir / name).write_text(TOOL)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls"
    calls.touch()
    run = subprocess.run(
        ["bash", str(tmp_path / "scripts" / "test.sh"), "-q"],
        env={"PATH": "/usr/bin:/bin", "CALLS": str(calls), "FAIL": fail, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return run.returncode, calls.read_text().splitlines()


def test_all_checks_pass_through_to_pytest_with_its_arguments(tmp_path: Path) -> None:
    code, calls = _run(tmp_path, fail="")
    assert code == 0
    assert calls == ["ruff format --check .", "ruff check .", "mypy ", PYTEST]


def test_the_number_of_workers_is_a_setting_and_0_runs_in_one_process(tmp_path: Path) -> None:
    code, calls = _run(tmp_path, fail="", LINGSTREAM_TEST_WORKERS="0")
    assert code == 0
    assert calls[-1] == "pytest -n 0 --dist loadfile -q"


@pytest.mark.parametrize(
    ("fail", "ran"),
    [
        ("ruff format", ["ruff format --check ."]),
        ("ruff check", ["ruff format --check .", "ruff check ."]),
        ("mypy ", ["ruff format --check .", "ruff check .", "mypy "]),
        ("pytest -n", ["ruff format --check .", "ruff check .", "mypy ", PYTEST]),
    ],
)
def test_a_failing_check_fails_the_run_and_stops_it(tmp_path: Path, fail: str, ran: list[str]) -> None:
    code, calls = _run(tmp_path, fail=fail)
    assert code == 3
    assert calls == ran
