"""Per-owner quotas: the pure decision, the configuration's checks, and the controller applying them in the same
step as the admission decision (a refusal takes no place in the queue and never touches another owner)."""

from __future__ import annotations

import pytest

from admission import (
    AdmissionConfig,
    AdmissionConfigError,
    AdmissionEventKind,
    KeyQuota,
    TicketReason,
    TicketState,
    quota_verdict,
)
from tests.support.admission import EventLog, assert_invariants, make_controller

RUNNING = TicketReason.RUNNING_QUOTA
QUEUED = TicketReason.QUEUED_QUOTA


@pytest.mark.parametrize(
    ("quota", "running", "queued", "would_queue", "verdict"),
    [
        (KeyQuota(), 50, 50, True, None),
        (KeyQuota(max_running=2), 1, 0, False, None),
        (KeyQuota(max_running=2), 1, 1, False, RUNNING),  # queued tickets count towards max_running
        (KeyQuota(max_running=2), 2, 0, True, RUNNING),
        (KeyQuota(max_queued=0), 0, 0, False, None),  # admitted at once: max_queued does not apply
        (KeyQuota(max_queued=0), 3, 0, True, QUEUED),
        (KeyQuota(max_queued=1), 3, 0, True, None),
        (KeyQuota(max_queued=1), 3, 1, True, QUEUED),
        (KeyQuota(max_running=3, max_queued=1), 2, 1, True, RUNNING),  # running checked first
        (KeyQuota(max_running=3, max_queued=1), 1, 1, True, QUEUED),
    ],
)
def test_quota_verdict_table(
    quota: KeyQuota, running: int, queued: int, would_queue: bool, verdict: TicketReason | None
) -> None:
    assert quota_verdict(quota, running=running, queued=queued, would_queue=would_queue) is verdict


@pytest.mark.parametrize(
    "fields",
    [{"max_running": 0}, {"max_running": -1}, {"max_queued": -1}, {"max_running": True}, {"max_queued": 1.5}],
)
def test_a_bound_out_of_range_is_a_config_error_naming_the_field(fields: dict[str, object]) -> None:
    (name,) = fields
    with pytest.raises(AdmissionConfigError, match=name):
        KeyQuota(**fields)  # type: ignore[arg-type]


def test_limit_of_names_the_bound_a_refusal_hit() -> None:
    quota = KeyQuota(max_running=4, max_queued=0)
    assert quota.limit_of(RUNNING) == ("max_running", 4)
    assert quota.limit_of(QUEUED) == ("max_queued", 0)
    with pytest.raises(ValueError, match="not a refusal"):
        KeyQuota(max_running=4).limit_of(QUEUED)


def test_config_gives_each_owner_its_override_else_the_default() -> None:
    default = KeyQuota(max_running=2)
    special = KeyQuota(max_running=5, max_queued=0)
    config = AdmissionConfig(default_quota=default, key_quotas=(("vip", special),))
    assert config.quota_of("vip") == special
    assert config.quota_of("anyone") == default
    assert config.has_quotas
    assert not AdmissionConfig().has_quotas
    with pytest.raises(AdmissionConfigError, match="twice"):
        AdmissionConfig(key_quotas=(("a", special), ("a", default)))


def test_over_max_running_is_refused_without_a_place_in_the_queue_and_others_go_on() -> None:
    controller, _ = make_controller(num_workers=2, queue_size=4, key_quotas=(("greedy", KeyQuota(max_running=2)),))
    log = EventLog()
    controller.subscribe(log)
    assert controller.create("greedy", ticket_id="g1").state is TicketState.ADMITTED
    assert controller.create("other", ticket_id="o1").state is TicketState.ADMITTED
    assert controller.create("greedy", ticket_id="g2").state is TicketState.QUEUED  # waits for capacity
    refused = controller.create("greedy", ticket_id="g3")
    assert (refused.state, refused.reason) == (TicketState.REJECTED, RUNNING)
    assert refused.retry_after_s is None
    # The refusal took no place: the next owner queues right behind g2, at position 2.
    behind = controller.create("other", ticket_id="o2")
    assert (behind.state, behind.position) == (TicketState.QUEUED, 2)
    assert [e.ticket.ticket_id for e in log.events if e.kind is AdmissionEventKind.QUEUED] == ["g2", "o2"]
    # When greedy's session ends, its own queued ticket is admitted (strict FIFO), and it may create again.
    controller.release("g1")
    assert controller.get("g2").state is TicketState.ADMITTED
    again = controller.create("greedy", ticket_id="g4")  # one running now: it may wait again, behind o2
    assert (again.state, again.position) == (TicketState.QUEUED, 2)
    controller.release("o1")
    assert controller.get("o2").state is TicketState.ADMITTED
    assert controller.statistics().quota_rejected_total == 1
    assert_invariants(controller)


def test_max_queued_bounds_only_waiting_and_zero_means_run_at_once_or_never() -> None:
    controller, _ = make_controller(num_workers=1, queue_size=4, default_quota=KeyQuota(max_queued=0))
    assert controller.create("a", ticket_id="a1").state is TicketState.ADMITTED
    refused = controller.create("a", ticket_id="a2")
    assert (refused.state, refused.reason) == (TicketState.REJECTED, QUEUED)
    refused = controller.create("b", ticket_id="b1")  # the default applies to every owner
    assert refused.reason is QUEUED
    assert controller.statistics().queue_depth == 0
    controller.release("a1")
    assert controller.create("b", ticket_id="b2").state is TicketState.ADMITTED
    assert_invariants(controller)


def test_counts_follow_every_way_out_of_the_queue() -> None:
    controller, clock = make_controller(
        num_workers=1, queue_size=4, queue_timeout=10.0, default_quota=KeyQuota(max_queued=1)
    )
    controller.create("x", ticket_id="run")
    controller.create("k", ticket_id="q1")
    assert controller.create("k", ticket_id="q2").reason is QUEUED
    controller.cancel("q1")  # cancelled: the place is the owner's again
    assert controller.create("k", ticket_id="q3").state is TicketState.QUEUED
    clock.advance(11.0)  # expired
    assert controller.get("q3").state is TicketState.EXPIRED
    assert controller.create("k", ticket_id="q4").state is TicketState.QUEUED
    controller.drain()  # cancelled by the drain
    assert_invariants(controller)
    assert controller.list_tickets(owner="k") == ()
