"""The Python client's automatic reconnect (issue #33): the pure core (`Reconnector`) driven step by step on a
hand-held clock, and the stream's shell around it with fake links and a fake service (the real thing, two replicas
and a SIGKILL, is `tests/e2e/test_adoption.py`)."""

from __future__ import annotations

import asyncio
import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription, VideoStreamTrack

from pipeline.bidirectional import ControlState, Pause
from service.scaleout.backend import DEFAULT_ADOPTION_WAIT_S
from transport.base import ChunkStatus, DoneStatus, StateStatus, StatusMessage
from transport.client import LiveStream, SessionInfo, UnreachableError
from transport.client.errors import ConnectError
from transport.client.links import EmbeddedLink
from transport.client.reconnect import (
    RECONNECT_TIMEOUT,
    End,
    Join,
    Probe,
    Reconnector,
    ReconnectPhase,
    ReconnectPolicy,
    SessionView,
    Wait,
)
from transport.protocol import decode_control, encode_status


def _phase(core: Reconnector) -> ReconnectPhase:
    """The phase, read through a call (mypy narrows a property across the calls that change it otherwise)."""
    return core.phase


POLICY = ReconnectPolicy(budget_s=10.0, first_delay_s=0.5, max_delay_s=2.0, stall_s=3.0, probe_interval_s=1.0)
RUNNING = SessionView("running", None, None, joinable=True)
PAUSED = SessionView("paused", None, None, joinable=True)
ORPHANED = SessionView("recovering", "replica_lost", None, joinable=True)
WORKER_RECOVERING = SessionView("recovering", "worker_lost", None, joinable=True)
FAILED = SessionView("failed", "replica_lost: r1", ("replica_lost", "replica_lost: r1 (no replica adopted it)"), False)


def test_a_silent_running_session_is_joined_again_and_counted() -> None:
    core = Reconnector(POLICY, 0.0)
    core.activity(1.0)
    assert core.next_step(2.0) == Wait(4.0)  # silent for stall_s from the last frame
    assert core.next_step(4.0) == Probe()
    assert core.phase is ReconnectPhase.SUSPECT
    core.probed(4.1, RUNNING)  # the service says it runs, and nothing arrives: the connection is broken
    assert _phase(core) is ReconnectPhase.RECOVERING
    assert "nothing received for 3.1 s" in core.lost_why
    assert core.next_step(4.1) == Probe()
    core.probed(4.2, ORPHANED)
    assert core.next_step(4.2) == Join()
    core.joined(5.0)
    assert _phase(core) is ReconnectPhase.CONNECTED
    assert core.reconnects == 1
    assert core.last_recovery_s == pytest.approx(0.9)
    assert core.next_step(5.0) == Wait(8.0)  # watching again, from the join


def test_paused_draining_or_a_worker_recovering_keeps_the_connection_and_asks_again() -> None:
    core = Reconnector(POLICY, 0.0)
    assert core.next_step(3.0) == Probe()
    for now, view in ((3.0, PAUSED), (4.0, WORKER_RECOVERING), (5.0, SessionView("draining", None, None, True))):
        core.probed(now, view)
        assert core.phase is ReconnectPhase.SUSPECT
        assert core.next_step(now) == Wait(now + 1.0)
        assert core.next_step(now + 1.0) == Probe()
    core.activity(6.5)  # a frame: the session goes on over the same connection
    core.probed(6.5, PAUSED)
    assert core.phase is ReconnectPhase.CONNECTED
    assert core.reconnects == 0


def test_refused_joins_back_off_doubling_to_the_bound_and_the_budget_ends_with_the_stable_code() -> None:
    core = Reconnector(POLICY, 0.0)
    core.link_lost(1.0, "the peer connection failed", failed=True)
    assert core.phase is ReconnectPhase.RECOVERING
    tries: list[float] = []
    now = 1.0
    while True:
        step = core.next_step(now)
        if isinstance(step, End):
            break
        if isinstance(step, Wait):
            now = step.until
            continue
        assert isinstance(step, Probe)
        core.probed(now, RUNNING)
        assert core.next_step(now) == Join()
        tries.append(now)
        core.join_failed(now, "409 session_on_other_replica")
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(tries)]
    assert gaps[:4] == [0.5, 1.0, 2.0, 2.0]  # first_delay_s doubling to max_delay_s
    assert now == pytest.approx(11.0)  # budget_s after the loss
    assert step.error is not None
    assert step.error[0] == RECONNECT_TIMEOUT
    assert step.reason.startswith("connection lost: the peer connection failed; ")
    assert _phase(core) is ReconnectPhase.ENDED
    assert core.next_step(now + 5) == step


