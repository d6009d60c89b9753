"""A late LiveKit viewer in a spawned process of its own: joins a room with `livekit.rtc` and reports the service
participant's attributes once its `lingstream.state` reads a state (and, given `then_post`, after POSTing that URL,
the next state). The FFI never loads in the test process: its tokio threads would stay in the network namespace the
process first used it in (with the suite on xdist workers another module's, and the server then unreachable:
"Network is unreachable", or "transport timed out"), and a process that loaded it must end through
`transport.livekit.ffi_exit.exit_process`. Start it from the thread inside the test's namespace: the child is born
there."""

from __future__ import annotations

import asyncio
import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["viewer_sees"]

_WAIT_S = 30.0
_CHILD_S = 90.0


async def _sees(url: str, token: str, service: str, states: list[str], then_post: str | None) -> dict[str, str]:
    import httpx
    from livekit import rtc

    room = rtc.Room()
    changed = asyncio.Event()
    room.on("participant_attributes_changed", lambda *_: changed.set())
    room.on("participant_connected", lambda *_: changed.set())
    await room.connect(url, token, rtc.RoomOptions(auto_subscribe=False, connect_timeout=_WAIT_S))
    try:
        seen: dict[str, str] = {}
        then_status: dict[str, str] = {}
        async with asyncio.timeout(_WAIT_S):
            for number, target in enumerate(states):
                while True:
                    participant = room.remote_participants.get(service)
                    if participant is not None and participant.attributes.get("lingstream.state") == target:
                        seen = dict(participant.attributes)
                        seen["kind_is_agent"] = str(participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT)
                        break
                    changed.clear()
                    await changed.wait()
                if number == 0 and then_post is not None:
                    async with httpx.AsyncClient(timeout=10.0) as client:
                        answer = await client.post(then_post)
                    then_status["then_status"] = str(answer.status_code)
        return seen | then_status
    finally:
        await room.disconnect()


def _child(conn: Connection, url: str, token: str, service: str, states: list[str], then_post: str | None) -> None:
    from transport.livekit.ffi_exit import exit_process

    try:
        result: dict[str, Any] = {"seen": asyncio.run(_sees(url, token, service, states, then_post))}
    except BaseException as exc:  # reported to the test, whatever it is
        result = {"error": f"{type(exc).__name__}: {exc}"}
    conn.send(result)
    conn.close()
    exit_process(0)


def viewer_sees(
    url: str, token: str, service: str, state: str, *, then_post: str | None = None, then_state: str | None = None
) -> dict[str, str]:
    """The service participant's attributes as a late viewer read them once its state was `state` (with
    `then_post`: POSTed once that state was seen, then the attributes once the state is `then_state`). Each dict also
    holds `kind_is_agent` ("True"/"False") and, with `then_post`, `then_status` (the POST's HTTP status)."""
    states = [state] if then_state is None else [state, then_state]
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(send, url, token, service, states, then_post), daemon=True)
    process.start()
    send.close()
    try:
        if not receive.poll(_CHILD_S):
            raise AssertionError(f"the viewer reported nothing in {_CHILD_S} s")
        result: dict[str, Any] = receive.recv()
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join()
    assert process.exitcode == 0, f"the viewer exited {process.exitcode}"
    assert "error" not in result, result["error"]
    seen: dict[str, str] = result["seen"]
    return seen
