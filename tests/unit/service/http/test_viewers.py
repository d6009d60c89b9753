"""Viewers through the real service in-process: an embedded viewer's credential, its receive-only peer connection
(aiortc plays the browsers), what it may not do, `MAX_VIEWERS` on both transports, places freed when viewers leave,
and the stable codes of every refusal."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
from aiortc import RTCSessionDescription

from pipeline.bidirectional import ControlState
from tests.support.fakes.livekit import sign_webhook, webhook_body
from tests.support.fakes.webrtc_client import BrowserPeer
from tests.support.service_harness import Harness, metric, running_service
from tests.support.waits import until
from tests.unit.service.http.test_transport_routes import ALICE, API_KEYS, BOB, KEY, PACED, SECRET, livekit_service
from transport.base import ChunkStatus, ErrorStatus, StateStatus
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport
from transport.embedded.viewers import VIEWER_CANNOT_CONTROL

_WAIT = 10.0


class WallClock:
    """The wall clock viewer credentials expire on, moved by the test."""

    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def embedded(
    max_viewers: int = 8, wall: WallClock | None = None, **settings: Any
) -> AsyncIterator[tuple[Harness, EmbeddedTransport]]:
    transport = EmbeddedTransport(EmbeddedConfig(max_viewers=max_viewers), wall=wall or WallClock())
    async with running_service(transport=transport, world=PACED, **settings) as svc:  # type: ignore[arg-type]
        yield svc, transport


@contextlib.asynccontextmanager
async def peers(count: int) -> AsyncIterator[list[BrowserPeer]]:
    made = [BrowserPeer() for _ in range(count)]
    try:
        yield made
    finally:
        for peer in made:
            await peer.close()


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def _offer(svc: Harness, peer: BrowserPeer, url: str, token: str | None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    response = await svc.client.post(url, json={"sdp": await peer.offer(), "type": "offer"}, headers=headers)
    if response.status_code == 200:
        answer = response.json()
        await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        async with asyncio.timeout(_WAIT):
            await peer.opened.wait()
    return response


async def test_an_embedded_viewer_sees_the_frames_and_status_and_cannot_control() -> None:
    async with embedded() as (svc, transport), peers(2) as (controller, viewer):
        session = (await svc.create()).json()
        sid = session["id"]
        assert (await _offer(svc, controller, session["transport"]["offer_url"], None)).status_code == 200
        minted = await svc.client.post(f"/v1/sessions/{sid}/viewers")
        assert minted.status_code == 201
        details = minted.json()
        assert details["kind"] == "embedded"
        assert details["role"] == "viewer"
        assert details["offer_url"] == f"/v1/sessions/{sid}/watch"
        assert details["expires_at"] == WallClock().now + 60
        assert (await _offer(svc, viewer, details["offer_url"], details["viewer_token"])).status_code == 200
        assert await viewer.next_status() == StateStatus("running")
        frame = await viewer.next_frame()
        assert (frame.width, frame.height) == (32, 32)

        viewer.send(ControlState(5, frozenset({"w"})))
        refused = await viewer.next_status()
        while not isinstance(refused, ErrorStatus):  # chunk statuses keep coming meanwhile
            refused = await viewer.next_status()
        assert refused.code == VIEWER_CANNOT_CONTROL
        controller.send(ControlState(6, frozenset({"l"})))
        await until(
            lambda: ControlState(6, frozenset({"l"})) in svc.world.controls[sid],
            "the control at sequence 6",
            within=_WAIT,
            every=0,
        )
        assert ControlState(5, frozenset({"w"})) not in svc.world.controls[sid]
        stats = transport.session_statistics(sid).viewers
        assert stats.controls_refused == 1
        assert stats.seats.watching == 1
        assert stats.frames_offered > 0
        text = (await svc.client.get("/metrics")).text
        assert metric(text, 'lingstream_viewers{transport="embedded"}') == 1
        assert metric(text, 'lingstream_viewers_controls_refused_total{transport="embedded"}') == 1
        assert metric(text, 'lingstream_viewers_frames_dropped_total{transport="embedded"}') == stats.frames_dropped
        # The viewer is not the controller: its peer connection did not take the controller's place.
        assert transport.binding(sid).peer_connection is not None
        assert transport.binding(sid).peer_connection is not viewer.pc


async def test_a_viewers_chunk_statuses_are_stamped_like_the_controllers() -> None:
    # The page and the Python client learn which received frame starts a chunk (and so tell keep-warm repeats from
    # generated frames) from `first_frame_pts`, and a Python client maps its frames with `stream_base_pts`: a
    # viewer's statuses carry both, the base being the first frame its own track sent.
    async with embedded() as (svc, _transport), peers(2) as (controller, viewer):
        session = (await svc.create()).json()
        assert (await _offer(svc, controller, session["transport"]["offer_url"], None)).status_code == 200
        details = (await svc.client.post(f"/v1/sessions/{session['id']}/viewers")).json()
        assert (await _offer(svc, viewer, details["offer_url"], details["viewer_token"])).status_code == 200
        assert await viewer.next_status() == StateStatus("running")
        chunks: list[ChunkStatus] = []
        while len(chunks) < 3:
            status = await viewer.next_status()
            if not isinstance(status, ChunkStatus):
                continue
            assert status.first_frame_pts is not None, status
            # The base is known once the viewer's own track sent a frame (a status just before has none).
            if status.stream_base_pts is not None:
                chunks.append(status)
        received: set[int] = set()
        for status in chunks:
            assert status.first_frame_pts is not None
            assert status.stream_base_pts is not None
            # The receiver counts pts from the first frame it got: the chunk's first frame is among them.
            wanted = status.first_frame_pts - status.stream_base_pts
            async with asyncio.timeout(_WAIT):
                while wanted not in received:
                    frame = await viewer.next_frame()
                    assert frame.pts is not None
                    received.add(frame.pts)


async def test_max_viewers_refuses_with_429_and_a_viewer_that_leaves_frees_its_place() -> None:
    wall = WallClock()
    first = BrowserPeer()
    async with embedded(max_viewers=2, wall=wall) as (svc, transport), peers(1) as (second,):
        sid = (await svc.create()).json()["id"]
        url = f"/v1/sessions/{sid}/viewers"
        one, two = (await svc.client.post(url)).json(), (await svc.client.post(url)).json()
        full = await svc.client.post(url)
        assert _error(full) == (429, "too_many_viewers")
        assert "2 viewer" in full.json()["error"]["message"]

        assert (await _offer(svc, first, one["offer_url"], one["viewer_token"])).status_code == 200
        await first.next_frame()
        assert _error(await svc.client.post(url)) == (429, "too_many_viewers")
        await first.close()  # the viewer leaves: its place is free again
        await until(
            lambda: transport.session_statistics(sid).viewers.seats.watching == 0,
            "no viewer watching",
            within=_WAIT,
            every=0,
        )
        three = await svc.client.post(url)
        assert three.status_code == 201

        # A credential never used frees its place when its time to join has passed.
        assert _error(await svc.client.post(url)) == (429, "too_many_viewers")
        wall.now += 61
        assert (await svc.client.post(url)).status_code == 201
        expired = await _offer(svc, second, two["offer_url"], two["viewer_token"])
        assert _error(expired) == (401, "viewer_token_expired")
        stats = transport.session_statistics(sid).viewers.seats
        assert (stats.limit, stats.left, stats.refused_full) == (2, 1, 3)


async def test_viewer_credentials_are_refused_with_stable_codes() -> None:
    async with embedded(api_keys=API_KEYS, queue_size=2) as (svc, _transport), peers(1) as (viewer,):
        sid = (await svc.create(headers=ALICE)).json()["id"]
        other = (await svc.create(headers=ALICE)).json()
        assert other["status"] == "queued"
        assert _error(await svc.client.post(f"/v1/sessions/{sid}/viewers")) == (401, "unauthorized")
        assert _error(await svc.client.post(f"/v1/sessions/{sid}/viewers", headers=BOB)) == (404, "session_not_found")
        assert _error(await svc.client.post(f"/v1/sessions/{other['id']}/viewers", headers=ALICE)) == (
            409,
            "session_not_running",
        )
        details = (await svc.client.post(f"/v1/sessions/{sid}/viewers", headers=ALICE)).json()
        url, token = details["offer_url"], details["viewer_token"]
        sdp = await viewer.offer()
        body = {"sdp": sdp, "type": "offer"}
        for bad in (None, "", "Basic abc", f"Bearer {token}x", "Bearer v1.00.1.zz", ALICE["Authorization"]):
            headers = {"Authorization": bad} if bad is not None else {}
            answer = await svc.client.post(url, json=body, headers=headers)
            assert _error(answer) == (401, "viewer_token_invalid"), bad
            assert answer.headers["www-authenticate"].startswith("Bearer")
        # Bound to its session: the same credential for another session is not valid.
        elsewhere = await svc.client.post(
            f"/v1/sessions/{other['id']}/watch", json=body, headers={"Authorization": f"Bearer {token}"}
        )
        assert _error(elsewhere) == (401, "viewer_token_invalid")
        bad_offer = await svc.client.post(
            url, json={"sdp": "v=0\r\nnonsense", "type": "offer"}, headers={"Authorization": f"Bearer {token}"}
        )
        assert _error(bad_offer) == (422, "invalid_request")
        # The credential is the viewer's authentication: no API key needed, and it is still good after a refusal.
        assert (await _offer(svc, viewer, url, token)).status_code == 200
        assert await viewer.next_status() == StateStatus("running")


async def test_max_viewers_on_livekit_refuses_with_429_and_a_departure_frees_a_place() -> None:
    async with livekit_service(max_viewers=2) as (svc, transport, _factory):
        created = (await svc.create()).json()
        sid, room = created["id"], created["transport"]["room"]
        url = f"/v1/sessions/{sid}/viewers"
        first, second = (await svc.client.post(url)).json(), (await svc.client.post(url)).json()
        assert first["identity"] != second["identity"]
        assert _error(await svc.client.post(url)) == (429, "too_many_viewers")

        async def hook(event: str, identity: str) -> None:
            body = webhook_body(event, room, identity)
            answer = await svc.client.post(
                "/v1/livekit/webhook", content=body, headers={"Authorization": sign_webhook(body, KEY, SECRET)}
            )
            assert answer.status_code == 200

        await hook("participant_joined", first["identity"])
        assert transport.session_statistics(sid).viewers.watching == 1
        text = (await svc.client.get("/metrics")).text
        assert metric(text, 'lingstream_viewers{transport="livekit"}') == 1
        assert "lingstream_viewers_frames_dropped_total{" not in text  # the SFU forwards to viewers, not the service
        assert _error(await svc.client.post(url)) == (429, "too_many_viewers")
        await hook("participant_left", first["identity"])
        await hook("participant_left", first["identity"])  # a repeated webhook changes nothing
        assert transport.session_statistics(sid).viewers.left == 1
        assert (await svc.client.post(url)).status_code == 201


def _stop_reading(peer: BrowserPeer) -> int:
    """Make the peer read nothing more from the network (no media, no SCTP acknowledgements, no STUN answers), as
    a frozen browser tab would; returns how many sockets were paused."""
    paused = 0
    for transceiver in peer.pc.getTransceivers():
        connection = transceiver.receiver.transport.transport._connection
        for protocol in connection._protocols:
            socket: Any = protocol.transport  # a selector datagram transport: it has pause_reading
            socket.pause_reading()
            paused += 1
    return paused


async def test_a_viewer_that_reads_nothing_does_not_slow_the_controller() -> None:
    async with embedded() as (svc, transport), peers(2) as (controller, viewer):
        session = (await svc.create()).json()
        sid = session["id"]
        assert (await _offer(svc, controller, session["transport"]["offer_url"], None)).status_code == 200
        details = (await svc.client.post(f"/v1/sessions/{sid}/viewers")).json()
        assert (await _offer(svc, viewer, details["offer_url"], details["viewer_token"])).status_code == 200
        await viewer.next_frame()
        assert _stop_reading(viewer) > 0
        before = transport.session_statistics(sid)
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(40):  # 2 s of video at the fake world's 20 frames per second
            await controller.next_frame()
        elapsed = loop.time() - started
        after = transport.session_statistics(sid)
        assert elapsed < 4.0, f"the controller got 40 frames in {elapsed:.2f} s while a viewer read nothing"
        # Frames kept being offered to the frozen viewer without waiting for it; it still holds its place.
        assert after.viewers.frames_offered - before.viewers.frames_offered >= 30
        assert after.viewers.seats.watching == 1
        assert after.pacer.dropped_late == before.pacer.dropped_late
