"""Progressive decode on the processes placement: the decoding worker process hands a chunk's parts to the service
process as partial replies, so a chunk's first part reaches the reader while the rest of the chunk is still being
decoded in the worker; a decode failure mid-chunk fails the session as on threads (the part already read stays
read, the chunk never comes); a decoding rank that dies mid-chunk fails the session the same way.

One module-scoped service (decode co-located with a one-rank DiT: two worker processes) with a decoder the test
holds at chunk 1's second part (`gated_world.py`) serves every test; the rank-death test runs last. Bit equality
of the parts with whole-chunk decode, on one and two DiT ranks, is in `test_processes.py`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import pytest
import pytest_asyncio

from admission import ExecutionLease
from pipeline.bidirectional import ChunkItem, ChunkOutput, ChunkPart, ControlState
from pipeline.errors import SessionFailedError
from pipeline.lingbot import LingBotService, ModelRuntimeConfig, ProcessPlacement, plan_placement
from tests.unit.pipeline.lingbot.gated_world import GatedReferenceFactory
from tests.unit.pipeline.worker_stages import Gates, make_gates

in_module_loop = pytest.mark.asyncio(loop_scope="module")

SMALL = {"width": 64, "height": 48, "chunk_size": 3, "hud": True}


@dataclass
class Held:
    service: LingBotService
    gates: Gates


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def held() -> AsyncIterator[Held]:
    gates = make_gates()
    cpu = ModelRuntimeConfig(devices=("cpu",), world_size=1, dtype="float32", torch_threads=1)
    placement = ProcessPlacement(
        plan_placement(cpu, cpu, cpu), GatedReferenceFactory(gates.started, gates.gate), call_timeout_s=30.0
    )
    service = LingBotService(placement, lease=ExecutionLease(), realtime=False)
    await service.start()
    yield Held(service, gates)
    await gates.open()
    await service.stop()


@pytest.fixture
def fresh(held: Held) -> Held:
    held.gates.clear()
    return held


async def first_chunk_and_the_held_part(service: LingBotService, session_id: str) -> AsyncIterator[ChunkItem]:
    """Open `session_id` holding a key; return its outputs after chunk 0 (three parts, then whole) and chunk 1's
    first part were read."""
    await service.create_session(session_id, service.prepare(SMALL, None))
    service.push_control(session_id, ControlState(1, frozenset({"w", "l"})))
    outputs: AsyncIterator[ChunkItem] = service.outputs(session_id, parts=True)
    items = [await anext(outputs) for _ in range(4)]
    assert [type(item) for item in items] == [ChunkPart, ChunkPart, ChunkPart, ChunkOutput]
    assert np.array_equal(np.concatenate([item.frames for item in items[:3]]), items[3].frames)
    return outputs


@in_module_loop
async def test_a_chunks_first_part_reaches_the_reader_while_the_worker_still_decodes_the_chunk(fresh: Held) -> None:
    service = fresh.service
    assert service.progressive_decode
    outputs = await first_chunk_and_the_held_part(service, "gate-a")
    first = await anext(outputs)  # chunk 1's first part, while its second waits at the gate in the worker
    assert isinstance(first, ChunkPart)
    assert (first.index, first.offset, first.first_frame_index, len(first.frames)) == (1, 0, 9, 4)
    await fresh.gates.wait_started()  # the worker holds part 2 of the chunk: only the test opens the gate
    await fresh.gates.open()
    rest = [await anext(outputs) for _ in range(3)]
    whole = rest[-1]
    assert isinstance(whole, ChunkOutput)
    assert whole.index == 1
    parts = [first, *rest[:2]]
    assert [(p.offset, p.first_frame_index) for p in parts if isinstance(p, ChunkPart)] == [(0, 9), (4, 13), (8, 17)]
    assert np.array_equal(np.concatenate([p.frames for p in parts]), whole.frames)
    assert 0 < whole.timings["control_to_first_frame"] < whole.timings["control_to_output"]
    summary = await service.close_session("gate-a")
    assert summary.failure is None


@in_module_loop
async def test_a_decode_failure_mid_chunk_in_the_worker_fails_the_session_and_releases_everything(
    fresh: Held,
) -> None:
    service = fresh.service
    outputs = await first_chunk_and_the_held_part(service, "fail-b")
    first = await anext(outputs)
    assert isinstance(first, ChunkPart)
    assert first.index == 1
    await fresh.gates.wait_started()
    await fresh.gates.open()
    with pytest.raises(SessionFailedError, match="ran out of memory mid-chunk"):
        await anext(outputs)  # no more parts of the failed chunk, and never the chunk itself
    summary = await service.close_session("fail-b")
    assert summary.failure is not None
    assert "mid-chunk" in summary.failure
    assert summary.chunks == 1
    assert summary.slot_leaks == 0
    assert summary.cleanup_failures == {}
    assert service.ready  # a stage failure costs the session, not the worker group


@in_module_loop
async def test_a_decoding_rank_killed_mid_chunk_fails_the_session_after_the_parts_it_sent(fresh: Held) -> None:
    service = fresh.service
    deaths = service.worker_statistics()["denoise_decode"].deaths
    outputs = await first_chunk_and_the_held_part(service, "kill-c")
    first = await anext(outputs)
    assert isinstance(first, ChunkPart)
    assert first.index == 1
    await fresh.gates.wait_started()
    await fresh.gates.open()
    with pytest.raises(SessionFailedError, match="exit code 9"):
        await anext(outputs)
    summary = await service.close_session("kill-c")
    assert summary.chunks == 1
    assert summary.slot_leaks == 0
    assert service.worker_statistics()["denoise_decode"].deaths == deaths + 1
    assert first.frames.shape == (4, 48, 64, 3)  # the part read before the death is still whole and readable
    assert int(first.frames.sum()) > 0
