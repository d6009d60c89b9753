"""The transport routes in-process: the SDP offer (an aiortc peer plays the browser), viewer tokens and webhooks
(the real LiveKit transport over the fake RoomService and scripted rooms), fresh join details on GET, the page's
static routes, and `build_transport`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiortc import RTCSessionDescription
from livekit import api

from pipeline.bidirectional import ControlState
from service.errors import SettingsError
from service.http.contract import EmbeddedJoin, EmbeddedViewer, LiveKitJoin, LiveKitViewer
from service.http.page import LIVEKIT_BUNDLE, livekit_vendor_dir
from service.settings import load_settings
from service.transports import build_transport, ice_addresses_for_host
from tests.support.fakes.livekit import FakeRoomFactory, FakeRoomService, TwirpCall, sign_webhook, webhook_body
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.fakes.webrtc_client import BrowserPeer
from tests.support.service_harness import Harness, running_service, wait_status
from tests.support.waits import until
from transport.base import StateStatus
from transport.embedded.binding import PeerPresence
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport
from transport.livekit.binding import ControllerPresence
from transport.livekit.config import LiveKitConfig
from transport.livekit.rooms import RoomManager
from transport.livekit.transport import LiveKitTransport

KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"
API_KEYS = "key-alice-0123456789abcdef,key-bob-0123456789abcdef"
ALICE = {"Authorization": "Bearer key-alice-0123456789abcdef"}
BOB = {"Authorization": "Bearer key-bob-0123456789abcdef"}
PACED = {"pace_s": 0.05, "frame_size": 32}
_WAIT = 10.0


@contextlib.asynccontextmanager
async def embedded_service(**settings: Any) -> AsyncIterator[tuple[Harness, EmbeddedTransport]]:
    transport = EmbeddedTransport(EmbeddedConfig())
    async with running_service(transport=transport, world=PACED, **settings) as svc:  # type: ignore[arg-type]
        yield svc, transport


@contextlib.asynccontextmanager
async def livekit_service(
    max_viewers: int = 8, room_service: FakeRoomService | None = None, **settings: Any
) -> AsyncIterator[tuple[Harness, LiveKitTransport, FakeRoomFactory]]:
    """The service on the LiveKit transport, its RoomService the fake `room_service` (a fresh one by default)."""
    server = room_service if room_service is not None else FakeRoomService(KEY, SECRET)
    url = await server.start()
    factory = FakeRoomFactory(KEY, SECRET)
    config = LiveKitConfig(
        url=url, client_url="wss://livekit.example", api_key=KEY, api_secret=SECRET, max_viewers=max_viewers
    )
    transport = LiveKitTransport(config, room_factory=factory, timers=FakeTimers())
    try:
        async with running_service(transport=transport, world=PACED, **settings) as svc:  # type: ignore[arg-type]
            yield svc, transport, factory
    finally:
        await server.close()


@contextlib.asynccontextmanager
async def browser(**kwargs: Any) -> AsyncIterator[BrowserPeer]:
    peer = BrowserPeer(**kwargs)
    try:
        yield peer
    finally:
        await peer.close()


async def offer_over_http(
    svc: Harness, peer: BrowserPeer, url: str, headers: dict[str, str] | None = None
) -> httpx.Response:
    """POST the peer's offer to `url`; on 200 apply the answer and wait for the control channel to open."""
    response = await svc.client.post(url, json={"sdp": await peer.offer(), "type": "offer"}, headers=headers)
    if response.status_code == 200:
        answer = response.json()
        await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        async with asyncio.timeout(_WAIT):
            await peer.opened.wait()
    return response


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# -- embedded WebRTC ------------------------------------------------------------------------------------------------


