"""`Ownership`: the sessions this replica runs for the shared admission, from admission until their slot went back.

A ticket admitted onto this replica's slot is *owned* here: if another replica took its create, it is first
*adopted* (its payload read, the runtime asked to `prepare` it again and `register` the `Session`); then one writer
task per session publishes every status change to the registry (always the newest snapshot) and, after the
terminal one, releases the slot, so that any replica reading at the release sees the end. A close request that
arrives while the session is being adopted waits here and is applied once it is registered. A session that ended
here because the replica drains and hands it off (`Session.handing_off`) is not released: its last checkpoint is
written, then admission orphans it for another replica to adopt (`hand_off`), its end here never published. This
is the part of `RedisAdmissionBackend` that writes; the backend's facade (`service.scaleout.backend`) routes events
and answers the registry reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

from admission import AdmissionError, AdmissionEvent, AdmissionEventKind
from pipeline.bidirectional import CloseMode
from service.errors import AdmissionUnavailableError, NotTicketOwnerError
from service.logs import session_context
from service.runtime.backend import AdmissionHost
from service.runtime.fanout import Subscription
from service.runtime.sessions import Session, SessionSnapshot, SessionState
from service.runtime.tasks import TaskSet
from service.scaleout.admission import RedisAdmission, SharedTicketView
from service.scaleout.checkpoints import CheckpointStoreError, CheckpointWriter, RedisCheckpointStore
from service.scaleout.registry import (
    body_resumed_room,
    decode_payload,
    encode_body,
    failed_body,
    payload_caller_room,
    payload_records,
)
from transport.base import ResumedRoom

__all__ = ["CALL_ERRORS", "Ownership", "adoption_down_s", "adoption_paused_s", "spawn_unless_closed"]

logger = logging.getLogger(__name__)

T = TypeVar("T")

# What a call to Redis may fail with once started: an outage, a refusal by the owner check, a closed backend.
CALL_ERRORS = (AdmissionUnavailableError, NotTicketOwnerError, AdmissionError)
HAND_OFF_RETRY_S = 0.25
"""How soon a hand-off that could not reach Redis is tried again (until the backend closes)."""


def spawn_unless_closed(tasks: TaskSet, coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T] | None:
    """Spawn `coro` on `tasks`; once they are closed (the runtime has stopped: Redis reclaims what is left on
    deregistration), log and return None."""
    try:
        return tasks.spawn(coro, name=name)
    except RuntimeError:  # closed (the coroutine was closed with it)
        logger.warning("shared admission: %s skipped after shutdown", name)
        return None


@dataclass(slots=True)
class _Owned:
    """A session this replica runs, from admission until its slot went back: the one writer of its registry
    status (`lock` orders the writes; `published` is the last sequence written)."""

    session: Session
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    published: int = -1
    writer: asyncio.Task[None] | None = None


class Ownership:
    """The owned and adopting sessions of one replica, their status writers and their releases.

    Everything runs on `tasks` (the backend's `TaskSet`, closed in its `aclose` after the writers finished). Redis
    failures are logged, never raised: a status that could not be written is written again after a reconnect
    (`republish`), a slot that could not be released is reclaimed by Redis when this replica deregisters.
    """

    def __init__(self, admission: RedisAdmission, tasks: TaskSet, checkpoints: CheckpointWriter) -> None:
        self._admission = admission
        self._tasks = tasks
        self._checkpoints = checkpoints
        self._owned: dict[str, _Owned] = {}
        self._adopting: set[str] = set()
        self._pending_closes: dict[str, CloseMode] = {}

    def knows(self, ticket_id: str) -> bool:
        """Owned here, or being adopted."""
        return ticket_id in self._adopting or ticket_id in self._owned

    def in_flight(self) -> int:
        """Slots still counted for sessions being adopted, or ended but not yet given back."""
        return len(self._adopting) + sum(1 for owned in self._owned.values() if owned.session.terminal)

    def writers(self) -> list[asyncio.Task[None]]:
        return [owned.writer for owned in self._owned.values() if owned.writer is not None]

    def own(self, session: Session) -> None:
        """The session is admitted here: start its registry writer (before its ADMITTED move, so it is written)."""
        owned = self._owned[session.id] = _Owned(session)
        subscription = session.snapshots.subscribe()
        owned.writer = spawn_unless_closed(
            self._tasks, self._write_statuses(owned, subscription), name=f"status-{session.id}"
        )
        if owned.writer is None:
            subscription.close()

    def adopt(self, host: AdmissionHost, view: SharedTicketView, *, resume: RedisCheckpointStore | None = None) -> None:
        """A ticket created on another replica was admitted onto a slot here: start it in the background. With
        `resume`, it is a running session whose replica was lost (or handed it off) adopted here: it is rebuilt from
        its checkpoint in that store and goes on where it stood (docs/continuity.md)."""
        tid = view.ticket_id
        self._adopting.add(tid)
        if spawn_unless_closed(self._tasks, self._adopt(host, view, resume), name=f"adopt-{tid}") is None:
            self._adopting.discard(tid)

    def close_when_adopted(self, ticket_id: str, mode: CloseMode) -> None:
        """A close request for a session not (yet) registered here: kept if it is being adopted, else dropped."""
        if ticket_id in self._adopting:
            self._pending_closes[ticket_id] = mode

    def release(self, session: Session) -> None:
        """The runtime is done with the session: give its slot back, after its writer published the end."""
        owned = self._owned.get(session.id)
        if owned is None or owned.writer is None or owned.writer.done():
            spawn_unless_closed(self._tasks, self._let_go(session), name=f"release-{session.id}")
        # else: its writer publishes the final status, then releases (in that order: see `_write_statuses`)

    def republish(self) -> None:
        """Contact with Redis came back (it may have lost the records): write every owned session's status again."""
        for owned in list(self._owned.values()):
            owned.published = -1
            spawn_unless_closed(self._tasks, self._publish_latest(owned), name=f"republish-{owned.session.id}")

    async def release_now(self, session_id: str) -> None:
        try:
            await self._admission.release(session_id)
        except CALL_ERRORS as exc:
            logger.warning("session %s: giving its admission slot back failed: %r", session_id, exc)
        finally:
            self._owned.pop(session_id, None)

    async def _write_statuses(self, owned: _Owned, subscription: Subscription[SessionSnapshot]) -> None:
        """The one writer of a session's registry status: on every change it writes the newest snapshot; after
        the terminal one, it gives the slot back (so that any replica reading at the release sees the end)."""
        session = owned.session
        try:
            with subscription:
                async for _ in subscription:
                    await self._publish_latest(owned)
            await self._publish_latest(owned)
        finally:
            if session.terminal:
                await self._let_go(session)

    async def _let_go(self, session: Session) -> None:
        """The session ended here: its slot goes back, or, handed off, it goes to another replica."""
        if session.handing_off:
            await self._hand_off(session)
        else:
            await self.release_now(session.id)

    async def _hand_off(self, session: Session) -> None:
        """The runner stopped the handed-off session (no chunk after its last checkpoint): once that checkpoint is
        in Redis, admission orphans it (`hand_off`), and the first replica with room adopts it from there, ahead of
        the queue. A stop its client asked for meanwhile follows it there. Through an outage the hand-off is tried
        again until the backend closes (then, this replica's liveness lapsing, the reaper orphans it all the same:
        it is marked adoptable and its checkpoint outlives the replica TTL). If admission refuses it (its
        checkpoint or request is gone), it ends `replica_lost` and its slot goes back."""
        sid = session.id
        try:
            code = await self._hand_off_call(session)
            if code == "ok":
                logger.info("session %s handed off: it waits for a replica with room to adopt it", sid)
                stop = session.stop_after_hand_off
                if stop is not None:
                    logger.info("session %s: the stop its client asked for during the hand-off follows it", sid)
                    try:
                        await self._admission.request_close(sid, stop[0].value)
                    except CALL_ERRORS as exc:
                        logger.warning("session %s: its client's stop did not reach admission: %r", sid, exc)
            elif code is not None:
                logger.warning("session %s could not be handed off (%s): it ends here", sid, code)
                self._checkpoints.discard(sid)
                if code == "no_checkpoint":
                    message = "its replica drained and could not hand it to another (no checkpoint in Redis)"
                    await self._give_back(sid, "replica_lost", message)
        finally:
            self._owned.pop(sid, None)

    async def _hand_off_call(self, session: Session) -> str | None:
        """`hand_off` once the session's newest checkpoint is written (a paused one says how long it has been
        paused, for its adopter); its code, or None on a refusal that is not an outage (logged)."""
        session_id = session.id
        while True:
            try:
                await self._checkpoints.written(session_id)
                return await self._admission.hand_off(session_id, paused_for_s=session.paused_for_s)
            except AdmissionUnavailableError as exc:
                logger.warning("session %s: hand-off not made (Redis unreachable), trying again: %r", session_id, exc)
            except CALL_ERRORS as exc:
                logger.error("session %s: hand-off refused: %r", session_id, exc)
                return None
            await asyncio.sleep(HAND_OFF_RETRY_S)

    async def _publish_latest(self, owned: _Owned) -> None:
        async with owned.lock:
            if owned.session.handing_off and owned.session.terminal:
                return  # it ended here only: the registry keeps `recovering` until its adopter runs it
            snapshot = owned.session.snapshot()
            if snapshot.sequence == owned.published or not self._admission.available:
                return  # unchanged, or Redis is away (everything is written again once it is back)
            try:
                await self._admission.publish_status(
                    snapshot.id,
                    snapshot.state.value,
                    reason=snapshot.reason,
                    body=encode_body(snapshot, webhook_url=owned.session.webhook_url),
                    paused_for_s=_paused_for(owned.session),
                )
            except NotTicketOwnerError as exc:
                logger.warning("session %s: its status cannot be published: %s", snapshot.id, exc)
            except (AdmissionUnavailableError, AdmissionError) as exc:
                logger.debug("session %s: publishing its status failed: %r", snapshot.id, exc)
                return
            owned.published = snapshot.sequence

    async def _adopt(self, host: AdmissionHost, view: SharedTicketView, resume: RedisCheckpointStore | None) -> None:
        """A session created on another replica was admitted here: rebuild it from its payload (and, with
        `resume`, its checkpoint), then run it as if it had been created here. If that fails, it is failed in the
        registry and its slot goes back."""
        tid = view.ticket_id
        began = time.monotonic()
        room: ResumedRoom | None = None
        try:
            try:
                if host.closing:
                    raise _NotAdopted("shutdown", "the replica that admitted it was shutting down")
                payload = await self._admission.take_payload(tid)
                if payload is None:
                    raise _NotAdopted("create_failed", "its request expired before a replica could start it")
                request = decode_payload(payload)
                caller_room = payload_caller_room(payload)
                record = payload_records(payload)
                prepared = await host.prepare(request.config, request.image)
                if resume is not None:
                    try:
                        checkpoint = await resume.get(tid)
                    except CheckpointStoreError as exc:
                        raise _NotAdopted("replica_lost", f"its checkpoint could not be read: {exc}") from exc
                    if checkpoint is None:
                        raise _NotAdopted("replica_lost", "its replica was lost and its checkpoint is gone")
                    prepared = dataclasses.replace(
                        prepared,
                        resume=checkpoint,
                        down_s=adoption_down_s(view, began),
                        resume_cause=view.orphan_reason or "replica_lost",
                        paused=view.paused_at is not None,
                    )
                    room = await self._resumed_room(tid)
                if host.closing:
                    raise _NotAdopted("shutdown", "the replica that admitted it was shutting down")
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                code, message = exc.args if isinstance(exc, _NotAdopted) else ("create_failed", str(exc))
                logger.warning("session %s admitted here could not be started: %s", tid, message)
                self._pending_closes.pop(tid, None)
                await self._give_back(tid, code, message)
                return
            session = host.register(
                tid,
                view.owner,
                prepared,
                view.created_at,
                record=record,
                max_seconds=request.max_seconds,
                caller_room=caller_room,
                webhook_url=request.webhook_url,
            )
            if resume is not None and room is not None:
                session.resumes_room(room)
            paused_for = adoption_paused_s(view, began) if resume is not None else None
            if paused_for is not None:
                session.handed_over_paused(paused_for)
        finally:
            self._adopting.discard(tid)
        pending = self._pending_closes.pop(tid, None)
        with session_context(tid):
            if resume is not None:
                logger.info("session %s adopted: it goes on here from its checkpoint", tid)
            else:
                logger.info("session %s (created on replica %s) adopted", tid, view.origin)
            self.own(session)
            host.admission_event(session, AdmissionEvent(AdmissionEventKind.ADMITTED, view.as_ticket_view()))
            if pending is not None:
                host.request_close(session, pending, "client_deleted")

    async def _resumed_room(self, session_id: str) -> ResumedRoom | None:
        """The LiveKit room the lost replica's session streamed in (its published join details), which the adopter
        joins again; None without one, or when the registry cannot say (the session then gets a room of its own,
        which its clients do not know: logged)."""
        try:
            current = await self._admission.get(session_id)
        except CALL_ERRORS as exc:
            logger.warning("session %s: its room could not be read back, it gets a new one: %r", session_id, exc)
            return None
        return body_resumed_room(current.body)

    async def _give_back(self, session_id: str, code: str, message: str) -> None:
        """An admitted ticket this replica will not run: recorded as failed (closed at shutdown), slot back."""
        state = SessionState.CLOSED if code == "shutdown" else SessionState.FAILED
        try:
            current = await self._admission.get(session_id)
            body = failed_body(current.body, state, code, message)
            await self._admission.publish_status(session_id, state.value, reason=code, body=body)
        except CALL_ERRORS as exc:
            logger.debug("session %s: recording that it was not started failed: %r", session_id, exc)
        await self.release_now(session_id)


def _paused_for(session: Session) -> float | None:
    """How long the session has been paused, as its status write records it in its ticket (None: not paused). Its
    pause counts while it is paused, handed off paused (`recovering`), adopted paused and not yet moved to paused
    again, or closing from a pause; it ends with a resume or the session's end. Read with the snapshot it is written
    with (no await between): the ticket's `paused` and its status always agree."""
    return None if session.terminal else session.paused_for_s


def adoption_down_s(view: SharedTicketView, began: float) -> float:
    """How long the adopted session has been without a replica: from its lost replica's last heartbeat (or, handed
    off, from its hand-off: `orphaned_at`) to the adoption (both on the Redis server's clock), plus the time since the
    adopted event reached this replica (`began`, monotonic). 0 when the view does not say (an older Redis side)."""
    left = view.orphaned_at if view.orphan_reason == "replica_draining" else view.last_seen_at
    if left is None or view.adopted_at is None:
        return 0.0
    return max(0.0, view.adopted_at - left) + (time.monotonic() - began)


def adoption_paused_s(view: SharedTicketView, began: float) -> float | None:
    """How long the adopted session has been paused, if it was handed off, or lost, paused (`paused_at`): from its
    pause to the adoption (both on the Redis server's clock) plus the time since the adopted event reached this replica
    (`began`, monotonic). None: it was not paused."""
    if view.paused_at is None:
        return None
    adopted = view.adopted_at if view.adopted_at is not None else view.paused_at
    return max(0.0, adopted - view.paused_at) + (time.monotonic() - began)


class _NotAdopted(Exception):
    """Why an admitted session was not started here: `(code, message)`."""
