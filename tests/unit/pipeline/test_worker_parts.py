"""ParallelWorker's partial replies: a stage's parts reach the part listeners on the loop, in order, before the
call's result and from rank 0 only; parts of a cancelled call are dropped; a failure, an unreadable part, a failing
listener or a dead rank after some parts keeps those delivered and fails the call; and parts leave no shared memory
or descriptor behind in either process.

One module-scoped worker of two ranks (a gloo group) serves every test; the rank-death test runs last, since the
worker then restarts.
"""

from __future__ import annotations

import asyncio
import gc
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import torch

from pipeline.actor import StageCall
from pipeline.errors import ActorDiedError, StageFailedError
from pipeline.process import ParallelWorker, ParallelWorkerConfig, WorkerContext
from tests.support.worker_stages import Gates, make_gates, parts_stage

in_module_loop = pytest.mark.asyncio(loop_scope="module")

WAIT_S = 30.0


@dataclass
class Listener:
    """Records every part with whether its call had resolved when the part came."""

    parts: list[tuple[int, Any]] = field(default_factory=list)
    resolved_when_seen: list[bool] = field(default_factory=list)
    pending: dict[int, asyncio.Task[Any]] = field(default_factory=dict)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    fail: bool = False

    def __call__(self, call: StageCall, part: object) -> None:
        if self.fail:
            raise RuntimeError("the listener broke")
        self.parts.append((call.sequence_id, part))
        task = self.pending.get(call.sequence_id)
        self.resolved_when_seen.append(task is not None and task.done())
        self.arrived.set()

    def of(self, sequence: int) -> list[tuple[int, int, list[int]]]:
        """(rank, index, the distinct values of its tensor) of each part of call `sequence`."""
        return [
            (part[0], part[1], sorted({int(v) for v in part[2].unique()}))
            for seq, part in self.parts
            if seq == sequence
        ]

    async def wait_for(self, sequence: int, count: int) -> None:
        async with asyncio.timeout(WAIT_S):
            while len(self.of(sequence)) < count:
                self.arrived.clear()
                await self.arrived.wait()


@dataclass
class Fixture:
    worker: ParallelWorker
    gates: Gates
    listener: Listener

    def start(self, sequence: int, **inputs: object) -> asyncio.Task[Any]:
        call = StageCall("parts", "s", sequence, inputs)
        task = asyncio.get_running_loop().create_task(self.worker.invoke(call))
        self.listener.pending[sequence] = task
        return task


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def parts() -> AsyncIterator[Fixture]:
    gates = make_gates()
    config = ParallelWorkerConfig(
        name="parts",
        stage_factory=parts_stage,
        devices=("cpu", "cpu"),
        options={"started": gates.started, "gate": gates.gate},
        capacity=2,  # a cancelled call keeps its slot until the rank finishes it
        restart_backoff_initial_s=5.0,
    )
    worker = ParallelWorker(config)
    listener = Listener()
    worker.add_part_listener(listener)
    await worker.start()
    yield Fixture(worker, gates, listener)
    await worker.aclose()


@pytest.fixture
def fresh(parts: Fixture) -> Fixture:
    parts.gates.clear()
    parts.listener.fail = False
    return parts


@in_module_loop
async def test_parts_reach_the_listener_in_order_ahead_of_the_result_and_from_rank_0_only(fresh: Fixture) -> None:
    before = fresh.worker.statistics()
    task = fresh.start(1, parts=4, gate_at=2)
    await fresh.gates.wait_started()
    await fresh.listener.wait_for(1, 2)
    assert not task.done()  # parts 0 and 1 came while the call is held at part 2
    await fresh.gates.open()
    result = await task

    assert result == {"parts": 4, "rank": 0}
    assert fresh.listener.of(1) == [(0, 0, [0]), (0, 1, [1]), (0, 2, [2]), (0, 3, [3])]  # rank 1's were dropped
    assert not any(fresh.listener.resolved_when_seen)
    stats = fresh.worker.statistics()
    assert (stats.parts - before.parts, stats.dropped_parts - before.dropped_parts) == (4, 0)


@in_module_loop
async def test_parts_of_a_cancelled_call_are_dropped(fresh: Fixture) -> None:
    before = fresh.worker.statistics()
    task = fresh.start(2, parts=3, gate_at=1)
    await fresh.listener.wait_for(2, 1)
    await fresh.gates.wait_started()
    task.cancel()
    await fresh.gates.open()
    assert await fresh.start(3, parts=1) == {"parts": 1, "rank": 0}  # served after the cancelled call's parts

    assert [index for _, index, _ in fresh.listener.of(2)] == [0]
    stats = fresh.worker.statistics()
    assert (stats.parts - before.parts, stats.dropped_parts - before.dropped_parts) == (2, 2)


