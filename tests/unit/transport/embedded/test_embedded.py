"""The embedded WebRTC transport with two real aiortc peers in-process on loopback (the test is the browser)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace

import pytest

from pipeline.bidirectional import ControlState, Pause, ResetPose, SetPrompt
from tests.support.fakes.transport_port import FakeSessionPort, make_chunk
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.fakes.webrtc_client import BrowserPeer, frame_index_of
from transport.base import ChunkStatus, DoneStatus, ErrorStatus, ReconnectKind, StateStatus
from transport.embedded.binding import EmbeddedSessionBinding, PeerPresence
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport
from transport.errors import SessionAlreadyAttachedError, SessionNotAttachedError, SignalingError, TransportClosedError
from transport.session.binding import BindingState

W, H, FPS = 96, 64, 30.0
GRACE = 8.0


@dataclass
class Setup:
    transport: EmbeddedTransport
    port: FakeSessionPort
    timers: FakeTimers


async def _generate(port: FakeSessionPort, chunk_frames: int = 4) -> None:
    """A stand-in for the model: one chunk per chunk duration, forever (the frames' content is their index)."""
    index = 0
    while True:
        port.emit_chunk(
            make_chunk(index, first_frame_index=index * chunk_frames, count=chunk_frames, width=W, height=H, fps=FPS)
        )
        index += 1
        await asyncio.sleep(chunk_frames / FPS)


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    timers = FakeTimers()
    transport = EmbeddedTransport(EmbeddedConfig(reconnect_grace=GRACE), timers=timers)
    await transport.start()
    port = FakeSessionPort("s1", width=W, height=H, fps=FPS)
    details = await transport.attach(port)
    assert details == {"kind": "embedded", "offer_url": "/v1/sessions/s1/webrtc", "data_channel": "control"}
    generator = asyncio.create_task(_generate(port))
    yield Setup(transport, port, timers)
    generator.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await generator
    await transport.aclose()


@contextlib.asynccontextmanager
async def _browser(*, with_video: bool = True) -> AsyncIterator[BrowserPeer]:
    peer = BrowserPeer(with_video=with_video)
    try:
        yield peer
    finally:
        await peer.close()


async def _frame_indices(peer: BrowserPeer, count: int, first: int = 0) -> list[int]:
    indices = []
    for _ in range(count):
        frame = await peer.next_frame()
        assert (frame.width, frame.height) == (W, H)
        indices.append(frame_index_of(frame, first=first, span=50))
    return indices


async def test_browser_gets_frames_status_and_sends_control(setup: Setup) -> None:
    async with _browser() as browser:
        answer = await browser.connect(setup.transport, "s1")
        hosts = re.findall(r"a=candidate:\S+ \d+ udp \d+ (\S+) \d+ typ host", answer)
        assert hosts
        assert set(hosts) == {"127.0.0.1"}
        indices = await _frame_indices(browser, 6)
        assert indices == sorted(indices)  # in generation order

        browser.send(ControlState(5, frozenset({"w", "j"})))
        browser.send('{"v":1,"type":"control_state","seq":4,"keys":["s"]}')  # stale: dropped
        browser.send('{"v":1,"type":"reset_pose"}')
        assert await setup.port.wait_controls(2) == [ControlState(5, frozenset({"w", "j"})), ResetPose()]
        browser.send('{"v":1,"type":"prompt","seq":1,"text":"golden dusk"}')  # prompts count apart: seq 1 is new
        browser.send('{"v":1,"type":"pause"}')
        assert (await setup.port.wait_controls(4))[2:] == [SetPrompt(1, "golden dusk"), Pause()]

        setup.port.emit_status(ChunkStatus(7, 5, ("j", "w"), {"control_to_output": 0.25}))
        status = await browser.next_status()
        # While chunk 7's frames are being paced its status waits for the first of them and carries its timestamp.
        assert isinstance(status, ChunkStatus)
        assert replace(status, first_frame_pts=None, stream_base_pts=None) == ChunkStatus(
            7, 5, ("j", "w"), {"control_to_output": 0.25}
        )
        # Frames went out before it: it names the first one, from which an aiortc receiver counts its timestamps.
        assert status.stream_base_pts is not None
        assert status.first_frame_pts is not None
        assert 0 <= status.stream_base_pts < status.first_frame_pts

        browser.send("{broken")
        error = await browser.next_status()
        assert isinstance(error, ErrorStatus)
        assert error.code == "malformed_json"
        stats = setup.transport.session_statistics("s1")
        assert (stats.control.rejected, stats.control.inbox.stale, stats.presence) == (
            1,
            1,
            PeerPresence.CONNECTED,
        )


async def test_reoffer_rebinds_to_the_same_session(setup: Setup) -> None:
    async with _browser() as first:
        await first.connect(setup.transport, "s1")
        before = await _frame_indices(first, 3)
        old_pc = setup.transport.binding("s1").peer_connection
        async with _browser() as second:
            await second.connect(setup.transport, "s1")
            assert old_pc is not None
            assert old_pc.connectionState == "closed"
            after = await _frame_indices(second, 4, first=before[-1])
            second.send(ControlState(1, frozenset({"a"})))
            assert await setup.port.wait_controls(1) == [ControlState(1, frozenset({"a"}))]
            setup.port.emit_status(StateStatus("running"))
            assert await second.next_status() == StateStatus("running")
    # The frames continue where they were: the session's pacer and chunk stream were never rebuilt.
    assert after[0] > before[-1]
    assert after == sorted(after)
    assert (setup.port.chunks_opened, setup.port.status_opened) == (1, 1)
    stats = setup.transport.session_statistics("s1")
    assert stats.offers == 2
    assert setup.port.gone == []


async def test_every_new_channel_is_told_the_current_state_once(setup: Setup) -> None:
    setup.port.emit_status(StateStatus("running"))  # before anyone connected
    async with _browser() as first:
        await first.connect(setup.transport, "s1")
        assert await first.next_status() == StateStatus("running")
        setup.port.emit_status(ChunkStatus(0, -1, (), {}))
        status = await first.next_status()  # no second copy of the state before it
        assert isinstance(status, ChunkStatus)
        assert replace(status, first_frame_pts=None, stream_base_pts=None) == ChunkStatus(0, -1, (), {})
        async with _browser() as second:
            await second.connect(setup.transport, "s1")
            assert await second.next_status() == StateStatus("running")


async def test_peer_loss_starts_the_grace_and_a_return_resumes(setup: Setup) -> None:
    async with _browser() as first:
        await first.connect(setup.transport, "s1")
        await setup.timers.wait_until(lambda: not setup.timers.live)  # connected: the join timer is gone
    # The browser closed its peer connection: the grace timer runs.
    await setup.timers.wait_until(lambda: len(setup.timers.live) == 1)
    assert setup.timers.live[0].due == pytest.approx(setup.timers.now + GRACE)
    assert setup.transport.binding("s1").presence is PeerPresence.AWAY
    setup.timers.advance(GRACE - 1)
    async with _browser() as second:
        await second.connect(setup.transport, "s1")
        await _frame_indices(second, 2, first=0)
        await setup.timers.wait_until(lambda: not setup.timers.live)
        setup.timers.advance(GRACE * 3)
        assert setup.port.gone == []
        assert setup.transport.session_statistics("s1").peer_returns == 1
        common = setup.transport.binding_statistics("s1")
        assert common.reconnects == {ReconnectKind.PEER_RETURN: 1}
        assert common.track_dropped == setup.transport.session_statistics("s1").track_dropped


async def test_a_rebind_that_never_connects_ends_the_session(setup: Setup) -> None:
    async with _browser() as first:
        await first.connect(setup.transport, "s1")
        await setup.timers.wait_until(lambda: not setup.timers.live)
        async with _browser() as second:
            await setup.transport.answer("s1", await second.offer(), "offer")  # the answer is never applied
            (timer,) = setup.timers.live
            assert timer.due == pytest.approx(setup.timers.now + GRACE)
            setup.timers.advance(GRACE)
    assert setup.port.gone == ["the client did not reconnect"]


async def test_grace_expiry_ends_the_session(setup: Setup) -> None:
    async with _browser() as browser:
        await browser.connect(setup.transport, "s1")
    await setup.timers.wait_until(lambda: len(setup.timers.live) == 1)
    setup.timers.advance(GRACE)
    assert setup.port.gone == ["the client left"]


async def test_client_that_never_offers_ends_the_session(setup: Setup) -> None:
    (timer,) = setup.timers.live
    setup.timers.advance(timer.due)
    assert setup.port.gone == ["the client never connected"]


async def test_bad_offers_are_refused(setup: Setup) -> None:
    with pytest.raises(SessionNotAttachedError):
        await setup.transport.answer("nope", "v=0", "offer")
    with pytest.raises(SignalingError, match="type 'offer'"):
        await setup.transport.answer("s1", "v=0", "answer")
    with pytest.raises(SignalingError, match="over"):
        await setup.transport.answer("s1", "a" * 70_000, "offer")
    with pytest.raises(SignalingError, match="no video"):
        await setup.transport.answer("s1", "v=0\r\nthis is not sdp\r\n", "offer")
    with pytest.raises(SignalingError, match="could not be answered: ValueError"):
        await setup.transport.answer(
            "s1", "v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 96\r\na=rtpmap:96 VP8/90000\r\n", "offer"
        )
    async with _browser(with_video=False) as no_video:
        with pytest.raises(SignalingError, match="no video"):
            await setup.transport.answer("s1", await no_video.offer(), "offer")
    stats = setup.transport.session_statistics("s1")
    assert stats.offers == 0
    assert stats.offers_rejected == 3
    assert setup.transport.statistics().offers_rejected == 5  # the three above and the two refused up front
    # The session is unharmed: a good offer still works.
    async with _browser() as browser:
        await browser.connect(setup.transport, "s1")
        await _frame_indices(browser, 1, first=0)


async def test_detach_closes_the_peer_and_refuses_more_offers(setup: Setup) -> None:
    async with _browser() as browser:
        await browser.connect(setup.transport, "s1")
        pc = setup.transport.binding("s1").peer_connection
        setup.port.emit_status(DoneStatus("closed"))  # published by the session just before it detaches
        await setup.transport.detach("s1", "closed")
        await setup.transport.detach("s1", "closed")
        assert await browser.next_status() == DoneStatus("closed")
        assert pc is not None
        assert pc.connectionState == "closed"
        async with _browser() as late:
            with pytest.raises(SessionNotAttachedError):
                await setup.transport.answer("s1", await late.offer(), "offer")
    assert setup.port.gone == []


def _state(binding: EmbeddedSessionBinding) -> BindingState:
    """The binding's state, read through a call: mypy would carry the narrowing of `assert binding.state is NEW`
    over `binding.start()` and call the next check impossible."""
    return binding.state


async def test_the_binding_state_follows_start_the_client_leaving_and_detach() -> None:
    port = FakeSessionPort("s1", width=W, height=H, fps=FPS)
    timers = FakeTimers()
    binding = EmbeddedSessionBinding(port, config=EmbeddedConfig(initial_join_timeout=30.0), timers=timers)
    assert _state(binding) is BindingState.NEW
    binding.start()
    assert _state(binding) is BindingState.LIVE
    assert binding.statistics().tasks == 4
    with pytest.raises(RuntimeError, match=r"embedded binding of session 's1' cannot move from .*LIVE to .*LIVE"):
        binding.start()
    timers.advance(30.0)
    assert port.gone == ["the client never connected"]
    assert (binding.state, binding.presence) == (BindingState.OVER, PeerPresence.GONE)
    assert not binding.closed
    await binding.aclose("client_gone")
    stats = binding.statistics()
    assert (stats.state, stats.tasks) == (BindingState.CLOSED, 0)
    assert binding.closed


async def test_a_binding_closed_before_start_is_closed() -> None:
    binding = EmbeddedSessionBinding(FakeSessionPort("s1"), config=EmbeddedConfig(), timers=FakeTimers())
    await binding.aclose("never started")
    assert binding.state is BindingState.CLOSED
    with pytest.raises(SessionNotAttachedError):
        await binding.answer("v=0")


async def test_attach_rules() -> None:
    transport = EmbeddedTransport()
    with pytest.raises(TransportClosedError):
        await transport.attach(FakeSessionPort("s1"))
    await transport.start()
    try:
        details = await transport.attach(FakeSessionPort("a b"))
        assert details["offer_url"] == "/v1/sessions/a%20b/webrtc"
        assert transport.join_details("a b") == details
        with pytest.raises(SessionAlreadyAttachedError):
            await transport.attach(FakeSessionPort("a b"))
    finally:
        await transport.aclose()
    assert transport.sessions == 0
