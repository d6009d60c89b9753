"""How long an adopted session was without a replica (`adoption_down_s`, its recovery's start; issue #33): from
its lost replica's last heartbeat, or from its hand-off when it was handed off on drain, never from a heartbeat
left over from an earlier loss."""

from __future__ import annotations

import time

import pytest

from admission import TicketState
from service.scaleout.admission import SharedTicketView
from service.scaleout.ownership import adoption_down_s, adoption_paused_s


def _view(
    reason: str | None,
    *,
    seen: float | None,
    orphaned: float | None,
    adopted: float | None,
    paused: float | None = None,
) -> SharedTicketView:
    return SharedTicketView(
        ticket_id="x",
        owner="k",
        state=TicketState.ADMITTED,
        reason=None,
        position=None,
        worker=0,
        retry_after_s=None,
        created_at=1.0,
        admitted_at=1.0,
        ended_at=None,
        queue_deadline=None,
        heartbeat_deadline=None,
        replica="b",
        last_seen_at=seen,
        adopted_at=adopted,
        orphaned_at=orphaned,
        orphan_reason=reason,
        paused_at=paused,
    )


def test_a_lost_replicas_session_counts_from_its_last_heartbeat_and_a_handed_off_one_from_its_hand_off() -> None:
    now = time.monotonic()
    lost = _view("replica_lost", seen=100.0, orphaned=101.5, adopted=102.0)
    assert adoption_down_s(lost, now) == pytest.approx(2.0, abs=0.5)
    # Lost once (seen 100), adopted, later handed off at 500: the old heartbeat is not its start.
    handed = _view("replica_draining", seen=100.0, orphaned=500.0, adopted=500.25)
    assert adoption_down_s(handed, now) == pytest.approx(0.25, abs=0.5)
    assert adoption_down_s(_view(None, seen=None, orphaned=None, adopted=102.0), now) == 0.0  # an older Redis side


def test_a_session_handed_off_paused_counts_its_pause_from_its_first_pause_and_a_running_one_is_not_paused() -> None:
    now = time.monotonic()
    paused = _view("replica_draining", seen=100.0, orphaned=500.0, adopted=500.5, paused=440.0)
    assert adoption_paused_s(paused, now) == pytest.approx(60.5, abs=0.5)  # paused at 440, adopted at 500.5
    assert adoption_paused_s(_view("replica_draining", seen=100.0, orphaned=500.0, adopted=500.5), now) is None
