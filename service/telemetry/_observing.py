"""What every module of observable series shares: a collection callback over a record that may be absent.

`callback(read, observe)` makes the function an observable instrument calls per collection: it reads the source's
record (`read()`; None: no record, so no observation) and turns it into observations (`observe`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from opentelemetry.metrics import CallbackOptions, Observation

__all__ = ["Observe", "callback"]

T = TypeVar("T")

Observe = Callable[[T], Iterable[Observation]]


def callback(read: Callable[[], T | None], observe: Observe[T]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def collect(_options: CallbackOptions) -> Iterable[Observation]:
        value = read()
        return () if value is None else list(observe(value))

    return collect
