"""A bounded cache of prompt encodings: what a denoiser keeps so each distinct prompt is encoded once.

The text prompt reaches the denoiser with every chunk (`ChunkDenoiser.denoise_chunk(..., prompt=...)`, see
`model.py`), and nearly every chunk repeats the previous one's. A model that turns text into tensors (a real
checkpoint's umt5 encoder and per-layer cross-attention K/V; the reference model's look) asks this cache first:

    cache: PromptCache[TextKV] = PromptCache(capacity=16)
    text = cache.get(prompt, lambda: model.encode_text(umt5(prompt)))   # encodes only a prompt it has not kept

Keys are the prompt strings themselves (already validated, at most 512 UTF-8 bytes). Overflow policy: least recently
used out. `get` and `clear` are called from the one thread that owns the denoiser (its actor); `statistics` may be
read from any thread. An encoder that raises leaves nothing cached, so the next chunk with that prompt tries again.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["PromptCache", "PromptCacheStatistics"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class PromptCacheStatistics:
    """`encodings`: prompts encoded (cache misses); `hits`: lookups answered from the cache; `size`: kept now."""

    encodings: int
    hits: int
    size: int
    capacity: int


class PromptCache(Generic[_T]):
    """Encodings by prompt string, at most `capacity` of them, least recently used out first."""

    def __init__(self, capacity: int = 16) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"capacity must be an int >= 1, got {capacity!r}")
        self._capacity = capacity
        self._items: OrderedDict[str, _T] = OrderedDict()
        self._encodings = 0
        self._hits = 0
        self._lock = threading.Lock()

    def get(self, prompt: str, encode: Callable[[], _T]) -> _T:
        """The encoding of `prompt`, from the cache or from `encode()` (called outside the lock, then kept)."""
        with self._lock:
            if prompt in self._items:
                self._items.move_to_end(prompt)
                self._hits += 1
                return self._items[prompt]
        value = encode()
        with self._lock:
            self._encodings += 1
            self._items[prompt] = value
            self._items.move_to_end(prompt)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()

    def statistics(self) -> PromptCacheStatistics:
        with self._lock:
            return PromptCacheStatistics(self._encodings, self._hits, len(self._items), self._capacity)
