"""The admission invariant checker can fail: each deliberately corrupted controller raises, naming the problem.

The stateful and unit tests call `check_invariants()` after every step; this proves that the check is not vacuous.
Corrupting private state is the point here (no public call can produce these states), so it is done only here.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest

from admission import AdmissionController, AdmissionInvariantError, TicketState
from tests.support.admission import make_controller


def _busy() -> AdmissionController:
    """Two workers x one slot, both taken, two tickets queued: a controller whose accounting is consistent."""
    controller, _ = make_controller(num_workers=2, max_sessions_per_worker=1, queue_size=4)
    for ticket_id in ("run-0", "run-1", "wait-0", "wait-1"):
        controller.create("k", ticket_id=ticket_id)
    controller.check_invariants()
    return controller


def _over_count(c: AdmissionController) -> None:
    c._retained[0] += 1


def _slot_freed_but_queue_waits(c: AdmissionController) -> None:
    ticket = c._live.pop("run-0")
    c._retained[ticket.worker or 0] -= 1


def _admitted_without_worker(c: AdmissionController) -> None:
    c._live["run-1"].worker = None


def _lost_from_fifo(c: AdmissionController) -> None:
    c._queue.pop("wait-1")


def _positions_shuffled(c: AdmissionController) -> None:
    c._queue["wait-0"].position = 2


def _finished_but_live(c: AdmissionController) -> None:
    c._live["run-0"].state = TicketState.RELEASED


def _queue_over_size(c: AdmissionController) -> None:
    c._config = dataclasses.replace(c._config, queue_size=1)


def _heartbeat_order_lost(c: AdmissionController) -> None:
    c._silence.pop("wait-0")


CORRUPTIONS: dict[str, tuple[Callable[[AdmissionController], None], str]] = {
    "retained count off by one": (_over_count, r"retained counts \[2, 1\] != admitted tickets per worker \[1, 1\]"),
    "a slot freed while tickets wait": (
        _slot_freed_but_queue_waits,
        r"a ticket waits although it could be admitted \(or the controller is draining\)",
    ),
    "an admitted ticket without a worker": (_admitted_without_worker, "admitted ticket 'run-1' has no worker"),
    "a queued ticket missing from the FIFO": (_lost_from_fifo, "the FIFO and the live queued tickets differ"),
    "queue positions out of order": (_positions_shuffled, r"queue positions are \[2, 2\], not 1..2"),
    "a finished ticket still live": (_finished_but_live, "a finished ticket is still live"),
    "a queue deeper than queue_size": (_queue_over_size, "queue depth 2 exceeds queue_size 1"),
    "a queued ticket missing from the heartbeat order": (
        _heartbeat_order_lost,
        "the heartbeat order and the FIFO hold different tickets",
    ),
}


@pytest.mark.parametrize("name", sorted(CORRUPTIONS))
def test_a_corrupted_controller_fails_its_invariant_check_naming_the_problem(name: str) -> None:
    corrupt, message = CORRUPTIONS[name]
    controller = _busy()
    corrupt(controller)
    with pytest.raises(AdmissionInvariantError) as raised:
        controller.check_invariants()
    # The problems are joined with "; ": the expected one must be one of them, whole.
    assert any(re.fullmatch(message, problem) for problem in str(raised.value).split("; ")), str(raised.value)


def test_a_worker_over_its_cap_is_named() -> None:
    controller = _busy()
    controller._retained[1] = 2
    controller._live["wait-0"].worker = 1
    controller._live["wait-0"].state = TicketState.ADMITTED
    del controller._queue["wait-0"]
    with pytest.raises(AdmissionInvariantError, match="worker 1 retains 2 > 1"):
        controller.check_invariants()
