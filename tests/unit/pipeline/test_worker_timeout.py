"""ParallelWorker's call timeout: a rank that never answers is declared stuck, its group is killed and restarted,
and the call fails with `ActorDiedError` instead of waiting forever."""

from __future__ import annotations

import time

import pytest

from pipeline.errors import ActorDiedError, PipelineSpecError
from pipeline.process import ParallelWorker, ParallelWorkerConfig
from tests.support.waits import until
from tests.support.worker_stages import WAIT_S, call, counter_stage, make_gates, pids_gone


async def test_a_rank_stuck_past_the_call_timeout_is_killed_and_its_group_restarts() -> None:
    gates = make_gates()  # no "gate" option: a "block" call sleeps far past the timeout
    config = ParallelWorkerConfig(
        name="stuck",
        stage_factory=counter_stage,
        options={"started": gates.started},
        call_timeout_s=1.0,
        kill_grace_s=1.0,
        restart_backoff_initial_s=0.1,
    )
    worker = ParallelWorker(config)
    deaths: list[tuple[int, str]] = []
    worker.add_death_listener(lambda _name, incarnation, reason: deaths.append((incarnation, reason)))
    await worker.start()
    try:
        assert (await worker.invoke(call(session="before")))["count"] == 1  # a call within the limit is untouched
        await worker.release_session("before")
        pids = worker.pids
        started = time.monotonic()

        with pytest.raises(ActorDiedError, match=r"rank\(s\) 0 did not finish stage 'counter' session 'hung' .*1 s"):
            await worker.invoke(call("block", session="hung"))

        assert time.monotonic() - started < 10  # one timeout and a kill, not the 30 s the call would take
        assert [incarnation for incarnation, _ in deaths] == [1]
        assert "(stuck)" in deaths[0][1]
        await until(lambda: worker.healthy, "the worker to be healthy again", within=WAIT_S)
        assert worker.incarnation == 2
        assert pids_gone(pids)
        assert (await worker.invoke(call(session="after")))["count"] == 1
        assert worker.statistics().lost_calls == 1
    finally:
        await worker.aclose()


def test_call_timeout_must_be_positive() -> None:
    with pytest.raises(PipelineSpecError, match="call_timeout_s must be positive"):
        ParallelWorkerConfig(name="w", stage_factory=counter_stage, call_timeout_s=0.0)
