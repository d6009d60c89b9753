"""The ticket lifecycle table: legal moves, terminal states, and the sentence an illegal move raises."""

from __future__ import annotations

import pytest

from admission import (
    INITIAL_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    IllegalTransitionError,
    TicketState,
    require_transition,
)


def test_transition_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(TicketState)


def test_terminal_states_are_exactly_those_without_moves() -> None:
    assert frozenset({TicketState.RELEASED, TicketState.EXPIRED, TicketState.CANCELLED, TicketState.REJECTED}) == (
        TERMINAL_STATES
    )
    assert INITIAL_STATES.isdisjoint({TicketState.RELEASED, TicketState.EXPIRED, TicketState.CANCELLED})


def test_only_queued_tickets_can_be_admitted_expired_or_cancelled() -> None:
    for old in TicketState:
        for new in (TicketState.ADMITTED, TicketState.EXPIRED, TicketState.CANCELLED):
            if old is TicketState.QUEUED:
                require_transition("t", old, new)
            else:
                with pytest.raises(IllegalTransitionError):
                    require_transition("t", old, new)


@pytest.mark.parametrize("terminal", [state for state in TicketState if state in TERMINAL_STATES])
def test_an_illegal_transition_raises_with_a_sentence(terminal: TicketState) -> None:
    with pytest.raises(IllegalTransitionError) as caught:
        require_transition("s1", terminal, TicketState.ADMITTED)
    message = str(caught.value)
    assert message.startswith(f"admission ticket 's1' cannot move from {terminal.value} to admitted")
    assert "terminal" in message
    assert (caught.value.old, caught.value.new) == (terminal.value, "admitted")