@in_module_loop
async def test_a_failure_after_some_parts_keeps_them_delivered_and_fails_the_call(fresh: Fixture) -> None:
    task = fresh.start(4, parts=4, gate_at=2, then="fail")
    await fresh.gates.wait_started()
    await fresh.gates.open()
    with pytest.raises(StageFailedError, match="failed after 2 parts"):
        await task
    assert [index for _, index, _ in fresh.listener.of(4)] == [0, 1]
    assert fresh.worker.healthy


@in_module_loop
async def test_a_part_the_parent_cannot_read_fails_the_call_and_drops_its_later_parts(fresh: Fixture) -> None:
    before = fresh.worker.statistics()
    await fresh.gates.open()  # no waiting at the gate
    with pytest.raises(StageFailedError, match="a part could not be unpickled in the parent"):
        await fresh.start(5, parts=3, gate_at=1, then="unreadable")
    assert [index for _, index, _ in fresh.listener.of(5)] == [0]  # never 2 without 1
    stats = fresh.worker.statistics()
    assert (stats.parts - before.parts, stats.dropped_parts - before.dropped_parts) == (1, 3)


@in_module_loop
async def test_a_part_that_cannot_be_pickled_fails_the_call_in_the_rank(fresh: Fixture) -> None:
    await fresh.gates.open()
    with pytest.raises(StageFailedError, match="the part is not picklable"):
        await fresh.start(6, parts=2, gate_at=1, then="unpicklable")
    assert [index for _, index, _ in fresh.listener.of(6)] == [0]


@in_module_loop
async def test_a_listener_that_raises_fails_the_call(fresh: Fixture) -> None:
    fresh.listener.fail = True
    with pytest.raises(StageFailedError, match="a part listener failed: RuntimeError: the listener broke"):
        await fresh.start(7, parts=2)
    fresh.listener.fail = False
    assert await fresh.start(8, parts=1) == {"parts": 1, "rank": 0}


def torch_segments_mapped() -> int:
    """Shared-memory segments torch made that this process maps now."""
    maps = Path("/proc/self/maps").read_text().splitlines()
    return len(
        {line.split()[-2] if line.endswith("(deleted)") else line.split()[-1] for line in maps if "/torch_" in line}
    )


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads mappings and descriptors from /proc")
@in_module_loop
async def test_parts_leave_no_shared_memory_or_descriptor_behind(fresh: Fixture) -> None:
    async def rank_0_fds() -> int:
        fds = (await fresh.worker.invoke(StageCall("parts", "s", 0, {"op": "fds"})))["fds"]
        assert isinstance(fds, int)
        return fds

    await fresh.start(9, parts=4, frames=8)  # warm-up: the first parts open what stays open (the sharer's socket)
    fresh.listener.parts.clear()
    gc.collect()
    mapped, fds = torch_segments_mapped(), await rank_0_fds()
    for sequence in range(10, 20):
        await fresh.start(sequence, parts=4, frames=8)
    held = torch_segments_mapped()
    fresh.listener.parts.clear()
    gc.collect()

    assert held >= mapped + 40  # each part crossed in a segment of its own, mapped while the part lives
    assert torch_segments_mapped() == mapped
    assert await rank_0_fds() == fds  # the rank handed over every descriptor it shared


@in_module_loop
async def test_a_rank_that_dies_mid_call_keeps_the_parts_it_sent_delivered_and_fails_the_call(fresh: Fixture) -> None:
    task = fresh.start(30, parts=4, gate_at=2, then="exit")
    await fresh.gates.wait_started()
    await fresh.listener.wait_for(30, 2)
    await fresh.gates.open()
    with pytest.raises(ActorDiedError, match="exit code 3"):
        await task
    assert [index for _, index, _ in fresh.listener.of(30)] == [0, 1]
    assert all(isinstance(part[2], torch.Tensor) for _, part in fresh.listener.parts)


def test_a_context_outside_a_worker_process_cannot_send_parts() -> None:
    context = WorkerContext("w", 0, 1, "cpu", 1, 1, {})
    with pytest.raises(RuntimeError, match="only be sent by a stage running in a worker process"):
        context.parts.send(os.getpid())
