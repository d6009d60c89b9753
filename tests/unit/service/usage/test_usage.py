"""Usage metering's pure parts on fake clocks: the bucketed ledger, the meter that turns admission events and chunks
into usage, and the `since` of `GET /v1/usage`."""

from __future__ import annotations

import pytest

from admission import AdmissionConfig, AdmissionController, KeyQuota
from service.errors import InvalidUsageQueryError
from service.usage import UsageLedger, UsageMeter, UsageTotals, parse_since
from tests.support.fakes.clock import FakeClock

HOUR = 3600.0
T0 = 1_800_000_000.0  # a wall time on an hour boundary (1.8e9 is a multiple of 3600)


class FakeWall:
    """Wall-clock seconds that move with the admission's fake clock (offset `T0`)."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock

    def __call__(self) -> float:
        return T0 + self._clock.now()


def test_a_span_across_bucket_edges_is_split_so_since_counts_only_what_follows() -> None:
    ledger = UsageLedger()
    ledger.add_span("k", T0 + HOUR - 30, T0 + 2 * HOUR + 10, queued=False)  # 30 s, 1 h, 10 s
    assert ledger.since("k", T0).running_s == pytest.approx(HOUR + 40)
    assert ledger.since("k", T0 + HOUR).running_s == pytest.approx(HOUR + 10)
    assert ledger.since("k", T0 + HOUR + 1800).running_s == pytest.approx(HOUR + 10)  # the bucket's start counts
    assert ledger.since("k", T0 + 2 * HOUR).running_s == pytest.approx(10)
    assert ledger.since("other", T0) == UsageTotals()
    ledger.add_span("k", T0 + 5, T0 + 5, queued=True)  # empty: nothing
    ledger.add_span("k", T0 + 9, T0 + 5, queued=True)  # inverted: nothing
    assert ledger.totals()["k"] == UsageTotals(running_s=pytest.approx(HOUR + 40))  # type: ignore[arg-type]


def test_old_buckets_are_pruned_but_all_time_totals_keep_growing() -> None:
    ledger = UsageLedger(bucket_s=3600, retention_s=2 * 3600)
    ledger.add("k", T0, UsageTotals(chunks=1))
    ledger.add("k", T0 + 3 * HOUR, UsageTotals(chunks=2))  # the first bucket is now past the retention
    assert ledger.since("k", T0).chunks == 2
    assert ledger.totals()["k"].chunks == 3
    with pytest.raises(ValueError, match="bucket_s"):
        UsageLedger(bucket_s=3600, retention_s=60)


def _metered() -> tuple[AdmissionController, UsageMeter, FakeClock]:
    clock = FakeClock()
    config = AdmissionConfig(num_workers=1, queue_size=4, queue_timeout=100.0, queue_heartbeat_timeout=None)
    controller = AdmissionController(config, clock=clock)
    meter = UsageMeter(UsageLedger(), clock, FakeWall(clock))
    controller.subscribe(meter.event)
    return controller, meter, clock


def test_the_meter_counts_sessions_waits_running_time_chunks_and_frames_once() -> None:
    controller, meter, clock = _metered()
    controller.create("a", ticket_id="a1")  # admitted at once
    controller.create("b", ticket_id="b1")  # queued
    clock.advance(10)
    meter.chunk("a1", "a", frames=4)
    clock.advance(5)
    controller.release("a1")  # b1 waited 15 s and is admitted now
    clock.advance(7)
    meter.chunk("b1", "b", frames=4)
    meter.chunk("b1", "b", frames=3)
    clock.advance(3)
    meter.settle("b")  # a read: b1's running time up to now (10 s)
    clock.advance(2)
    controller.release("b1")
    totals = meter.ledger.totals()
    assert totals["a"] == UsageTotals(running_s=15.0, queued_s=0.0, sessions=1, chunks=1, frames=4)
    assert totals["b"] == UsageTotals(running_s=12.0, queued_s=15.0, sessions=1, chunks=2, frames=7)
    controller.release("b1")  # idempotent: counted once
    meter.settle()
    assert meter.ledger.totals()["b"].running_s == 12.0


def test_waits_that_end_in_expiry_or_cancel_count_and_refusals_count_nothing() -> None:
    controller, meter, clock = _metered()
    controller.create("x", ticket_id="run")
    controller.create("k", ticket_id="q1")
    controller.create("k", ticket_id="q2")
    clock.advance(4)
    controller.cancel("q1")
    clock.advance(200)  # q2 expires at its deadline, 100 s after it was created
    controller.tick()
    assert meter.ledger.totals()["k"] == UsageTotals(queued_s=104.0, sessions=2)
    quota = AdmissionConfig(num_workers=1, queue_size=4, default_quota=KeyQuota(max_queued=0))
    limited = AdmissionController(quota, clock=clock)
    other = UsageMeter(UsageLedger(), clock, FakeWall(clock))
    limited.subscribe(other.event)
    limited.create("k", ticket_id="r1")
    assert limited.create("k", ticket_id="r2").reason is not None  # refused: no session counted
    assert other.ledger.totals()["k"].sessions == 1


def test_spans_land_in_the_wall_buckets_they_happened_in() -> None:
    controller, meter, clock = _metered()
    clock.advance(HOUR - 20)
    controller.create("a", ticket_id="a1")
    clock.advance(50)  # 20 s in the first hour, 30 s in the second
    controller.release("a1")
    assert meter.ledger.since("a", T0 + HOUR).running_s == pytest.approx(30.0)
    assert meter.ledger.since("a", T0).running_s == pytest.approx(50.0)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, T0 - 35 * 86_400),  # everything kept
        ("", T0 - 35 * 86_400),
        ("2027-01-15T08:00:00Z", T0),
        ("2027-01-15T09:00:00+01:00", T0),
        ("2027-01-15T07:59:00z", T0 - 60),
        (str(T0 - 60), T0 - 60),
        ("2020-01-01T00:00:00Z", T0 - 35 * 86_400),  # older than the retention: where the counts start
    ],
)
def test_since_parses_rfc3339_and_unix_seconds_clamped_to_the_retention(raw: str | None, expected: float) -> None:
    assert parse_since(raw, T0) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("yesterday", "RFC 3339"),
        ("2027-01-15T08:00:00", "needs an offset"),
        ("nan", "finite"),
        ("-inf", "finite"),
        (str(T0 + 3600), "in the future"),
        ("2099-01-01T00:00:00Z", "in the future"),
    ],
)
def test_a_bad_since_is_invalid_since(raw: str, message: str) -> None:
    with pytest.raises(InvalidUsageQueryError, match=message):
        parse_since(raw, T0)