async def test_an_offer_is_answered_and_the_browser_gets_frames_status_and_sends_control() -> None:
    async with embedded_service() as (svc, transport):
        created = await svc.create({"config": {"fps": 10}})
        assert created.status_code == 201
        body = created.json()
        session = body["id"]
        assert body["transport"] == {
            "kind": "embedded",
            "offer_url": f"/v1/sessions/{session}/webrtc",
            "data_channel": "control",
        }
        async with browser() as peer:
            answered = await offer_over_http(svc, peer, body["transport"]["offer_url"])
            assert answered.status_code == 200
            assert answered.json()["type"] == "answer"
            assert "a=candidate:" in answered.json()["sdp"]
            assert await peer.next_status() == StateStatus("running")
            frame = await peer.next_frame()
            assert (frame.width, frame.height) == (32, 32)
            peer.send(ControlState(3, frozenset({"w"})))
            await until(
                lambda: ControlState(3, frozenset({"w"})) in svc.world.controls[session],
                "the control at sequence 3",
                within=_WAIT,
                every=0,
            )
            assert transport.session_statistics(session).presence is PeerPresence.CONNECTED
            again = (await svc.client.get(f"/v1/sessions/{session}")).json()
            assert again["transport"] == body["transport"]


async def test_a_new_offer_rebinds_the_same_session_to_the_new_peer() -> None:
    async with embedded_service() as (svc, transport):
        session = (await svc.create()).json()["id"]
        url = f"/v1/sessions/{session}/webrtc"
        async with browser() as first:
            assert (await offer_over_http(svc, first, url)).status_code == 200
            await first.next_frame()
            old = transport.binding(session).peer_connection
            async with browser() as second:
                assert (await offer_over_http(svc, second, url)).status_code == 200
                assert old is not None
                assert old.connectionState == "closed"
                await second.next_frame()
                second.send(ControlState(9, frozenset({"l"})))
                await until(
                    lambda: ControlState(9, frozenset({"l"})) in svc.world.controls[session],
                    "the control at sequence 9",
                    within=_WAIT,
                    every=0,
                )
        assert transport.session_statistics(session).offers == 2
        assert svc.world.created == [session]  # rebound, never re-created
        assert (await svc.client.get(f"/v1/sessions/{session}")).json()["status"] == "running"


async def test_offers_are_refused_with_clear_codes() -> None:
    async with embedded_service(api_keys=API_KEYS, queue_size=2) as (svc, _transport):
        session = (await svc.create(headers=ALICE)).json()["id"]
        queued = (await svc.create(headers=ALICE)).json()
        assert queued["status"] == "queued"
        url = f"/v1/sessions/{session}/webrtc"
        async with browser() as peer, browser(with_video=False) as audio_less:
            sdp = await peer.offer()
            assert _error(await svc.client.post(url, json={"sdp": sdp, "type": "offer"})) == (401, "unauthorized")
            assert _error(await svc.client.post(url, json={"sdp": sdp, "type": "offer"}, headers=BOB)) == (
                404,
                "session_not_found",
            )
            unknown = await svc.client.post(
                "/v1/sessions/nope/webrtc", json={"sdp": sdp, "type": "offer"}, headers=ALICE
            )
            assert _error(unknown) == (404, "session_not_found")
            waiting = await svc.client.post(
                f"/v1/sessions/{queued['id']}/webrtc", json={"sdp": sdp, "type": "offer"}, headers=ALICE
            )
            assert waiting.status_code == 409
            assert waiting.json()["error"]["code"] == "session_not_running"
            assert "queued" in waiting.json()["error"]["message"]
            for bad in ({"sdp": sdp, "type": "answer"}, {"type": "offer"}, {"sdp": sdp, "type": "offer", "x": 1}):
                assert _error(await svc.client.post(url, json=bad, headers=ALICE)) == (422, "invalid_request"), bad
            garbage = await svc.client.post(url, json={"sdp": "v=0\r\nnonsense", "type": "offer"}, headers=ALICE)
            assert _error(garbage) == (422, "invalid_request")
            no_video = await svc.client.post(
                url, json={"sdp": await audio_less.offer(), "type": "offer"}, headers=ALICE
            )
            assert _error(no_video) == (422, "invalid_request")
            assert "video" in no_video.json()["error"]["message"]
            as_form = await svc.client.post(
                url, content=b"sdp=x", headers={**ALICE, "content-type": "application/x-www-form-urlencoded"}
            )
            assert _error(as_form) == (415, "unsupported_media_type")
            assert (await offer_over_http(svc, peer, url, headers=ALICE)).status_code == 200

        deleted = await svc.client.delete(f"/v1/sessions/{session}", headers=ALICE)
        assert deleted.json()["status"] == "closed"
        async with browser() as late:
            ended = await svc.client.post(url, json={"sdp": await late.offer(), "type": "offer"}, headers=ALICE)
        assert ended.status_code == 409
        assert "ended" in ended.json()["error"]["message"]


