"""The seam between `ServiceRuntime` and session admission: `AdmissionBackend`, and `AdmissionHost`, its way back.

Problem: the runtime runs the sessions of one instance (its model workers, its transport), while the decisions
about who may run, and where, belong to admission, which is either this instance's own (in memory,
`service.runtime.memory_backend.MemoryAdmissionBackend`) or shared by every replica of a deployment (in Redis,
`service.scaleout.backend.RedisAdmissionBackend`). With a shared admission a session may be created on one replica,
wait in the one global queue, run on another, and be read or deleted from a third. The runtime is written once,
against this protocol; a backend varies only what admission varies, like httpx's client and its transport::

    runtime = ServiceRuntime(config, workers, transport)                                    # in memory
    runtime = ServiceRuntime(config, workers, transport, backend=RedisAdmissionBackend(...))  # shared by replicas

What a backend owns: the tickets (create or queue, heartbeat, cancel while queued, release the slot), the workers'
health as admission sees it, stopping admission (drain), its statistics and availability, and every session this
runtime keeps no record of (the registry: lookups, lists, event streams and deletes of sessions queued in a shared
queue or run by another replica, and the close requests it forwards to their owners). What the runtime owns: its
sessions' records, their runners, the drain's deadline, the workers and the transport.

The way back: the runtime passes an `AdmissionHost` to `start`. A backend tells it every admission decision about a
session that has a record here (`admission_event`: queue position, admitted, expired, cancelled) and may ask it to
close a session, to end one admission lost, to forget a queued one that another replica took over, or to build the
record of a session created elsewhere and admitted here (`prepare`, then `register`).

Ordering: the runtime marks every worker unhealthy, then `start`s the backend, then reports each worker's health as
it changes. A decision a call makes is delivered to the host before the call returns (an immediate admission runs
the session's runner before `create` answers). `release` is called exactly once per admitted session, after its
final state. At shutdown the runtime calls `stop_admitting`, ends every session, and only then `aclose`, so that
final statuses and releases still reach a shared admission. Every call is made on the runtime's event loop; the
synchronous ones never wait for I/O (a shared backend does that work in background tasks that it owns).

Cancellation: cancelling `create` cancels only the wait for admission; the runtime forgets the session and the
backend takes the ticket back later (cancelled or released). Cancelling `lookup`, `follow`, `delete` or
`sessions_of` loses nothing. `aclose` cancels and awaits every task the backend owns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from admission import AdmissionEvent
from pipeline.bidirectional import CloseMode, PortableCheckpoint, PreparedSession
from service.runtime.records import AdmissionReport, HandOffRoom, LostSession, RuntimeTuning, SnapshotStream
from service.runtime.sessions import Session, SessionSnapshot
from service.usage.ledger import UsageReport, UsageTotals
from transport.base import CallerRoom

__all__ = ["AdmissionBackend", "AdmissionHost"]


class AdmissionHost(Protocol):
    """What an admission backend may ask of the runtime it admits for (`ServiceRuntime` hands one to `start`).

    Every method is synchronous and runs on the event loop, except `prepare` (it validates off the loop).
    """

    @property
    def tuning(self) -> RuntimeTuning:
        """The runtime's waits (e.g. how long a DELETE waits, how long shutdown waits for final statuses)."""
        ...

    @property
    def closing(self) -> bool:
        """The runtime is shutting down: a session admitted now must not be started."""
        ...

    def session(self, session_id: str) -> Session | None:
        """The runtime's record of the session (queued, running, or finished and remembered), if it has one."""
        ...

    def queued(self) -> list[Session]:
        """The live sessions with a record here that wait in the queue."""
        ...

    def admission_event(self, session: Session, event: AdmissionEvent) -> None:
        """An admission decision about a live session with a record here: the observer is told, then the session
        follows it (new queue position; admitted: its runner starts; expired or cancelled: it ends)."""
        ...

    def request_close(self, session: Session, mode: CloseMode, reason: str) -> None:
        """Close the session with `mode` (a DELETE that reached this replica through the shared admission)."""
        ...

    def set_paused(self, session: Session, paused: bool) -> None:
        """Pause or resume the session (a request that reached this replica through the shared admission); raises
        `SessionQueuedError` or `SessionNotStreamingError` when it cannot."""
        ...

    def lose(self, session: Session, code: str, message: str) -> None:
        """Admission took the session away (its replica was reaped, or the shared record was lost): a queued
        session ends cancelled with reason `code`; an admitted one fails with `(code, message)` and is cancelled."""
        ...

    def lost_elsewhere(self, lost: LostSession) -> None:
        """A session this runtime has no record of was declared lost with the replica that ran it, by this
        replica's admission (once in the deployment): its `session.ended` goes out from here."""
        ...

    def replica_lost(self, replica_id: str) -> None:
        """This replica's admission reaped `replica_id` (once in the deployment): the recordings it was making are
        failed from here (its local files went with it)."""
        ...

    def forget(self, session: Session) -> None:
        """Drop the record of a queued session that lives on elsewhere (admitted by another replica, or handed
        over by a replica that stops admitting); the runtime answers for it through the backend from now on."""
        ...

    async def prepare(self, config: Mapping[str, object], image: bytes | None) -> PreparedSession:
        """Validate a create request as `create` does (image bounds, the model worker's checks), off the loop."""
        ...

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
        """Record a session created on another replica, still queued: an ADMITTED `admission_event` starts it
        (`record`: it was created with `"record": true`; `max_seconds`: its running-time limit; `caller_room`: the
        caller's LiveKit room it publishes into; `webhook_url`: the create's own webhook endpoint)."""
        ...


