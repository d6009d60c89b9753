"""`SessionRunner` on its own: a fake worker, a recording transport and its four callbacks, no runtime."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator
from typing import cast

from admission import AdmissionEvent
from pipeline.bidirectional import ChunkOutput, CloseMode, PortableCheckpoint
from service.runtime.config_view import config_view
from service.runtime.port import LiveSessionPort
from service.runtime.records import RuntimeTuning
from service.runtime.runner import RunnerCallbacks, SessionRunner
from service.runtime.sessions import Session, SessionBuffers, SessionState
from tests.support.fakes.world import FakeWorld
from tests.support.service_harness import FAST, RecordingTransport
from tests.support.waits import until
from transport.base import DoneStatus, StateStatus, StatusMessage


class _Observer:
    def __init__(self) -> None:
        self.chunks: list[int] = []
        self.ended: list[str] = []

    def admission_event(self, session: Session, event: AdmissionEvent) -> None:
        pass

    def enter_session(self, session: Session) -> None:
        pass

    def chunk(self, session: Session, chunk: ChunkOutput) -> None:
        self.chunks.append(chunk.index)

    def session_ended(self, session: Session) -> None:
        self.ended.append(session.id)


class _Owner:
    """What the runtime would do with the callbacks, recorded in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def callbacks(self) -> RunnerCallbacks:
        return RunnerCallbacks(
            request_close=self.request_close,
            running=lambda session: self.calls.append(("running", session.state.value)),
            release_slot=lambda session: self.calls.append(("release_slot", session.state.value)),
            ended=lambda session: self.calls.append(("ended", session.state.value)),
            set_paused=lambda session, paused: self.calls.append(("set_paused", str(paused))),
        )

    def request_close(self, session: Session, mode: CloseMode, reason: str) -> None:
        self.calls.append(("request_close", reason))
        session.request_close(mode, reason)


def _admitted(world: FakeWorld, session_id: str, *, resume: bool = False) -> Session:
    prepared = world.prepare({"fps": 10}, None)
    if resume:  # adopted: it goes on from a checkpoint (the fake world ignores what)
        prepared = dataclasses.replace(prepared, resume=object())
    session = Session(session_id, "owner", prepared, config_view(prepared.config), SessionBuffers())
    session.admitted(0)
    return session


async def test_a_runner_runs_a_session_through_its_callbacks_and_gives_the_slot_back_once() -> None:
    world = FakeWorld()
    await world.start()
    transport = RecordingTransport()
    observer = _Observer()
    owner = _Owner()
    runner = SessionRunner(transport, FAST, observer, owner.callbacks())
    session = _admitted(world, "s1")
    task = asyncio.create_task(runner.run(session, world))
    await until(lambda: session.state is SessionState.RUNNING, "the session to run", every=0)
    assert session.transport_details == {"kind": "fake", "room": "room-s1"}
    world.emit("s1", 2)
    await until(lambda: len(observer.chunks) == 2, "two chunks observed", every=0)
    transport.ports["s1"].client_gone("test")
    await asyncio.wait_for(task, 5)
    assert session.state is SessionState.CLOSED
    assert owner.calls == [
        ("running", "running"),
        ("request_close", "client_gone: test"),
        ("request_close", "completed"),  # the output reader saw the end (a no-op once closing)
        ("release_slot", "closed"),
        ("ended", "closed"),
    ]
    assert not session.holds_slot
    assert world.close_calls == [("s1", CloseMode.CANCEL)]
    assert transport.detached == [("s1", "client_gone: test")]
    assert transport.statuses["s1"][-1] == DoneStatus("client_gone")  # the stable code, without the free text


async def test_a_cancelled_runner_finishes_the_session_for_shutdown_and_still_detaches() -> None:
    world = FakeWorld()
    await world.start()
    transport = RecordingTransport()
    owner = _Owner()
    runner = SessionRunner(transport, FAST, _Observer(), owner.callbacks())
    session = _admitted(world, "s2")
    task = asyncio.create_task(runner.run(session, world))
    await until(lambda: session.state is SessionState.RUNNING, "the session to run", every=0)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert (session.state, session.reason) == (SessionState.CLOSED, "shutdown")
    assert [name for name, _ in owner.calls] == ["running", "release_slot", "ended"]
    assert world.close_calls == [("s2", CloseMode.CANCEL)]
    assert world.live == 0
    assert transport.detached == [("s2", "shutdown")]


