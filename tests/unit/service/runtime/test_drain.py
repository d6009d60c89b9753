"""`Drain` with hand-off (issue #33, docs/continuity.md): running and paused sessions are offered to `hand_off` first,
again every `hand_off_retry_s` while there is no room, until half the drain timeout; only then are the rest told the
service drains (`announce`) and waited for as before. Driven with a real `SessionTable` and `Session`s, a hand-off
callable standing in for the conductor and admission (whose own tests are the rolling restart and the Lua tests)."""

from __future__ import annotations

import asyncio

from pipeline.bidirectional import CloseMode, PreparedSession
from service.runtime.drain import Drain
from service.runtime.records import RuntimeTuning
from service.runtime.session_table import SessionTable
from service.runtime.sessions import Session, SessionBuffers, SessionState

TUNING = RuntimeTuning(hand_off_retry_s=0.01, drain_close_grace_s=0.05)


def _running(table: SessionTable, sid: str) -> Session:
    prepared = PreparedSession(config={}, width=8, height=8, fps=10.0, frame_limit=None)
    session = Session(sid, "owner", prepared, {}, SessionBuffers(snapshots=8, statuses=8, chunks=2))
    table.add(session)
    session.admitted(0)
    session.move(SessionState.RUNNING)
    return session


def _end(table: SessionTable, session: Session) -> None:
    session.move(SessionState.CLOSED, reason="done")
    table.ended(session)


async def test_sessions_with_room_are_handed_off_the_rest_retried_then_announced_and_waited_for() -> None:
    table = SessionTable(16)
    roomy, _later, never, paused, closing = (
        _running(table, s) for s in ("roomy", "later", "never", "paused", "closing")
    )
    paused.move(SessionState.PAUSED)
    closing.request_close(CloseMode.DRAIN, "client_stop")
    offers: list[str] = []
    announced = asyncio.Event()
    closes: list[tuple[str, CloseMode, str]] = []

    async def hand_off(session: Session) -> bool | None:
        offers.append(session.id)
        if session.id == "never":
            return None  # its worker cannot rebuild it
        if session.id == "later" and offers.count("later") < 3:
            return False  # no room yet
        _end(table, session)  # handed off: it leaves here
        return True

    drain = Drain(
        1.0,
        TUNING,
        table,
        lambda s, mode, reason: closes.append((s.id, mode, reason)),
        hand_off=hand_off,
        announce=announced.set,
    )
    assert drain.hands_off
    drain.begin()
    run = asyncio.create_task(drain.run())
    await asyncio.wait_for(announced.wait(), 2)
    assert offers.count("roomy") == 1
    assert offers.count("never") == 1
    assert offers.count("later") == 3  # asked again until there was room
    assert offers.count("paused") == 1  # a paused session goes too (it stays paused on its adopter)
    assert "closing" not in offers  # one whose close was asked for ends here
    assert {s.id for s in table.admitted()} == {"never", "closing"}
    assert not drain.complete
    _end(table, never)
    _end(table, closing)
    await asyncio.wait_for(run, 2)
    assert drain.complete
    assert closes == []  # they ended before the deadline: nothing was closed
    assert roomy.terminal


async def test_with_nowhere_to_go_the_drain_gives_up_at_half_its_timeout_and_closes_at_the_deadline() -> None:
    table = SessionTable(16)
    stuck = _running(table, "stuck")
    offers = 0

    async def no_room(session: Session) -> bool | None:
        nonlocal offers
        offers += 1
        return False  # admission unreachable, or no replica has a free slot

    closes: list[tuple[str, CloseMode, str]] = []
    announced = asyncio.Event()

    def request_close(session: Session, mode: CloseMode, reason: str) -> None:
        closes.append((session.id, mode, reason))
        if mode is CloseMode.CANCEL:
            _end(table, session)

    drain = Drain(0.4, TUNING, table, request_close, hand_off=no_room, announce=announced.set)
    loop = asyncio.get_running_loop()
    drain.begin()
    started = loop.time()
    run = asyncio.create_task(drain.run())
    await asyncio.wait_for(announced.wait(), 2)
    assert 0.2 <= loop.time() - started < 0.35  # half the timeout spent asking for room
    assert offers >= 5
    await asyncio.wait_for(run, 2)
    assert closes == [("stuck", CloseMode.DRAIN, "service_drain"), ("stuck", CloseMode.CANCEL, "drain_deadline")]
    assert stuck.terminal
