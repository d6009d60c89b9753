"""The control intake shared by both bindings: the error-reply rate limit over time, on a fake clock."""

from __future__ import annotations

from tests.fakes.clock import FakeClock
from tests.fakes.transport_port import FakeSessionPort
from transport import ControlIntake
from transport.base import ErrorStatus, StatusMessage

# docs/control-protocol.md: error replies come in bursts of 10, then 5 per second.
BURST = 10
RATE = 5.0


def _intake(clock: FakeClock) -> tuple[ControlIntake, list[StatusMessage]]:
    replies: list[StatusMessage] = []
    return ControlIntake(FakeSessionPort(), replies.append, clock=clock), replies


def _garbage(intake: ControlIntake, count: int) -> None:
    for _ in range(count):
        intake.receive(b"{not json")


def test_the_error_reply_burst_stays_capped_after_a_long_idle_and_refills_at_the_documented_rate() -> None:
    clock = FakeClock(1000.0)
    intake, replies = _intake(clock)

    _garbage(intake, 50)
    assert len(replies) == BURST  # a fresh intake starts with one full burst
    assert all(isinstance(r, ErrorStatus) and r.code == "malformed_json" for r in replies)

    # An hour of silence would refill 18 000 tokens at 5/s: the bucket still holds one burst at most.
    clock.advance(3600.0)
    _garbage(intake, 50)
    assert len(replies) == 2 * BURST

    # Empty now. Refill is 5 per second: half a token after 0.1 s (no reply), one and a half after 0.3 s.
    clock.advance(0.1)
    _garbage(intake, 3)
    assert len(replies) == 2 * BURST
    clock.advance(0.2)
    _garbage(intake, 3)
    assert len(replies) == 2 * BURST + 1
    # 0.5 token left over + 1 s at 5/s = 5.5 tokens: five replies out of twenty.
    clock.advance(1.0)
    _garbage(intake, 20)
    assert len(replies) == 2 * BURST + 1 + 5

    stats = intake.statistics()
    assert stats.rejected == 50 + 50 + 3 + 3 + 20
    assert stats.error_replies == len(replies)
    assert stats.error_replies + stats.error_replies_suppressed == stats.rejected


def test_a_configured_rate_and_burst_are_used() -> None:
    clock = FakeClock()
    replies: list[StatusMessage] = []
    intake = ControlIntake(FakeSessionPort(), replies.append, clock=clock, error_rate=1.0, error_burst=2)
    _garbage(intake, 5)
    assert len(replies) == 2
    clock.advance(0.5)
    _garbage(intake, 5)
    assert len(replies) == 2
    clock.advance(0.5)
    _garbage(intake, 5)
    assert len(replies) == 3
