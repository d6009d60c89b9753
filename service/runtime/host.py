"""`RuntimeHost`: the runtime as its admission backend sees it (`service.runtime.backend.AdmissionHost`).

A narrow view, so that what only backends may do (register an adopted session, forget a handed-over one, end a
session admission lost) stays off `ServiceRuntime`'s own interface. It is told what it forwards to, like the runner:
the runtime's lifecycle and session table, its `SessionConductor`, and two functions of the runtime's (validate a
create off the loop, register a session created elsewhere).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Protocol

from admission import AdmissionEvent
from pipeline.bidirectional import CloseMode, PreparedSession
from service.runtime.conductor import SessionConductor
from service.runtime.records import LostSession, RuntimeTuning
from service.runtime.session_table import SessionTable
from service.runtime.sessions import Session
from service.runtime.state import RuntimeLifecycle
from transport.base import CallerRoom

__all__ = ["Register", "RuntimeHost"]


class Register(Protocol):
    """Builds and records a queued session created on another replica (`AdmissionHost.register`)."""

    def __call__(
        self,
        session_id: str,
        owner: str,
        prepared: PreparedSession,
        created_at: float,
        *,
        record: bool,
        max_seconds: float | None,
        caller_room: CallerRoom | None,
        webhook_url: str | None = None,
    ) -> Session: ...


class RuntimeHost:
    """An `AdmissionHost` over one runtime's parts (see the module docstring)."""

    def __init__(
        self,
        *,
        tuning: RuntimeTuning,
        lifecycle: RuntimeLifecycle,
        table: SessionTable,
        conductor: SessionConductor,
        prepare: Callable[[Mapping[str, object], bytes | None], PreparedSession],
        register: Register,
        replica_lost: Callable[[str], None],
    ) -> None:
        self._tuning = tuning
        self._lifecycle = lifecycle
        self._table = table
        self._conductor = conductor
        self._prepare = prepare
        self._register = register
        self._replica_lost = replica_lost

    @property
    def tuning(self) -> RuntimeTuning:
        return self._tuning

    @property
    def closing(self) -> bool:
        return self._lifecycle.closing

    def session(self, session_id: str) -> Session | None:
        return self._table.get(session_id)

    def queued(self) -> list[Session]:
        return self._table.queued()

    def admission_event(self, session: Session, event: AdmissionEvent) -> None:
        self._conductor.admission_event(session, event)

    def request_close(self, session: Session, mode: CloseMode, reason: str) -> None:
        self._conductor.request_close(session, mode, reason)

    def lose(self, session: Session, code: str, message: str) -> None:
        self._conductor.lose(session, code, message)

    def set_paused(self, session: Session, paused: bool) -> None:
        self._conductor.set_paused(session, paused)

    def lost_elsewhere(self, lost: LostSession) -> None:
        self._conductor.lost_elsewhere(lost)

    def replica_lost(self, replica_id: str) -> None:
        self._replica_lost(replica_id)

    def forget(self, session: Session) -> None:
        self._conductor.forget(session)

    async def prepare(self, config: Mapping[str, object], image: bytes | None) -> PreparedSession:
        """`prepare` (image bounds, the model worker's checks) in a worker thread."""
        return await asyncio.to_thread(self._prepare, config, image)

    def register(
        self,
        session_id: str,
        owner: str,
        prepared: PreparedSession,
        created_at: float,
        *,
        record: bool = False,
        max_seconds: float | None = None,
        caller_room: CallerRoom | None = None,
        webhook_url: str | None = None,
    ) -> Session:
        return self._register(
            session_id,
            owner,
            prepared,
            created_at,
            record=record,
            max_seconds=max_seconds,
            caller_room=caller_room,
            webhook_url=webhook_url,
        )
