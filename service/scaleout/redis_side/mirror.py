"""`ReplicaMirror`: what one replica knows of shared admission between its calls to Redis.

Redis holds the truth; each replica keeps a mirror of its own part of it: the slots it holds, the lost sessions
still running on its workers (their slots stay reserved), its workers' health and drain flag (sent with every
script call), the queue positions it follows (`FollowedPositions`: only those behind a departure are read again),
and its listeners. The mirror applies events from script replies
and from the stream exactly once (per-ticket versions), counts what this replica decided, and decides when the
async shell (`service.scaleout.admission.RedisAdmission`) should run a maintenance pass or refresh positions. Pure:
no awaits, no I/O; the shell calls it on the event loop.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping

from admission import AdmissionConfig, AdmissionStatistics, RingBufferSummary, TicketReason, TicketState
from service.scaleout.redis_side.positions import FollowedPositions
from service.scaleout.redis_side.records import (
    CloseRequest,
    PauseRequest,
    SharedAdmissionEvent,
    SharedEventKind,
    SharedTicketView,
    decode_text,
    decode_view,
)

__all__ = ["ReplicaMirror"]

logger = logging.getLogger(__name__)

_VERSION_MEMORY = 65_536  # tickets whose last delivered version is remembered (overflow: forget the oldest)


class ReplicaMirror:
    """One replica's local view of shared admission; see the module docstring.

    `wake_maintenance` is called when a pass should run now (a new ticket while this replica has room);
    `wake_positions` when queue positions it follows may have changed. Listeners run synchronously, in event
    order; one that raises is logged and skipped.
    """

    def __init__(
        self,
        replica_id: str,
        config: AdmissionConfig,
        *,
        wake_maintenance: Callable[[], None],
        wake_positions: Callable[[], None],
    ) -> None:
        self.replica_id = replica_id
        self.config = config
        self.healthy = [True] * config.num_workers
        self.draining = False
        self.queue_depth = 0
        self.deferred: dict[str, str] = {}  # ticket id -> "release" | "abort": calls to replay once Redis answers
        self.departures = 0  # tickets heard leaving the queue (any ticket, any replica), ever
        self._wake_maintenance = wake_maintenance
        self._wake_positions = wake_positions
        self._held: dict[str, SharedTicketView] = {}
        self._zombies: dict[str, SharedTicketView] = {}
        self._payloads: dict[str, bytes] = {}
        self._versions: OrderedDict[str, int] = OrderedDict()
        self._positions = FollowedPositions()
        self._queued_here: dict[str, SharedTicketView] = {}  # queued tickets created on this replica
        self._watched: Counter[str] = Counter()
        self._listeners: list[Callable[[SharedAdmissionEvent], None]] = []
        self._close_listeners: list[Callable[[CloseRequest], None]] = []
        self._pause_listeners: list[Callable[[PauseRequest], None]] = []
        self._reaped_listeners: list[Callable[[SharedTicketView], None]] = []
        self._replica_listeners: list[Callable[[str], None]] = []
        self._totals: Counter[str] = Counter()
        self._counted: OrderedDict[tuple[str, int], None] = OrderedDict()
        self._info = ""
        self._info_generation = 0
        self._waits = RingBufferSummary(config.wait_window)
        self._lengths = RingBufferSummary(config.session_length_window)

    # ------------------------------------------------------------------------------------------------ observers

    def subscribe(self, listener: Callable[[SharedAdmissionEvent], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self._listeners.remove(listener) if listener in self._listeners else None

    def on_close_requested(self, listener: Callable[[CloseRequest], None]) -> Callable[[], None]:
        self._close_listeners.append(listener)
        return lambda: self._close_listeners.remove(listener) if listener in self._close_listeners else None

    def on_pause_requested(self, listener: Callable[[PauseRequest], None]) -> Callable[[], None]:
        self._pause_listeners.append(listener)
        return lambda: self._pause_listeners.remove(listener) if listener in self._pause_listeners else None

    def on_reaped(self, listener: Callable[[SharedTicketView], None]) -> Callable[[], None]:
        self._reaped_listeners.append(listener)
        return lambda: self._reaped_listeners.remove(listener) if listener in self._reaped_listeners else None

    def on_replica_reaped(self, listener: Callable[[str], None]) -> Callable[[], None]:
        self._replica_listeners.append(listener)
        return lambda: self._replica_listeners.remove(listener) if listener in self._replica_listeners else None

    def apply_replica_reaped(self, replica_id: str) -> None:
        """This replica's `maintain` reaped `replica_id` (once in the deployment: the reap is one atomic script)."""
        for listener in tuple(self._replica_listeners):
            try:
                listener(replica_id)
            except Exception:
                logger.exception("redis admission replica-reaped hook %r failed for %s", listener, replica_id)

    def watch(self, ticket_id: str) -> Callable[[], None]:
        self._watched[ticket_id] += 1
        self._positions.follow(ticket_id)
        self._wake_positions()
        done = False

        def unwatch() -> None:
            nonlocal done
            if not done:
                done = True
                self._watched[ticket_id] -= 1
                if self._watched[ticket_id] <= 0:
                    del self._watched[ticket_id]
                    if ticket_id not in self._queued_here:
                        self._positions.unfollow(ticket_id)

        return unwatch

    def held(self) -> dict[str, int]:
        """Ticket id -> worker of every slot held here, lost-but-still-running sessions included."""
        views = (*self._held.values(), *self._zombies.values())
        return {view.ticket_id: view.worker for view in views if view.worker is not None}

    def held_views(self) -> tuple[SharedTicketView, ...]:
        """The slots this replica holds in Redis as far as it knows (for the `maintain` re-assertion)."""
        return tuple(self._held.values())

    def holds(self, ticket_id: str) -> bool:
        return ticket_id in self._held

    def positions_request(self) -> tuple[list[str], list[str]] | None:
        """The followed tickets whose positions may have moved since the last request: (ids to read whole, ids
        whose rank is enough), or None when none may have."""
        return self._positions.request()

    def create_started(self, ticket_id: str) -> None:
        """A create is in flight here: the follower leaves the ticket for the create's reply (see `create_ended`)."""
        self._positions.hold(ticket_id)

    def create_ended(self, ticket_id: str) -> None:
        """The create is over; if the ticket still needs a read (a departure was heard meanwhile), wake the follower."""
        if self._positions.settled(ticket_id):
            self._wake_positions()

    def position_current(self, ticket_id: str) -> None:
        """The position of a ticket just created here is current (no departure was heard while the create was in
        flight): no need to read it again."""
        self._positions.current(ticket_id)

    def positions_stale(self) -> None:
        """Contact with Redis came back (events may have been missed): every followed position is read again."""
        self._positions.all_stale()
        self._wake_positions()

    def queued_here(self) -> list[str]:
        """Tickets created here that this replica last heard of as queued."""
        return list(self._queued_here)

    def has_room(self) -> bool:
        if self.draining:
            return False
        used = [0] * self.config.num_workers
        for worker in self.held().values():
            used[worker] += 1
        cap = self.config.max_sessions_per_worker
        return any(healthy and count < cap for healthy, count in zip(self.healthy, used, strict=True))

    def info(self) -> str:
        """This replica as the scripts read it: "workers|slots per worker|health mask|draining|reserved|generation"
        (the generation grows with every change, so Redis never keeps an older one)."""
        reserved = [0] * self.config.num_workers
        for view in self._zombies.values():
            if view.worker is not None:
                reserved[view.worker] += 1
        mask = "".join("1" if healthy else "0" for healthy in self.healthy)
        spare = ",".join(str(count) for count in reserved)
        info = f"{self.config.num_workers}|{self.config.max_sessions_per_worker}|{mask}|{int(self.draining)}|{spare}"
        if info != self._info:
            self._info, self._info_generation = info, self._info_generation + 1
        return f"{info}|{self._info_generation}"

    def statistics(self) -> AdmissionStatistics:
        retained = [0] * self.config.num_workers
        for worker in self.held().values():
            retained[worker] += 1
        totals = self._totals
        return AdmissionStatistics(
            retained=tuple(retained),
            healthy=tuple(self.healthy),
            max_sessions_per_worker=self.config.max_sessions_per_worker,
            queue_depth=self.queue_depth,
            queue_size=self.config.queue_size,
            draining=self.draining,
            queued_total=totals["queued"],
            admitted_total=totals["admitted"],
            rejected_total=totals["rejected"],
            rejected_draining_total=totals["rejected_draining"],
            expired_total=totals["expired"],
            heartbeat_lost_total=totals["heartbeat_lost"],
            cancelled_total=totals["cancelled"],
            released_total=totals["released"],
            queue_wait=self._waits.snapshot(),
            session_length=self._lengths.snapshot(),
            quota_rejected_total=totals["quota_rejected"],
        )

    # ------------------------------------------------------------------------------------------------ changes

    def stash_payload(self, ticket_id: str, payload: bytes) -> None:
        self._payloads[ticket_id] = payload

    def take_payload(self, ticket_id: str) -> bytes | None:
        return self._payloads.pop(ticket_id, None)

    def forget_held(self, ticket_id: str) -> SharedTicketView | None:
        """Stop counting a slot whose release must wait for Redis; returns its last view."""
        self._payloads.pop(ticket_id, None)
        return self._held.pop(ticket_id, None)

    def end_zombie(self, ticket_id: str) -> SharedTicketView | None:
        """The service stopped a lost session: its reserved slot is free again."""
        view = self._zombies.pop(ticket_id, None)
        if view is not None:
            self._wake_maintenance()
        return view

    def reject(self, view: SharedTicketView) -> SharedTicketView:
        self._totals["rejected"] += 1
        if view.reason is TicketReason.DRAINING:
            self._totals["rejected_draining"] += 1
        elif view.reason in (TicketReason.RUNNING_QUOTA, TicketReason.QUEUED_QUOTA):
            self._totals["quota_rejected"] += 1
        self._publish(SharedAdmissionEvent(SharedEventKind.REJECTED, view, self.replica_id))
        return view

    def apply(self, fields: Mapping[str, bytes]) -> None:
        """One ticket event, from a script reply of this replica or from the stream: applied and delivered at most
        once, never after a newer event of the same ticket; counted once if this replica made the change."""
        try:
            kind = SharedEventKind(decode_text(fields.get("k", b"")))
        except ValueError:
            logger.warning("redis admission: ignoring an event of unknown kind %r", fields.get("k"))
            return
        view = decode_view(fields)
        by = decode_text(fields.get("by", b""))
        if by == self.replica_id:
            self._count(kind, view)
        if self._fresh(view):
            raw_seq = fields.get("seq")
            seq = int(raw_seq) if raw_seq else None
            # a ticket that had a queue deadline and is no longer queued has just left the queue
            left_queue = view.state is not TicketState.QUEUED and bool(fields.get("qdl"))
            self._deliver(kind, view, by, seq=seq, left_queue=left_queue)

    def apply_lost(self, view: SharedTicketView) -> None:
        """`maintain` found a session this replica holds reaped (or forgotten); unless the stream said so first."""
        if view.ticket_id in self._held:
            self._fresh(view)
            self._deliver(SharedEventKind.LOST, view, "")

    def apply_reaped(self, view: SharedTicketView) -> None:
        """This replica's `maintain` reaped another replica and declared `view`'s session lost with it: only this
        replica hears it (the LOST event goes to every replica), so its listeners act once for the deployment."""
        for listener in tuple(self._reaped_listeners):
            try:
                listener(view)
            except Exception:
                logger.exception("redis admission reaped hook %r failed for %s", listener, view.ticket_id)

    def apply_unknown(self, view: SharedTicketView) -> None:
        """`maintain` found a slot held here that no reply reported (a lost reply): deliver its admission."""
        if self._fresh(view):
            self._deliver(SharedEventKind.ADMITTED, view, self.replica_id)

    def apply_vanished(self, ticket_id: str, now: float) -> None:
        """A ticket created here that Redis no longer knows (it lost its data): report it LOST, so that the
        service fails the session instead of leaving it queued for ever."""
        view = self._queued_here.pop(ticket_id, None)
        if view is None:
            return
        view = dataclasses.replace(
            view,
            state=TicketState.CANCELLED,
            position=None,
            ended_at=now,
            queue_deadline=None,
            heartbeat_deadline=None,
            failure="admission_state_lost",
            status="failed",
            status_reason="admission_state_lost",
            version=view.version + 1,
        )
        self._fresh(view)
        self._deliver(SharedEventKind.LOST, view, "")

    def apply_positions(
        self,
        asked: list[str],
        whole: list[tuple[SharedTicketView, int | None]],
        ranks: list[tuple[str, int]],
    ) -> None:
        """Fresh positions of the `asked` tickets that are still queued (`whole` records with their `seq`, and
        `ranks`): POSITION_CHANGED for those that moved."""
        for view in self._positions.apply(asked, whole, ranks):
            self._publish(SharedAdmissionEvent(SharedEventKind.POSITION_CHANGED, view, self.replica_id))

    def apply_close(self, fields: Mapping[str, bytes]) -> None:
        """A close request from the stream: the hooks hear it if this replica owns the session."""
        if decode_text(fields.get("replica", b"")) != self.replica_id:
            return
        request = CloseRequest(
            decode_text(fields["id"]), decode_text(fields.get("mode", b"drain")), decode_text(fields.get("by", b""))
        )
        for listener in tuple(self._close_listeners):
            try:
                listener(request)
            except Exception:
                logger.exception("redis admission close hook %r failed for %s", listener, request.ticket_id)

    def apply_pause(self, fields: Mapping[str, bytes]) -> None:
        """A pause or resume request from the stream: the hooks hear it if this replica owns the session."""
        if decode_text(fields.get("replica", b"")) != self.replica_id:
            return
        request = PauseRequest(
            decode_text(fields["id"]),
            decode_text(fields.get("action", b"pause")) == "pause",
            decode_text(fields.get("by", b"")),
        )
        for listener in tuple(self._pause_listeners):
            try:
                listener(request)
            except Exception:
                logger.exception("redis admission pause hook %r failed for %s", listener, request.ticket_id)

    # ----------------------------------------------------------------------------------------------- internals

    def _count(self, kind: SharedEventKind, view: SharedTicketView) -> None:
        """A change this replica made, counted once whether its reply or the stream tells first (a reply may be
        lost or its call cancelled; the stream may deliver late), and whatever order the listeners hear it in."""
        key = (view.ticket_id, view.version)
        if key in self._counted:
            return
        self._counted[key] = None
        while len(self._counted) > _VERSION_MEMORY:
            self._counted.popitem(last=False)
        self._totals[kind.value] += 1
        if kind is SharedEventKind.EXPIRED and view.reason is TicketReason.HEARTBEAT_LOST:
            self._totals["heartbeat_lost"] += 1
        elif kind is SharedEventKind.ADMITTED and view.admitted_at is not None:
            self._waits.record(view.admitted_at - view.created_at)
        elif kind is SharedEventKind.RELEASED and view.admitted_at is not None and view.ended_at is not None:
            self._lengths.record(view.ended_at - view.admitted_at)

    def _fresh(self, view: SharedTicketView) -> bool:
        last = self._versions.get(view.ticket_id)
        if last is not None and view.version <= last:
            return False
        self._versions[view.ticket_id] = view.version
        self._versions.move_to_end(view.ticket_id)
        while len(self._versions) > _VERSION_MEMORY:
            self._versions.popitem(last=False)
        return True

    def _deliver(
        self,
        kind: SharedEventKind,
        view: SharedTicketView,
        by: str,
        *,
        seq: int | None = None,
        left_queue: bool = False,
    ) -> None:
        me, tid = self.replica_id, view.ticket_id
        if kind is SharedEventKind.ORPHANED and view.replica == me and by != me and tid in self._held:
            # reaped while this replica was silent: the session goes on elsewhere, this replica's copy must stop
            view = dataclasses.replace(view, failure=f"replica_lost: {me} (the session went on elsewhere)")
            kind = SharedEventKind.LOST
        if view.replica == me:
            if kind is SharedEventKind.ADMITTED:
                self._held[tid] = view
            elif kind is SharedEventKind.RELEASED:
                self._held.pop(tid, None)
                self._payloads.pop(tid, None)
            elif kind is SharedEventKind.LOST and self._held.pop(tid, None) is not None:
                self._zombies[tid] = view  # it still runs here until the service stops it and calls release()
                self._payloads.pop(tid, None)
                logger.error("redis admission %s: session %s was lost (%s)", me, tid, view.failure)
            elif kind is SharedEventKind.STATUS and tid in self._held:
                self._held[tid] = view
            elif kind is SharedEventKind.ADOPTED:
                self._held[tid] = view  # re-asserted by the maintenance pass from now on, like any slot held here
            elif kind is SharedEventKind.ORPHANED:
                self._held.pop(tid, None)  # handed off: no slot of this replica's any more
        if view.state is TicketState.QUEUED:
            if view.origin == me:
                self._queued_here[tid] = view
            if view.origin == me or tid in self._watched:
                self._positions.seen_queued(view, seq)
                self._wake_positions()
        else:
            self._positions.unfollow(tid)
            self._queued_here.pop(tid, None)
            if left_queue:
                self.departures += 1
                if seq is not None and self._positions.departed(seq):
                    self._wake_positions()  # only followed tickets behind it moved up
        if kind is SharedEventKind.QUEUED and by != me and self.has_room():
            self._wake_maintenance()  # a new ticket and a free slot here: admit it now, not at the next pass
        if self.deferred.get(tid) != "abort":  # whoever made that create already heard "unavailable"
            self._publish(SharedAdmissionEvent(kind, view, by))

    def _publish(self, event: SharedAdmissionEvent) -> None:
        for listener in tuple(self._listeners):
            try:
                listener(event)
            except Exception:
                logger.exception("redis admission listener %r failed on %s", listener, event.kind.value)
