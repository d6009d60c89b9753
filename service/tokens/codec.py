"""`TokenCodec`: client, session and watch tokens as JSON Web Tokens (HS256), signed with the deployment's secret.

Why a JWT: it is the standard, reviewable format for a short signed grant (RFC 7519), every language reads it, and
PyJWT is already installed with `livekit-api` (LiveKit's join tokens are JWTs too). Only HS256 is accepted, so an
`alg: none` or an RSA/HMAC confusion is refused before any signature work. The header names the secret with `kid`
(the first 16 hex digits of a domain-separated SHA-256 of it, which tells nothing about it): the first configured
secret signs, every configured one verifies, so a deployment rotates by moving `LINGSTREAM_TOKEN_SECRET` to
`LINGSTREAM_TOKEN_SECRET_PREVIOUS` and setting a new one, and drops the old one once the longest token has lapsed.

Claims: `iss` `lingstream`, `ver` 1, `kind` (client | session | watch), `sub` the issuing key's owner fingerprint
(not reversible to the key), `jti`, `iat`, `exp`; a client token adds `n` (creates), `max_seconds`, `record`,
`origins`; session and watch tokens add `sid`, the session (a session token also `origins`; a watch token's `jti`
is its share id). PyJWT compares signatures in constant time. Time comes from the injected `clock` (wall seconds),
never from PyJWT's own, so tests move it; a token whose `exp` is not after `clock()` is expired.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

import jwt

from service.errors import TokenExpiredError, TokenInvalidError
from service.tokens.grants import ClientGrant, Grant, SessionGrant, TokenKind, WatchGrant

__all__ = ["ISSUER", "MAX_TOKEN_CHARS", "TokenCodec", "key_id_of_secret", "looks_like_token"]

ISSUER = "lingstream"
MAX_TOKEN_CHARS = 4096
_VERSION = 1
_ALGORITHM = "HS256"
_KID_DOMAIN = b"lingstream-token-kid:"
_REQUIRED = ["exp", "iat", "sub", "jti", "iss"]


def key_id_of_secret(secret: str) -> str:
    """The `kid` naming a secret in a token's header (16 hex digits of a domain-separated hash)."""
    return hashlib.sha256(_KID_DOMAIN + secret.encode()).hexdigest()[:16]


def looks_like_token(value: str) -> bool:
    """Whether a bearer value has a JWT's shape (three base64url parts, a JSON header): checked before the API
    keys are, so a token is never compared with them and an API key is never parsed as a token."""
    return value.startswith("eyJ") and value.count(".") == 2 and len(value) <= MAX_TOKEN_CHARS