def test_a_session_that_ended_meanwhile_ends_the_stream_with_its_reason_and_code() -> None:
    core = Reconnector(POLICY, 0.0)
    core.link_lost(0.0, "the peer connection failed", failed=True)
    assert core.next_step(0.0) == Probe()
    core.probed(0.1, FAILED)
    assert core.next_step(0.1) == End("replica_lost: r1", FAILED.error)


def test_a_closed_connection_is_joined_again_only_while_the_session_is_recovering() -> None:
    # The service closes a controller's connection when another client's offer rebinds the session: taking it back
    # would make two clients take it from each other in turn.
    taken_over = Reconnector(POLICY, 0.0)
    taken_over.link_lost(1.0, "the data channel closed", failed=False)
    assert taken_over.next_step(1.0) == Probe()
    taken_over.activity(1.0)  # nothing can arrive over a closed link; a late frame does not revive it
    taken_over.probed(1.1, RUNNING)
    assert taken_over.next_step(1.1) == End("connection lost: the data channel closed", None)

    handed = Reconnector(POLICY, 0.0)
    handed.link_lost(1.0, "the data channel closed", failed=False)
    assert handed.next_step(1.0) == Probe()
    handed.probed(1.1, ORPHANED)
    assert handed.phase is ReconnectPhase.RECOVERING

    unknown = Reconnector(POLICY, 0.0)  # the service cannot be asked (the replica we talked to died): join again
    unknown.link_lost(1.0, "the data channel closed", failed=False)
    assert unknown.next_step(1.0) == Probe()
    unknown.probe_failed(1.2, "unreachable")
    assert unknown.phase is ReconnectPhase.RECOVERING
    assert unknown.next_step(1.2) == Wait(1.7)


def test_a_close_right_after_the_connection_said_recovering_is_a_hand_off_and_is_joined_again() -> None:
    # A draining replica tells `recovering` over the connection, then closes it; the replica with room may adopt
    # the session and run it before the client asks: still join again (the session was not taken by a client).
    handed = Reconnector(POLICY, 0.0)
    handed.told("recovering")
    handed.link_lost(1.0, "the peer connection closed", failed=False)
    assert handed.next_step(1.0) == Probe()
    handed.probed(1.1, RUNNING)
    assert handed.phase is ReconnectPhase.RECOVERING
    assert handed.next_step(1.1) == Probe()
    handed.probed(1.2, RUNNING)
    assert handed.next_step(1.2) == Join()
    handed.joined(1.5)
    assert (handed.phase, handed.reconnects) == (ReconnectPhase.CONNECTED, 1)

    handed.link_lost(2.0, "the data channel closed", failed=False)  # the new connection was told nothing yet
    handed.probed(2.1, RUNNING)
    assert handed.next_step(2.1) == End("connection lost: the data channel closed", None)

    back = Reconnector(POLICY, 0.0)  # recovering, then running again (a worker rebuilt it): a close is a take-over
    back.told("recovering")
    back.told("running")
    back.link_lost(1.0, "the data channel closed", failed=False)
    back.probed(1.1, RUNNING)
    assert back.next_step(1.1) == End("connection lost: the data channel closed", None)

    ended = Reconnector(POLICY, 0.0)
    ended.told("recovering")
    ended.link_lost(1.0, "the data channel closed", failed=False)
    ended.probed(1.1, FAILED)
    assert ended.next_step(1.1) == End("replica_lost: r1", FAILED.error)


