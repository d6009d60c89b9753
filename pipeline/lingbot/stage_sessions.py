"""One model stage's per-session states and call statistics, and the chunk-order check every stage makes, shared by
the reference model and LingBot-World-Fast.

Each stage object of a `WorldModel` (encode, denoise, decode) keeps a state per open session between its
`create_cache` and `release_cache`, and counts its calls and the time they took. The table is safe to use from
several threads (a stage object is called by one actor, statistics are read from another thread).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Generic, TypeVar

from pipeline.lingbot.chunks import ChunkPlan
from pipeline.lingbot.errors import ChunkContractError, ModelSessionError

__all__ = ["SessionTable", "StageStatistics", "check_chunk_order"]

_S = TypeVar("_S")


@dataclass(frozen=True, slots=True)
class StageStatistics:
    """A snapshot of one stage object: sessions with a cache now, calls recorded and the seconds they took."""

    open_sessions: int
    calls: int
    busy_s: float


class SessionTable(Generic[_S]):
    """Per-session state of one stage (`stage` names it in errors), with the stage's call statistics."""

    def __init__(self, stage: str) -> None:
        self._stage = stage
        self._lock = threading.Lock()
        self._sessions: dict[str, _S] = {}
        self._calls = 0
        self._busy_s = 0.0

    def add(self, session_id: str, state: _S) -> None:
        with self._lock:
            if session_id in self._sessions:
                raise ModelSessionError(f"{self._stage}: session {session_id!r} already has a cache")
            self._sessions[session_id] = state

    def get(self, session_id: str) -> _S:
        with self._lock:
            state = self._sessions.get(session_id)
        if state is None:
            raise ModelSessionError(f"{self._stage}: no cache for session {session_id!r} (create_cache first)")
        return state

    def remove(self, session_id: str) -> _S | None:
        """Forget the session's state and return it; None (no error) for an unknown id, so a release can repeat."""
        with self._lock:
            return self._sessions.pop(session_id, None)

    def record(self, seconds: float) -> None:
        with self._lock:
            self._calls += 1
            self._busy_s += seconds

    def statistics(self) -> StageStatistics:
        with self._lock:
            return StageStatistics(len(self._sessions), self._calls, self._busy_s)


def check_chunk_order(stage: str, plan: ChunkPlan, chunk_index: int, chunk_size: int, expected: int) -> None:
    """A chunk call must match the session's plan (`ChunkContractError`) and come in order (`ModelSessionError`:
    chunk `expected` is the next one)."""
    if chunk_size != plan.chunk_size:
        raise ChunkContractError(f"{stage}: chunk_size {chunk_size} does not match the session's {plan.chunk_size}")
    if not 0 <= chunk_index < plan.num_chunks:
        raise ChunkContractError(f"{stage}: chunk index {chunk_index} outside the session's 0..{plan.num_chunks - 1}")
    if chunk_index != expected:
        raise ModelSessionError(f"{stage}: chunk {chunk_index} arrived out of order, expected chunk {expected}")
