"""The names of API keys that are safe to show: owner fingerprints and the short key ids of quotas and usage.

A caller's *owner* is a fingerprint of its API key's SHA-256 digest, derived with a domain-separating prefix (128
bits shown); it is stored with admission tickets and never reversible to the key. Its *key id* is the owner's first
12 hex digits (`key-1a2b3c4d5e6f`): what `/metrics` labels usage with, what `GET /v1/usage` answers, what the
log shows at start, and how the config file's `key_quotas` names a key. Without API keys every caller is the one
owner `anonymous`, whose key id is `anonymous` too.
"""

from __future__ import annotations

import hashlib

__all__ = ["ANONYMOUS", "key_id", "owner_fingerprint"]

ANONYMOUS = "anonymous"
_OWNER_DOMAIN = b"lingstream-session-owner:"
_OWNER_PREFIX = "key-"
_KEY_ID_HEX = 12


def owner_fingerprint(key_digest: bytes) -> str:
    """The owner id of a key, from its SHA-256 digest (a second, domain-separated hash; 128 bits shown)."""
    return _OWNER_PREFIX + hashlib.sha256(_OWNER_DOMAIN + key_digest).hexdigest()[:32]


def key_id(owner: str) -> str:
    """The short, shareable id of an owner (`key-` + 12 hex digits; `anonymous` stays itself)."""
    if owner.startswith(_OWNER_PREFIX):
        return owner[: len(_OWNER_PREFIX) + _KEY_ID_HEX]
    return owner