# -- the checkpoint a successor goes on from: the last chunk the transport delivered (issue #33)


class _PacingTransport(RecordingTransport):
    """A transport that reports deliveries (`ReportsDelivery`); the test says when a chunk was delivered."""

    @property
    def reports_delivery(self) -> bool:
        return True


def _saving(owner: _Owner, saved: list[int]) -> RunnerCallbacks:
    def save(session: Session, checkpoint: PortableCheckpoint, resumable: bool) -> None:
        saved.append(checkpoint.next_chunk)
        owner.calls.append(("save_checkpoint", str(checkpoint.next_chunk)))

    return dataclasses.replace(owner.callbacks(), save_checkpoint=save)


async def _running(
    transport: RecordingTransport, saved: list[int], tuning: RuntimeTuning = FAST
) -> tuple[FakeWorld, Session, _Owner, _Observer, asyncio.Task[None]]:
    world = FakeWorld()  # a `CheckpointingService`: its checkpoint goes on after the last chunk the reader took
    await world.start()
    owner, observer = _Owner(), _Observer()
    runner = SessionRunner(transport, tuning, observer, _saving(owner, saved))
    session = _admitted(world, "s1")
    task = asyncio.create_task(runner.run(session, world))
    await until(lambda: session.state is SessionState.RUNNING, "the session to run", every=0)
    return world, session, owner, observer, task


async def test_a_chunks_checkpoint_is_saved_once_the_transport_delivered_it_and_never_after_the_close() -> None:
    transport, saved = _PacingTransport(), list[int]()
    world, session, _, observer, task = await _running(transport, saved)
    world.emit("s1", 2)
    await until(lambda: len(observer.chunks) == 2, "two chunks read", every=0)
    assert saved == []  # generated, not yet sent: a successor would skip them
    port = transport.ports["s1"]
    port.delivered(0)
    assert saved == [1]
    port.client_gone("test")  # closed with chunk 1 still in the pacer
    await asyncio.wait_for(task, 5)
    port.delivered(1)  # the pacer lets it go after the end: no stale checkpoint after the release
    assert saved == [1]
    assert session.state is SessionState.CLOSED


async def test_a_transport_without_delivery_reports_gets_each_checkpoint_as_its_chunk_is_generated() -> None:
    transport, saved = RecordingTransport(), list[int]()
    world, _, _, observer, task = await _running(transport, saved)
    world.emit("s1", 2)
    await until(lambda: len(observer.chunks) == 2, "two chunks read", every=0)
    assert saved == [1, 2]
    transport.ports["s1"].client_gone("test")
    await asyncio.wait_for(task, 5)


async def test_a_handed_off_session_lets_its_chunks_out_first_and_hands_off_after_the_last_ones_checkpoint() -> None:
    transport, saved = _PacingTransport(), list[int]()
    world, session, owner, observer, task = await _running(transport, saved)
    world.emit("s1", 3)
    await until(lambda: len(observer.chunks) == 3, "three chunks read", every=0)
    port = transport.ports["s1"]
    port.delivered(0)
    assert session.hand_off("draining")
    await until(lambda: world.close_calls == [("s1", CloseMode.CANCEL)], "the worker to stop it", every=0)
    await asyncio.sleep(0.05)
    assert not task.done()  # waiting for chunks 1 and 2 to go out; the transport is still attached
    assert transport.detached == []
    port.delivered(2)
    await asyncio.wait_for(task, 5)
    assert saved == [1, 3]  # the adopter goes on after chunk 2, the last one the client was sent
    names = [name for name, _ in owner.calls]
    assert names.index("release_slot") > names.index("save_checkpoint")  # the hand-off reads the last one
    assert transport.detached == [("s1", "handed_off")]


async def test_a_hand_off_waits_for_the_delivery_only_so_long_then_goes_on_from_what_was_sent() -> None:
    transport, saved = _PacingTransport(), list[int]()
    tuning = dataclasses.replace(FAST, hand_off_deliver_s=0.05)
    world, session, _, observer, task = await _running(transport, saved, tuning)
    world.emit("s1", 2)
    await until(lambda: len(observer.chunks) == 2, "two chunks read", every=0)
    transport.ports["s1"].delivered(0)
    assert session.hand_off("draining")
    await asyncio.wait_for(task, 5)  # chunk 1 never went out (a stuck pacer): the adopter generates it again
    assert saved == [1]