class AdmissionBackend(Protocol):
    """Session admission as `ServiceRuntime` uses it; see the module docstring for the contract."""

    # ---------------------------------------------------------------------------------------------- life

    async def start(self, host: AdmissionHost) -> None:
        """Start admitting; from now on every decision about a session with a record here goes to `host`."""
        ...

    def stop_admitting(self) -> None:
        """Drain or shutdown (idempotent): this instance admits nothing more. Queued sessions with a record here
        are cancelled (one admission) or forgotten and left to the other replicas (shared) before it returns."""
        ...

    async def aclose(self) -> None:
        """After every session here ended: let final statuses and releases reach admission (bounded by the host's
        `shutdown_close_s`), then stop every background task."""
        ...

    # ---------------------------------------------------------------------------------------------- state

    @property
    def available(self) -> bool:
        """Whether admission can be reached now (always, in memory). While it cannot, the instance is not ready,
        creates answer 503 `admission_unavailable`, and running sessions go on."""
        ...

    @property
    def shares_queue(self) -> bool:
        """Whether the queue is shared with other replicas. Then a session queued here may start on another
        replica at any moment, so its event stream and DELETE go through `follow` and `delete` below, not through
        the runtime's record of it."""
        ...

    def statistics(self) -> AdmissionReport:
        """Admission's figures for /metrics, without waiting (a shared backend serves a background refresh)."""
        ...

    def set_worker_healthy(self, index: int, healthy: bool) -> None:
        """Worker `index` of this instance may (not) take sessions."""
        ...

    # ---------------------------------------------------------------------------------------------- tickets

    async def create(self, session: Session, config: Mapping[str, object], image: bytes | None) -> int | None:
        """Ask a slot for the new, prepared `session` (`config` and `image` are its request, for a replica that
        may have to build it again). Returns its queue position while it waits, None once admitted (the ADMITTED
        decision reached the host first). Raises `QueueFullError`, `QuotaExceededError`, `DrainingError` or
        `AdmissionUnavailableError`."""
        ...

    def heartbeat(self, session_id: str) -> None:
        """The client of a queued session is still there (a GET or an open event stream); other sessions are
        ignored. Never raises."""
        ...

    def cancel_queued(self, session: Session) -> None:
        """The client cancelled its queued session; it ends through a CANCELLED `admission_event` (at once in
        memory, once the shared admission has it otherwise)."""
        ...

    def release(self, session: Session) -> None:
        """The admitted session ended (its final state is set): its slot goes back. Called exactly once. A session
        that ended here because it was handed off (`session.handing_off`) is given to admission for another replica
        to adopt instead: its last checkpoint written first, its slot moving with it (a shared backend)."""
        ...

    async def hand_off_room(self, session: Session) -> HandOffRoom:
        """The instance drains with `LINGSTREAM_DRAIN_MODE=hand_off`: can its running `session` go on on another
        replica now? One instance's admission: never. Never raises (an unreachable admission: not yet)."""
        ...

    # ---------------------------------------------------------------------------------------------- usage
    # Per-owner usage (docs/scale-out.md, §12): admission counts sessions, queued and running time at its own
    # transitions; the runtime reports the chunks.

    def record_chunk(self, session: Session, frames: int) -> None:
        """A chunk of `frames` frames of `session` was generated here. Never raises, never waits (a shared backend
        sends the counts in the background, coalesced)."""
        ...

    def save_checkpoint(self, session: Session, checkpoint: PortableCheckpoint, *, resumable: bool) -> None:
        """The admitted `session` reached a chunk boundary; `checkpoint` describes it there (docs/continuity.md). A
        shared backend keeps it where another replica can rebuild the session from it (written in the background,
        newest wins, dropped after the release) and, when the worker is `resumable`, lets another replica adopt the
        session if this one is lost; one instance's admission keeps nothing (the worker holds it). Never raises,
        never waits."""
        ...

    async def usage(self, owner: str, since: float) -> UsageReport:
        """`owner`'s usage counted from the bucket that holds `since` (Unix seconds) up to now. Raises
        `AdmissionUnavailableError` when a shared backend cannot be reached."""
        ...

    def usage_totals(self) -> Mapping[str, UsageTotals]:
        """Every owner's all-time usage, by owner, without waiting (a shared backend serves its last refresh)."""
        ...

    # ---------------------------------------------------------------------------------------------- registry
    # Sessions this runtime answers for without a record of its own (with one instance: none, so 404).

    async def lookup(self, owner: str, session_id: str) -> SessionSnapshot:
        """The session of `owner`; a queued session's lookup is a heartbeat. Raises `SessionNotFoundError` (also
        for another owner's session) or `AdmissionUnavailableError`."""
        ...

    async def lookup_here(self, owner: str, session_id: str) -> SessionSnapshot:
        """As `lookup`, for a route bound to this instance's transport: a session another replica runs raises
        `SessionElsewhereError` naming it."""
        ...

    async def sessions_of(self, owner: str) -> Sequence[SessionSnapshot]:
        """`owner`'s live sessions that admission knows of (the runtime adds, and prefers, its own records)."""
        ...

    async def follow(self, owner: str, session_id: str) -> tuple[SessionSnapshot, SnapshotStream]:
        """The session's current snapshot and a stream of its later ones (ends after the terminal one)."""
        ...

    async def delete(self, owner: str, session_id: str, mode: CloseMode) -> SessionSnapshot:
        """End the session (idempotent): cancel it while queued, else ask its owner to close it with `mode`;
        waits up to the host's `delete_wait_s` for the end and answers the newest snapshot."""
        ...

    async def set_paused(self, owner: str, session_id: str, paused: bool) -> SessionSnapshot:
        """Pause (`paused`) or resume a session run by another replica: its owner is asked, and the answer waits up
        to the host's `delete_wait_s` for the change. Raises `SessionNotFoundError`, `SessionQueuedError` (still in
        the queue), `SessionNotStreamingError` (ended) or `AdmissionUnavailableError`."""
        ...