def test_done_or_a_close_by_the_user_ends_it_and_bad_bounds_are_refused() -> None:
    core = Reconnector(POLICY, 0.0)
    core.ended("client_stop")
    assert core.next_step(100.0) == End("client_stop", None)
    core.link_lost(101.0, "closed", failed=True)  # after the end, nothing moves
    assert core.phase is ReconnectPhase.ENDED
    with pytest.raises(ValueError, match="budget_s must be positive"):
        ReconnectPolicy(budget_s=0)
    with pytest.raises(ValueError, match="max_delay_s"):
        ReconnectPolicy(first_delay_s=3.0, max_delay_s=1.0)


def test_the_python_client_and_the_page_give_a_lost_connection_the_same_budget() -> None:
    """One documented budget (docs/continuity.md): the replica TTL (10 s) plus the adoption wait (30 s) plus the
    adopter's rebuild and the new connection. The page's constant is read from its source."""
    source = (Path(__file__).parents[4] / "web/packages/client/src/rejoin.ts").read_text()
    found = re.search(r"export const REJOIN_BUDGET_MS = ([0-9_]+);", source)
    assert found is not None, "REJOIN_BUDGET_MS is no longer a literal in rejoin.ts: update this test"
    page_budget_s = int(found.group(1).replace("_", "")) / 1000
    assert ReconnectPolicy().budget_s == page_budget_s == 60.0
    assert ReconnectPolicy().budget_s >= DEFAULT_ADOPTION_WAIT_S + 10.0  # the default REPLICA_TTL


# -- the shell: LiveStream with fake links and a fake service ---------------------------------------------------


class FakeLink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    async def send(self, payload: bytes, *, reliable: bool) -> None:
        if self.closed:
            raise ConnectError("the control channel is not open")
        self.sent.append(payload)

    async def aclose(self) -> None:
        self.closed = True


def _body(status: str, reason: str | None = None, error: tuple[str, str] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "s1",
        "status": status,
        "reason": reason,
        "transport": {"kind": "embedded", "offer_url": "/v1/sessions/s1/webrtc"},
        "video": {"width": 8, "height": 8, "fps": 20},
    }
    if error is not None:
        body["error"] = {"code": error[0], "message": error[1]}
    return body


class FakeService:
    """Answers GET with the bodies it is given in turn (the last one repeats); a raised error as given."""

    def __init__(self, *answers: dict[str, Any] | Exception) -> None:
        self.answers = list(answers)
        self.asked = 0

    async def get(self, session_id: str) -> SessionInfo:
        self.asked += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return SessionInfo.from_body(answer)


FAST = ReconnectPolicy(budget_s=5.0, first_delay_s=0.02, max_delay_s=0.05, stall_s=0.3, probe_interval_s=0.05)


def _chunk(index: int) -> bytes:
    status = ChunkStatus(index, 0, (), first_frame_id=index)
    return encode_status(status)


async def test_a_stalled_stream_joins_again_holds_controls_meanwhile_and_its_labels_continue() -> None:
    stream = LiveStream(SessionInfo.from_body(_body("running")))
    first = FakeLink()
    stream.attach_link(first)
    links: list[FakeLink] = []
    joined = asyncio.Event()
    refusals = [ConnectError("409 session_on_other_replica")]

    async def rejoin(target: LiveStream, latest: SessionInfo) -> FakeLink:
        assert target is stream
        assert latest.transport is not None
        if refusals:
            raise refusals.pop()
        links.append(FakeLink())
        joined.set()
        return links[-1]

    seen: list[StatusMessage] = []
    recovering = asyncio.Event()
    stream.add_status_listener(seen.append)
    stream.add_status_listener(lambda m: recovering.set() if isinstance(m, StateStatus) else None)
    service = FakeService(_body("running"), UnreachableError("down"), _body("recovering", "replica_lost"))
    stream.reconnect_with(FAST, service, rejoin)  # type: ignore[arg-type]
    stream.on_status(_chunk(0))
    stream.on_frame(np.zeros((8, 8, 3), np.uint8), None, 0)
    await stream.send_keys(["w"])
    async with asyncio.timeout(5):
        await recovering.wait()  # silent for stall_s while the service says running
    held = await stream.send_keys(["w", "d"])  # held, not sent over the dead link
    await stream.send(Pause())
    async with asyncio.timeout(5):
        await joined.wait()
    assert first.closed
    assert [decode_control(payload) for payload in first.sent] == [ControlState(held - 1, frozenset({"w"}))]
    sent = [decode_control(payload) for payload in links[0].sent]
    assert sent == [ControlState(held + 1, frozenset({"w", "d"})), Pause()]  # the held keys as a newer snapshot
    stream.on_status(_chunk(5))  # the adopter went on from its checkpoint
    stream.on_frame(np.ones((8, 8, 3), np.uint8), None, 5)
    frames = [await stream.next_frame(), await stream.next_frame()]
    assert [(f.chunk.index if f and f.chunk else None) for f in frames] == [0, 5]
    stats = stream.statistics()
    assert stats.reconnects == 1
    assert stats.last_recovery_s is not None
    states = [m for m in seen if isinstance(m, StateStatus)]
    assert [s.state for s in states] == ["recovering", "recovering"]  # then as the service said: still recovering
    assert states[0].detail is not None
    assert "nothing received" in states[0].detail
    assert states[1].detail == "reconnected"
    assert stream.done is None
    await stream.aclose()
    assert links[0].closed


