"""The records of shared admission and the decoding of what the Lua scripts and the event stream return.

`SharedTicketView` is `admission.TicketView` plus where the ticket lives (owner replica, origin, registry status);
`SharedAdmissionEvent` carries one change of one ticket; `CloseRequest` is a DELETE forwarded to the owner, and
`PauseRequest` a pause or resume forwarded to it. The
`decode_*` functions turn the flat Redis arrays (`[field, value, ...]`) of the ticket hashes, events and script
replies into these records; `service.scaleout.admission` is their only caller. The deployment's statistics
(`SharedAdmissionStatistics`, `ReplicaStatistics`) are defined with the runtime's records and `NotTicketOwnerError`
in the service's error tree (the base modules read them without importing scale-out code); both are re-exported.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from admission import TicketReason, TicketState, TicketView
from service.errors import NotTicketOwnerError
from service.runtime.records import ReplicaStatistics, SharedAdmissionStatistics

__all__ = [
    "CloseRequest",
    "NotTicketOwnerError",
    "PauseRequest",
    "ReplicaStatistics",
    "ScriptReply",
    "SharedAdmissionEvent",
    "SharedAdmissionStatistics",
    "SharedEventKind",
    "SharedTicketView",
    "decode_fields",
    "decode_replica",
    "decode_reply",
    "decode_text",
    "decode_view",
]


class SharedEventKind(enum.Enum):
    # A ticket entered the global queue (the view carries its position then).
    QUEUED = "queued"
    # A ticket got a slot on some replica's worker, at creation or from the queue (view: replica, worker).
    ADMITTED = "admitted"
    # A queued ticket this replica follows moved up (each replica computes this for the tickets it follows).
    POSITION_CHANGED = "position_changed"
    # A queued ticket timed out or lost its heartbeat (the view's reason says which).
    EXPIRED = "expired"
    # A queued ticket was cancelled (by a client on any replica, or because every replica drains).
    CANCELLED = "cancelled"
    # An admitted session ended and its owner replica gave the slot back.
    RELEASED = "released"
    # An admitted session's replica stopped heartbeating: the reaper took its slot back and failed it (state
    # RELEASED, `failure` "replica_lost: <id>"); or Redis lost the ticket's record ("admission_record_lost" for an
    # admitted one, "admission_state_lost" for a queued one, then state CANCELLED).
    LOST = "lost"
    # The owner published a new session status / body (the registry part of the ticket).
    STATUS = "status"
    # An admitted session left its replica's slot to wait for an adopter: its replica was lost (the reaper found
    # its checkpoint), or handed it off while draining (issue #33). Still admitted; status `recovering`.
    ORPHANED = "orphaned"
    # A replica adopted an orphan: the slot is now its own (view: replica, worker); it rebuilds the session.
    ADOPTED = "adopted"
    # A create on this replica was refused (queue full or draining); other replicas never see it.
    REJECTED = "rejected"


@dataclass(frozen=True, slots=True)
class SharedTicketView:
    """An immutable snapshot of one shared ticket: `admission.TicketView`'s fields plus where it lives.

    Times are seconds since the epoch on the Redis server's clock. `position` (1 = next, global) and the deadlines
    only while QUEUED; `worker` and `replica` (the owner: the replica that holds the slot and runs the model
    session) once ADMITTED; `origin` is the replica the create arrived on; `failure` is set when the owner was lost
    ("replica_lost: <id>"), and `last_seen_at` then is that replica's last heartbeat (its running time counts to
    there). `status`, `status_reason` and `body` are the registry: what the owner last published (admission itself
    writes queued/admitted/expired/cancelled/closed/failed); `body` is None in events. `version` grows with every
    change of the ticket.
    """

    ticket_id: str
    owner: str
    state: TicketState
    reason: TicketReason | None
    position: int | None
    worker: int | None
    retry_after_s: int | None
    created_at: float
    admitted_at: float | None
    ended_at: float | None
    queue_deadline: float | None
    heartbeat_deadline: float | None
    replica: str | None = None
    origin: str | None = None
    failure: str | None = None
    status: str | None = None
    status_reason: str | None = None
    body: str | None = None
    version: int = 0
    last_seen_at: float | None = None
    adopted_at: float | None = None  # when a replica adopted it (after its own was lost or handed it off)
    orphaned_at: float | None = None  # when it last left its replica for an adopter (kept once adopted)
    orphan_reason: str | None = None  # why: "replica_lost" (reaped) or "replica_draining" (handed off on drain)
    paused_at: float | None = None  # handed off paused: when its pause began (its adopter goes on paused)

    @property
    def is_terminal(self) -> bool:
        return self.state not in (TicketState.QUEUED, TicketState.ADMITTED)

    def as_ticket_view(self) -> TicketView:
        """The same snapshot as the in-memory controller's record (without the shared fields)."""
        return TicketView(
            ticket_id=self.ticket_id,
            owner=self.owner,
            state=self.state,
            reason=self.reason,
            position=self.position,
            worker=self.worker,
            retry_after_s=self.retry_after_s,
            created_at=self.created_at,
            admitted_at=self.admitted_at,
            ended_at=self.ended_at,
            queue_deadline=self.queue_deadline,
            heartbeat_deadline=self.heartbeat_deadline,
        )


