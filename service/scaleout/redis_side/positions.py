"""`FollowedPositions`: the queued tickets one replica follows, and which of their positions may have moved.

A ticket's position is its rank in the global queue, which is ordered by `seq` (the order of arrival). It changes
only when a ticket *ahead* of it leaves the queue (admitted, cancelled, expired): an arrival joins at the tail and
moves nobody. So this keeps the followed tickets sorted by `seq` and, for each departure the replica hears of (from
a script reply or the event stream), marks only those behind it; `request()` then names them, and the `positions`
script reads just their ranks (ZRANK, O(log n) each) and sends back `id, position` pairs. Nothing else of the queue
is read, and a replica that follows nothing behind a departure reads nothing. Tickets it has no record of (a
`watch` before any event of theirs) are asked for whole, once.

Also refreshed: a ticket when it is first seen queued (the departure of one ahead of it may have been heard before
its own arrival, since script replies and the stream race) unless the replica heard no departure while its create
was in flight (`current`), and every followed ticket after an outage (events may have been missed). Pure: no I/O;
`service.scaleout.redis_side.mirror.ReplicaMirror` owns one.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable

from service.scaleout.redis_side.records import SharedTicketView

__all__ = ["FollowedPositions"]


class FollowedPositions:
    """Followed ticket ids with their last known view, position and `seq`; see the module docstring.

    Invariants: `_order` is the sorted `seq` of every followed ticket whose `seq` is known, `_by_seq` maps each
    back; a ticket is stale (to be read) when it is in `_stale`, or its `seq` is above `_stale_from`, or
    `_all_stale` is set.
    """

    def __init__(self) -> None:
        self._position: dict[str, int | None] = {}  # followed id -> last position known (None: not yet)
        self._views: dict[str, SharedTicketView] = {}
        self._seq: dict[str, int] = {}
        self._order: list[int] = []
        self._by_seq: dict[int, str] = {}
        self._stale: set[str] = set()
        self._stale_from: int | None = None
        self._all_stale = False
        self._in_flight: set[str] = set()  # creates under way here: their reply carries the position

    def __contains__(self, ticket_id: object) -> bool:
        return ticket_id in self._position

    def __len__(self) -> int:
        return len(self._position)

    def position(self, ticket_id: str) -> int | None:
        return self._position.get(ticket_id)

    def follow(self, ticket_id: str) -> None:
        """Start following a ticket known only by id (a `watch`): it is read whole at the next request."""
        if ticket_id not in self._position:
            self._position[ticket_id] = None
            self._stale.add(ticket_id)

    def seen_queued(self, view: SharedTicketView, seq: int | None) -> None:
        """An event of a followed (or newly followed) queued ticket: keep its view; first sighting: refresh it."""
        tid = view.ticket_id
        first = tid not in self._views
        self._views[tid] = view
        self._position[tid] = view.position
        if seq is not None and tid not in self._seq:
            self._seq[tid] = seq
            bisect.insort(self._order, seq)
            self._by_seq[seq] = tid
        if first:
            self._stale.add(tid)

    def hold(self, ticket_id: str) -> None:
        """A create of this ticket is in flight here: its reply will carry the position, so a request leaves the
        ticket out (still stale) until `settled`. Without it, the stream's copy of the create's own event can reach
        the follower first and cost a read the reply makes useless."""
        self._in_flight.add(ticket_id)

    def settled(self, ticket_id: str) -> bool:
        """The create is over (answered, failed or cancelled); True if the ticket is still to be read."""
        self._in_flight.discard(ticket_id)
        return ticket_id in self._stale or self._all_stale

    def current(self, ticket_id: str) -> None:
        """The position last seen is known to be current (no departure was heard since it was computed): the
        refresh of a first sighting is not needed."""
        self._stale.discard(ticket_id)

    def unfollow(self, ticket_id: str) -> None:
        if ticket_id not in self._position:
            return
        del self._position[ticket_id]
        self._views.pop(ticket_id, None)
        self._stale.discard(ticket_id)
        seq = self._seq.pop(ticket_id, None)
        if seq is not None:
            index = bisect.bisect_left(self._order, seq)
            del self._order[index]
            del self._by_seq[seq]

    def departed(self, seq: int) -> bool:
        """A ticket with `seq` left the queue: those behind it moved up. True if any followed ticket is behind."""
        if not self._order or self._order[-1] <= seq:
            return False
        if self._stale_from is None or seq < self._stale_from:
            self._stale_from = seq
        return True

    def all_stale(self) -> None:
        """Events may have been missed (an outage): read every followed ticket at the next request."""
        self._all_stale = True

    def request(self) -> tuple[list[str], list[str]] | None:
        """What to read now and forget the marks: (ids to read whole, ids whose rank is enough), or None."""
        if self._all_stale:
            stale: Iterable[str] = list(self._position)
        else:
            stale = set(self._stale)
            if self._stale_from is not None:
                start = bisect.bisect_right(self._order, self._stale_from)
                stale.update(self._by_seq[seq] for seq in self._order[start:])
        self._stale.clear()
        self._stale_from = None
        self._all_stale = False
        if self._in_flight:
            held = self._in_flight.intersection(stale)
            self._stale.update(held)
            stale = [tid for tid in stale if tid not in held]
        whole = [tid for tid in stale if tid in self._position and tid not in self._views]
        ranked = [tid for tid in stale if tid in self._views]
        return (whole, ranked) if whole or ranked else None

    def apply(
        self,
        asked: Iterable[str],
        whole: Iterable[tuple[SharedTicketView, int | None]],
        ranks: Iterable[tuple[str, int]],
    ) -> list[SharedTicketView]:
        """Fresh positions of the `asked` tickets still queued: `whole` records (with their `seq`) and `ranks`.
        Returns the views whose position moved (for POSITION_CHANGED). An asked ticket that was never seen queued
        and is not queued now is no longer followed."""
        moved: list[SharedTicketView] = []
        answered: set[str] = set()
        for view, seq in whole:
            tid = view.ticket_id
            answered.add(tid)
            if tid in self._position:
                before = self._position[tid]
                self.seen_queued(view, seq)
                self._stale.discard(tid)
                if before != view.position:
                    moved.append(view)
        for tid, position in ranks:
            answered.add(tid)
            known = self._views.get(tid)
            if known is not None and self._position.get(tid) != position:
                view = dataclasses.replace(known, position=position)
                self._views[tid] = view
                self._position[tid] = position
                moved.append(view)
        for tid in asked:
            if tid not in answered and tid not in self._views and tid in self._position:
                self.unfollow(tid)
        return moved
