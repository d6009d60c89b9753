"""A session as the service sees it: its lifecycle, its record, and the streams it publishes.

The lifecycle (one enum, an explicit transition table, a frozenset of terminal states)::

    queued ──► admitted ──► running ──► draining ──► closed
       │           │          ▲  │           └───────► failed
       │           │  resume  │  ▼ pause
       │           │         paused ──────────────► closed | failed | draining
       │           └───────────┴─────────────────► closed | failed | draining
       ├──► expired
       └──► cancelled

A rejected create (queue full, draining) never becomes a session: it is answered and forgotten. `Session` is the
mutable record the runtime keeps for each session; every change of state or queue position is published as a
`SessionSnapshot` to its SSE subscribers (a `Broadcast`, drop-oldest per subscriber: every snapshot is complete,
so a slow subscriber only skips intermediate states). The transport-facing `StatusMessage` stream and the chunk
stream live here too; all three close when the session reaches a terminal state, after a final `DoneStatus`
(preceded by an `ErrorStatus` when the session failed).
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from pipeline.bidirectional import ChunkItem, ChunkOutput, ChunkPart, CloseMode, PreparedSession
from service.errors import SessionTransitionError
from service.runtime.fanout import Broadcast, Flag
from service.runtime.recordings import RecordingReport, SessionRecording
from transport.base import (
    CallerRoom,
    ChunkStatus,
    DoneStatus,
    ErrorStatus,
    ResumedRoom,
    StateStatus,
    StatusMessage,
    WarningStatus,
)

__all__ = [
    "LIVE_STATES",
    "TERMINAL_STATES",
    "TRANSITIONS",
    "Session",
    "SessionBuffers",
    "SessionSnapshot",
    "SessionState",
    "require_transition",
]


class SessionState(enum.Enum):
    # Waiting in the admission FIFO; holds a queue position, no slot.
    QUEUED = "queued"
    # Holds a slot on one model worker; the worker is creating it and the transport is being attached.
    ADMITTED = "admitted"
    # Created and attached: generating and streaming to the client.
    RUNNING = "running"
    # Running, but generating nothing until resumed (keeps its slot, caches and pose; takes no model time).
    PAUSED = "paused"
    # Running, but its model worker failed under it: being rebuilt from its checkpoint (keeps its slot, its id, its
    # room and its transport; frames resume after it). docs/continuity.md.
    RECOVERING = "recovering"
    # Winding down: a close (drain or cancel) is in progress, or the instance drains and will close it by the deadline.
    DRAINING = "draining"
    # Ended after admission without a failure (client DELETE, Stop, client gone, completed, drain) (terminal).
    CLOSED = "closed"
    # Left the queue unadmitted: queue timeout or lost heartbeat (terminal).
    EXPIRED = "expired"
    # Model-side creation or generation, or the transport, failed (terminal).
    FAILED = "failed"
    # Left the queue unadmitted: cancelled by the client or by the instance's drain (terminal).
    CANCELLED = "cancelled"


TRANSITIONS: Mapping[SessionState, frozenset[SessionState]] = MappingProxyType(
    {
        SessionState.QUEUED: frozenset({SessionState.ADMITTED, SessionState.EXPIRED, SessionState.CANCELLED}),
        SessionState.ADMITTED: frozenset(
            {SessionState.RUNNING, SessionState.DRAINING, SessionState.CLOSED, SessionState.FAILED}
        ),
        SessionState.RUNNING: frozenset(
            {
                SessionState.PAUSED,
                SessionState.RECOVERING,
                SessionState.DRAINING,
                SessionState.CLOSED,
                SessionState.FAILED,
            }
        ),
        SessionState.RECOVERING: frozenset(
            {SessionState.RUNNING, SessionState.DRAINING, SessionState.CLOSED, SessionState.FAILED}
        ),
        SessionState.PAUSED: frozenset(
            {
                SessionState.RUNNING,
                SessionState.RECOVERING,  # handed off on a drain: it goes on, paused, on another replica
                SessionState.DRAINING,
                SessionState.CLOSED,
                SessionState.FAILED,
            }
        ),
        SessionState.DRAINING: frozenset({SessionState.CLOSED, SessionState.FAILED}),
        SessionState.CLOSED: frozenset(),
        SessionState.EXPIRED: frozenset(),
        SessionState.FAILED: frozenset(),
        SessionState.CANCELLED: frozenset(),
    }
)
"""Every legal move, from each state. Sessions are born QUEUED (an immediate admission moves on at once)."""

TERMINAL_STATES: frozenset[SessionState] = frozenset(state for state, moves in TRANSITIONS.items() if not moves)
LIVE_STATES: frozenset[SessionState] = frozenset(SessionState) - TERMINAL_STATES
_SLOT_STATES = frozenset(
    {
        SessionState.ADMITTED,
        SessionState.RUNNING,
        SessionState.PAUSED,
        SessionState.RECOVERING,
        SessionState.DRAINING,
    }
)


_CLIENT_STOPS = frozenset({"client_stop", "client_deleted"})
"""The close reasons that are its client's own wish (kept across a hand-off), not the replica letting go of it."""


