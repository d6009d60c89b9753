"""The retry schedule, step by step: exponential, capped, jittered by the draw given, bounded in attempts."""

from __future__ import annotations

import pytest

from service.webhooks.schedule import RetryPolicy, Verdict


def test_a_failing_delivery_is_retried_after_1_2_4_s_then_given_up_at_max_attempts() -> None:
    policy = RetryPolicy(max_attempts=4, first_delay_s=1.0, factor=2.0, max_delay_s=300.0, jitter=0.0)
    now = 1000.0
    steps = []
    for attempt in range(1, 5):
        decision = policy.decide(attempt, 503, now)
        steps.append((decision.verdict, decision.retry_at))
        if decision.retry_at is not None:
            now = decision.retry_at
    assert steps == [
        (Verdict.RETRY, 1001.0),
        (Verdict.RETRY, 1003.0),
        (Verdict.RETRY, 1007.0),
        (Verdict.GIVE_UP, None),
    ]


def test_2xx_delivers_410_gives_up_and_no_answer_retries() -> None:
    policy = RetryPolicy(jitter=0.0)
    assert policy.decide(1, 200, 0.0).verdict is Verdict.DELIVERED
    assert policy.decide(3, 204, 0.0).verdict is Verdict.DELIVERED
    assert policy.decide(1, 410, 0.0).verdict is Verdict.GIVE_UP
    assert policy.decide(1, None, 5.0).retry_at == 6.0
    assert policy.decide(1, 302, 5.0).verdict is Verdict.RETRY  # a redirect is not followed: not delivered


def test_delays_are_capped_and_jitter_only_shortens() -> None:
    policy = RetryPolicy(max_attempts=20, first_delay_s=1.0, factor=2.0, max_delay_s=60.0, jitter=0.5)
    assert policy.delay_after(10, draw=0.0) == 60.0
    assert policy.delay_after(10, draw=0.999) == pytest.approx(60.0 * (1 - 0.5 * 0.999))
    assert policy.delay_after(1, draw=0.5) == 0.75
    assert policy.delay_after(20) is None


def test_the_default_schedule_is_bounded() -> None:
    policy = RetryPolicy()
    assert policy.schedule() == (1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
    assert sum(policy.schedule()) < 300


@pytest.mark.parametrize(
    "kwargs", [{"max_attempts": 0}, {"first_delay_s": 0}, {"factor": 0.5}, {"jitter": 1.0}, {"max_delay_s": 0.1}]
)
def test_a_policy_out_of_bounds_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="retry policy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]