async def test_offers_need_the_embedded_transport() -> None:
    async with running_service() as svc, browser() as peer:
        session = (await svc.create()).json()["id"]
        sdp = await peer.offer()
        off = await svc.client.post(f"/v1/sessions/{session}/webrtc", json={"sdp": sdp, "type": "offer"})
        assert _error(off) == (404, "not_found")
        assert "embedded" in off.json()["error"]["message"]
    async with livekit_service() as (svc, _transport, _factory), browser() as peer:
        session = (await svc.create()).json()["id"]
        other = await svc.client.post(
            f"/v1/sessions/{session}/webrtc", json={"sdp": await peer.offer(), "type": "offer"}
        )
        assert other.status_code == 409
        assert "LiveKit" in other.json()["error"]["message"]


async def test_webhooks_need_livekit_and_viewers_need_a_transport() -> None:
    async with running_service() as svc:
        session = (await svc.create()).json()["id"]
        assert _error(await svc.client.post(f"/v1/sessions/{session}/viewers")) == (404, "not_found")
    async with embedded_service() as (svc, _transport):
        hook = await svc.client.post("/v1/livekit/webhook", content=b"{}", headers={"Authorization": "x"})
        assert _error(hook) == (404, "not_found")


# -- LiveKit --------------------------------------------------------------------------------------------------------


def _claims(token: object) -> Any:
    assert isinstance(token, str)
    return api.TokenVerifier(KEY, SECRET).verify(token)


async def test_get_returns_fresh_livekit_join_details_for_the_same_identity() -> None:
    async with livekit_service() as (svc, _transport, _factory):
        created = (await svc.create()).json()
        joined = created["transport"]
        assert joined["kind"] == "livekit"
        assert joined["url"] == "wss://livekit.example"
        fresh = (await svc.client.get(f"/v1/sessions/{created['id']}")).json()["transport"]
        assert fresh["identity"] == joined["identity"]
        assert fresh["room"] == joined["room"]
        assert fresh["expires_at"] >= joined["expires_at"]
        claims = _claims(fresh["token"])
        assert claims.identity == joined["identity"]
        assert claims.video.room == joined["room"]


async def test_viewer_tokens_are_subscribe_only_and_owner_scoped() -> None:
    async with livekit_service(api_keys=API_KEYS, queue_size=2) as (svc, _transport, _factory):
        created = (await svc.create(headers=ALICE)).json()
        session = created["id"]
        queued = (await svc.create(headers=ALICE)).json()["id"]
        minted = await svc.client.post(f"/v1/sessions/{session}/viewers", headers=ALICE)
        assert minted.status_code == 201
        viewer = minted.json()
        assert viewer["room"] == created["transport"]["room"]
        assert viewer["identity"].startswith("view-")
        assert viewer["identity"] != created["transport"]["identity"]
        assert "control_topic" not in viewer
        grants = _claims(viewer["token"]).video
        assert (grants.can_subscribe, grants.can_publish, grants.can_publish_data) == (True, False, False)
        assert grants.room == viewer["room"]

        assert _error(await svc.client.post(f"/v1/sessions/{session}/viewers")) == (401, "unauthorized")
        assert _error(await svc.client.post(f"/v1/sessions/{session}/viewers", headers=BOB)) == (
            404,
            "session_not_found",
        )
        assert _error(await svc.client.post("/v1/sessions/nope/viewers", headers=ALICE)) == (404, "session_not_found")
        assert (await svc.client.post(f"/v1/sessions/{queued}/viewers", headers=ALICE)).status_code == 409


