"""A process's tree and what it holds, read from /proc (Linux): its descendants, the /dev/shm files they map or
hold open, and whether a pid is still alive (a zombie counts as gone). For the tests that check a service leaves no
process and no shared memory behind."""

from __future__ import annotations

import os
from pathlib import Path


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        ppid = int(stat.rpartition(")")[2].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def shm_paths(pids: set[int]) -> set[str]:
    """The /dev/shm files these processes map or hold open and that still have a name."""
    paths: set[str] = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
            links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
        except OSError:
            continue
        for name in [line.split(maxsplit=5)[-1] for line in maps if "/dev/shm/" in line] + links:
            if name.startswith("/dev/shm/") and not name.endswith("(deleted)"):
                paths.add(name)
    return paths


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and " Z " not in Path(f"/proc/{pid}/stat").read_text()