def require_transition(session_id: str, old: SessionState, new: SessionState) -> None:
    """Raise `SessionTransitionError` unless the table allows `old -> new`."""
    if new not in TRANSITIONS[old]:
        why = (
            "it has ended"
            if old in TERMINAL_STATES
            else f"{old.value} sessions can only become " + ", ".join(sorted(state.value for state in TRANSITIONS[old]))
        )
        raise SessionTransitionError(f"session {session_id!r} cannot move from {old.value} to {new.value}: {why}")


@dataclass(frozen=True, slots=True)
class SessionSnapshot:
    """One session as of one moment; what GET returns and what the SSE stream carries.

    `created_at`/`updated_at` are wall-clock seconds since the epoch. `queue_position` is set only while queued
    (1 = next). `transport` holds the join details once attached. `error` is `(code, message)` for failed sessions.
    `sequence` increases with every published change (the SSE event id). `max_seconds` is the session's time limit
    (None: none) and `ends_at` the wall-clock second it ends by, once it runs. `record`: created with `"record":
    true` (and recording configured); `recording`: its recording as of this moment, once the session started.
    """

    id: str
    state: SessionState
    reason: str | None
    queue_position: int | None
    created_at: float
    updated_at: float
    transport: Mapping[str, object] | None
    config: Mapping[str, object]
    width: int
    height: int
    fps: float
    error: tuple[str, str] | None
    sequence: int
    max_seconds: float | None = None
    ends_at: float | None = None
    record: bool = False
    recording: RecordingReport | None = None

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True, slots=True)
class SessionBuffers:
    """Per-subscriber buffer sizes (overflow: drop oldest) of a session's three streams. `chunks` counts items: whole
    chunks and, with progressive decode, the parts ahead of each (a transport reads each item as it comes; one that
    lost a part plays the chunk's frames it missed from the whole chunk, `transport.session.binding.PartFeed`)."""

    snapshots: int = 16
    statuses: int = 64
    chunks: int = 2


