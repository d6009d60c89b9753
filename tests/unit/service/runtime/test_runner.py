"""`SessionRunner` on its own: a fake worker, a recording transport and its four callbacks, no runtime."""

from __future__ import annotations

import asyncio

from admission import AdmissionEvent
from pipeline.bidirectional import ChunkOutput, CloseMode
from service.runtime.config_view import config_view
from service.runtime.runner import RunnerCallbacks, SessionRunner
from service.runtime.sessions import Session, SessionBuffers, SessionState
from tests.support.fakes.world import FakeWorld
from tests.support.service_harness import FAST, RecordingTransport
from tests.support.waits import until
from transport.base import DoneStatus


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


def _admitted(world: FakeWorld, session_id: str) -> Session:
    prepared = world.prepare({"fps": 10}, None)
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
