"""`SessionPort` for one admitted session: what a transport attaches to.

The port is a thin view over the service's `Session`: chunks and status messages come from the session's bounded
broadcasts (filled by the session's single output reader, see `service.runtime.runner`), control goes to the session's
model worker, and "client gone" asks the runtime to close the session. A transport may subscribe to `chunks()` and
`status()` any number of times (a reconnect rebinds: it subscribes again); nothing about the session changes.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

from pipeline.bidirectional import BidirectionalService, ChunkItem, CloseMode, ControlMessage, Pause, Resume, Stop
from pipeline.errors import UnknownSessionError
from service.errors import ServiceError, lookup
from service.runtime.sessions import Session, SessionState
from transport.base import CallerRoom, ResumedRoom, StateStatus, StatusMessage
from transport.errors import ControlRejectedError

__all__ = ["LiveSessionPort"]

logger = logging.getLogger(__name__)

_STEERABLE = frozenset({SessionState.RUNNING, SessionState.PAUSED, SessionState.RECOVERING, SessionState.DRAINING})

CloseRequest = Callable[[Session, CloseMode, str], None]
PauseRequest = Callable[[Session, bool], None]
"""Pause (True) or resume (False) the session; raises a `ServiceError` when it cannot (e.g. it is closing)."""


class LiveSessionPort:
    """Implements `transport.base.SessionPort` for one session on one model worker.

    - `chunks()`: from now on, bounded per subscriber, latest wins (a slow consumer skips chunks); ends when the
      session ends. With progressive decode each chunk's `ChunkPart`s come ahead of it.
    - `status()`: first the current state (a rebinding transport learns where the session is) and the standing
      `warning` if any (the session ends soon), then state changes, one `ChunkStatus` per chunk, and a final
      `ErrorStatus`/`DoneStatus`; bounded per subscriber (drop oldest); ends after `DoneStatus`.
    - `push_control()`: never blocks. A `Stop` closes the session with drain (the chunk in progress is delivered);
      `Pause`/`Resume` go to the runtime (as the REST routes do), and one it refuses raises `ControlRejectedError`
      with the error table's code; other messages go to the worker while the session runs or is paused (also while
      the service drains, until the session's close is requested) and are dropped (counted) otherwise.
    - `client_gone()`: closes the session with cancel.
    - `delivered()`: the transport's pacer let the chunks up to one go (`delivered`, given by the runner: their
      checkpoints are published for a successor, `service.runtime.delivery`).
    """

    def __init__(
        self,
        session: Session,
        worker: BidirectionalService,
        request_close: CloseRequest,
        set_paused: PauseRequest,
        *,
        delivered: Callable[[int], None] = lambda _chunk_index: None,
    ) -> None:
        self._session = session
        self._worker = worker
        self._request_close = request_close
        self._set_paused = set_paused
        self._delivered = delivered
        self.dropped_controls = 0

    @property
    def session_id(self) -> str:
        return self._session.id

    @property
    def caller_room(self) -> CallerRoom | None:
        return self._session.caller_room

    @property
    def resumed_room(self) -> ResumedRoom | None:
        return self._session.resumed_room

    @property
    def handed_off(self) -> bool:
        return self._session.handing_off

    @property
    def ends_at(self) -> float | None:
        return self._session.ends_at

    @property
    def width(self) -> int:
        return self._session.prepared.width

    @property
    def height(self) -> int:
        return self._session.prepared.height

    @property
    def fps(self) -> float:
        return self._session.prepared.fps

    @property
    def state(self) -> str:
        return self._session.state.value

    def push_control(self, message: ControlMessage) -> None:
        if isinstance(message, Stop):
            self._request_close(self._session, CloseMode.DRAIN, "client_stop")
            return
        if isinstance(message, Pause | Resume):
            try:
                self._set_paused(self._session, isinstance(message, Pause))
            except ServiceError as exc:
                spec = lookup(exc)
                code = spec.code if spec is not None else "session_not_running"
                raise ControlRejectedError(code, str(exc)) from exc
            return
        # Interactive until a close is requested: a session kept running through the service's drain still steers.
        if self._session.close_mode is not None or self._session.state not in _STEERABLE:
            self.dropped_controls += 1
            return
        try:
            self._worker.push_control(self._session.id, message)
        except UnknownSessionError:
            # The worker already forgot the session (it is closing): the same as arriving after the end.
            self.dropped_controls += 1

    async def chunks(self) -> AsyncIterator[ChunkItem]:
        with self._session.chunks.subscribe() as subscription:
            async for chunk in subscription:
                yield chunk

    async def status(self) -> AsyncIterator[StatusMessage]:
        with self._session.statuses.subscribe() as subscription:
            if not self._session.terminal:
                yield StateStatus(_told_state(self._session))
                if self._session.warning is not None:
                    yield self._session.warning
            async for message in subscription:
                yield message

    def client_gone(self, reason: str) -> None:
        logger.info("session %s: client gone (%s); closing", self._session.id, reason)
        self._request_close(self._session, CloseMode.CANCEL, f"client_gone: {reason}")

    def delivered(self, chunk_index: int) -> None:
        self._delivered(chunk_index)


def _told_state(session: Session) -> str:
    """The state a transport that subscribes tells its client first. An adopted session (it goes on from a
    checkpoint: `prepared.resume`) is ADMITTED on its adopter only until the transport attached it, moments later:
    its client, which followed it there, is told it is still `recovering` (a page after a hand-off read `recovering,
    admitted, running` and showed a fresh start between), and `running` (or `paused`) once it runs."""
    if session.state is SessionState.ADMITTED and session.prepared.resume is not None:
        return SessionState.RECOVERING.value
    return session.state.value
