"""Pause and resume of one running session: who may, and the order of what happens.

A session may be paused while it runs and resumed while it is paused; asking again for the state it is in changes
nothing (both are idempotent, so a client that retries is safe). Anything else is refused with a stable code: a
session still in the queue (`SessionQueuedError`, 409 `session_queued`), or one that is not running (admitted and
not started yet, closing, ended: `SessionNotStreamingError`, 409 `session_not_running`).

Order: the model worker is told first (`Pause`: it finishes the chunk in progress, then asks for no more model time;
`Resume`: it goes on), then the session's state moves (PAUSED / RUNNING), which publishes the change to the REST
snapshot, the event stream and the client's `state` status. A worker that no longer knows the session (it is being
closed) refuses, and nothing moves. The caller (`ServiceRuntime`) starts or stops the pause deadline.
"""

from __future__ import annotations

from pipeline.bidirectional import BidirectionalService, Pause, Resume
from pipeline.errors import UnknownSessionError
from service.errors import SessionNotStreamingError, SessionQueuedError
from service.runtime.sessions import Session, SessionState

__all__ = ["set_paused"]


def set_paused(session: Session, worker: BidirectionalService, paused: bool, *, max_pause_s: float) -> bool:
    """Pause (`paused`) or resume `session` on `worker`; returns whether its state changed. Raises as the module
    docstring says."""
    verb = "paused" if paused else "resumed"
    if session.state is SessionState.QUEUED:
        raise SessionQueuedError(f"session {session.id!r} is still queued; it can be {verb} once it runs")
    wanted, current = (
        (SessionState.PAUSED, SessionState.RUNNING) if paused else (SessionState.RUNNING, SessionState.PAUSED)
    )
    closing = session.close_mode is not None
    if session.state is wanted and not closing:
        return False
    if session.state is not current or closing:
        state = "closing" if closing and not session.terminal else session.state.value
        raise SessionNotStreamingError(
            f"session {session.id!r} is {state}; only a {current.value} session can be {verb}"
        )
    try:
        worker.push_control(session.id, Pause() if paused else Resume())
    except UnknownSessionError:
        raise SessionNotStreamingError(f"session {session.id!r} is closing; it cannot be {verb}") from None
    if paused:
        session.move(SessionState.PAUSED, detail=f"paused; it closes unless resumed within {max_pause_s:g} s")
    else:
        session.move(SessionState.RUNNING)
    return True
