"""Mutation testing of the core modules with mutmut; prints ONE JSON line (see docs/testing.md).

Run through `scripts/mutation.sh` (it installs the pinned mutmut into the venv first). Each group of modules is
mutated against only the tests that exercise it (the map below), in a private copy of the working tree: mutmut
writes its mutants under `mutants/` of that copy, so the shared tree is never touched, and per mutant it runs only
the tests of its group that reach the mutated function (its coverage map). Options:

    --quick            one small group (the control codec and pacing): about ten minutes here
    --group NAME       only this group (repeatable); groups: see GROUPS
    --sample N         per group, run only N mutants drawn at random (seeded: `--seed`, default 23), so that the
                       ratio estimates the group's score in a fraction of the time
    --max-children N   parallel mutant runs (default: the CPU count)
    --keep             keep the temporary copies (their mutants/ hold mutmut's results, e.g. for `mutmut show`)

The JSON line: `mutants` (those run: all generated, or the sample), `generated`, `killed` (a test failed, or the
tests hung: `timeouts` of them), `survived`, `killed_ratio` = killed / (killed + survived), `unjudged` (run, but no
test of the group reaches them), per-group figures, `seconds`, and `survivors`, each as
"path:line function: the mutated line".
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# mutmut's exit codes per mutant (mutmut.stats): a failing test kills; a hang (timeout) is detected too, so it
# counts as killed; 0 survived; the rest (no tests reach it, skipped, suspicious, ...) cannot be judged.
_KILLED = frozenset({1, 3})
_TIMEOUT = frozenset({-24, 24, 36, 152, 255})
# Statements mutmut leaves alone: a log call is not behaviour, so mutating its message or arguments only makes
# equivalent mutants (docs/testing.md).
_LOG_CALL = r"^\s*logger\.(debug|info|warning|error|exception)\("


@dataclass(frozen=True)
class Group:
    name: str
    modules: tuple[str, ...]  # files to mutate, relative to the repository root
    tests: tuple[str, ...]  # the tests that own them (none with a wall-clock budget: mutmut's tracing slows them)


GROUPS = (
    Group(
        "scheduler",
        (
            "pipeline/core/scheduler.py",
            "pipeline/core/_ready.py",
            "pipeline/core/_close.py",
            "pipeline/core/_session.py",
            "pipeline/orchestrator.py",
        ),
        (
            "tests/unit/pipeline/test_core.py",
            "tests/unit/pipeline/test_core_accounting.py",
            "tests/unit/pipeline/test_orchestrator.py",
            "tests/unit/pipeline/test_scheduling_guarantees.py",
            "tests/unit/pipeline/test_ready_structures.py",
        ),
    ),
    Group(
        "admission",
        (
            "admission/controller.py",
            "admission/_live.py",
            "admission/_outbox.py",
            "admission/lease.py",
            "admission/ticket.py",
            "admission/driver.py",
            "admission/config.py",
            "admission/summary.py",
            "admission/quota.py",
        ),
        ("tests/unit/admission",),
    ),
    Group(
        "transport",
        ("transport/session/control.py", "transport/session/pacing.py"),
        (
            "tests/unit/transport/session/test_control.py",
            "tests/unit/transport/session/test_pacing.py",
            "tests/unit/transport/session/test_pacing_accounting.py",
            "tests/unit/transport/session/test_reconnect_control.py",
            "tests/unit/transport/livekit/test_binding.py",
        ),
    ),
    Group(
        "redis",
        (
            "service/scaleout/admission.py",
            "service/scaleout/link.py",
            "service/scaleout/maintenance.py",
            "service/scaleout/tickets.py",
            "service/scaleout/redis_side/mirror.py",
            "service/scaleout/redis_side/records.py",
        ),
        (
            "tests/unit/service/scaleout/test_redis_admission.py",
            "tests/unit/service/scaleout/test_redis_accounting.py",
            "tests/unit/service/scaleout/test_redis_outages.py",
            "tests/unit/service/scaleout/test_redis_quotas.py",
            "tests/unit/service/scaleout/test_redis_usage.py",
            "tests/unit/service/scaleout/test_retry_after_redis.py",
        ),
    ),
)
QUICK = ("transport",)


def _tracked_files() -> list[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name and (ROOT / name).is_file()]


def _copy_tree(target: Path) -> None:
    for name in _tracked_files():
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, destination)


def _setup_cfg(group: Group) -> str:
    def listing(items: tuple[str, ...] | list[str]) -> str:
        return "".join(f"\n    {item}" for item in items)

    packages = sorted({module.split("/")[0] for module in group.modules} | {"pipeline", "admission", "transport"})
    pytest_args = ["-p", "no:cacheprovider", "-q", "-x", "--timeout=60", "-p", "no:randomly"]
    return (
        "[mutmut]\n"
        f"source_paths ={listing(packages)}\n"
        f"only_mutate ={listing(group.modules)}\n"
        f"also_copy ={listing(['service', 'bench', 'scripts'])}\n"
        f"pytest_add_cli_args_test_selection ={listing(group.tests)}\n"
        f"pytest_add_cli_args ={listing(pytest_args)}\n"
        "use_git_change_detection = false\n"
        # A log call is not behaviour: mutating its message or arguments makes an equivalent mutant.
        f"do_not_mutate_patterns ={listing([_LOG_CALL])}\n"
    )


@dataclass
class GroupResult:
    exit_codes: dict[str, int | None]  # mutmut's exit code per mutant run (all, or the sample)
    generated: int  # mutants generated for the group
    survivors: list[str]  # located: "path:line function: mutated line"


def _run_group(group: Group, max_children: int, keep: bool, sample: int | None, seed: int) -> GroupResult:
    workdir = Path(tempfile.mkdtemp(prefix=f"lingstream-mutation-{group.name}-"))
    try:
        _copy_tree(workdir)
        (workdir / "setup.cfg").write_text(_setup_cfg(group))
        env = dict(os.environ)  # noqa: TID251 - a script, not a library
        env.update(PYTHONPATH=str(workdir), PYTHONDONTWRITEBYTECODE="1")
        log = workdir / "mutmut.log"
        names: list[str] = []
        if sample is not None:
            # Generate the mutants and collect the coverage map without running any (no name matches), then draw.
            _mutmut(workdir, env, log, max_children, ["lingstream-no-such-mutant"])
            every = sorted(_read_exit_codes(workdir, group))
            names = sorted(random.Random(seed).sample(every, min(sample, len(every))))
        code = _mutmut(workdir, env, log, max_children, names)
        exit_codes = _read_exit_codes(workdir, group)
        generated = len(exit_codes)
        if names:
            exit_codes = {name: exit_codes.get(name) for name in names}
        if code != 0 and all(exit_code is None for exit_code in exit_codes.values()):
            tail = log.read_text()[-3000:]
            raise SystemExit(f"mutmut failed for group {group.name} (exit {code}):\n{tail}")
        survivors = sorted(name for name, exit_code in exit_codes.items() if exit_code == 0)
        return GroupResult(exit_codes, generated, _locate(workdir, env, survivors))
    finally:
        if keep:
            print(f"group {group.name}: kept {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def _mutmut(workdir: Path, env: dict[str, str], log: Path, max_children: int, names: list[str]) -> int:
    with log.open("a") as out:
        return subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(max_children), *names],
            cwd=workdir,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            check=False,
        ).returncode


def _read_exit_codes(workdir: Path, group: Group) -> dict[str, int | None]:
    exit_codes: dict[str, int | None] = {}
    for module in group.modules:
        meta = workdir / "mutants" / f"{module}.meta"
        if meta.exists():
            exit_codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return exit_codes


def _locate(workdir: Path, env: dict[str, str], names: list[str]) -> list[str]:
    """Each survivor as 'path:line function: mutated line', read from `mutmut show`'s diff."""
    located = []
    for name in names:
        diff = subprocess.run(
            [sys.executable, "-m", "mutmut", "show", name],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        located.append(_describe(workdir, name, diff))
    return located


def _describe(workdir: Path, name: str, diff: str) -> str:
    """'path:line function: mutated line'; the line is found in the unmutated source (the diff is per function)."""
    path = next((row[4:].strip() for row in diff.splitlines() if row.startswith("--- ")), "?")
    removed = next((row[1:] for row in diff.splitlines() if row.startswith("-") and not row.startswith("---")), "")
    added = next(
        (row[1:].strip() for row in diff.splitlines() if row.startswith("+") and not row.startswith("+++")), ""
    )
    function = name.split("__mutmut_")[0].replace("xǁ", "").replace("ǁ", ".")
    line = 0
    source = workdir / path
    if source.is_file() and removed.strip():
        def_name = function.rsplit(".", 1)[-1]
        lines = source.read_text().splitlines()
        start = next((i for i, text in enumerate(lines) if f"def {def_name}(" in text), 0)
        line = next((i + 1 for i in range(start, len(lines)) if lines[i].strip() == removed.strip()), 0)
    return f"{path}:{line} {function}: {added}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--group", action="append", choices=[g.name for g in GROUPS])
    parser.add_argument("--max-children", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--sample", type=int)
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args()
    names = args.group or (list(QUICK) if args.quick else [g.name for g in GROUPS])
    started = time.monotonic()
    exit_codes: dict[str, int | None] = {}
    survivors: list[str] = []
    per_group: dict[str, dict[str, int]] = {}
    generated = 0
    for group in (g for g in GROUPS if g.name in names):
        group_started = time.monotonic()
        result = _run_group(group, args.max_children, args.keep, args.sample, args.seed)
        codes = result.exit_codes
        exit_codes.update(codes)
        survivors.extend(result.survivors)
        generated += result.generated
        per_group[group.name] = {
            "mutants": len(codes),
            "generated": result.generated,
            "killed": sum(1 for c in codes.values() if c in _KILLED or c in _TIMEOUT),
            "survived": sum(1 for c in codes.values() if c == 0),
            "seconds": round(time.monotonic() - group_started),
        }
    timeouts = sum(1 for code in exit_codes.values() if code in _TIMEOUT)
    killed = sum(1 for code in exit_codes.values() if code in _KILLED) + timeouts
    survived = sum(1 for code in exit_codes.values() if code == 0)
    unjudged = len(exit_codes) - killed - survived
    judged = killed + survived
    print(
        json.dumps(
            {
                "mutants": len(exit_codes),
                "generated": generated,
                "sample_per_group": args.sample,
                "killed": killed,
                "survived": survived,
                "timeouts": timeouts,
                "unjudged": unjudged,
                "killed_ratio": round(killed / judged, 4) if judged else None,
                "groups": per_group,
                "seconds": round(time.monotonic() - started),
                "survivors": survivors,
            },
            ensure_ascii=False,
        )
    )


if __name__ == "__main__":
    main()
