"""`SessionIntake`: the way into the runtime's `SessionTable`, from a create request to its first answer.

A create is checked in this order: `"record": true` without a recordings directory (422), the requested time limit
against the server's (422), a shared admission that cannot be reached (503), whether the runtime accepts creates now
(503 draining or not ready: it serves, and some model worker is ready), then the reference image's header bounds and
the model worker's own validation (`prepare`, off the loop in a worker thread), and the acceptance again (the
validation took time). The session is then registered (queued) and handed to admission: a queued one is answered at
once, an admitted one once it runs or `create_wait_s` passed. A rejected create (queue full, quota, draining) leaves
the table at once. `register` is also how the admission backend records a session created on another replica
(`RuntimeHost.register`). Everything runs on the event loop except `prepare`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Mapping

from pipeline.bidirectional import PreparedSession
from service.config_records import ServiceConfig
from service.errors import (
    AdmissionUnavailableError,
    DrainingError,
    InvalidConfigError,
    MaxSecondsTooLargeError,
    NotReadyError,
    RecordingNotConfiguredError,
    SessionStartError,
    lookup,
)
from service.logs import bind_session_id
from service.runtime.backend import AdmissionBackend
from service.runtime.config_view import config_view
from service.runtime.drain import Drain
from service.runtime.health import WorkerHealth
from service.runtime.images import check_image
from service.runtime.records import RuntimeTuning
from service.runtime.session_table import SessionTable
from service.runtime.sessions import Session, SessionSnapshot, SessionState
from service.runtime.state import RuntimeLifecycle, RuntimeState
from transport.base import CallerRoom
from transport.errors import CallerTokenError, CallerTokenRefusedError, RoomInUseError, RoomNotFoundError

__all__ = ["SessionIntake"]

logger = logging.getLogger(__name__)


class SessionIntake:
    """Creates and registers the sessions of one runtime (see the module docstring). `recording` tells whether the
    runtime records sessions (a recordings directory is configured)."""

    def __init__(
        self,
        *,
        config: ServiceConfig,
        tuning: RuntimeTuning,
        lifecycle: RuntimeLifecycle,
        drain: Drain,
        workers: WorkerHealth,
        backend: AdmissionBackend,
        table: SessionTable,
        recording: bool,
    ) -> None:
        self._config = config
        self._tuning = tuning
        self._lifecycle = lifecycle
        self._drain = drain
        self._health = workers
        self._backend = backend
        self._table = table
        self._recording = recording

    async def create(
        self,
        owner: str,
        config: Mapping[str, object],
        image: bytes | None,
        *,
        caller_room: CallerRoom | None = None,
        record: bool = False,
        max_seconds: float | None = None,
        webhook_url: str | None = None,
    ) -> tuple[SessionSnapshot, bool]:
        """Validate, then admit or queue a new session; returns its snapshot and whether it was admitted at once.
        `caller_room`: the caller's LiveKit room the transport publishes the session into (checked by the route).
        `max_seconds` limits its running time (at most the server's `max_session_seconds`, which applies when it is
        None).

        Raises `InvalidConfigError` (and the image errors) for bad input, `RecordingNotConfiguredError` for `record`
        without a recordings directory, `MaxSecondsTooLargeError`, `QueueFullError`, `QuotaExceededError` (the
        owner's quota, checked with the admission decision), `DrainingError`, `NotReadyError`,
        `AdmissionUnavailableError` (a shared backend cannot be reached), or `SessionStartError` when an immediately
        admitted session failed to start.
        """
        if record and not self._recording:
            raise RecordingNotConfiguredError(
                'this service does not record sessions: "record": true needs LINGSTREAM_RECORDINGS_DIR'
            )
        limit = self._time_limit(max_seconds)
        if self._lifecycle.state is RuntimeState.SERVING and not self._backend.available:
            raise AdmissionUnavailableError("the shared admission backend is unavailable; retry shortly")
        self._check_accepting()
        prepared = await asyncio.to_thread(self.prepare, config, image)
        self._check_accepting()
        session = self.register(
            secrets.token_urlsafe(16),
            owner,
            prepared,
            None,
            record=record,
            max_seconds=limit,
            caller_room=caller_room,
            webhook_url=webhook_url,
        )
        bind_session_id(session.id)  # the rest of this request is the session's: admission's lines name it too
        try:
            queued_at = await self._backend.create(session, config, image)
        except BaseException:
            self._table.drop(session.id)  # rejected, or an outcome the backend takes back itself
            raise
        return await self._created(session, queued_at)

    async def _created(self, session: Session, queued_at: int | None) -> tuple[SessionSnapshot, bool]:
        """After admission's answer to a create: a queued session answers at once (`queued_at`, its position);
        an admitted one once it runs (or `create_wait_s` passed). Raises `SessionStartError` if it failed."""
        if queued_at is not None:
            logger.info("session %s queued at position %s", session.id, queued_at)
            return session.snapshot(), False
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._tuning.create_wait_s):
                await session.settled.wait()
        if session.state is SessionState.FAILED:
            code, message = session.failure if session.failure else ("failed", "it failed")
            room = session.caller_room
            # The caller's room went away or was taken between the route's check and the join (another replica's
            # session got there first): the caller's doing, answered as the route's check would have.
            if room is not None and code == "room_in_use":
                raise RoomInUseError(room.name)
            if room is not None and code == "room_not_found":
                raise RoomNotFoundError(room.name)
            if room is not None and code == "livekit_token_refused":
                raise CallerTokenRefusedError(message, room.name)
            if room is not None and code == "livekit_token_invalid":
                raise CallerTokenError(message)
            raise SessionStartError(f"session {session.id} was admitted but could not be started: {message}")
        return session.snapshot(), True

    def _check_accepting(self) -> None:
        if self._drain.started:
            raise DrainingError("the service is draining and admits no new sessions; retry on another instance")
        if self._lifecycle.state is not RuntimeState.SERVING:
            raise NotReadyError("the service is starting or stopping; retry shortly")
        if not self._health.any_healthy():
            raise NotReadyError("no model worker is ready; retry shortly")

    def _time_limit(self, requested: float | None) -> float | None:
        """The running-time limit of a new session: its own, which may not exceed the server's, or the server's."""
        server = self._config.max_session_seconds
        if requested is None:
            return server
        if server is not None and requested > server:
            raise MaxSecondsTooLargeError(
                f"max_seconds {requested:g} is over this service's limit of {server:g} s "
                "(LINGSTREAM_MAX_SESSION_SECONDS)"
            )
        return requested

    def prepare(self, config: Mapping[str, object], image: bytes | None) -> PreparedSession:
        """Runs in a worker thread: image header bounds, then the model worker's own validation."""
        if image is not None:
            check_image(image, self._config.limits)
        try:
            return self._health[0].prepare(config, image)
        except ValueError as exc:
            spec = lookup(exc)
            if spec is not None and spec.status < 500:
                raise
            raise InvalidConfigError(str(exc) or "invalid session config") from exc

    def register(
        self,
        session_id: str,
        owner: str,
        prepared: PreparedSession,
        created_at: float | None,
        *,
        record: bool,
        max_seconds: float | None,
        caller_room: CallerRoom | None,
        webhook_url: str | None = None,
    ) -> Session:
        """Record a new queued session (created here, or on another replica: `created_at` is then its own)."""
        session = Session(
            session_id,
            owner,
            prepared,
            config_view(prepared.config),
            self._tuning.buffers,
            max_seconds=max_seconds,
            record=record and self._recording,
            caller_room=caller_room,
            created_at=created_at,
            webhook_url=webhook_url,
        )
        self._table.add(session)
        return session
