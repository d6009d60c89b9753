"""The runtime's own lifecycle table (`service.runtime.state`) and its one mover."""

from __future__ import annotations

import pytest

from service.errors import RuntimeTransitionError, lookup
from service.runtime.state import RUNTIME_TRANSITIONS, TERMINAL_RUNTIME_STATES, RuntimeLifecycle, RuntimeState


def test_the_table_has_a_row_for_every_state_and_leads_only_to_states_it_has() -> None:
    assert set(RUNTIME_TRANSITIONS) == set(RuntimeState)
    for state, moves in RUNTIME_TRANSITIONS.items():
        assert moves <= set(RuntimeState), state
        assert state not in moves, f"{state} moves to itself"


def test_closed_is_the_one_terminal_state_and_has_no_moves() -> None:
    assert frozenset({RuntimeState.CLOSED}) == TERMINAL_RUNTIME_STATES
    for state in TERMINAL_RUNTIME_STATES:
        assert RUNTIME_TRANSITIONS[state] == frozenset()


def test_every_state_is_reachable_from_new_and_every_live_state_can_close() -> None:
    reached, frontier = {RuntimeState.NEW}, [RuntimeState.NEW]
    while frontier:
        for new in RUNTIME_TRANSITIONS[frontier.pop()]:
            if new not in reached:
                reached.add(new)
                frontier.append(new)
    assert reached == set(RuntimeState)
    for state in set(RuntimeState) - TERMINAL_RUNTIME_STATES - {RuntimeState.CLOSING}:
        assert RuntimeState.CLOSING in RUNTIME_TRANSITIONS[state], state


def test_a_lifecycle_follows_the_life_of_a_runtime_that_drains() -> None:
    lifecycle = RuntimeLifecycle()
    assert (lifecycle.state, lifecycle.closing) == (RuntimeState.NEW, False)
    for state in (RuntimeState.SERVING, RuntimeState.DRAINING, RuntimeState.CLOSING):
        lifecycle.move(state)
        assert lifecycle.state is state
    assert lifecycle.closing
    lifecycle.move(RuntimeState.CLOSED)
    assert (lifecycle.state, lifecycle.closing) == (RuntimeState.CLOSED, True)


@pytest.mark.parametrize(
    ("path", "illegal"),
    [
        ((), RuntimeState.CLOSED),  # closing comes first
        ((RuntimeState.SERVING,), RuntimeState.NEW),
        ((RuntimeState.SERVING, RuntimeState.DRAINING), RuntimeState.SERVING),
        ((RuntimeState.CLOSING,), RuntimeState.DRAINING),
        ((RuntimeState.CLOSING, RuntimeState.CLOSED), RuntimeState.SERVING),
    ],
)
def test_an_illegal_move_raises_with_a_sentence_and_changes_nothing(
    path: tuple[RuntimeState, ...], illegal: RuntimeState
) -> None:
    lifecycle = RuntimeLifecycle()
    for state in path:
        lifecycle.move(state)
    before = lifecycle.state
    assert not lifecycle.can_move(illegal)
    with pytest.raises(RuntimeTransitionError, match=f"cannot move from {before.value} to {illegal.value}: "):
        lifecycle.move(illegal)
    assert lifecycle.state is before


def test_an_illegal_move_is_a_bug_answered_as_internal() -> None:
    spec = lookup(RuntimeTransitionError("x"))
    assert spec is not None
    assert (spec.status, spec.code) == (500, "internal")
