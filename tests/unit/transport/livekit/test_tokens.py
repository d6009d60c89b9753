"""LiveKit join tokens: exact least-privilege grants, unique server-generated identities, short TTL."""

from __future__ import annotations

import json

import jwt
import pytest
from livekit import api
from livekit.api.access_token import Claims

from transport.base import SERVICE_IDENTITY_PREFIX
from transport.errors import TransportConfigError
from transport.livekit.tokens import ParticipantRole, TokenIssuer, room_name_for

KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"


def _decode(token: str) -> Claims:
    return api.TokenVerifier(KEY, SECRET).verify(token)


def test_controller_may_subscribe_and_send_data_but_not_publish_media() -> None:
    issued = TokenIssuer(KEY, SECRET).controller("abc", "lingstream-abc")
    claims = _decode(issued.token)
    assert claims.video == api.VideoGrants(
        room_join=True,
        room="lingstream-abc",
        can_subscribe=True,
        can_publish=False,
        can_publish_data=True,
        can_update_own_metadata=False,
    )
    assert claims.identity == issued.identity
    assert issued.identity.startswith("ctl-abc-")
    assert json.loads(claims.metadata) == {"session_id": "abc", "role": "controller"}


def test_viewer_may_only_subscribe() -> None:
    claims = _decode(TokenIssuer(KEY, SECRET).viewer("abc", "lingstream-abc").token)
    assert claims.video == api.VideoGrants(
        room_join=True,
        room="lingstream-abc",
        can_subscribe=True,
        can_publish=False,
        can_publish_data=False,
        can_update_own_metadata=False,
    )
    assert claims.identity.startswith("view-abc-")


def test_service_publishes_camera_video_and_data_and_its_attributes_and_subscribes_to_nothing() -> None:
    claims = _decode(TokenIssuer(KEY, SECRET).service("abc", "lingstream-abc").token)
    assert claims.video == api.VideoGrants(
        room_join=True,
        room="lingstream-abc",
        can_subscribe=False,
        can_publish=True,
        can_publish_sources=["camera"],
        can_publish_data=True,
        can_update_own_metadata=True,
    )
    assert claims.identity.startswith("svc-abc-")
    # the seam's rule for telling service participants apart (transport.base) is this prefix
    assert claims.identity.startswith(SERVICE_IDENTITY_PREFIX)
    assert TokenIssuer.has_role(claims.identity, ParticipantRole.SERVICE)


def test_only_the_service_participant_joins_as_an_agent() -> None:
    # kind agent: an Agents worker never takes it for the user, and it does not keep an empty room alive.
    issuer = TokenIssuer(KEY, SECRET)
    assert _decode(issuer.service("abc", "r").token).kind == "agent"
    assert _decode(issuer.controller("abc", "r").token).kind in ("", "standard")
    assert _decode(issuer.viewer("abc", "r").token).kind in ("", "standard")


def test_raw_claims_spell_out_every_permission() -> None:
    # The server reads these camelCase claims; a missing boolean would mean the server's default (often "allow").
    raw = jwt.decode(TokenIssuer(KEY, SECRET).controller("abc", "r").token, SECRET, algorithms=["HS256"])
    assert raw["video"] == {
        "roomJoin": True,
        "room": "r",
        "canPublish": False,
        "canSubscribe": True,
        "canPublishData": True,
        "canUpdateOwnMetadata": False,
    }
    assert raw["iss"] == KEY


def test_identities_are_unique_per_token() -> None:
    issuer = TokenIssuer(KEY, SECRET)
    identities = {issuer.viewer("abc", "r").identity for _ in range(200)}
    identities |= {issuer.controller("abc", "r").identity for _ in range(200)}
    assert len(identities) == 400


def test_reissue_keeps_a_known_identity_and_checks_its_role() -> None:
    issuer = TokenIssuer(KEY, SECRET)
    first = issuer.controller("abc", "r")
    again = issuer.controller("abc", "r", identity=first.identity)
    assert _decode(again.token).identity == first.identity
    with pytest.raises(TransportConfigError, match="does not belong"):
        issuer.service("abc", "r", identity=first.identity)


def test_join_ttl_is_short_and_configurable() -> None:
    default = jwt.decode(TokenIssuer(KEY, SECRET).controller("a", "r").token, SECRET, algorithms=["HS256"])
    assert default["exp"] - default["nbf"] == 60
    short = TokenIssuer(KEY, SECRET, join_ttl=15)
    issued = short.controller("a", "r")
    raw = jwt.decode(issued.token, SECRET, algorithms=["HS256"])
    assert raw["exp"] - raw["nbf"] == 15
    assert issued.expires_at == pytest.approx(raw["exp"], abs=1)


def test_tokens_of_another_secret_do_not_verify() -> None:
    token = TokenIssuer(KEY, "another-secret-that-is-long-enough-0123456789").controller("a", "r").token
    with pytest.raises(jwt.InvalidSignatureError):
        _decode(token)


def test_session_ids_are_made_safe_for_identities_and_rooms() -> None:
    assert room_name_for("a b/c") == "lingstream-a_b_c"
    identity = TokenIssuer.new_identity(ParticipantRole.VIEWER, "x" * 100)
    assert len(identity) < 80
    with pytest.raises(TransportConfigError):
        room_name_for("")


@pytest.mark.parametrize(("key", "secret", "ttl"), [("", SECRET, 60), (KEY, "", 60), (KEY, SECRET, 0)])
def test_invalid_issuer_settings_are_refused(key: str, secret: str, ttl: float) -> None:
    with pytest.raises(TransportConfigError):
        TokenIssuer(key, secret, join_ttl=ttl)
