"""ParallelWorkerStageActor: the StageActor seam over a ParallelWorker, its statistics, cancellation contract and
recovery from a killed worker process."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from pipeline.errors import ActorDiedError, ActorUnavailableError, StageFailedError
from pipeline.process import ParallelWorkerConfig, ParallelWorkerStageActor
from tests.support.waits import until
from tests.support.worker_stages import WAIT_S, Gates, call, counter_stage, make_gates, pids_gone

in_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def gates() -> Gates:
    return make_gates()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def actor(gates: Gates) -> AsyncIterator[ParallelWorkerStageActor]:
    config = ParallelWorkerConfig(
        name="counter", stage_factory=counter_stage, options={"started": gates.started, "gate": gates.gate}
    )
    actor = ParallelWorkerStageActor(config)
    await actor.start()
    yield actor
    await actor.aclose()


@in_module_loop
async def test_statistics_count_calls_failures_and_in_flight(actor: ParallelWorkerStageActor) -> None:
    before = actor.statistics()
    await actor.invoke(call(session="stats"))
    with pytest.raises(StageFailedError):
        await actor.invoke(call("fail", session="stats", sequence=1))

    stats = actor.statistics()
    assert (stats.name, stats.healthy, stats.incarnation, stats.in_flight) == ("counter", True, 1, 0)
    assert (stats.calls - before.calls, stats.failures - before.failures, stats.restarts) == (2, 1, 0)
    assert actor.capacity == 1


@in_module_loop
async def test_malformed_tensor_ref_artifact_fails_the_call(actor: ParallelWorkerStageActor) -> None:
    with pytest.raises(StageFailedError, match=r"artifact 'latent': TensorRef 'k': nbytes 7 does not match"):
        await actor.invoke(call("bad_ref", session="refs"))
    assert actor.healthy


@in_module_loop
async def test_cancelled_invoke_finishes_in_the_child_and_its_result_is_dropped(
    actor: ParallelWorkerStageActor, gates: Gates
) -> None:
    gates.clear()
    stale = actor.worker_statistics().stale_results
    blocked = asyncio.create_task(actor.invoke(call("block", session="cancel")))
    await gates.wait_started()

    blocked.cancel()
    with pytest.raises(asyncio.CancelledError):
        await blocked
    assert actor.statistics().in_flight == 1  # still running in the child, so it keeps its slot

    await gates.open()
    await until(lambda: actor.statistics().in_flight == 0, "no call in flight", within=WAIT_S)
    assert actor.worker_statistics().stale_results == stale + 1
    assert (await actor.invoke(call(session="cancel", sequence=1)))["count"] == 1


@in_module_loop
async def test_killed_process_fails_the_call_in_flight_and_restarts_as_the_next_incarnation() -> None:
    gates = make_gates()
    deaths: list[tuple[str, int, str]] = []
    config = ParallelWorkerConfig(
        name="mortal",
        stage_factory=counter_stage,
        options={"started": gates.started},  # no gate: "block" sleeps until killed
        stop_timeout_s=0.5,
        kill_grace_s=1.0,
        restart_backoff_initial_s=0.2,
    )
    actor = ParallelWorkerStageActor(config)
    actor.add_death_listener(lambda name, incarnation, reason: deaths.append((name, incarnation, reason)))
    await actor.start()
    try:
        assert (await actor.invoke(call(session="kept")))["count"] == 1
        (old_pid,) = actor.worker_statistics().pids
        in_flight = asyncio.create_task(actor.invoke(call("block", session="kept", sequence=1)))
        await gates.wait_started()

        os.kill(old_pid, signal.SIGKILL)

        with pytest.raises(ActorDiedError, match=r"incarnation 1 died during stage 'counter' session 'kept'"):
            await in_flight
        assert len(deaths) == 1
        name, incarnation, reason = deaths[0]
        assert (name, incarnation) == ("mortal", 1)
        assert f"pid {old_pid}" in reason
        assert "SIGKILL" in reason
        assert not actor.healthy
        with pytest.raises(ActorUnavailableError, match="restarting"):
            await actor.invoke(call(session="kept", sequence=2))
        await actor.release_session("kept")  # its state died with the process: nothing to release

        await until(lambda: actor.healthy, "the actor to be healthy again", within=WAIT_S)
        assert actor.incarnation == 2
        (new_pid,) = actor.worker_statistics().pids
        assert new_pid != old_pid
        again = await actor.invoke(call(session="kept", sequence=2))
        assert (again["count"], again["incarnation"]) == (1, 2)  # per-session state starts afresh
        stats = actor.worker_statistics()
        assert (stats.deaths, stats.restarts, stats.lost_calls) == (1, 1, 1)

        # Stopping with a call that never finishes: graceful for stop_timeout_s, then forced.
        gates.clear()
        stuck = asyncio.create_task(actor.invoke(call("block", session="stuck")))
        await gates.wait_started()
    finally:
        await actor.aclose()

    with pytest.raises(ActorUnavailableError, match="stopped before stage 'counter' session 'stuck'"):
        await stuck
    assert pids_gone((old_pid, new_pid))
    assert len(deaths) == 1  # stopping is not dying
