"""Control state across a reconnect, on both transports: "newest wins" survives the rebind.

A client that comes back (embedded: a new offer for the same session; LiveKit: the controller leaves and rejoins,
or the service itself rejoins its room) may send a snapshot older than the last one accepted before it left (a
lossy channel delivers late, or the client resends what it had queued). The session's control inbox outlives the
rebind, so that snapshot is dropped and counted instead of rolling the session's keys back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from pipeline.bidirectional import ControlMessage, ControlState
from tests.support.fakes.livekit import FakeRoomFactory
from tests.support.fakes.transport_port import FakeSessionPort
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.fakes.webrtc_client import BrowserPeer
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport
from transport.livekit.binding import LiveKitSessionBinding
from transport.livekit.config import LiveKitConfig
from transport.livekit.tokens import ParticipantRole, TokenIssuer

KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"
GRACE = 8.0


async def _controls(port: FakeSessionPort, count: int) -> list[ControlMessage]:
    return await asyncio.wait_for(port.wait_controls(count), timeout=10)


def _snapshot(seq: int, *keys: str) -> ControlState:
    return ControlState(seq, frozenset(keys))


# -- embedded WebRTC ---------------------------------------------------------------------------------------------


@pytest.fixture
async def embedded() -> AsyncIterator[tuple[EmbeddedTransport, FakeSessionPort, FakeTimers]]:
    timers = FakeTimers()
    transport = EmbeddedTransport(EmbeddedConfig(reconnect_grace=GRACE), timers=timers)
    await transport.start()
    port = FakeSessionPort("s1", width=96, height=64, fps=30.0)
    await transport.attach(port)
    try:
        yield transport, port, timers
    finally:
        await transport.aclose()


async def test_embedded_a_returning_peer_cannot_roll_control_back(
    embedded: tuple[EmbeddedTransport, FakeSessionPort, FakeTimers],
) -> None:
    transport, port, timers = embedded
    first = BrowserPeer()
    try:
        await first.connect(transport, "s1")
        first.send(_snapshot(5, "w"))
        assert await _controls(port, 1) == [_snapshot(5, "w")]
    finally:
        await first.close()
    await timers.wait_until(lambda: len(timers.live) == 1)  # the peer is away: the grace runs

    second = BrowserPeer()  # the same session, a new offer
    try:
        await second.connect(transport, "s1")
        second.send(_snapshot(3, "s"))  # older than seq 5: dropped
        second.send(_snapshot(5, "s"))  # the same seq again: a duplicate
        second.send(_snapshot(6, "a"))
        # The data channel is ordered: once seq 6 is through, 3 and 5 have been judged.
        assert await _controls(port, 2) == [_snapshot(5, "w"), _snapshot(6, "a")]
    finally:
        await second.close()
    stats = transport.session_statistics("s1")
    assert stats.peer_returns == 1
    assert (stats.control.inbox.stale, stats.control.inbox.duplicates, stats.control.inbox.last_seq) == (1, 1, 6)


# -- LiveKit ----------------------------------------------------------------------------------------------------


@pytest.fixture
async def livekit() -> AsyncIterator[tuple[LiveKitSessionBinding, FakeRoomFactory, FakeSessionPort]]:
    port = FakeSessionPort(fps=50.0)
    factory = FakeRoomFactory(KEY, SECRET)
    config = LiveKitConfig(
        url="ws://livekit.test",
        api_key=KEY,
        api_secret=SECRET,
        reconnect_grace=GRACE,
        rejoin_backoff=0.0,
        rejoin_attempts=3,
    )
    binding = LiveKitSessionBinding(
        port,
        config=config,
        room_name="lingstream-s1",
        controller_identity=TokenIssuer.new_identity(ParticipantRole.CONTROLLER, "s1"),
        service_identity=TokenIssuer.new_identity(ParticipantRole.SERVICE, "s1"),
        tokens=TokenIssuer(KEY, SECRET),
        room_factory=factory,
        timers=FakeTimers(),
    )
    await binding.start()
    try:
        yield binding, factory, port
    finally:
        await binding.aclose()


def _wire(seq: int, *keys: str) -> str:
    return json.dumps({"v": 1, "type": "control_state", "seq": seq, "keys": list(keys)})


async def test_livekit_a_rejoining_controller_cannot_roll_control_back(
    livekit: tuple[LiveKitSessionBinding, FakeRoomFactory, FakeSessionPort],
) -> None:
    binding, factory, port = livekit
    controller = binding.controller_identity
    room = factory.current
    room.participant_joins(controller)
    room.receive_data(_wire(5, "w"), controller)
    room.participant_leaves(controller)
    room.participant_joins(controller)  # back within the grace
    room.receive_data(_wire(3, "s"), controller)  # older than seq 5: dropped
    room.receive_data(_wire(6, "a"), controller)
    assert port.controls == [_snapshot(5, "w"), _snapshot(6, "a")]
    stats = binding.statistics()
    assert stats.controller_returns == 1
    assert (stats.control.inbox.stale, stats.control.inbox.last_seq) == (1, 6)


async def test_livekit_control_state_survives_the_service_rejoining_a_new_room(
    livekit: tuple[LiveKitSessionBinding, FakeRoomFactory, FakeSessionPort],
) -> None:
    binding, factory, port = livekit
    controller = binding.controller_identity
    first = factory.current
    first.participant_joins(controller)
    first.receive_data(_wire(5, "w"), controller)
    first.drop("SIGNAL_CLOSE")  # the service's connection is lost: it rejoins with a new room object
    await asyncio.wait_for(factory.wait_publishes(2), timeout=10)
    second = factory.current
    assert second is not first
    second.receive_data(_wire(4, "s"), controller)  # older than seq 5: dropped
    second.receive_data(_wire(5, "s"), controller)  # the same seq again: a duplicate
    second.receive_data(_wire(7, "d"), controller)
    assert port.controls == [_snapshot(5, "w"), _snapshot(7, "d")]
    stats = binding.statistics()
    assert stats.rejoins == 1
    assert (stats.control.inbox.stale, stats.control.inbox.duplicates, stats.control.inbox.last_seq) == (1, 1, 7)