@dataclass(frozen=True, slots=True)
class SharedAdmissionEvent:
    """One change of one ticket; `by` is the replica that made it ("" when reconstructed after an outage)."""

    kind: SharedEventKind
    ticket: SharedTicketView
    by: str


@dataclass(frozen=True, slots=True)
class CloseRequest:
    """A DELETE that landed on `requested_by` for a session this replica owns; `mode` is "drain" or "cancel"."""

    ticket_id: str
    mode: str
    requested_by: str


@dataclass(frozen=True, slots=True)
class PauseRequest:
    """A pause (`paused`) or resume that landed on `requested_by` for a session this replica owns."""

    ticket_id: str
    paused: bool
    requested_by: str


@dataclass(frozen=True, slots=True)
class ScriptReply:
    """A decoded script reply: its `code`, the script-specific `result`, the ticket `events` it emitted, the queue
    depth after it, and the `(id, payload)` pairs it admitted onto the calling replica."""

    code: str
    result: Any
    events: list[dict[str, bytes]]
    queue_depth: int
    taken: list[tuple[str, bytes | None]]


def decode_text(raw: object) -> str:
    if isinstance(raw, bytes):
        return raw.decode()
    return str(raw)


def decode_fields(flat: Sequence[object]) -> dict[str, bytes]:
    """A flat Redis array `[field, value, ...]` as a dict of bytes values."""
    out: dict[str, bytes] = {}
    for i in range(0, len(flat) - 1, 2):
        value = flat[i + 1]
        out[decode_text(flat[i])] = value if isinstance(value, bytes) else str(value).encode()
    return out


def decode_view(fields: Mapping[str, bytes]) -> SharedTicketView:
    """A ticket hash (or an event entry) as a snapshot."""

    def text(name: str) -> str | None:
        raw = fields.get(name)
        return None if raw is None or raw == b"" else raw.decode()

    def number(name: str) -> int | None:
        raw = text(name)
        return None if raw is None else round(float(raw))

    def seconds(name: str) -> float | None:
        raw = number(name)
        return None if raw is None else raw / 1000

    state = TicketState(text("state"))
    queued = state is TicketState.QUEUED
    reason = text("reason")
    return SharedTicketView(
        ticket_id=text("id") or "",
        owner=text("owner") or "",
        state=state,
        reason=TicketReason(reason) if reason else None,
        position=number("pos") if queued else None,
        worker=None if queued else number("worker"),
        retry_after_s=None,
        created_at=seconds("created") or 0.0,
        admitted_at=seconds("admitted"),
        ended_at=seconds("ended"),
        queue_deadline=seconds("qdl") if queued else None,
        heartbeat_deadline=seconds("hbdl") if queued else None,
        replica=text("replica"),
        origin=text("origin"),
        failure=text("failure"),
        status=text("status"),
        status_reason=text("status_reason"),
        body=text("body"),
        version=number("v") or 0,
        last_seen_at=seconds("seen"),
        adopted_at=seconds("adopted"),
        orphaned_at=seconds("orphaned"),
        orphan_reason=text("why"),
        paused_at=seconds("paused"),
    )


def decode_reply(raw: Sequence[Any]) -> ScriptReply:
    """A script's `{code, result, events, queue_depth, taken}` reply (see `service.scaleout.redis_side.scripts`)."""
    code, result, events, depth, taken = raw
    return ScriptReply(
        code=decode_text(code),
        result=result,
        events=[decode_fields(entry) for entry in events],
        queue_depth=int(depth),
        taken=[(decode_text(taken[i]), taken[i + 1]) for i in range(0, len(taken), 2)],
    )


def decode_replica(raw_id: object, raw_info: object, alive: object, workers: Sequence[Any]) -> ReplicaStatistics:
    """One row of the `overview` script: id, "workers|slots|mask|draining|reserved|generation", alive, held
    workers."""
    n, cap, mask, draining, reserved, _generation = decode_text(raw_info).split("|")
    retained = [0] * int(n)
    for worker in workers:
        retained[int(worker)] += 1
    return ReplicaStatistics(
        replica_id=decode_text(raw_id),
        alive=bool(alive),
        num_workers=int(n),
        max_sessions_per_worker=int(cap),
        healthy=tuple(flag == "1" for flag in mask),
        draining=draining == "1",
        retained=tuple(retained),
        reserved=tuple(int(x) for x in reserved.split(",") if x),
    )
