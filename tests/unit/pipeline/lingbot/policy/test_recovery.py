"""The recovery core (`pipeline.lingbot.policy.recovery`), driven step by step with a hand-held clock: when a
session is re-seeded, when it is given up, and the races (a stop while recovering, a second death during a
recovery, a close during a re-seed)."""

from __future__ import annotations

import pytest

from pipeline.lingbot.policy.recovery import (
    RecoveryBudget,
    RecoveryCause,
    RecoveryError,
    RecoveryState,
    RecoveryTracker,
    failure_cause,
)

DIED = "actor 'denoise' died (incarnation 1): rank 1 (pid 7) exited with exit code -9 (SIGKILL)"
UNAVAILABLE = "stage 'denoise': ActorUnavailableError: worker 'dit' is restarting"
RAISED = "stage 'denoise' failed for session 's': RuntimeError: boom"


def test_failure_reasons_map_to_causes() -> None:
    assert failure_cause(DIED) is RecoveryCause.WORKER_LOST
    assert failure_cause("stage 'denoise': ActorDiedError: rank 0 exited") is RecoveryCause.WORKER_LOST
    assert failure_cause(UNAVAILABLE) is RecoveryCause.WORKER_LOST
    assert failure_cause(RAISED) is RecoveryCause.STAGE_FAILED
    assert failure_cause("stage 'denoise': ModelContextExhaustedError: model_context_exhausted: ...") is None


def test_the_final_mark_is_the_models_reason() -> None:
    from pipeline.lingbot.models.errors import CONTEXT_EXHAUSTED_REASON

    assert failure_cause(f"x: {CONTEXT_EXHAUSTED_REASON}: y") is None


def test_a_worker_loss_is_recovered_and_the_first_chunk_after_completes_it() -> None:
    tracker = RecoveryTracker(RecoveryBudget(attempts=3, timeout_s=10))
    assert tracker.rebuilt(0.5) is None  # an ordinary chunk: nothing to complete
    decision = tracker.failed(1.0, DIED, has_checkpoint=True)
    assert (decision.recover, decision.cause, decision.attempt) == (True, RecoveryCause.WORKER_LOST, 1)
    assert tracker.state is RecoveryState.RECOVERING
    assert tracker.deadline == 11.0
    assert not tracker.expired(10.9)
    assert tracker.rebuilt(3.5) == 2.5
    assert (tracker.state, tracker.attempts, tracker.cause, tracker.recoveries) == (RecoveryState.RUNNING, 0, None, 1)
    assert tracker.deadline is None


def test_a_second_death_during_the_recovery_is_another_attempt_of_the_same_recovery() -> None:
    tracker = RecoveryTracker(RecoveryBudget(attempts=2, timeout_s=10))
    assert tracker.failed(1.0, DIED, has_checkpoint=True).attempt == 1
    second = tracker.failed(2.0, UNAVAILABLE, has_checkpoint=True)
    assert (second.recover, second.attempt) == (True, 2)
    assert tracker.deadline == 11.0  # measured from the failure that started it
    assert tracker.cause is RecoveryCause.WORKER_LOST
    third = tracker.failed(3.0, DIED, has_checkpoint=True)
    assert not third.recover
    assert third.why == "2 re-seed(s) in a row failed"
    assert tracker.state is RecoveryState.FAILED
    with pytest.raises(RecoveryError, match="cannot move from failed"):
        tracker.failed(4.0, DIED, has_checkpoint=True)


def test_a_chunk_between_failures_starts_the_count_again() -> None:
    tracker = RecoveryTracker(RecoveryBudget(attempts=1, timeout_s=10))
    for now in (1.0, 5.0, 9.0):
        assert tracker.failed(now, RAISED, has_checkpoint=True).recover
        assert tracker.rebuilt(now + 0.5) == 0.5
    assert tracker.recoveries == 3


def test_no_checkpoint_a_final_failure_and_a_late_failure_are_not_recovered() -> None:
    assert RecoveryTracker(RecoveryBudget()).failed(0.0, DIED, has_checkpoint=False).why == (
        "the session has no checkpoint"
    )
    final = RecoveryTracker(RecoveryBudget()).failed(0.0, "model_context_exhausted", has_checkpoint=True)
    assert (final.recover, final.cause) == (False, None)
    late = RecoveryTracker(RecoveryBudget(attempts=5, timeout_s=2))
    assert late.failed(0.0, DIED, has_checkpoint=True).recover
    assert late.expired(2.5)
    assert late.failed(2.5, DIED, has_checkpoint=True).why == "recovery took longer than 2 s"


def test_waiting_past_the_deadline_gives_up() -> None:
    tracker = RecoveryTracker(RecoveryBudget(attempts=3, timeout_s=2))
    tracker.failed(0.0, DIED, has_checkpoint=True)
    assert not tracker.expired(2.0)
    assert tracker.expired(2.01)
    assert tracker.give_up("its workers did not come back in time") == "its workers did not come back in time"
    assert tracker.state is RecoveryState.FAILED


def test_a_stop_or_close_while_recovering_ends_it_without_the_failure() -> None:
    tracker = RecoveryTracker(RecoveryBudget())
    tracker.failed(0.0, DIED, has_checkpoint=True)
    tracker.stopped()
    assert (tracker.state, tracker.interrupted) == (RecoveryState.ENDED, True)
    tracker.stopped()  # idempotent
    with pytest.raises(RecoveryError, match="a chunk came out of a session whose recovery is ended"):
        tracker.rebuilt(1.0)


def test_a_stop_while_running_is_not_an_interrupted_recovery() -> None:
    tracker = RecoveryTracker(RecoveryBudget())
    tracker.stopped()
    assert (tracker.state, tracker.interrupted) == (RecoveryState.ENDED, False)


def test_a_close_during_the_reseed_after_a_second_death_still_counts_as_interrupted() -> None:
    tracker = RecoveryTracker(RecoveryBudget(attempts=3))
    tracker.failed(0.0, DIED, has_checkpoint=True)
    tracker.failed(1.0, DIED, has_checkpoint=True)  # the re-seed's first chunk died too
    tracker.stopped()  # closed while the second re-seed was under way
    assert tracker.interrupted
    assert tracker.state is RecoveryState.ENDED


def test_the_budget_is_validated() -> None:
    with pytest.raises(ValueError, match="attempts must be at least 1"):
        RecoveryBudget(attempts=0)
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        RecoveryBudget(timeout_s=0)