async def test_webhooks_are_verified_by_signature_without_an_api_key() -> None:
    async with livekit_service(api_keys=API_KEYS) as (svc, transport, factory):
        created = (await svc.create(headers=ALICE)).json()
        session, details = created["id"], created["transport"]
        controller = details["identity"]
        factory.current.participant_joins(controller)
        assert transport.session_statistics(session).controller is ControllerPresence.PRESENT

        body = webhook_body("participant_left", details["room"], controller)
        forged = sign_webhook(body, KEY, "another-secret-that-is-long-enough-0123456789")
        rejected = await svc.client.post(
            "/v1/livekit/webhook", content=body, headers={"Authorization": forged, **_WEBHOOK}
        )
        assert _error(rejected) == (401, "unauthorized")
        unsigned = await svc.client.post("/v1/livekit/webhook", content=body, headers=_WEBHOOK)
        assert _error(unsigned) == (401, "unauthorized")
        tampered = await svc.client.post(
            "/v1/livekit/webhook",
            content=body.replace("participant_left", "participant_joined"),
            headers={"Authorization": sign_webhook(body, KEY, SECRET), **_WEBHOOK},
        )
        assert _error(tampered) == (401, "unauthorized")
        assert transport.session_statistics(session).controller is ControllerPresence.PRESENT

        factory.current.remote.discard(controller)  # the room no longer has it either
        accepted = await svc.client.post(
            "/v1/livekit/webhook", content=body, headers={"Authorization": sign_webhook(body, KEY, SECRET), **_WEBHOOK}
        )
        assert accepted.status_code == 200
        assert accepted.json() == {"received": True}
        assert transport.session_statistics(session).controller is ControllerPresence.AWAY
        assert transport.statistics().webhooks_rejected == 3

        finished = webhook_body("room_finished", details["room"])
        answer = await svc.client.post(
            "/v1/livekit/webhook",
            content=finished,
            headers={"Authorization": sign_webhook(finished, KEY, SECRET), **_WEBHOOK},
        )
        assert answer.status_code == 200
        svc.headers = ALICE
        closed = await wait_status(svc, session, "closed", within=_WAIT)
        assert closed["reason"].startswith("client_gone")


_WEBHOOK = {"content-type": "application/webhook+json"}


# -- the page -------------------------------------------------------------------------------------------------------


async def test_the_page_and_its_modules_are_served_without_an_api_key() -> None:
    async with embedded_service(api_keys=API_KEYS) as (svc, _transport):
        index = await svc.client.get("/")
        assert index.status_code == 200
        assert index.headers["content-type"].startswith("text/html")
        assert '<script type="module" src="/static/app.js">' in index.text
        for name in ("app.js", "lingstream-client.js"):  # the page and its build of @lingstream/client (issue #36)
            module = await svc.client.get(f"/static/{name}")
            assert module.status_code == 200, name
            assert module.headers["content-type"].startswith("text/javascript"), name
        assert (await svc.client.get("/static/style.css")).headers["content-type"].startswith("text/css")
        assert _error(await svc.client.get("/static/missing.js")) == (404, "not_found")
        assert _error(await svc.client.get("/static/../api.py")) == (404, "not_found")
        config = (await svc.client.get("/page-config.json")).json()
        assert config["transport"] == "embedded"
        assert config["api_keys"] is True
        paths = (await svc.client.get("/openapi.json")).json()["paths"]
        assert "/" not in paths
        assert {"/v1/sessions/{session_id}/webrtc", "/v1/sessions/{session_id}/viewers", "/v1/livekit/webhook"} <= set(
            paths
        )


async def test_the_livekit_bundle_comes_from_the_vendor_dir(tmp_path: Path) -> None:
    (tmp_path / LIVEKIT_BUNDLE).write_text("export const Room = class {};\n")
    async with running_service(web_vendor_dir=str(tmp_path)) as svc:
        config = (await svc.client.get("/page-config.json")).json()
        assert config == {
            "transport": None,
            "livekit_client": f"/vendor/livekit-client/{LIVEKIT_BUNDLE}",
            "api_keys": False,
            "token_url": None,
        }
        bundle = await svc.client.get(config["livekit_client"])
        assert bundle.status_code == 200
        assert bundle.headers["content-type"].startswith("text/javascript")
        assert "Room" in bundle.text
    empty = tmp_path / "empty"
    empty.mkdir()
    async with running_service(web_vendor_dir=str(empty)) as svc:
        assert (await svc.client.get("/page-config.json")).json()["livekit_client"] is None
        assert _error(await svc.client.get(f"/vendor/livekit-client/{LIVEKIT_BUNDLE}")) == (404, "not_found")


