"""Retry-After is capped by `max_retry_after_s`, whether the estimate comes from the default or from history."""

from __future__ import annotations

from admission import TicketReason, TicketState
from tests.support.admission import make_controller


def test_retry_after_never_exceeds_its_configured_maximum() -> None:
    controller, clock = make_controller(
        num_workers=1,
        queue_size=0,
        default_session_seconds=1000.0,
        max_retry_after_s=45,
        queue_heartbeat_timeout=None,
        session_length_window=4,
    )
    controller.create("k", ticket_id="busy")
    rejected = controller.create("k", ticket_id="late")
    assert (rejected.state, rejected.reason) == (TicketState.REJECTED, TicketReason.QUEUE_FULL)
    assert rejected.retry_after_s == 45  # the default (1000 s) over one slot, capped
    assert controller.retry_after_s() == 45

    # From history: two 600 s sessions, still over the cap.
    for i in range(2):
        controller.release("busy" if i == 0 else f"long-{i - 1}")
        controller.create("k", ticket_id=f"long-{i}")
        clock.advance(600.0)
    assert controller.create("k", ticket_id="later").retry_after_s == 45

    # Below the cap the estimate itself is answered: once the window holds only 20 s sessions, 20.
    for i in range(5):
        controller.release("long-1" if i == 0 else f"short-{i - 1}")
        controller.create("k", ticket_id=f"short-{i}")
        clock.advance(20.0)
    assert controller.create("k", ticket_id="latest").retry_after_s == 20
