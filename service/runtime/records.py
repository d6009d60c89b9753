"""The records and seams of `ServiceRuntime`: its tuning, what it reports, and the protocols it is observed through.

`RuntimeTuning` holds the timings and bounds that are not deployment settings (tests shorten them). `Readiness`
(/readyz), `DrainStatus` (GET /internal/drain) and `RuntimeStatistics` (/metrics) are the frozen answers the runtime
gives; `AdmissionReport` is what its admission backend contributes to the statistics, and `SharedAdmissionStatistics`
(with one `ReplicaStatistics` per replica) what a backend shared by several replicas knows of the whole deployment.
`SessionObserver` is told about every session's life (`service.telemetry.sessions` implements it); `SessionEvents` is
told of the moments integrators are told of by webhook (`service.webhooks` implements it); `SnapshotStream` is
what an event stream reads. They live apart from the runtime so that what only reads them (schemas, metrics) need
not import it; `service.runtime.runtime` re-exports the runtime's own.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Protocol

from admission import AdmissionEvent, AdmissionStatistics
from pipeline.bidirectional import ChunkOutput
from service.runtime.recording_catalog import RecordingEntry
from service.runtime.recordings import RecordingStatistics
from service.runtime.sessions import Session, SessionBuffers, SessionSnapshot
from service.usage.ledger import UsageTotals

__all__ = [
    "AdmissionReport",
    "DrainStatus",
    "HandOffRoom",
    "LostSession",
    "NoEvents",
    "Readiness",
    "ReplicaStatistics",
    "RuntimeStatistics",
    "RuntimeTuning",
    "SessionEventKind",
    "SessionEvents",
    "SessionObserver",
    "SharedAdmissionStatistics",
    "SnapshotStream",
]


@dataclass(frozen=True, slots=True)
class RuntimeTuning:
    """Timings and bounds that are not deployment settings (tests shorten them).

    - `create_wait_s`: how long POST waits for an immediately admitted session to be created and attached before it
      answers 201 with state `admitted` (the client then follows GET or the event stream).
    - `delete_wait_s`: how long DELETE waits for the close before it answers 202 with state `draining`.
    - `sse_keepalive_s`: the longest gap between keep-alive comments on an event stream (also capped at a third of
      the heartbeat timeout, so an open stream always keeps its queued session's place).
    - `health_interval_s`: how often worker readiness is polled (it is also checked on every create and /readyz).
    - `reader_stop_s`: after the worker closed a session, how long its output reader may take to see the end.
    - `drain_close_grace_s`: how long before the drain deadline remaining sessions are asked to close with drain
      (at most a quarter of the drain timeout); at the deadline they are cancelled.
    - `shutdown_close_s`: at shutdown, how long sessions get to close (cancel) before their runners are cancelled.
    - `admission_tick_s`: the admission driver's expiry check interval.
    - `hand_off_retry_s`: a draining replica that hands its sessions off (`LINGSTREAM_DRAIN_MODE=hand_off`) asks
      this often whether another replica has room for the ones still here, until half the drain timeout passed.
    - `hand_off_deliver_s`: a session handed off first lets the transport send the chunks already generated, at most
      this long, so that its adopter goes on after the last chunk the client was sent (docs/continuity.md).
    - `resume_client_wait_s`: an adopted session on a transport whose client reconnects (embedded) reads its first
      chunk once its client is back, waiting at most this long (its generation waits meanwhile).
    - `recording_queue_bytes`: how far (bytes of frames) a session's recording may fall behind its stream before it
      is dropped (`recording_overrun`; the stream goes on).
    """

    create_wait_s: float = 10.0
    delete_wait_s: float = 5.0
    sse_keepalive_s: float = 15.0
    health_interval_s: float = 1.0
    reader_stop_s: float = 5.0
    drain_close_grace_s: float = 5.0
    shutdown_close_s: float = 10.0
    admission_tick_s: float = 0.5
    hand_off_retry_s: float = 0.5
    hand_off_deliver_s: float = 3.0
    resume_client_wait_s: float = 10.0
    recording_queue_bytes: int = 128 * 1024 * 1024
    buffers: SessionBuffers = dataclasses.field(default_factory=SessionBuffers)


@dataclass(frozen=True, slots=True)
class Readiness:
    """/readyz: `ready`, else a stable `code` ("not_ready" or "draining") and a sentence."""

    ready: bool
    code: str | None = None
    reason: str | None = None


class HandOffRoom(enum.Enum):
    """Whether a draining replica can hand a running session to another replica (docs/continuity.md)."""

    # Another live replica, not draining, has a free slot for it now: stop it here and hand it off.
    READY = "ready"
    # None has room now (or admission cannot be reached): keep running it here and ask again.
    NOT_YET = "not_yet"
    # It can never be handed off from here (one instance; its worker cannot rebuild it; it is not in Redis yet).
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class DrainStatus:
    """GET /internal/drain: whether a drain runs, whether it is complete, and what is still open."""

    draining: bool
    complete: bool
    running: int
    queued: int
    deadline_in_s: float | None


@dataclass(frozen=True, slots=True)
class ReplicaStatistics:
    """One registered replica as the shared admission sees it. `alive`: its liveness key exists; `retained[i]`:
    slots held on worker i; `reserved[i]`: slots of lost sessions it has not stopped yet (they admit nothing)."""

    replica_id: str
    alive: bool
    num_workers: int
    max_sessions_per_worker: int
    healthy: tuple[bool, ...]
    draining: bool
    retained: tuple[int, ...]
    reserved: tuple[int, ...]

    @property
    def free_slots(self) -> int:
        if not self.alive or self.draining:
            return 0
        return sum(
            max(0, self.max_sessions_per_worker - used - spare)
            for used, spare, healthy in zip(self.retained, self.reserved, self.healthy, strict=True)
            if healthy
        )


@dataclass(frozen=True, slots=True)
class SharedAdmissionStatistics:
    """The whole deployment: every registered replica and the global queue depth."""

    replicas: tuple[ReplicaStatistics, ...]
    queue_depth: int

    @property
    def capacity(self) -> int:
        return sum(r.num_workers * r.max_sessions_per_worker for r in self.replicas if r.alive and not r.draining)

    @property
    def retained_total(self) -> int:
        return sum(sum(r.retained) for r in self.replicas)

    @property
    def free_slots(self) -> int:
        return sum(r.free_slots for r in self.replicas)


@dataclass(frozen=True, slots=True)
class AdmissionReport:
    """What an admission backend reports (`AdmissionBackend.statistics`): this instance's `admission` statistics
    (slots, counters; `queue_depth` is the queue every create joins), `slots_in_flight`, the slots admission counts
    for sessions that are not (or no longer) live in the runtime (being adopted, or ended with their release still
    on its way), and `shared`, the whole deployment when admission is shared by several replicas (else None)."""

    admission: AdmissionStatistics
    slots_in_flight: int = 0
    shared: SharedAdmissionStatistics | None = None


@dataclass(frozen=True, slots=True)
class RuntimeStatistics:
    """What /metrics reads. `sessions` counts live sessions by state; `ended_total` finished ones by final state.
    `slots_held` counts sessions holding an admission slot; `slot_mismatch` is admission's retained count minus it
    (anything but 0 means a leak or a double count). `shared` is the whole deployment (every replica, the global
    queue) with the Redis backend, as of its last refresh; None in memory. `usage` is every key's all-time usage by
    key id (this instance's in memory; the deployment's, as of the last refresh, with the Redis backend).
    `ended_by_limit` counts sessions a limit ended, by reason (`time_limit`, `paused_too_long`; the state is closed);
    `recordings` is the recording store's figures (None: recording is not configured)."""

    sessions: Mapping[str, int]
    ended_total: Mapping[str, int]
    admission: AdmissionStatistics
    ready: bool
    draining: bool
    slots_held: int
    slot_mismatch: int
    shared: SharedAdmissionStatistics | None = None
    usage: Mapping[str, UsageTotals] = dataclasses.field(default_factory=dict)
    ended_by_limit: Mapping[str, int] = dataclasses.field(default_factory=dict)
    recordings: RecordingStatistics | None = None


class SessionObserver(Protocol):
    """Told about every session's life (`service.telemetry.sessions` implements it: spans, metric events).

    Every call is synchronous, on the event loop, made by the runtime at a fixed point; it must be cheap and must
    not raise. `admission_event` comes before the runtime applies the event; `enter_session` runs inside the new
    runner task's own context (what it binds there, e.g. the session's span, is seen by every task the runner
    starts); `chunk` for each chunk the session's output reader takes; `session_ended` once, at the final state,
    before the transport is detached.
    """

    def admission_event(self, session: Session, event: AdmissionEvent) -> None: ...

    def enter_session(self, session: Session) -> None: ...

    def chunk(self, session: Session, chunk: ChunkOutput) -> None: ...

    def session_ended(self, session: Session) -> None: ...


class SessionEventKind(enum.Enum):
    """The moments of a session's life an integrator is told of (the webhook event `type`)."""

    # It waits in the admission queue (a session admitted at once is never queued).
    QUEUED = "session.queued"
    # It generates and streams (once per session).
    RUNNING = "session.running"
    # A client paused it.
    PAUSED = "session.paused"
    # A client resumed it.
    RESUMED = "session.resumed"
    # It ends soon unless the client acts (its time limit, a pause that lasts too long).
    WARNING = "session.warning"
    # It reached its final state (closed, failed, expired or cancelled).
    ENDED = "session.ended"
    # Its recording is complete and can be downloaded.
    RECORDING_READY = "recording.ready"
    # Its recording stopped (the session went on).
    RECORDING_FAILED = "recording.failed"


@dataclass(frozen=True, slots=True)
class LostSession:
    """A session another replica ran, declared ended by this replica's admission because that replica was lost
    (the redis backend's reaper; this replica has no record of it). `snapshot` is the session as the registry knows
    it (failed, its error `replica_lost`); `owner` and `webhook_url` say where its events go; it ran from
    `running_from` (None: it never ran) to `lost_at`, its replica's last heartbeat (Unix seconds). The frames it
    generated were counted on the lost replica and are not known."""

    snapshot: SessionSnapshot
    owner: str
    webhook_url: str | None
    running_from: float | None
    lost_at: float


class SessionEvents(Protocol):
    """Told of each `SessionEventKind` moment of a session with a record here (`service.webhooks.WebhookEmitter`
    implements it), by the replica that holds the session at that moment.

    Like `SessionObserver`, every call is synchronous, on the event loop, cheap, and never raises nor waits: an
    implementation that sends the event somewhere queues it (bounded) and sends it from a task of its own.
    `details` are the kind's own facts (a warning's `code` and `ends_in_s`, a recording's figures); what the session
    says of itself (state, reason, error, times) the implementation reads from `session`. `generated` counts the
    frames of each chunk (the ended event reports them). `session_lost` is the `session.ended` of a session lost with
    another replica (told on the one replica that declared it lost, once per session); `recording_lost` the
    `recording.failed` of a recording that replica was making (its catalog entry, failed by this replica).
    """

    def session_event(
        self, session: Session, kind: SessionEventKind, details: Mapping[str, object] | None = None
    ) -> None: ...

    def generated(self, session: Session, frames: int) -> None: ...

    def session_lost(self, lost: LostSession) -> None: ...

    def recording_lost(self, entry: RecordingEntry) -> None: ...


class NoEvents:
    """`SessionEvents` that go nowhere (the runtime's default: no webhooks configured)."""

    def session_event(
        self, session: Session, kind: SessionEventKind, details: Mapping[str, object] | None = None
    ) -> None:
        pass

    def generated(self, session: Session, frames: int) -> None:
        pass

    def session_lost(self, lost: LostSession) -> None:
        pass

    def recording_lost(self, entry: RecordingEntry) -> None:
        pass


class SnapshotStream(Protocol):
    """What an event stream reads: a session's snapshots after the first (ends after the terminal one); leaving
    `with` (or `close()`) stops it. `fanout.Subscription` is one."""

    def __enter__(self) -> object: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def __anext__(self) -> Awaitable[SessionSnapshot]: ...

    def close(self) -> None: ...