def test_the_checkout_bundle_is_found_when_npm_installed_it() -> None:
    found = livekit_vendor_dir(None)
    checkout = Path(__file__).resolve().parents[4] / "web" / "node_modules" / "livekit-client" / "dist"
    if not (checkout / LIVEKIT_BUNDLE).is_file():
        pytest.skip("web/node_modules has no livekit-client (scripts/setup.sh installs it with npm)")
    assert found == checkout


# -- build_transport ------------------------------------------------------------------------------------------------


def test_build_transport_is_embedded_without_livekit_and_follows_the_bind_address() -> None:
    embedded = build_transport(load_settings())
    assert isinstance(embedded, EmbeddedTransport)
    assert embedded.config.ice_host_addresses == ("127.0.0.1",)
    assert embedded.config.reconnect_grace == 20.0
    everywhere = build_transport(load_settings(host="0.0.0.0", reconnect_grace=7))
    assert isinstance(everywhere, EmbeddedTransport)
    assert everywhere.config.ice_host_addresses is None
    assert everywhere.config.reconnect_grace == 7.0
    assert ice_addresses_for_host("10.1.2.3") == ("10.1.2.3",)
    assert ice_addresses_for_host("::") is None
    assert ice_addresses_for_host("localhost") == ("127.0.0.1",)
    assert ice_addresses_for_host("lingstream.internal") is None


def test_build_transport_is_livekit_with_all_three_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIVEKIT_URL", "ws://127.0.0.1:7880")
    monkeypatch.setenv("LIVEKIT_API_KEY", KEY)
    monkeypatch.setenv("LIVEKIT_API_SECRET", SECRET)
    monkeypatch.setenv("LINGSTREAM_VIDEO_CODEC", "h264")
    monkeypatch.setenv("LINGSTREAM_VIDEO_BITRATE", "750000")
    monkeypatch.setenv("LINGSTREAM_RECONNECT_GRACE", "9")
    transport = build_transport(load_settings())
    assert isinstance(transport, LiveKitTransport)
    config = transport.config
    assert (config.url, config.api_key, config.api_secret) == ("ws://127.0.0.1:7880", KEY, SECRET)
    assert (config.codec, config.max_bitrate, config.reconnect_grace) == ("h264", 750_000, 9.0)
    monkeypatch.delenv("LIVEKIT_API_SECRET")
    with pytest.raises(SettingsError, match="LIVEKIT_API_SECRET"):
        build_transport(load_settings())


async def test_a_create_may_name_the_callers_livekit_room_with_stable_codes_for_what_cannot_be() -> None:
    async with livekit_service() as (svc, transport, factory):
        rooms = RoomManager(transport.config.url, KEY, SECRET)
        await rooms.start()
        try:
            missing = await svc.create({"livekit": {"room": "lobby-404"}})
            assert _error(missing) == (422, "room_not_found")
            assert "lobby-404" in missing.json()["error"]["message"]
            assert (await svc.client.get("/v1/sessions")).json()["sessions"] == []  # nothing took a place
            assert _error(await svc.create({"livekit": {"room": ""}})) == (422, "invalid_request")
            assert _error(await svc.create({"livekit": {"room": "lobby-7", "colour": "red"}})) == (
                422,
                "invalid_request",
            )

            await rooms.create_room("lobby-7")
            created = await svc.create({"livekit": {"room": "lobby-7", "controller_identity": "user-42"}})
            assert created.status_code == 201, created.text
            details = created.json()["transport"]
            assert (details["room"], details["identity"], details["token"]) == ("lobby-7", "user-42", None)
            assert details["room_owner"] == "caller"
            assert _claims(factory.current.connects[0][1]).video.room == "lobby-7"
            fresh = (await svc.client.get(f"/v1/sessions/{created.json()['id']}")).json()["transport"]
            assert (fresh["identity"], fresh["token"]) == ("user-42", None)
            busy = await svc.create({"livekit": {"room": "lobby-7"}})
            assert _error(busy) == (409, "room_in_use")

            ended = await svc.client.delete(f"/v1/sessions/{created.json()['id']}", params={"mode": "cancel"})
            assert ended.status_code in (200, 202)
            await wait_status(svc, created.json()["id"], "closed")
            assert await rooms.room_exists("lobby-7")  # left, not deleted
        finally:
            await rooms.aclose()