async def test_a_stream_whose_session_ended_while_it_was_away_ends_with_the_sessions_reason_and_code() -> None:
    stream = LiveStream(SessionInfo.from_body(_body("running")))
    stream.attach_link(FakeLink())

    async def rejoin(_stream: LiveStream, _latest: SessionInfo) -> FakeLink:
        raise AssertionError("an ended session is not joined")

    failed = _body("failed", "replica_lost: r1", ("replica_lost", "replica_lost: r1 (no replica adopted it)"))
    stream.reconnect_with(FAST, FakeService(failed), rejoin)  # type: ignore[arg-type]
    stream.on_link_lost("the peer connection failed", failed=True)
    async with asyncio.timeout(5):
        done = await stream.wait_done()
    assert done == DoneStatus("replica_lost: r1")
    assert [(e.code, e.message) for e in stream.errors] == [
        ("replica_lost", "replica_lost: r1 (no replica adopted it)")
    ]
    assert await stream.next_frame() is None
    await stream.aclose()


async def test_a_stream_that_cannot_join_again_within_its_budget_ends_with_reconnect_timeout() -> None:
    stream = LiveStream(SessionInfo.from_body(_body("running")))
    stream.attach_link(FakeLink())
    tries = 0

    async def rejoin(_stream: LiveStream, _latest: SessionInfo) -> FakeLink:
        nonlocal tries
        tries += 1
        raise ConnectError("409 session_not_running")

    policy = ReconnectPolicy(budget_s=0.4, first_delay_s=0.02, max_delay_s=0.05, stall_s=5.0, probe_interval_s=0.05)
    stream.reconnect_with(policy, FakeService(_body("recovering", "replica_lost")), rejoin)  # type: ignore[arg-type]
    stream.on_link_lost("the peer connection failed", failed=True)
    async with asyncio.timeout(5):
        done = await stream.wait_done()
    assert done.reason.startswith("connection lost: the peer connection failed; the session could not be joined")
    assert [e.code for e in stream.errors] == [RECONNECT_TIMEOUT]
    assert tries >= 3
    await stream.aclose()


class _IdleTrack(VideoStreamTrack):
    """A service's video that sends a few frames, then none (a paused session, a model resting)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent = 0

    async def recv(self) -> Any:
        if self.sent >= 3:
            await asyncio.Event().wait()
        self.sent += 1
        return await super().recv()


class _AnsweringService:
    """The offer route of a service, with a real aiortc peer connection that sends `_IdleTrack` and echoes nothing."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.offer = ""

    async def answer_offer(self, _url: str, sdp: str, *, within: float | None = None) -> str:
        self.offer = sdp
        self.pc.addTrack(_IdleTrack())
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return str(self.pc.localDescription.sdp)


class _CountingStream:
    def __init__(self) -> None:
        self.alive = 0
        self.frames = 0
        self.heard = asyncio.Event()

    def on_alive(self) -> None:
        self.alive += 1
        if self.alive >= 3:
            self.heard.set()

    def on_frame(self, *_args: object) -> None:
        self.frames += 1

    def on_status(self, _data: object) -> None: ...

    def on_link_lost(self, _why: str, *, failed: bool = False) -> None: ...