class Session:
    """The service's record of one session, from its first queue decision to its terminal state.

    Mutated only on the event loop, and only through its own methods, each named for what happened (`admitted`,
    `attached`, `recording_started`, `time_limit_started`, `slot_released`, `mark_service_draining`, `move`,
    `request_close`, ...): its fields read as properties, so a write from outside is a type error, not a quiet
    change that skips the publication. Every method is synchronous, so a state change and its publication are atomic
    on the loop.
    """

    # Slots: a finished session stays in the history (LINGSTREAM_SESSION_HISTORY of them); no per-instance dict.
    __slots__ = (
        "_caller_room",
        "_close_mode",
        "_close_reason",
        "_created_at",
        "_ends_at",
        "_failure",
        "_handing_off",
        "_holds_slot",
        "_paused_since",
        "_position",
        "_prepared",
        "_reason",
        "_record",
        "_recording",
        "_resumed_room",
        "_sequence",
        "_service_draining",
        "_state",
        "_stop_after_hand_off",
        "_transport_details",
        "_updated_at",
        "_warning",
        "_webhook_url",
        "_worker",
        "chunks",
        "close_requested",
        "config_view",
        "ended",
        "escalated",
        "id",
        "max_seconds",
        "owner",
        "settled",
        "snapshots",
        "statuses",
    )

    def __init__(
        self,
        session_id: str,
        owner: str,
        prepared: PreparedSession,
        config_view: Mapping[str, object],
        buffers: SessionBuffers,
        *,
        max_seconds: float | None = None,
        record: bool = False,
        caller_room: CallerRoom | None = None,
        created_at: float | None = None,
        webhook_url: str | None = None,
    ) -> None:
        self.id = session_id
        self.owner = owner
        self.max_seconds = max_seconds
        self.config_view = MappingProxyType(dict(config_view))
        self._prepared = prepared
        self._record = record  # created with "record": true (and recording configured)
        self._caller_room = caller_room  # the caller's LiveKit room to publish into, if it named one
        self._resumed_room: ResumedRoom | None = None  # adopted: the lost replica's room, joined again
        self._webhook_url = webhook_url  # the create's own webhook endpoint (checked against the allow-list)
        self._created_at = time.time() if created_at is None else created_at
        self._updated_at = self._created_at
        self._ends_at: float | None = None
        self._warning: WarningStatus | None = None
        self._recording: SessionRecording | None = None  # its recording, from the session's start (the runner)
        self._state = SessionState.QUEUED
        self._reason: str | None = None
        self._position: int | None = None
        self._worker: int | None = None
        self._transport_details: Mapping[str, object] | None = None
        self._failure: tuple[str, str] | None = None
        self._close_mode: CloseMode | None = None
        self._close_reason: str | None = None
        self._holds_slot = False
        self._service_draining = False
        self._handing_off = False
        self._paused_since: float | None = None  # monotonic: when its pause began (here, or before a hand-off)
        self._stop_after_hand_off: tuple[CloseMode, str] | None = None
        self.close_requested = Flag()
        self.escalated = Flag()
        self.settled = Flag()
        self.ended = Flag()
        self.snapshots: Broadcast[SessionSnapshot] = Broadcast(buffers.snapshots)
        self.statuses: Broadcast[StatusMessage] = Broadcast(buffers.statuses)
        self.chunks: Broadcast[ChunkItem] = Broadcast(buffers.chunks)
        self._sequence = 0

    # -- what it holds (read-only: every write is one of the methods below)

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def reason(self) -> str | None:
        """Why it is in its state (set by the move that gave one)."""
        return self._reason

    @property
    def position(self) -> int | None:
        """Its queue position while queued (1 = next)."""
        return self._position

    @property
    def worker(self) -> int | None:
        """The model worker admission gave it, once admitted."""
        return self._worker

    @property
    def prepared(self) -> PreparedSession:
        return self._prepared

    @property
    def record(self) -> bool:
        return self._record

    @property
    def recording(self) -> SessionRecording | None:
        return self._recording

    @property
    def caller_room(self) -> CallerRoom | None:
        return self._caller_room

    @property
    def resumed_room(self) -> ResumedRoom | None:
        return self._resumed_room

    def resumes_room(self, room: ResumedRoom) -> None:
        """Adopted from a lost replica whose session streamed in `room`: the transport joins it again (before the
        session is attached; docs/continuity.md)."""
        self._resumed_room = room

    @property
    def webhook_url(self) -> str | None:
        """The create's own webhook endpoint, if it named one (besides the key's or the deployment's)."""
        return self._webhook_url

    @property
    def created_at(self) -> float:
        return self._created_at

    @property
    def updated_at(self) -> float:
        return self._updated_at

    @property
    def ends_at(self) -> float | None:
        """The wall-clock second its time limit ends it, once it runs (None: no limit)."""
        return self._ends_at

    @property
    def warning(self) -> WarningStatus | None:
        return self._warning

    @property
    def transport_details(self) -> Mapping[str, object] | None:
        """The client's join details, once the transport attached it."""
        return self._transport_details

    @property
    def failure(self) -> tuple[str, str] | None:
        """`(code, message)` of its first failure."""
        return self._failure

    @property
    def close_mode(self) -> CloseMode | None:
        return self._close_mode

    @property
    def close_reason(self) -> str | None:
        return self._close_reason

    @property
    def holds_slot(self) -> bool:
        """It holds an admission slot that has not been given back yet."""
        return self._holds_slot

    @property
    def handing_off(self) -> bool:
        """Its replica drains and hands it to another (`hand_off`): its end here is not the session's end."""
        return self._handing_off

    @property
    def stop_after_hand_off(self) -> tuple[CloseMode, str] | None:
        """A stop its client asked for while it was being handed off (mode, reason): for the adopter to carry out."""
        return self._stop_after_hand_off

    @property
    def paused_for_s(self) -> float | None:
        """How long it has been paused (None: it is not): since its pause here, or, handed off paused, since its
        pause on the replica it left (`handed_over_paused`). Kept through a hand-off (`recovering`) for the adopter."""
        return None if self._paused_since is None else max(0.0, time.monotonic() - self._paused_since)

    def handed_over_paused(self, paused_for_s: float) -> None:
        """Adopted from a replica that handed it off, or was lost, while it was paused, `paused_for_s` into its pause:
        it goes on paused here, its pause's deadline counted from its first pause (before it is admitted and run
        here)."""
        self._paused_since = time.monotonic() - max(0.0, paused_for_s)

    @property
    def service_draining(self) -> bool:
        """The instance drains and told this session so (it ends by the drain's deadline)."""
        return self._service_draining

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def past_queue(self) -> bool:
        """Whether the session is past the queue and not yet ended (it holds, or is about to give back, a slot)."""
        return self.state in _SLOT_STATES

    def snapshot(self) -> SessionSnapshot:
        return SessionSnapshot(
            id=self.id,
            state=self.state,
            reason=self.reason,
            queue_position=self.position if self.state is SessionState.QUEUED else None,
            created_at=self.created_at,
            updated_at=self.updated_at,
            transport=None if self.transport_details is None else MappingProxyType(dict(self.transport_details)),
            config=self.config_view,
            width=self.prepared.width,
            height=self.prepared.height,
            fps=self.prepared.fps,
            error=self.failure if self.state is SessionState.FAILED else None,
            sequence=self._sequence,
            max_seconds=self.max_seconds,
            ends_at=self.ends_at,
            record=self.record,
            recording=self.recording.report() if self.recording is not None else None,
        )

    def move(self, new: SessionState, *, reason: str | None = None, detail: str | None = None) -> None:
        """Change state (checked against the table) and publish it; a terminal state also ends every stream."""
        require_transition(self.id, self.state, new)
        # Handed over paused (`handed_over_paused`), it passes through RUNNING unseen: its runner's `running` callback
        # moves it on to PAUSED at once (`Conductor._running`), and a client told `running` in between would show it
        # playing for a moment (a page after a paused hand-off saw `admitted, running, paused`: once in three under
        # load, when its room was joined before the session ran).
        unseen = new is SessionState.RUNNING and self._state is SessionState.ADMITTED and self._paused_since is not None
        if new is SessionState.PAUSED and self._paused_since is None:
            self._paused_since = time.monotonic()
        elif new is SessionState.RUNNING and self._state is SessionState.PAUSED:
            self._paused_since = None
        self._state = new
        if reason is not None:
            self._reason = reason
        if new is not SessionState.QUEUED:
            self._position = None
        if not (self._handing_off and new in TERMINAL_STATES) and not unseen:  # its end here is not the session's
            self._publish_snapshot()
        if new is SessionState.RUNNING:
            self.settled.set()
        if new in TERMINAL_STATES:
            self._end()
        elif not unseen:
            self.statuses.publish(StateStatus(new.value, detail))

    def warn(self, status: WarningStatus | None) -> None:
        """Tell the client the session ends soon (its time limit, or a pause that lasts too long); the warning is
        kept, so a client that (re)connects is told it too (`ends_in_s` as of when it was sent). None: the warning
        no longer holds (the pause ended)."""
        self._warning = status
        if status is not None and not self.terminal:
            self.statuses.publish(status)

    def set_position(self, position: int | None) -> None:
        """A new queue position (from an admission event); published only when it changed."""
        if self.state is SessionState.QUEUED and position != self.position:
            self._position = position
            self._publish_snapshot()

    def record_failure(self, code: str, message: str) -> None:
        """Remember why the session failed; the first failure wins (later ones are consequences)."""
        if self.failure is None:
            self._failure = (code, message)

    def request_close(self, mode: CloseMode, reason: str) -> bool:
        """Ask the session's runner to close it with `mode`; a CANCEL escalates a DRAIN already under way.

        Returns whether anything changed. The first request's reason is kept. An admitted or running session moves
        to DRAINING at once, so every reader sees that it is ending.
        """
        if self.terminal or self.state is SessionState.QUEUED:
            return False
        if self._handing_off:
            # It stops here to go on elsewhere: a client's own stop is kept for the adopter; the rest (its reader's
            # end, its transport's "client gone") is this replica letting go of it.
            if reason in _CLIENT_STOPS and self._stop_after_hand_off is None:
                self._stop_after_hand_off = (mode, reason)
            return False
        if self.close_mode is None:
            self._close_mode = mode
            self._close_reason = reason
            self.close_requested.set()
            if mode is CloseMode.CANCEL:
                self.escalated.set()
        elif mode is CloseMode.CANCEL and self.close_mode is CloseMode.DRAIN:
            self._close_mode = CloseMode.CANCEL
            self.escalated.set()
        else:
            return False
        if self.state is not SessionState.DRAINING:
            self.move(SessionState.DRAINING, reason=reason, detail=f"closing ({mode.value})")
        return True

    def hand_off(self, detail: str) -> bool:
        """Its replica drains and hands it to another (docs/continuity.md, "Hand-off on drain"): a running or paused
        session no close was asked of moves to RECOVERING (`detail` tells the client why) and its runner stops it
        here with a cancel (a chunk in flight is dropped: the adopter generates it again from the last checkpoint;
        a paused one keeps `paused_for_s` for its adopter, which goes on paused). Its end here publishes no `done`
        (the client follows the session to its adopter), and a stop its client asks for from now on is kept
        (`stop_after_hand_off`). Returns whether it will be handed off."""
        if self.state not in (SessionState.RUNNING, SessionState.PAUSED) or self.close_mode is not None:
            return False
        self._handing_off = True
        self._close_mode = CloseMode.CANCEL
        self._close_reason = "handed_off"
        self.close_requested.set()
        self.escalated.set()
        self.move(SessionState.RECOVERING, reason="handed_off", detail=detail)
        return True

    def admitted(self, worker: int | None) -> None:
        """Admission gave the session a slot on model `worker`: it holds the slot and moves to ADMITTED."""
        require_transition(self.id, self._state, SessionState.ADMITTED)
        self._worker = worker
        self._holds_slot = True
        self.move(SessionState.ADMITTED)

    def attached(self, details: Mapping[str, object]) -> None:
        """The transport attached the session; `details` are what a client joins with (published with the next
        change of state)."""
        self._transport_details = dict(details)

    def recording_started(self, recording: SessionRecording) -> None:
        """Its recording started (it was created with `"record": true`)."""
        self._recording = recording

    def time_limit_started(self, ends_at: float) -> None:
        """It runs with a time limit: it ends by wall-clock second `ends_at`."""
        self._ends_at = ends_at

    def slot_released(self) -> bool:
        """It gives its admission slot back: True the one time it held one (the caller then releases it to
        admission), False after that, so that a slot goes back exactly once."""
        held, self._holds_slot = self._holds_slot, False
        return held

    def mark_service_draining(self, detail: str) -> None:
        """The instance drains: remember it (a session that starts running later is told too), and a running session
        that no close was asked of moves to DRAINING with `detail` (it ends by the drain's deadline)."""
        self._service_draining = True
        if self._state in (SessionState.RUNNING, SessionState.RECOVERING) and self._close_mode is None:
            self.move(SessionState.DRAINING, reason="service_draining", detail=detail)

    def publish_part(self, part: ChunkPart) -> None:
        """Frames of a chunk decoded ahead of it (progressive decode): for the transport only, no status."""
        self.chunks.publish(part)

    def publish_chunk(self, chunk: ChunkOutput) -> None:
        self.chunks.publish(chunk)
        self.statuses.publish(
            ChunkStatus(
                index=chunk.index,
                applied_seq=chunk.applied_seq,
                keys=tuple(sorted(chunk.keys)),
                timings=MappingProxyType(dict(chunk.timings)),
                prompt=chunk.prompt,
                prompt_seq=chunk.prompt_seq,
                first_frame_id=chunk.first_frame_index,
            )
        )

    def _publish_snapshot(self) -> None:
        self._sequence += 1
        self._updated_at = time.time()
        if self.snapshots.has_subscribers:
            self.snapshots.publish(self.snapshot())

    def _end(self) -> None:
        # A finished session stays readable for a while: keep its figures, not its reference image.
        if self.prepared.image is not None:
            self._prepared = dataclasses.replace(self._prepared, image=None)
        if self._handing_off and self.state is SessionState.CLOSED:
            # It goes on elsewhere: the client hears no end, only its connection closing; it follows the session.
            self.snapshots.close()
            self.statuses.close()
            self.chunks.close()
            self.settled.set()
            self.ended.set()
            return
        if self.state is SessionState.FAILED:
            code, message = self.failure or ("failed", "the session failed")
            self.statuses.publish(ErrorStatus(code, message))
        # `done` names why as a stable code (client_stop, time_limit, model_failure, ...): the reason without the
        # free text some reasons carry after a colon ("client_gone: left" → "client_gone").
        code = (self.reason or "").split(":", 1)[0].strip()
        self.statuses.publish(DoneStatus(code or self.state.value))
        self.snapshots.close()
        self.statuses.close()
        self.chunks.close()
        self.settled.set()
        self.ended.set()
