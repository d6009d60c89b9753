"""Bearer credentials: API keys, and the tokens of issue #35 (client, session and watch tokens).

When keys are configured, every `/v1` call needs `Authorization: Bearer <key or token>`. A presented key is hashed
(SHA-256) and compared with every configured key's digest in constant time (`hmac.compare_digest`, no early exit),
so neither timing nor the order of keys tells anything. A session's owner is a fingerprint of the key, derived with
a domain-separating prefix (`service.api_keys`); it is stored with the admission ticket and never reversible to the
key. Without keys, every caller is the same anonymous owner.

A bearer value with a JWT's shape that is no configured key is read as a token when `LINGSTREAM_TOKEN_SECRET` is set
(`service.tokens.codec`): its signature and expiry are checked, the key that issued it must still be configured (a
removed key ends its tokens), and a watch token's share must not be revoked. `Authenticator.caller` answers the
`Caller` the routes ask what it may reach (`service.tokens.access`). Only the event stream also reads a token from
`?access_token=` (a browser's `EventSource` sends no headers); API keys are never read from a URL.
"""

from __future__ import annotations

import hashlib
import hmac

from service.api_keys import ANONYMOUS, owner_fingerprint
from service.errors import TokenExpiredError, TokenInvalidError, TokenRevokedError, UnauthorizedError
from service.tokens import Caller, TokenCodec, TokenPolicy, TokenStore, WatchGrant, looks_like_token

__all__ = ["ANONYMOUS", "ApiKeyAuth", "Authenticator", "bearer_value", "owner_fingerprint", "share_key"]


def bearer_value(authorization: str | None) -> str | None:
    """The credential of an `Authorization: Bearer <value>` header; None without one, `UnauthorizedError` for
    another scheme."""
    if authorization is None:
        return None
    scheme, _, value = authorization.strip().partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value:
        raise UnauthorizedError("the Authorization header must be `Bearer <key>`")
    return value


def share_key(session_id: str, share_id: str) -> str:
    """The name a share's revocation is kept under (bound to its session: one key's session id never reaches
    another's share)."""
    return f"{session_id}:{share_id}"


class ApiKeyAuth:
    """Checks `Authorization` headers against the configured key digests and names the caller's owner id."""

    def __init__(self, key_digests: tuple[bytes, ...]) -> None:
        self._digests = key_digests
        self._owners = frozenset(owner_fingerprint(digest) for digest in key_digests) or frozenset({ANONYMOUS})

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    @property
    def owners(self) -> frozenset[str]:
        """Every configured key's owner id (`anonymous` alone without keys)."""
        return self._owners

    def owner(self, authorization: str | None) -> str:
        """The caller's owner id, or `UnauthorizedError` when keys are configured and the header is missing/wrong."""
        if not self._digests:
            return ANONYMOUS
        value = bearer_value(authorization)
        if value is None:
            raise UnauthorizedError("this API needs an `Authorization: Bearer <key>` header")
        matched = self.match(value)
        if matched is None:
            raise UnauthorizedError("the API key is not valid")
        return matched

    def match(self, value: str) -> str | None:
        """The owner id of the configured key `value` is, or None (constant time over every key)."""
        presented = hashlib.sha256(value.encode("utf-8", "surrogateescape")).digest()
        matched: bytes | None = None
        for digest in self._digests:
            if hmac.compare_digest(presented, digest):
                matched = digest
        return None if matched is None else owner_fingerprint(matched)


class Authenticator:
    """Names the caller of a request: an API key's owner, or a token's grant (see the module docstring).
    `codec` None: tokens are off (a token is then just an unknown key)."""

    def __init__(self, keys: ApiKeyAuth, codec: TokenCodec | None, store: TokenStore, policy: TokenPolicy) -> None:
        self.keys = keys
        self.codec = codec
        self.store = store
        self.policy = policy

    async def caller(self, authorization: str | None, origin: str | None, *, access_token: str | None = None) -> Caller:
        value = bearer_value(authorization)
        if value is None and access_token:
            value = access_token.strip()
        if value is not None and self.codec is not None and looks_like_token(value) and self.keys.match(value) is None:
            return await self._token_caller(self.codec, value, origin)
        if value is not None and authorization is None:  # `?access_token=` carries tokens only, never a key
            raise TokenInvalidError("?access_token= takes a session or watch token, not an API key")
        return Caller(self.keys.owner(authorization), None, origin)

    async def _token_caller(self, codec: TokenCodec, value: str, origin: str | None) -> Caller:
        grant = codec.verify(value)
        if grant.owner not in self.keys.owners:
            raise TokenInvalidError("the API key that issued this token is no longer configured")
        if isinstance(grant, WatchGrant) and await self.store.revoked(share_key(grant.session_id, grant.share_id)):
            raise TokenRevokedError("this share link was revoked by the session's owner")
        return Caller(grant.owner, grant, origin)

    def check_session_alive(self, terminal: bool, updated_at: float) -> None:
        """`TokenExpiredError` when a token's session ended longer than the reconnect grace ago."""
        assert self.codec is not None
        if self.policy.session_over(terminal, updated_at, self.codec.now()):
            raise TokenExpiredError("the session has ended; its tokens expired with it")