@pytest.mark.parametrize("taken_at_listing", [2, 3])
async def test_a_callers_room_taken_by_another_replica_after_the_check_answers_room_in_use(
    taken_at_listing: int,
) -> None:
    # The route's check lists the room (1), attach lists it before joining (2) and after (3). Another replica's
    # session appears after the route's check: attach refuses (2), or it joined first and we leave (3). Either way
    # the create answers what the route's check would have, and the session is failed with that code.
    server = FakeRoomService(KEY, SECRET)
    server.rooms["lobby-7"] = api.Room(name="lobby-7", sid="RM_lobby-7")
    listings = 0

    def before(call: TwirpCall) -> None:
        nonlocal listings
        if call.method == "ListParticipants":
            listings += 1
            if listings == taken_at_listing:
                server.participants["lobby-7"] = ["svc-elsewhere-1"]  # joined at 0 ms: before anyone here

    server.before = before
    async with livekit_service(room_service=server) as (svc, transport, factory):
        taken = await svc.create({"livekit": {"room": "lobby-7"}})
        assert _error(taken) == (409, "room_in_use")
        assert listings == taken_at_listing
        (session,) = (await svc.client.get("/v1/sessions")).json()["sessions"]
        assert (session["status"], session["error"]["code"]) == ("failed", "room_in_use")
        assert transport.statistics().sessions == 0
        assert [room.disconnects for room in factory.rooms] == ([] if taken_at_listing == 2 else [1])
        assert (await svc.client.get("/healthz")).status_code == 200


async def test_a_callers_room_needs_the_livekit_transport() -> None:
    async with embedded_service() as (svc, _transport):
        refused = await svc.create({"livekit": {"room": "lobby-7"}})
        assert _error(refused) == (422, "invalid_request")
        assert "LiveKit" in refused.json()["error"]["message"]


# -- the typed contract (service.http.contract) ------------------------------------------------------------------


async def test_the_join_and_viewer_details_of_both_transports_are_what_the_schema_types() -> None:
    async with embedded_service() as (svc, _transport):
        created = (await svc.create()).json()
        await wait_status(svc, created["id"], "running")
        body = (await svc.client.get(f"/v1/sessions/{created['id']}")).json()
        EmbeddedJoin.model_validate(body["transport"])
        viewer = await svc.client.post(f"/v1/sessions/{created['id']}/viewers")
        assert viewer.status_code == 201
        EmbeddedViewer.model_validate(viewer.json())
        schema = (await svc.client.get("/openapi.json")).json()
    async with livekit_service() as (svc, _transport, _factory):
        created = (await svc.create()).json()
        LiveKitJoin.model_validate(created["transport"])
        fresh = (await svc.client.get(f"/v1/sessions/{created['id']}")).json()
        LiveKitJoin.model_validate(fresh["transport"])
        viewer = await svc.client.post(f"/v1/sessions/{created['id']}/viewers")
        assert viewer.status_code == 201
        LiveKitViewer.model_validate(viewer.json())
    components = schema["components"]["schemas"]
    assert {"LiveKitJoin", "EmbeddedJoin", "LiveKitViewer", "EmbeddedViewer", "ControlStatus"} <= set(components)
    transport = components["SessionBody"]["properties"]["transport"]["anyOf"][0]
    assert transport["discriminator"]["mapping"] == {
        "livekit": "#/components/schemas/LiveKitJoin",
        "embedded": "#/components/schemas/EmbeddedJoin",
    }
    answer = schema["paths"]["/v1/sessions/{session_id}/viewers"]["post"]["responses"]["201"]
    assert answer["content"]["application/json"]["schema"]["discriminator"]["propertyName"] == "kind"
