"""The embedded WebRTC transport under faults, through the whole service with real aiortc peers on loopback: a
peer connection that drops and comes back within the reconnect grace (the session carries on), one that stays
away past it (the session closes and its slot goes to the queue), and a peer that never consumes its data channel
(the service's buffers stay bounded)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiortc import RTCSessionDescription

from pipeline.bidirectional import ControlState
from tests.support.fakes.webrtc_client import BrowserPeer
from tests.support.fakes.world import FakeWorld
from tests.support.reliability import WAIT_S, App, running_app, samples, total, wait_status
from tests.support.waits import until
from transport.base import ChunkStatus, StateStatus
from transport.embedded.binding import PeerPresence
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport

GRACE = 1.0
_WAIT = 10.0


def _worlds(pace_s: float = 0.05) -> Any:
    return lambda settings: [FakeWorld(pace_s=pace_s, frame_size=32) for _ in range(settings.num_workers)]


@contextlib.asynccontextmanager
async def _peer() -> AsyncIterator[BrowserPeer]:
    peer = BrowserPeer()
    try:
        yield peer
    finally:
        await peer.close()


async def _join(app: App, peer: BrowserPeer, session: dict[str, Any]) -> None:
    offer = await app.client.post(
        session["transport"]["offer_url"], json={"sdp": await peer.offer(), "type": "offer"}, headers=app.headers
    )
    assert offer.status_code == 200, offer.text
    answer = offer.json()
    await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
    async with asyncio.timeout(_WAIT):
        await peer.opened.wait()


async def _next_chunk(peer: BrowserPeer) -> ChunkStatus:
    while True:
        status = await peer.next_status()
        if isinstance(status, ChunkStatus):
            return status


async def test_a_peer_that_drops_and_returns_within_the_grace_keeps_its_session() -> None:
    grace = 2 * GRACE  # room for a slow machine to set up the second peer connection in time
    transport = EmbeddedTransport(EmbeddedConfig(reconnect_grace=grace))
    async with running_app(_worlds(), transport=transport) as app:
        session = (await app.create({"config": {"fps": 20}})).json()
        sid = session["id"]
        async with _peer() as first:
            await _join(app, first, session)
            assert await first.next_status() == StateStatus("running")
            first.send(ControlState(5, frozenset({"w"})))
            seen = await _next_chunk(first)
            while seen.applied_seq != 5:
                seen = await _next_chunk(first)
        # The browser's peer connection is gone: the service notices and starts the grace.
        await until(
            lambda: transport.binding(sid).presence is PeerPresence.AWAY, "the service to see the drop", within=WAIT_S
        )
        async with _peer() as second:
            await _join(app, second, session)
            assert await second.next_status() == StateStatus("running")
            resumed = await _next_chunk(second)
            assert resumed.index > seen.index  # the same session went on: no new chunk 0
            assert resumed.applied_seq == 5  # and it still holds what the first connection sent
            second.send(ControlState(6, frozenset({"l"})))
            await until(
                lambda: ControlState(6, frozenset({"l"})) in app.workers[0].controls[sid], "control", within=WAIT_S
            )
            await asyncio.sleep(grace * 1.25)  # past the grace: a timer that was not cancelled would have fired
            assert (await app.get(sid))["status"] == "running"
            assert transport.session_statistics(sid).peer_returns == 1
            assert app.workers[0].created == [sid]  # rebound, never re-created
        assert (await app.client.delete(f"/v1/sessions/{sid}")).json()["status"] == "closed"
        text = await app.metrics()
        assert samples(text, "lingstream_transport_reconnects_total")['{kind="peer_return"}'] == 1


async def test_a_peer_that_stays_away_past_the_grace_closes_its_session_and_frees_the_slot() -> None:
    transport = EmbeddedTransport(EmbeddedConfig(reconnect_grace=GRACE))
    async with running_app(_worlds(), transport=transport, queue_size=2) as app:
        session = (await app.create({"config": {"fps": 20}})).json()
        waiting = (await app.create({"config": {"fps": 20}})).json()
        assert waiting["status"] == "queued"
        async with _peer() as peer:
            await _join(app, peer, session)
            await _next_chunk(peer)
        closed = await wait_status(app, session["id"], "closed", within=GRACE + _WAIT)
        assert closed["reason"] == "client_gone: the client left"
        await wait_status(app, waiting["id"], "running")  # the freed slot went to the queue head
        figures = await app.metrics()
        assert total(figures, "lingstream_admission_slots_retained") == 1
        assert total(figures, "lingstream_admission_slot_mismatch") == 0
        async with _peer() as late:
            refused = await app.client.post(
                session["transport"]["offer_url"], json={"sdp": await late.offer(), "type": "offer"}
            )
        assert refused.status_code == 409


async def test_a_peer_that_never_consumes_its_data_channel_leaves_the_service_buffers_bounded() -> None:
    limit = 4096
    transport = EmbeddedTransport(EmbeddedConfig(status_max_bytes=1024, status_buffer_bytes=limit))
    async with running_app(_worlds(pace_s=0.002), transport=transport) as app:
        session = (await app.create({"config": {"fps": 60}})).json()
        sid = session["id"]
        async with _peer() as peer:
            await _join(app, peer, session)
            await _next_chunk(peer)
            # From now on the browser acknowledges nothing on the data channel (a frozen or hostile client): the
            # service's SCTP association can send no more, so every status message would wait in memory.
            withheld = 0

            async def swallow(_chunk: object) -> None:
                nonlocal withheld
                withheld += 1

            assert peer.pc.sctp is not None
            peer.pc.sctp._receive_data_chunk = swallow  # type: ignore[method-assign,assignment]
            binding = transport.binding(sid)
            before = binding.statistics().outbox.sent
            await until(
                lambda: binding.statistics().outbox.sent > before + 300, "300 more status messages", within=WAIT_S
            )
            channel = binding._peer.channel if binding._peer is not None else None
            assert channel is not None
            assert withheld > 0
            assert channel.bufferedAmount <= limit
            stats = binding.statistics()
            assert stats.status_dropped_congested > 0
            assert stats.outbox.queued <= 64
            assert stats.presence is PeerPresence.CONNECTED  # the peer is still there: only its reads stopped
            frames_before = stats.pacer.frames_sent
            await until(
                lambda: binding.statistics().pacer.frames_sent > frames_before + 10, "video goes on", within=WAIT_S
            )
            server_pc = binding.peer_connection
            assert server_pc is not None
            deleted = await app.client.delete(f"/v1/sessions/{sid}")
            assert deleted.json()["status"] == "closed"
    # The app stopped right after the session ended, while its runner was still detaching the transport (the final
    # flush waits on a congested channel): the shutdown let the detach finish, so the peer connection is closed.
    ice = {transceiver.receiver.transport.transport.state for transceiver in server_pc.getTransceivers()}
    assert server_pc.sctp is not None
    assert ice | {server_pc.sctp.transport.transport.state} == {"closed"}
