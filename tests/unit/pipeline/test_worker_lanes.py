"""A worker with two call lanes (`ParallelWorkerConfig.lanes`, issue #32: a co-located decode beside the DiT): a
lane-1 call runs while a lane-0 call is busy in the same rank, each lane keeps its own order, parts reach the
listener with their own call, capacity is per lane, and the lane actor is a view of the owner's worker."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import pytest
import pytest_asyncio

from pipeline.actor import StageCall
from pipeline.errors import ActorUnavailableError, PipelineSpecError
from pipeline.process import ParallelWorkerConfig, ParallelWorkerStageActor
from tests.support.worker_stages import counter_stage, lane_stage

in_module_loop = pytest.mark.asyncio(loop_scope="module")


def call(op: str, sequence: int, **inputs: object) -> StageCall:
    return StageCall("lanes", "s", sequence, {"op": op, **inputs})


def out(artifacts: Mapping[str, object]) -> dict[str, Any]:
    """The stage's one artifact, a dict (`LaneStage`)."""
    value = artifacts["out"]
    assert isinstance(value, dict)
    return value


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def owner() -> AsyncIterator[ParallelWorkerStageActor]:
    config = ParallelWorkerConfig(name="lanes", stage_factory=lane_stage, devices=("cpu", "cpu"), lanes=2)
    actor = ParallelWorkerStageActor(config)
    await actor.start()
    yield actor
    await actor.aclose()


@in_module_loop
async def test_a_lane_one_call_runs_while_a_lane_zero_call_is_busy_in_the_same_rank(
    owner: ParallelWorkerStageActor,
) -> None:
    lane = owner.lane_actor("decode")
    parts: list[tuple[str, int, Any]] = []
    owner.add_part_listener(lambda c, part: parts.append((c.stage_id, c.sequence_id, part)))
    waiting = asyncio.create_task(owner.invoke(call("wait", 0, **{"for": 1})))
    first = await lane.invoke(StageCall("decode", "s", 0, {"op": "signal"}))
    second = await lane.invoke(StageCall("decode", "s", 1, {"op": "signal"}))
    waited = out(await waiting)
    assert waited["seen"] is True  # without a second lane it would have waited for GATE_TIMEOUT_S
    assert waited["thread"] == "MainThread"
    assert out(first)["thread"] == out(second)["thread"] == "lingstream-lane1"
    assert out(second)["order"][-2:] == [0, 1]  # lane 1 keeps its own order
    assert parts == [("decode", 0, {"part_of": 0}), ("decode", 1, {"part_of": 1})]  # with their own call
    stats = lane.statistics()
    assert (stats.calls, stats.failures, stats.in_flight) == (2, 0, 0)
    assert lane.healthy
    assert lane.incarnation == owner.incarnation
    await lane.release_session("s")


@in_module_loop
async def test_capacity_is_per_lane(owner: ParallelWorkerStageActor) -> None:
    lane = owner.lane_actor("decode")
    waiting = asyncio.create_task(owner.invoke(call("wait", 0, within=20.0, **{"for": 2})))
    await asyncio.sleep(0)  # submitted, and it waits for signal 2: lane 0 is at its capacity of 1
    with pytest.raises(ActorUnavailableError, match="at capacity: 1 call\\(s\\) in flight on lane 0"):
        await owner.invoke(call("wait", 1, **{"for": 2}))
    assert out(await lane.invoke(StageCall("decode", "s", 2, {"op": "signal"})))["thread"] == "lingstream-lane1"
    assert out(await waiting)["seen"] is True


def test_lanes_must_be_one_or_two_and_one_lane_has_no_lane_actor() -> None:
    with pytest.raises(PipelineSpecError, match="lanes must be 1 or 2"):
        ParallelWorkerConfig(name="x", stage_factory=counter_stage, lanes=3)
    single = ParallelWorkerStageActor(ParallelWorkerConfig(name="x", stage_factory=counter_stage))
    with pytest.raises(ValueError, match="one call lane"):
        single.lane_actor("decode")
