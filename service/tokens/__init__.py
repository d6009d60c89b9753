"""Browser-safe credentials (issue #35): client tokens an app's backend mints with its API key, the session tokens a
client token's creates answer, and the watch tokens of share links; what each may reach, and the state behind them
(creates counted, shares revoked) on one replica or every replica. docs/integrate.md tells an app how to use them."""

from service.tokens.access import Caller, Need, origin_allowed
from service.tokens.codec import ISSUER, MAX_TOKEN_CHARS, TokenCodec, key_id_of_secret, looks_like_token
from service.tokens.grants import ClientGrant, Grant, SessionGrant, TokenKind, WatchGrant
from service.tokens.policy import (
    CLIENT_TTL_DEFAULT_S,
    CLIENT_TTL_MAX_S,
    MAX_CREATES_BOUND,
    SESSION_TOKEN_MAX_S,
    TokenPolicy,
)
from service.tokens.store import MemoryTokenStore, TokenStore

__all__ = [
    "CLIENT_TTL_DEFAULT_S",
    "CLIENT_TTL_MAX_S",
    "ISSUER",
    "MAX_CREATES_BOUND",
    "MAX_TOKEN_CHARS",
    "SESSION_TOKEN_MAX_S",
    "Caller",
    "ClientGrant",
    "Grant",
    "MemoryTokenStore",
    "Need",
    "SessionGrant",
    "TokenCodec",
    "TokenKind",
    "TokenPolicy",
    "TokenStore",
    "WatchGrant",
    "key_id_of_secret",
    "looks_like_token",
    "origin_allowed",
]
