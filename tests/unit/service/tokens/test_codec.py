"""`TokenCodec` on its own: what each kind of token carries, expiry on the injected clock, forgery, `alg` confusion,
rotation by `kid`, and `looks_like_token` keeping API keys and tokens apart."""

from __future__ import annotations

import base64
import json

import jwt
import pytest

from service.errors import TokenExpiredError, TokenInvalidError
from service.tokens import ClientGrant, SessionGrant, TokenCodec, WatchGrant, key_id_of_secret, looks_like_token

SECRET = "first-token-secret-0123456789abcdefgh"
NEXT = "second-token-secret-0123456789abcdefg"


class Clock:
    def __init__(self) -> None:
        self.now = 1_900_000_000.0

    def __call__(self) -> float:
        return self.now


def test_each_kind_round_trips_its_grant() -> None:
    codec = TokenCodec([SECRET], clock=Clock())
    token, grant = codec.mint_client(
        "key-abc", ttl_s=120, max_creates=3, max_seconds=60.0, record=True, origins=["https://a.example"]
    )
    assert codec.verify(token) == grant
    assert grant == ClientGrant("key-abc", grant.token_id, 1_900_000_120.0, 3, 60.0, True, ("https://a.example",))
    session = codec.mint_session("key-abc", "sess-1", expires_at=1_900_000_500.0, origins=("https://a.example",))
    assert codec.verify(session) == SessionGrant("key-abc", "sess-1", 1_900_000_500.0, ("https://a.example",))
    watch, watch_grant = codec.mint_watch("key-abc", "sess-1", expires_at=1_900_000_500.0)
    assert codec.verify(watch) == watch_grant
    assert isinstance(watch_grant, WatchGrant)
    assert jwt.get_unverified_header(token)["kid"] == key_id_of_secret(SECRET)
    assert SECRET not in json.dumps(jwt.get_unverified_header(token))


def test_a_token_expires_on_the_injected_clock() -> None:
    clock = Clock()
    codec = TokenCodec([SECRET], clock=clock)
    token, _ = codec.mint_client("key-abc", ttl_s=60, max_creates=1, max_seconds=None, record=False, origins=())
    clock.now += 59
    codec.verify(token)
    clock.now += 1
    with pytest.raises(TokenExpiredError):
        codec.verify(token)


def _segment(value: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def test_forged_unsigned_and_foreign_tokens_are_invalid() -> None:
    codec = TokenCodec([SECRET], clock=Clock())
    token = codec.mint_session("key-abc", "sess-1", expires_at=1_900_000_500.0, origins=())
    head, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    other_session = f"{head}.{_segment({**claims, 'sid': 'sess-2'})}.{signature}"
    unsigned = f"{_segment({'alg': 'none', 'typ': 'JWT', 'kid': key_id_of_secret(SECRET)})}.{payload}."
    foreign = TokenCodec([NEXT], clock=Clock()).mint_session("key-abc", "sess-1", expires_at=2e9, origins=())
    same_kid_wrong_key = jwt.encode(claims, NEXT, algorithm="HS256", headers={"kid": key_id_of_secret(SECRET)})
    wrong_issuer = jwt.encode(
        {**claims, "iss": "someone"}, SECRET, algorithm="HS256", headers={"kid": key_id_of_secret(SECRET)}
    )
    for bad in (other_session, unsigned, foreign, same_kid_wrong_key, wrong_issuer, "eyJ.x.y", "x" * 5000):
        with pytest.raises(TokenInvalidError):
            codec.verify(bad)


def test_rotation_signs_with_the_new_secret_and_accepts_the_previous() -> None:
    old = TokenCodec([SECRET], clock=Clock())
    rotated = TokenCodec([NEXT, SECRET], clock=Clock())
    issued_before = old.mint_session("key-abc", "sess-1", expires_at=2e9, origins=())
    assert rotated.verify(issued_before).owner == "key-abc"
    issued_after = rotated.mint_session("key-abc", "sess-1", expires_at=2e9, origins=())
    assert jwt.get_unverified_header(issued_after)["kid"] == key_id_of_secret(NEXT)
    with pytest.raises(TokenInvalidError):
        old.verify(issued_after)


def test_tokens_and_api_keys_are_told_apart() -> None:
    token = TokenCodec([SECRET], clock=Clock()).mint_session("key-abc", "s", expires_at=2e9, origins=())
    assert looks_like_token(token)
    for key in ("key-alice-0123456789abcdef", "a.b.c", "eyJonly", ""):
        assert not looks_like_token(key)
