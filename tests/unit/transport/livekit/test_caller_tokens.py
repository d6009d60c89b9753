"""Reading a caller-minted join token without its secret: what would fail at the server is refused before a session
takes a place, and the token is never repeated."""

from __future__ import annotations

import datetime

import jwt
import pytest
from livekit import api

from transport.errors import CallerTokenError
from transport.livekit.caller_tokens import caller_url_allowed, read_caller_token
from transport.redaction import redact_tokens

URL = "wss://project.livekit.example"
NOW = 1_800_000_000.0  # the tokens below are minted for the real clock; the reader is told this "now" only for expiry


def mint(
    *,
    identity: str = "lingstream-world",
    room: str | None = "lobby",
    kind: str | None = "agent",
    ttl: float = 600.0,
    **grants: object,
) -> str:
    spelled: dict[str, object] = {"room_join": True, "room": room, "can_update_own_metadata": True}
    spelled.update(grants)
    token = (
        api.AccessToken("APIcaller", "caller-secret-long-enough-for-hs256-0123456789")
        .with_identity(identity)
        .with_grants(api.VideoGrants(**spelled))  # type: ignore[arg-type]
        .with_ttl(datetime.timedelta(seconds=ttl))
    )
    if kind is not None:
        token = token.with_kind(kind)  # type: ignore[arg-type]
    return token.to_jwt()


def now() -> float:
    return datetime.datetime.now(tz=datetime.UTC).timestamp()


def test_an_agent_token_for_one_room_is_read() -> None:
    token = mint()
    read = read_caller_token(URL, token, now=now())
    assert (read.url, read.room, read.identity, read.kind) == (URL, "lobby", "lingstream-world", "agent")
    assert read.expires_at > now() + 500
    assert read.token == token
    assert token not in repr(read)  # a credential: never in a repr, hence never in a log line by accident


@pytest.mark.parametrize(
    ("token", "reason"),
    [
        ("not-a-token", "not a JWT"),
        ("a.b", "not a JWT"),
        ("!!!.@@@.###", "not base64url-encoded JSON"),
        ("ey" * 5000, "at most"),
    ],
)
def test_what_is_not_a_jwt_is_refused(token: str, reason: str) -> None:
    with pytest.raises(CallerTokenError, match=reason):
        read_caller_token(URL, token, now=now())


@pytest.mark.parametrize(
    ("claims", "reason"),
    [
        ({"room_join": False}, "roomJoin to one named room"),
        ({"can_publish": False}, "canPublish"),
        ({"can_publish_sources": ["microphone"]}, "camera"),
        ({"can_publish_data": False}, "canPublishData"),
        ({"can_update_own_metadata": False}, "canUpdateOwnMetadata"),
    ],
)
def test_a_token_without_the_grants_the_service_needs_is_refused(claims: dict[str, object], reason: str) -> None:
    token = mint(**claims)  # type: ignore[arg-type]
    with pytest.raises(CallerTokenError, match=reason) as caught:
        read_caller_token(URL, token, now=now())
    assert token not in str(caught.value)


def test_a_camera_only_token_is_enough() -> None:
    assert read_caller_token(URL, mint(can_publish_sources=["camera"]), now=now()).room == "lobby"


def test_an_expired_token_and_one_not_valid_yet_are_refused() -> None:
    token = mint(ttl=60)
    with pytest.raises(CallerTokenError, match="expired"):
        read_caller_token(URL, token, now=now() + 58)  # within the join margin
    with pytest.raises(CallerTokenError, match="not valid yet"):
        read_caller_token(URL, token, now=now() - 3600)


def test_a_token_for_an_egress_or_sip_participant_is_refused_and_standard_is_accepted() -> None:
    with pytest.raises(CallerTokenError, match="kind must be agent"):
        read_caller_token(URL, mint(kind="sip"), now=now())
    assert read_caller_token(URL, mint(kind="standard"), now=now()).kind == "standard"
    assert read_caller_token(URL, mint(kind=None), now=now()).kind == ""


def raw(claims: dict[str, object]) -> str:
    # What livekit-api refuses to mint, another minting library may still write.
    return jwt.encode(claims, "caller-secret-long-enough-for-hs256-0123456789", algorithm="HS256")


def test_a_token_without_an_identity_or_a_room_is_refused() -> None:
    video = {"roomJoin": True, "room": "lobby", "canUpdateOwnMetadata": True}
    expiry = int(now()) + 600
    with pytest.raises(CallerTokenError, match="identity"):
        read_caller_token(URL, raw({"video": video, "exp": expiry}), now=now())
    with pytest.raises(CallerTokenError, match="one named room"):
        read_caller_token(URL, raw({"sub": "svc", "video": {**video, "room": ""}, "exp": expiry}), now=now())
    with pytest.raises(CallerTokenError, match="no video grant"):
        read_caller_token(URL, raw({"sub": "svc", "exp": expiry}), now=now())
    with pytest.raises(CallerTokenError, match="no expiry"):
        read_caller_token(URL, raw({"sub": "svc", "video": video}), now=now())


def test_the_url_must_be_a_livekit_url() -> None:
    with pytest.raises(CallerTokenError, match=r"livekit\.url"):
        read_caller_token("ftp://example.com", mint(), now=now())


@pytest.mark.parametrize(
    ("url", "patterns", "allowed"),
    [
        ("wss://a.livekit.cloud", ("wss://*.livekit.cloud",), True),
        ("https://a.livekit.cloud", ("wss://*.livekit.cloud",), True),  # https is wss's scheme on the API side
        ("wss://livekit.cloud", ("wss://*.livekit.cloud",), False),
        ("wss://a.livekit.cloud.evil.example", ("wss://*.livekit.cloud",), False),
        ("ws://a.livekit.cloud", ("wss://*.livekit.cloud",), False),  # not downgraded to plain text
        ("ws://10.0.0.5:7880", ("ws://10.0.0.5:7880",), True),
        ("ws://10.0.0.5:7881", ("ws://10.0.0.5:7880",), False),
        ("ws://10.0.0.5:7881", ("ws://10.0.0.5",), True),
        ("wss://anything.example", ("*",), True),
        ("wss://anything.example", (), False),
        ("not a url", ("*",), False),
    ],
)
def test_the_caller_url_allow_list(url: str, patterns: tuple[str, ...], allowed: bool) -> None:
    assert caller_url_allowed(url, patterns) is allowed


def test_tokens_are_redacted_from_text() -> None:
    token = mint()
    text = f"engine: signal failure: 401 Unauthorized - invalid token: {token}, error: signature is invalid"
    redacted = redact_tokens(text)
    assert token not in redacted
    assert (
        redacted == "engine: signal failure: 401 Unauthorized - invalid token: [redacted], error: signature is invalid"
    )