async def test_an_embedded_link_hears_the_services_sender_reports_while_no_frame_comes() -> None:
    # The liveness the reconnect reads besides frames: aiortc's video sender sends an RTCP sender report every
    # 0.5-1.5 s for as long as the peer connection lives, frames or not.
    service = _AnsweringService()
    stream = _CountingStream()
    link = await EmbeddedLink.open(
        service,  # type: ignore[arg-type]
        stream,  # type: ignore[arg-type]
        {"offer_url": "/v1/sessions/s1/webrtc"},
        host_addresses=("127.0.0.1",),
        within=10.0,
    )
    try:
        async with asyncio.timeout(15):
            await stream.heard.wait()  # three reports
        assert stream.frames <= 3  # while the video sent three frames at most
    finally:
        await link.aclose()
        await service.pc.close()


class _SlowClosingLink(FakeLink):
    """A link whose close takes a while (a peer connection's teardown on a loaded machine) and says if it finished."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = asyncio.Event()
        self.finished = False

    async def aclose(self) -> None:
        self.closing.set()
        await asyncio.sleep(0.3)
        self.closed = self.finished = True


async def test_a_lost_link_the_reconnect_is_closing_is_closed_to_the_end_by_the_streams_close() -> None:
    # The session ended while its connection was lost: the watcher drops the link and is cancelled by the user's
    # aclose() right then. The link's close must run to its end (a peer connection's close cut short leaves its
    # sockets to the garbage collector: the unclosed aiortc UDP sockets full runs saw).
    stream = LiveStream(SessionInfo.from_body(_body("running")))
    link = _SlowClosingLink()
    stream.attach_link(link)

    async def rejoin(_stream: LiveStream, _latest: SessionInfo) -> FakeLink:
        raise AssertionError("an ended session is not joined")

    stream.reconnect_with(FAST, FakeService(_body("closed", "client_stop")), rejoin)  # type: ignore[arg-type]
    stream.on_link_lost("the data channel closed")
    async with asyncio.timeout(5):
        await link.closing.wait()
    assert not link.finished
    async with asyncio.timeout(5):
        await stream.aclose()
    assert link.finished


def _bound_udp_ports() -> set[int]:
    """The local ports of this network namespace's UDP sockets bound to 127.0.0.1 (`/proc/net/udp`)."""
    ports: set[int] = set()
    for line in Path("/proc/self/net/udp").read_text().splitlines()[1:]:
        address, port = line.split()[1].split(":")
        if address == "0100007F":
            ports.add(int(port, 16))
    return ports


@pytest.mark.parametrize("steps", [1, 2, 3, 5, 8])
async def test_an_embedded_links_close_cut_short_still_closes_its_udp_sockets(steps: int) -> None:
    # The stream's close bound cancels a link's close that takes too long; aiortc's close cancelled part-way leaves
    # the ICE sockets open (the service still up: a service's close would have ended the link's transports). Cut
    # after `steps` turns of the loop (in the sender/receiver stops, the SCTP and DTLS teardown, ...; 1-5 leak without
    # the link's own socket close, 8 finds the close done), the link still closes every socket of its own: the ports
    # its offer's candidates name are no longer bound.
    service = _AnsweringService()
    link = await EmbeddedLink.open(
        service,  # type: ignore[arg-type]
        _CountingStream(),  # type: ignore[arg-type]
        {"offer_url": "/v1/sessions/s1/webrtc"},
        host_addresses=("127.0.0.1",),
        within=10.0,
    )
    try:
        offered = {int(port) for port in re.findall(r"a=candidate:\S+ \d+ udp \d+ 127\.0\.0\.1 (\d+)", service.offer)}
        held = offered & _bound_udp_ports()  # the candidate of the transport the answer's BUNDLE kept
        assert held
        closing = asyncio.ensure_future(link.aclose())
        for _ in range(steps):
            await asyncio.sleep(0)
        closing.cancel()
        await asyncio.gather(closing, return_exceptions=True)
        await asyncio.sleep(0)  # a closed datagram transport lets its socket go on the next turn
        assert not held & _bound_udp_ports()
    finally:
        await service.pc.close()