class TokenCodec:
    """Mints and verifies the three kinds of token; see the module docstring. Pure: no I/O, time from `clock`."""

    def __init__(self, secrets_: Sequence[str], *, clock: Callable[[], float] = time.time) -> None:
        if not secrets_:
            raise ValueError("a token codec needs at least one secret")
        self._signing = secrets_[0]
        self._kid = key_id_of_secret(secrets_[0])
        self._by_kid = {key_id_of_secret(secret): secret for secret in secrets_}
        self._clock = clock

    def now(self) -> float:
        return self._clock()

    # ---------------------------------------------------------------------------------------------------- mint

    def mint_client(
        self,
        owner: str,
        *,
        ttl_s: float,
        max_creates: int,
        max_seconds: float | None,
        record: bool,
        origins: Sequence[str],
    ) -> tuple[str, ClientGrant]:
        now = self._clock()
        grant = ClientGrant(
            owner=owner,
            token_id=secrets.token_hex(12),
            expires_at=float(int(now + ttl_s)),
            max_creates=max_creates,
            max_seconds=max_seconds,
            record=record,
            origins=tuple(origins),
        )
        extra = {"n": max_creates, "max_seconds": max_seconds, "record": record, "origins": list(grant.origins)}
        return self._sign(TokenKind.CLIENT, owner, grant.token_id, now, grant.expires_at, extra), grant

    def mint_session(self, owner: str, session_id: str, *, expires_at: float, origins: Sequence[str]) -> str:
        extra = {"sid": session_id, "origins": list(origins)}
        return self._sign(TokenKind.SESSION, owner, secrets.token_hex(12), self._clock(), expires_at, extra)

    def mint_watch(self, owner: str, session_id: str, *, expires_at: float) -> tuple[str, WatchGrant]:
        grant = WatchGrant(owner=owner, session_id=session_id, share_id=secrets.token_hex(12), expires_at=expires_at)
        token = self._sign(TokenKind.WATCH, owner, grant.share_id, self._clock(), expires_at, {"sid": session_id})
        return token, grant

    def _sign(
        self, kind: TokenKind, owner: str, token_id: str, now: float, expires_at: float, extra: dict[str, Any]
    ) -> str:
        claims = {
            "iss": ISSUER,
            "ver": _VERSION,
            "kind": kind.value,
            "sub": owner,
            "jti": token_id,
            "iat": int(now),
            "exp": int(expires_at),
            **extra,
        }
        return jwt.encode(claims, self._signing, algorithm=_ALGORITHM, headers={"kid": self._kid})

    # -------------------------------------------------------------------------------------------------- verify

    def verify(self, token: str) -> Grant:
        """The grant of a genuine, unexpired token: `TokenInvalidError` (malformed, forged, unknown secret, wrong
        issuer or version) or `TokenExpiredError`."""
        if not looks_like_token(token):
            raise TokenInvalidError("not a token of this service")
        try:
            header = jwt.get_unverified_header(token)
        except jwt.InvalidTokenError:
            raise TokenInvalidError("not a token of this service") from None
        secret = self._by_kid.get(str(header.get("kid", "")))
        if secret is None:
            raise TokenInvalidError("the token was signed with a secret this service does not hold (rotated out?)")
        try:
            claims = jwt.decode(
                token,
                secret,
                algorithms=[_ALGORITHM],
                issuer=ISSUER,
                options={"verify_exp": False, "verify_iat": False, "verify_nbf": False, "require": _REQUIRED},
            )
        except jwt.InvalidTokenError:
            raise TokenInvalidError("the token's signature or claims are not valid") from None
        try:
            grant = _grant(claims)
        except (TypeError, ValueError):
            raise TokenInvalidError("the token's claims are not valid") from None
        if grant.expires_at <= self._clock():
            raise TokenExpiredError(f"the {claims['kind']} token has expired; ask for a new one")
        return grant


def _grant(claims: dict[str, Any]) -> Grant:
    if claims.get("ver") != _VERSION:
        raise ValueError("unknown version")
    kind = TokenKind(_claim(claims, "kind"))
    owner, token_id, expires_at = str(_claim(claims, "sub")), str(_claim(claims, "jti")), float(_claim(claims, "exp"))
    if kind is TokenKind.CLIENT:
        max_seconds = claims.get("max_seconds")
        return ClientGrant(
            owner=owner,
            token_id=token_id,
            expires_at=expires_at,
            max_creates=int(_claim(claims, "n")),
            max_seconds=None if max_seconds is None else float(max_seconds),
            record=bool(_claim(claims, "record")),
            origins=tuple(str(origin) for origin in _claim(claims, "origins")),
        )
    session_id = _claim(claims, "sid")
    if not isinstance(session_id, str):
        raise TypeError("sid")
    if kind is TokenKind.SESSION:
        origins = tuple(str(origin) for origin in claims.get("origins", ()))
        return SessionGrant(owner=owner, session_id=session_id, expires_at=expires_at, origins=origins)
    return WatchGrant(owner=owner, session_id=session_id, share_id=token_id, expires_at=expires_at)


def _claim(claims: dict[str, Any], name: str) -> Any:
    """A claim the token must carry; a missing one is `ValueError` (the token is not valid)."""
    if name not in claims:
        raise ValueError(f"no {name!r} claim")
    return claims[name]