class _ReconnectingTransport(_PacingTransport):
    """A transport whose client comes back when the test says (`WaitsForClient`, as the embedded one)."""

    def __init__(self) -> None:
        super().__init__()
        self.connected = asyncio.Event()

    async def client_connected(self, session_id: str) -> None:
        await self.connected.wait()


async def test_an_adopted_sessions_chunks_are_read_once_its_client_is_back_and_none_before() -> None:
    world = FakeWorld()
    await world.start()
    transport, owner, observer = _ReconnectingTransport(), _Owner(), _Observer()
    runner = SessionRunner(transport, FAST, observer, owner.callbacks())
    session = _admitted(world, "s1", resume=True)
    task = asyncio.create_task(runner.run(session, world))
    await until(lambda: session.state is SessionState.RUNNING, "the session to run", every=0)
    world.emit("s1", 1)  # the chunk after the checkpoint: its client is not back yet
    await asyncio.sleep(0.05)
    assert observer.chunks == []  # held by the worker, not sent to nobody
    transport.connected.set()
    await until(lambda: observer.chunks == [0], "the chunk read once the client is back", every=0)
    transport.ports["s1"].client_gone("test")
    await asyncio.wait_for(task, 5)


async def test_an_adopted_session_whose_client_does_not_come_back_goes_on_after_the_bound() -> None:
    world = FakeWorld()
    await world.start()
    transport, owner, observer = _ReconnectingTransport(), _Owner(), _Observer()
    runner = SessionRunner(transport, dataclasses.replace(FAST, resume_client_wait_s=0.05), observer, owner.callbacks())
    session = _admitted(world, "s1", resume=True)
    task = asyncio.create_task(runner.run(session, world))
    await until(lambda: session.state is SessionState.RUNNING, "the session to run", every=0)
    world.emit("s1", 1)
    await until(lambda: observer.chunks == [0], "the chunk read after the bound", every=0)
    transport.ports["s1"].client_gone("test")
    await asyncio.wait_for(task, 5)


async def test_chunks_read_at_once_reach_a_waiting_subscriber_every_one_whatever_its_two_item_buffer() -> None:
    """Several chunks waiting on the worker are read at once (here an adopted session's, held until its client came
    back; a hand-off's adopter lost its first chunk this way): a subscriber waiting on the session's chunks, as the
    transport's feed does, gets each, none dropped for a buffer of two (`SessionBuffers.chunks`)."""
    world = FakeWorld()
    await world.start()
    transport, owner, observer = _ReconnectingTransport(), _Owner(), _Observer()
    runner = SessionRunner(transport, FAST, observer, owner.callbacks())
    session = _admitted(world, "s1", resume=True)
    assert SessionBuffers().chunks == 2
    got: list[int] = []
    subscription = session.chunks.subscribe()

    async def feed() -> None:
        async for item in subscription:
            got.append(item.index)

    reader = asyncio.create_task(feed())
    task = asyncio.create_task(runner.run(session, world))
    await until(lambda: session.state is SessionState.RUNNING, "the session to run", every=0)
    world.emit("s1", 4)  # all waiting on the worker when its client is back
    transport.connected.set()
    await until(lambda: observer.chunks == [0, 1, 2, 3], "the four chunks read", every=0)
    await until(lambda: len(got) + subscription.dropped == 4, "the subscriber to take or drop each", every=0)
    assert got == [0, 1, 2, 3]
    assert subscription.dropped == 0
    transport.ports["s1"].client_gone("test")
    await asyncio.wait_for(task, 5)
    subscription.close()
    await asyncio.wait_for(reader, 5)


async def test_an_adopted_session_is_told_recovering_until_it_runs_a_new_one_admitted() -> None:
    """A transport that subscribes while the session is ADMITTED (a LiveKit binding joins its room during the attach)
    tells its client the state first: for an adopted session that client followed it from its lost replica, and it is
    still recovering, not freshly admitted."""
    world = FakeWorld()
    await world.start()
    for resume, first in ((True, "recovering"), (False, "admitted")):
        session = _admitted(world, f"s-{resume}", resume=resume)
        port = LiveSessionPort(session, world, lambda *_: None, lambda *_: None)
        statuses = cast(AsyncGenerator[StatusMessage, None], port.status())  # an async generator: closed below
        async with contextlib.aclosing(statuses):
            assert await anext(statuses) == StateStatus(first)
            session.move(SessionState.RUNNING)
            assert await anext(statuses) == StateStatus("running")
