"""Which queue positions a replica reads again (issue #17): only the followed tickets behind a departure, never
because of an arrival, each once per batch of changes; all of them after an outage. Pure, no Redis (the scripts'
side is in test_redis_admission.py)."""

from __future__ import annotations

from admission import AdmissionConfig, TicketState
from service.scaleout.redis_side.mirror import ReplicaMirror
from service.scaleout.redis_side.positions import FollowedPositions
from service.scaleout.redis_side.records import SharedAdmissionEvent, SharedEventKind, SharedTicketView


def _view(tid: str, position: int | None, *, state: TicketState = TicketState.QUEUED) -> SharedTicketView:
    return SharedTicketView(
        ticket_id=tid,
        owner="k",
        state=state,
        reason=None,
        position=position,
        worker=None,
        retry_after_s=None,
        created_at=0.0,
        admitted_at=None,
        ended_at=None,
        queue_deadline=None,
        heartbeat_deadline=None,
        origin="a",
    )


def _ids(positions: FollowedPositions) -> tuple[list[str], list[str]]:
    """What the next request asks for, sorted: (ids to read whole, ids whose rank is enough)."""
    request = positions.request()
    return ([], []) if request is None else (sorted(request[0]), sorted(request[1]))


def _followed(count: int) -> FollowedPositions:
    """Tickets t1..tN at positions 1..N with seq 10, 20, ..., each already read once (their first sighting)."""
    positions = FollowedPositions()
    for i in range(1, count + 1):
        positions.seen_queued(_view(f"t{i}", i), seq=10 * i)
    assert len(_ids(positions)[1]) == count
    return positions


def test_a_departure_marks_only_the_tickets_behind_it() -> None:
    positions = _followed(5)
    assert positions.departed(35)  # between t3 and t4
    assert _ids(positions) == ([], ["t4", "t5"])


def test_a_departure_at_the_tail_reads_nothing() -> None:
    positions = _followed(1000)
    assert not positions.departed(10_005)  # behind every followed ticket: nobody moved
    assert positions.request() is None


def test_departures_between_two_requests_are_read_once_from_the_earliest() -> None:
    positions = _followed(6)
    positions.departed(45)
    positions.departed(25)
    assert _ids(positions) == ([], ["t3", "t4", "t5", "t6"])
    assert positions.request() is None


def test_new_ranks_report_only_the_tickets_that_moved_and_keep_their_records() -> None:
    positions = _followed(3)
    positions.departed(5)
    _, asked = _ids(positions)
    moved = positions.apply(asked, [], [("t1", 1), ("t2", 1), ("t3", 2)])
    assert [(v.ticket_id, v.position, v.owner) for v in moved] == [("t2", 1, "k"), ("t3", 2, "k")]
    assert positions.position("t3") == 2


def test_a_watched_ticket_is_read_whole_once_and_dropped_if_it_was_never_queued() -> None:
    positions = FollowedPositions()
    positions.follow("w")
    positions.follow("gone")
    assert _ids(positions) == (["gone", "w"], [])
    moved = positions.apply(["w", "gone"], [(_view("w", 7), 70)], [])
    assert [v.position for v in moved] == [7]
    assert "gone" not in positions
    assert positions.request() is None
    positions.departed(60)
    assert _ids(positions) == ([], ["w"])


def test_after_an_outage_every_followed_ticket_is_read() -> None:
    positions = _followed(4)
    positions.all_stale()
    assert _ids(positions) == ([], ["t1", "t2", "t3", "t4"])


def test_the_mirror_wakes_the_position_reader_only_for_departures_ahead_of_what_it_follows() -> None:
    wakes: list[str] = []
    mirror = ReplicaMirror(
        "a", AdmissionConfig(), wake_maintenance=lambda: None, wake_positions=lambda: wakes.append("p")
    )
    published: list[SharedAdmissionEvent] = []
    mirror.subscribe(published.append)

    def event(kind: str, tid: str, seq: int, state: str, **extra: str) -> dict[str, bytes]:
        fields = {"k": kind, "by": "b", "id": tid, "owner": "k", "state": state, "seq": str(seq), "v": "1"}
        fields.update({"origin": "a", "created": "0", **extra})
        return {key: value.encode() for key, value in fields.items()}

    for i in range(1, 4):
        mirror.apply(event("queued", f"t{i}", 10 * i, "queued", pos=str(i), qdl="99"))
    first = mirror.positions_request()  # the first sighting of each is read once
    assert first is not None
    assert sorted(first[1]) == ["t1", "t2", "t3"]
    wakes.clear()
    mirror.apply(event("queued", "other", 50, "queued", pos="4", qdl="99", origin="b"))  # an arrival elsewhere
    mirror.apply(event("cancelled", "other", 50, "cancelled", qdl="99", origin="b", v="2"))  # left behind t3
    assert wakes == []
    assert mirror.positions_request() is None
    mirror.apply(event("admitted", "t1", 10, "admitted", qdl="99", replica="b", worker="0", v="2"))  # the head left
    assert wakes == ["p"]
    request = mirror.positions_request()
    assert request is not None
    assert sorted(request[1]) == ["t2", "t3"]
    mirror.apply_positions(request[1], [], [("t2", 1), ("t3", 2)])
    assert [
        (e.ticket.ticket_id, e.ticket.position) for e in published if e.kind is SharedEventKind.POSITION_CHANGED
    ] == [
        ("t2", 1),
        ("t3", 2),
    ]


def test_a_first_sighting_known_to_be_current_is_not_read_again() -> None:
    positions = FollowedPositions()
    positions.seen_queued(_view("mine", 3), seq=30)  # the reply of a create made here
    positions.current("mine")  # no departure was heard while that create was in flight
    assert positions.request() is None
    positions.seen_queued(_view("theirs", 4), seq=40)  # seen without knowing what happened meanwhile
    assert _ids(positions) == ([], ["theirs"])


def test_a_create_in_flight_keeps_its_ticket_from_the_reader_until_its_reply_settles_it() -> None:
    """The stream's copy of a create's own event can reach the follower before the create's reply: the ticket waits
    for the reply (which carries the position) instead of costing a read."""
    positions = FollowedPositions()
    positions.hold("mine")
    positions.seen_queued(_view("mine", 3), seq=30)  # from the event stream, the reply still on its way
    positions.seen_queued(_view("theirs", 4), seq=40)
    assert _ids(positions) == ([], ["theirs"])  # not "mine" while its create is in flight
    positions.current("mine")  # the reply came and nothing left the queue meanwhile
    assert positions.settled("mine") is False
    assert positions.request() is None


def test_a_create_that_settles_without_a_current_position_leaves_its_ticket_to_be_read() -> None:
    positions = FollowedPositions()
    positions.hold("mine")
    positions.seen_queued(_view("mine", 3), seq=30)
    assert positions.request() is None  # held back, still stale
    assert positions.settled("mine") is True  # a departure was heard meanwhile (or the create failed)
    assert _ids(positions) == ([], ["mine"])
