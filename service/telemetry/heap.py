"""The process heap under glibc: how many malloc arenas it may use, and what they hold (in use and free).

Problem: glibc's malloc gives each thread that contends for the heap its own arena, up to 8 per core. The service
runs many threads (uvicorn's loop, three stage threads per model worker, aiortc's codec and network threads,
torch's pool), and each arena keeps the memory freed into it. Under session churn (video encoders, DTLS contexts
and tensors of several sizes made and freed for every session) RSS then creeps up while nothing leaks: measured
with `bench/load.py` (5 minutes, ~470 sessions), +0.87 MB/min in the second half with glibc's default arenas and
+0.05 MB/min with two (docs/reliability.md). `lingstream serve` therefore limits the arenas at start
(`LINGSTREAM_MALLOC_ARENAS`, default 2; an explicit `MALLOC_ARENA_MAX` in the environment wins), before the threads
that would create them exist: `limit_malloc_arenas`.

Example::

    heap = GlibcHeap.load()            # None when the C library is not glibc (musl, macOS)
    if heap is not None:
        heap.limit_arenas(2)
        heap.info()                    # HeapInfo(in_use_bytes=..., free_bytes=..., arenas=...)

Everything here is read-mostly and cheap except `info()`, which walks the arenas under their locks (use it for a
scrape, not a hot path).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re
from dataclasses import dataclass

__all__ = ["GlibcHeap", "HeapInfo", "limit_malloc_arenas"]

_M_ARENA_MAX = -8  # malloc.h
_HEAP_ENTRY = re.compile(rb'<heap nr="\d+">')


class _MallInfo2(ctypes.Structure):
    # glibc's `struct mallinfo2` (malloc.h, glibc 2.33+): ten size_t fields, in this order.
    _fields_ = [
        ("arena", ctypes.c_size_t),
        ("ordblks", ctypes.c_size_t),
        ("smblks", ctypes.c_size_t),
        ("hblks", ctypes.c_size_t),
        ("hblkhd", ctypes.c_size_t),  # bytes in chunks mmapped on their own (large allocations)
        ("usmblks", ctypes.c_size_t),
        ("fsmblks", ctypes.c_size_t),
        ("uordblks", ctypes.c_size_t),  # bytes handed out from the arenas
        ("fordblks", ctypes.c_size_t),  # bytes free but still held by the arenas
        ("keepcost", ctypes.c_size_t),
    ]


@dataclass(frozen=True, slots=True)
class HeapInfo:
    """glibc's view of the heap: `in_use_bytes` (arena chunks handed out plus chunks mmapped on their own),
    `free_bytes` (free chunks the arenas still hold: resident memory nothing uses) and `arenas`."""

    in_use_bytes: int
    free_bytes: int
    arenas: int


class GlibcHeap:
    """glibc's arena limit and heap statistics, through ctypes (see the module docstring)."""

    def __init__(self, libc: ctypes.CDLL) -> None:
        self._libc = libc
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.mallinfo2.argtypes = []
        libc.mallinfo2.restype = _MallInfo2
        libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)]
        libc.open_memstream.restype = ctypes.c_void_p
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.malloc_info.restype = ctypes.c_int
        libc.fclose.argtypes = [ctypes.c_void_p]
        libc.fclose.restype = ctypes.c_int
        libc.free.argtypes = [ctypes.c_void_p]
        libc.free.restype = None

    @classmethod
    def load(cls) -> GlibcHeap | None:
        """The process's glibc (2.33 or later), or None when the C library is something else."""
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        try:
            libc = ctypes.CDLL(name)
        except OSError:
            return None
        needed = ("gnu_get_libc_version", "mallopt", "mallinfo2", "malloc_info", "open_memstream")
        if not all(hasattr(libc, symbol) for symbol in needed):
            return None
        return cls(libc)

    def limit_arenas(self, count: int) -> None:
        """Let malloc use at most `count` arenas from now on (`mallopt(M_ARENA_MAX)`). Arenas that already exist
        stay; call it before the process starts its threads. Raises `ValueError` for a count below 1 and `OSError`
        when glibc refuses."""
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        if self._libc.mallopt(_M_ARENA_MAX, count) != 1:
            raise OSError(f"glibc refused mallopt(M_ARENA_MAX, {count})")

    def info(self) -> HeapInfo:
        raw = self._libc.mallinfo2()
        return HeapInfo(in_use_bytes=raw.uordblks + raw.hblkhd, free_bytes=raw.fordblks, arenas=self._arenas())

    def _arenas(self) -> int:
        # malloc_info's XML has one <heap nr="N"> element per arena; it is the only interface that counts them.
        buffer = ctypes.c_void_p()
        size = ctypes.c_size_t()
        stream = self._libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size))
        if not stream:
            raise OSError("open_memstream failed")
        try:
            self._libc.malloc_info(0, stream)
        finally:
            self._libc.fclose(stream)  # flushes and sets buffer/size
        try:
            return len(_HEAP_ENTRY.findall(ctypes.string_at(buffer.value, size.value))) if buffer.value else 0
        finally:
            self._libc.free(buffer.value)


def limit_malloc_arenas(arenas: int) -> str:
    """At most `arenas` glibc malloc arenas from now on (0: glibc's default; `MALLOC_ARENA_MAX` in the environment
    wins); returns what was done, for the start-up log. Call it before the process starts its threads."""
    if arenas == 0:
        return "glibc's default (LINGSTREAM_MALLOC_ARENAS=0)"
    if "MALLOC_ARENA_MAX" in os.environ:
        return f"MALLOC_ARENA_MAX={os.environ['MALLOC_ARENA_MAX']} from the environment"
    heap = GlibcHeap.load()
    if heap is None:
        return "not glibc: LINGSTREAM_MALLOC_ARENAS has no effect"
    try:
        heap.limit_arenas(arenas)
    except OSError as exc:
        return f"unchanged ({exc})"
    return f"at most {arenas}"
