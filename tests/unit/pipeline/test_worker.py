"""ParallelWorker: calls round-trip through spawned processes; stage failures, releases, capacity, start and stop."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from pipeline.actor import StageCall
from pipeline.errors import ActorDiedError, ActorUnavailableError, PipelineSpecError, StageFailedError
from pipeline.process import ParallelWorker, ParallelWorkerConfig, WorkerState
from tests.support.waits import until
from tests.support.worker_stages import (
    WAIT_S,
    Gates,
    all_reduce_stage,
    call,
    counter_stage,
    exploding_factory,
    make_gates,
    pids_gone,
    reporting_stage,
)

# Every async test shares the module loop, which owns the module-scoped worker.
in_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(scope="module")
def gates() -> Gates:
    return make_gates()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def worker(gates: Gates) -> AsyncIterator[ParallelWorker]:
    config = ParallelWorkerConfig(
        name="counter",
        stage_factory=counter_stage,
        torch_threads=2,
        options={"started": gates.started, "gate": gates.gate},
    )
    worker = ParallelWorker(config)
    await worker.start()
    yield worker
    await worker.aclose()


@in_module_loop
async def test_call_round_trips_and_session_state_persists_in_the_child(worker: ParallelWorker) -> None:
    first = await worker.invoke(call(session="round-trip", sequence=0))
    second = await worker.invoke(call(session="round-trip", sequence=1))
    other = await worker.invoke(call(session="round-trip-other", sequence=0))

    assert (first["count"], second["count"], other["count"]) == (1, 2, 1)
    assert first["pid"] == worker.pids[0] != os.getpid()
    assert first["threads"] == 2
    assert first["incarnation"] == worker.incarnation == 1


@in_module_loop
async def test_stage_exception_fails_only_that_call(worker: ParallelWorker) -> None:
    failures = worker.statistics().failures

    with pytest.raises(StageFailedError) as caught:
        await worker.invoke(call("fail", session="failing", sequence=3))

    assert (caught.value.stage_id, caught.value.session_id, caught.value.sequence_id) == ("counter", "failing", 3)
    assert caught.value.cause == "ValueError: boom at 3"
    assert worker.healthy
    assert worker.statistics().failures == failures + 1
    assert (await worker.invoke(call(session="after-failure")))["count"] == 1


@in_module_loop
async def test_unpicklable_inputs_and_artifacts_fail_the_call(worker: ParallelWorker) -> None:
    lambda_input = StageCall("counter", "pickling", 0, {"op": "count", "fn": lambda: None})
    with pytest.raises(StageFailedError, match="inputs are not picklable"):
        await worker.invoke(lambda_input)
    with pytest.raises(StageFailedError, match="artifacts are not picklable"):
        await worker.invoke(call("unpicklable", session="pickling"))
    assert worker.healthy
    assert worker.statistics().in_flight == 0


@in_module_loop
async def test_release_session_drops_state_in_the_child(worker: ParallelWorker) -> None:
    await worker.invoke(call(session="to-release", sequence=0))
    await worker.invoke(call(session="to-release", sequence=1))

    await worker.release_session("to-release")
    await worker.release_session("never-seen")  # unknown ids are a no-op

    released = (await worker.invoke(call("released", session="probe")))["released"]
    assert isinstance(released, list)
    assert released[-2:] == ["to-release", "never-seen"]
    assert (await worker.invoke(call(session="to-release", sequence=2)))["count"] == 1


@in_module_loop
async def test_failed_release_raises_with_the_stage_message(worker: ParallelWorker) -> None:
    with pytest.raises(StageFailedError, match="release failed: RuntimeError: cannot release unreleasable-1"):
        await worker.release_session("unreleasable-1")
    assert worker.healthy
    assert worker.statistics().pending_releases == 0


@in_module_loop
async def test_call_beyond_capacity_is_rejected_at_once(worker: ParallelWorker, gates: Gates) -> None:
    gates.clear()
    blocked = asyncio.create_task(worker.invoke(call("block", session="capacity")))
    await gates.wait_started()

    with pytest.raises(ActorUnavailableError, match=r"at capacity: 1 call\(s\) in flight \(capacity 1\)"):
        await worker.invoke(call(session="capacity-2"))

    await gates.open()
    assert (await blocked)["unblocked"] is True
    assert worker.statistics().in_flight == 0


@in_module_loop
async def test_invoke_and_release_outside_running_state() -> None:
    worker = ParallelWorker(ParallelWorkerConfig(name="idle", stage_factory=counter_stage))

    with pytest.raises(ActorUnavailableError, match="it is created"):
        await worker.invoke(call())
    await worker.release_session("s")  # nothing runs, so nothing holds state
    await worker.aclose()

    assert worker.state is WorkerState.STOPPED
    with pytest.raises(ActorUnavailableError, match="cannot start"):
        await worker.start()


@in_module_loop
async def test_failed_first_start_raises_and_leaves_no_process() -> None:
    worker = ParallelWorker(ParallelWorkerConfig(name="exploding", stage_factory=exploding_factory))

    with pytest.raises(ActorDiedError, match=r"failed to start: rank 0: stage_factory raised ValueError: factory expl"):
        await worker.start()

    assert worker.state is WorkerState.STOPPED
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("lingstream-exploding")]


@in_module_loop
async def test_rank_0s_ready_report_rides_on_its_ready_reply_and_stays_with_the_incarnation(
    worker: ParallelWorker,
) -> None:
    assert worker.statistics().ready_report is None  # a stage that reports nothing
    reporting = ParallelWorker(
        ParallelWorkerConfig(name="reporting", stage_factory=reporting_stage, devices=("cpu", "cpu"))
    )
    await reporting.start()
    try:
        report = reporting.statistics().ready_report
        assert isinstance(report, dict)
        assert (report["rank"], report["world_size"]) == (0, 2)
        assert report["pid"] == reporting.statistics().pids[0]
    finally:
        await reporting.aclose()


@in_module_loop
async def test_two_ranks_form_a_gloo_group_and_both_run_each_call() -> None:
    config = ParallelWorkerConfig(name="allreduce", stage_factory=all_reduce_stage, devices=("cpu", "cpu"))
    worker = ParallelWorker(config)
    await worker.start()
    try:
        pids = worker.pids
        result = await worker.invoke(StageCall("allreduce", "s", 0, {}))
    finally:
        await worker.aclose()

    assert len(set(pids)) == 2
    assert result == {"sum": 3.0, "rank": 0, "world_size": 2}  # 1 + 2: both ranks took part; rank 0 answered
    assert pids_gone(pids)


@in_module_loop
async def test_graceful_stop_finishes_the_call_in_flight_and_leaves_nothing_behind() -> None:
    gates = make_gates()
    threads_before = set(threading.enumerate())
    config = ParallelWorkerConfig(
        name="stopping", stage_factory=counter_stage, options={"started": gates.started, "gate": gates.gate}
    )
    worker = ParallelWorker(config)
    await worker.start()
    pids = worker.pids
    blocked = asyncio.create_task(worker.invoke(call("block", session="stop")))
    await gates.wait_started()

    stopping = asyncio.create_task(worker.aclose())
    await until(lambda: worker.state is WorkerState.STOPPING, "the worker to be stopping", within=WAIT_S)
    await gates.open()

    assert (await blocked)["unblocked"] is True
    await stopping
    assert worker.state is WorkerState.STOPPED
    assert worker.pids == ()
    assert pids_gone(pids)
    assert not [p for p in multiprocessing.active_children() if p.name.startswith("lingstream-stopping")]
    leftover = [t for t in set(threading.enumerate()) - threads_before if not t.name.startswith("asyncio_")]
    assert leftover == []
    with pytest.raises(ActorUnavailableError, match="it is stopped"):
        await worker.invoke(call())


@in_module_loop
async def test_a_killed_rank_restarts_from_the_forkserver_without_the_parents_main() -> None:
    # The restart that bounds a worker-loss recovery (issue #33): a fork of the server that imported torch, which
    # does not run the parent's `__main__` again (a service's main imports the whole service).
    config = ParallelWorkerConfig(name="forked", stage_factory=counter_stage, restart_backoff_initial_s=0.05)
    worker = ParallelWorker(config)
    await worker.start()
    try:
        first = await worker.invoke(call(op="modules"))
        assert first == {"main_file": None, "torch": True}
        os.kill(worker.pids[0], signal.SIGKILL)
        killed = time.monotonic()
        await until(lambda: worker.incarnation == 2 and worker.healthy, "the group to restart", within=WAIT_S)
        print(f"kill to the restarted group ready: {time.monotonic() - killed:.3f} s")
        assert await worker.invoke(call(op="modules")) == {"main_file": None, "torch": True}
    finally:
        await worker.aclose()


def test_config_rejects_an_unknown_start_method() -> None:
    with pytest.raises(PipelineSpecError, match="start_method must be 'forkserver' or 'spawn'"):
        ParallelWorkerConfig(name="w", stage_factory=counter_stage, start_method="fork")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"devices": ()}, "at least one device"),
        ({"devices": ("tpu:0",)}, "unsupported device 'tpu:0'"),
        ({"devices": ("cpu", "cuda:0")}, "mix CPU and CUDA"),
        ({"devices": ("cuda:0", "cuda:0")}, "one CUDA device per rank"),
        ({"capacity": 0}, "capacity must be at least 1"),
        ({"torch_threads": 0}, "torch_threads must be at least 1"),
        ({"stop_timeout_s": 0.0}, "stop_timeout_s must be positive"),
        ({"restart_backoff_initial_s": 5.0, "restart_backoff_max_s": 1.0}, "below restart_backoff_initial_s"),
    ],
)
def test_config_rejects_invalid_values(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(PipelineSpecError, match=message):
        ParallelWorkerConfig(name="bad", stage_factory=counter_stage, **overrides)
