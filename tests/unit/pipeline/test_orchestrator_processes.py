"""The orchestrator over a real process worker: a SIGKILLed worker fails only the sessions whose state it held."""

from __future__ import annotations

import os
import signal

import pytest

from pipeline import (
    CloseMode,
    PipelineSessionState,
    SessionFailedError,
    StreamingEdgeSpec,
    StreamingPipelineOrchestrator,
    StreamingPipelineSpec,
    StreamingStageSpec,
)
from pipeline.process import ParallelWorkerConfig, ParallelWorkerStageActor
from tests.support.waits import until
from tests.support.worker_stages import WAIT_S, echo_stage, make_gates

SPEC = StreamingPipelineSpec(
    stages=(StreamingStageSpec("worker", consumes=("x",), produces=("y",)),),
    edges=(StreamingEdgeSpec("x", target="worker", capacity=2),),
    outputs=("y",),
)


async def test_a_killed_worker_fails_its_sessions_restarts_and_serves_new_ones() -> None:
    gates = make_gates()
    config = ParallelWorkerConfig(
        name="worker",
        stage_factory=echo_stage,
        options={"started": gates.started},
        stop_timeout_s=0.5,
        kill_grace_s=1.0,
        restart_backoff_initial_s=0.1,
    )
    actor = ParallelWorkerStageActor(config)
    async with StreamingPipelineOrchestrator(SPEC, {"worker": actor}) as orch:
        holder = orch.open_session("holder")  # has state in the worker, idle when it dies
        doomed = orch.open_session("doomed")  # its call is in flight when the worker dies
        bystander = orch.open_session("bystander")  # never touched the worker
        await orch.submit("holder", {"x": (0, "a")})
        assert (await anext(holder)).payload == ("a", 1)
        await orch.submit("doomed", {"x": (0, "block")})
        await gates.wait_started()
        (pid,) = actor.worker_statistics().pids

        os.kill(pid, signal.SIGKILL)

        with pytest.raises(SessionFailedError, match=r"actor .worker. died \(incarnation 1\).*SIGKILL"):
            await anext(doomed)
        with pytest.raises(SessionFailedError, match="died"):
            await anext(holder)
        assert orch.session_state("bystander") is PipelineSessionState.OPEN
        await until(lambda: orch.ready, "the orchestrator to be ready", within=WAIT_S)
        assert actor.incarnation == 2
        await orch.submit("bystander", {"x": (0, "b")})
        assert (await anext(bystander)).payload == ("b", 1)
        report = await orch.close_session("bystander", CloseMode.DRAIN)
        assert report.state is PipelineSessionState.CLOSED
        assert report.slot_leaks == 0
        stats = orch.statistics()
        assert stats.core.sessions_by_state == {}  # the failed sessions were released by themselves
        assert stats.core.poisoned_sessions == ()
