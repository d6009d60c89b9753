"""service/telemetry/heap.py: glibc's arena limit really bounds the arenas, and the heap figures follow
allocations."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from service.telemetry.heap import GlibcHeap, limit_malloc_arenas

ROOT = Path(__file__).resolve().parents[4]

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")

# Eight threads that each allocate and then wait until all eight are alive: glibc gives every new thread an arena
# of its own until the limit (8 per core by default), so the count shows whether a limit holds.
_THREADS = textwrap.dedent(
    """
    import json, sys, threading
    sys.path.insert(0, {root!r})
    from service.telemetry.heap import GlibcHeap, limit_malloc_arenas
    note = limit_malloc_arenas({arenas})
    barrier = threading.Barrier(8)
    kept = []

    def work():
        kept.append([bytes(100) for _ in range(1000)])
        barrier.wait()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({{"note": note, "arenas": GlibcHeap.load().info().arenas}}))
    """
)


def _arenas_with(arenas: int, **environ: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | environ
    script = _THREADS.format(root=str(ROOT), arenas=arenas)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_the_limit_bounds_the_arenas_that_threads_would_create() -> None:
    unlimited = _arenas_with(0)
    limited = _arenas_with(2)
    assert unlimited["note"] == "glibc's default (LINGSTREAM_MALLOC_ARENAS=0)"
    assert isinstance(unlimited["arenas"], int)
    assert unlimited["arenas"] > 2
    assert limited == {"note": "at most 2", "arenas": 2}


def test_an_explicit_malloc_arena_max_wins_over_the_setting() -> None:
    result = _arenas_with(2, MALLOC_ARENA_MAX="3")
    assert result["note"] == "MALLOC_ARENA_MAX=3 from the environment"
    assert isinstance(result["arenas"], int)
    assert 2 < result["arenas"] <= 3


def test_heap_figures_follow_an_allocation() -> None:
    heap = GlibcHeap.load()
    assert heap is not None
    before = heap.info()
    block = bytearray(64 * 1024 * 1024)
    during = heap.info()
    del block
    after = heap.info()
    assert during.in_use_bytes - before.in_use_bytes >= 64 * 1024 * 1024
    assert during.in_use_bytes - after.in_use_bytes >= 64 * 1024 * 1024
    assert before.arenas >= 1
    assert before.free_bytes >= 0


def test_a_limit_below_one_is_refused() -> None:
    heap = GlibcHeap.load()
    assert heap is not None
    with pytest.raises(ValueError, match="at least 1"):
        heap.limit_arenas(0)
    assert limit_malloc_arenas(0) == "glibc's default (LINGSTREAM_MALLOC_ARENAS=0)"
