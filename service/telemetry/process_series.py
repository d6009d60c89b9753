"""The process's own series: resident memory from /proc and, under glibc, the malloc heap (`observe_process`).
Read on the collecting thread. docs/metrics.md lists them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from service.telemetry.heap import GlibcHeap, HeapInfo

__all__ = ["observe_process"]

_FRESH_S = 1.0  # one walk of the arenas per collection
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def observe_process(meter: Meter, heap: GlibcHeap | None = None) -> None:
    """Register the process's memory series on `meter`: resident memory from /proc (Linux) and, under glibc, what
    the malloc heap holds in use and free and its arena count (`service.telemetry.heap`). Read on the collecting
    thread."""

    def resident(_options: CallbackOptions) -> Iterable[Observation]:
        try:
            with open("/proc/self/statm", "rb") as statm:
                pages = int(statm.read().split()[1])
        except (OSError, ValueError, IndexError):
            return []
        return [Observation(pages * _PAGE_BYTES)]

    meter.create_observable_gauge(
        "lingstream.process.memory.resident", [resident], unit="By", description="Resident memory of the process."
    )
    if heap is None:
        return
    last: list[tuple[float, HeapInfo]] = []  # one walk of the arenas per collection

    def read() -> HeapInfo:
        if not last or time.monotonic() - last[0][0] >= _FRESH_S:
            last[:] = [(time.monotonic(), heap.info())]
        return last[0][1]

    def figure(pick: Callable[[HeapInfo], int]) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda _options: [Observation(pick(read()))]

    for name, unit, description, pick in (
        ("in_use", "By", "Bytes the malloc heap has handed out (glibc).", lambda i: i.in_use_bytes),
        (
            "free",
            "By",
            "Bytes the malloc heap holds free: resident memory nothing uses (glibc).",
            lambda i: i.free_bytes,
        ),
        (
            "arenas",
            "{arena}",
            "malloc arenas in the process (glibc; LINGSTREAM_MALLOC_ARENAS limits them).",
            lambda i: i.arenas,
        ),
    ):
        meter.create_observable_gauge(
            f"lingstream.process.heap.{name}", [figure(pick)], unit=unit, description=description
        )
