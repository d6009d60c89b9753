"""Where tokens keep state that a signature cannot carry: how many sessions a client token has made, and which
share links were revoked. `TokenStore` is the seam; `MemoryTokenStore` serves one replica (the memory admission
backend), `service.tokens.redis_store.RedisTokenStore` every replica of a deployment (the redis backend), so "at most
N creates" and a revocation hold whichever replica a request reaches.

Entries live as long as the token they are about (`expires_at`, wall seconds) and are dropped after: a client token
lives at most ten minutes, a watch token at most a day, so the memory store is bounded by the rate tokens are minted
times their lifetime. A claim is refunded when the create it was for did not take a place (a full queue, a quota),
so a refused create does not use up the token.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

__all__ = ["MemoryTokenStore", "TokenStore"]

_PRUNE_EVERY_S = 30.0


@runtime_checkable
class TokenStore(Protocol):
    """Counts client tokens' creates and remembers revoked shares. Ordering: `claim` is atomic (two replicas
    claiming the last create of a token: one wins); `revoke` is seen by every later `revoked` on every replica."""

    async def claim(self, token_id: str, limit: int, expires_at: float) -> bool:
        """Take one of the token's `limit` creates; False when all are taken."""
        ...

    async def refund(self, token_id: str) -> None:
        """Give back a create whose session took no place."""
        ...

    async def revoke(self, share_key: str, expires_at: float) -> None:
        """Revoke a share (until `expires_at`, after which its tokens are expired anyway)."""
        ...

    async def revoked(self, share_key: str) -> bool: ...

    async def aclose(self) -> None: ...


class MemoryTokenStore:
    """`TokenStore` in this process (one replica). `clock` gives wall seconds (tests move it)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._uses: dict[str, tuple[int, float]] = {}
        self._revoked: dict[str, float] = {}
        self._next_prune = 0.0

    def _prune(self) -> None:
        now = self._clock()
        if now < self._next_prune:
            return
        self._next_prune = now + _PRUNE_EVERY_S
        self._uses = {key: entry for key, entry in self._uses.items() if entry[1] > now}
        self._revoked = {key: until for key, until in self._revoked.items() if until > now}

    async def claim(self, token_id: str, limit: int, expires_at: float) -> bool:
        self._prune()
        used, _ = self._uses.get(token_id, (0, expires_at))
        if used >= limit:
            return False
        self._uses[token_id] = (used + 1, expires_at)
        return True

    async def refund(self, token_id: str) -> None:
        entry = self._uses.get(token_id)
        if entry is not None and entry[0] > 0:
            self._uses[token_id] = (entry[0] - 1, entry[1])

    async def revoke(self, share_key: str, expires_at: float) -> None:
        self._prune()
        self._revoked[share_key] = max(expires_at, self._revoked.get(share_key, 0.0))

    async def revoked(self, share_key: str) -> bool:
        until = self._revoked.get(share_key)
        return until is not None and until > self._clock()

    async def aclose(self) -> None:
        return None

    def entries(self) -> int:
        """Entries held (tests: the store stays bounded)."""
        return len(self._uses) + len(self._revoked)
