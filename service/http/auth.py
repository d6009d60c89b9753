"""Bearer API keys and session ownership.

When keys are configured, every `/v1` call needs `Authorization: Bearer <key>`. The presented key is hashed
(SHA-256) and compared with every configured key's digest in constant time (`hmac.compare_digest`, no early exit),
so neither timing nor the order of keys tells anything. A session's owner is a fingerprint of the key, derived with
a domain-separating prefix (`service.api_keys`); it is stored with the admission ticket and never reversible to the
key. Without keys, every caller is the same anonymous owner.
"""

from __future__ import annotations

import hashlib
import hmac

from service.api_keys import ANONYMOUS, owner_fingerprint
from service.errors import UnauthorizedError

__all__ = ["ANONYMOUS", "ApiKeyAuth", "owner_fingerprint"]


class ApiKeyAuth:
    """Checks `Authorization` headers against the configured key digests and names the caller's owner id."""

    def __init__(self, key_digests: tuple[bytes, ...]) -> None:
        self._digests = key_digests

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def owner(self, authorization: str | None) -> str:
        """The caller's owner id, or `UnauthorizedError` when keys are configured and the header is missing/wrong."""
        if not self._digests:
            return ANONYMOUS
        if authorization is None:
            raise UnauthorizedError("this API needs an `Authorization: Bearer <key>` header")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise UnauthorizedError("the Authorization header must be `Bearer <key>`")
        presented = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        matched: bytes | None = None
        for digest in self._digests:
            if hmac.compare_digest(presented, digest):
                matched = digest
        if matched is None:
            raise UnauthorizedError("the API key is not valid")
        return owner_fingerprint(matched)
