"""Progressive decode on the processes placement: the decoding worker process hands a chunk's parts to the service
process as partial replies, so a chunk's first part reaches the reader while the rest of the chunk is still being
decoded in the worker; a decode failure mid-chunk fails the session as on threads (the part already read stays
read, the chunk never comes); a decoding rank that dies mid-chunk fails the session the same way.

One module-scoped service (decode co-located with a one-rank DiT: two worker processes) with a decoder the test
holds at chunk 1's second part (`gated_world.py`) serves every test; the rank-death test runs last. Bit equality
of the parts with whole-chunk decode, on one and two DiT ranks, is in `test_processes.py`. Without processes: the
decoding rank's sink sends a chunk's parts and then its reply from one shared-memory buffer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler

import numpy as np
import numpy.typing as npt
import pytest
import pytest_asyncio

from admission import ExecutionLease
from pipeline.bidirectional import ChunkItem, ChunkOutput, ChunkPart, ControlState
from pipeline.errors import SessionFailedError
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.graph.actors import ProcessPlacement
from pipeline.lingbot.graph.group_stages import ChunkParts, FramesPart
from pipeline.lingbot.graph.placement import ModelRuntimeConfig, plan_placement
from pipeline.lingbot.graph.stages import FramesArtifact
from pipeline.lingbot.policy.service import LingBotService
from tests.support.gated_world import GatedReferenceFactory
from tests.support.worker_stages import Gates, make_gates

in_module_loop = pytest.mark.asyncio(loop_scope="module")

SMALL = {"width": 64, "height": 48, "chunk_size": 3, "hud": True}
SNAPSHOT = ControlSnapshot.from_keys(0, frozenset())


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
    await service.aclose()


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
    deaths = service.worker_statistics()["denoise"].deaths
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
    assert service.worker_statistics()["denoise"].deaths == deaths + 1
    assert first.frames.shape == (4, 48, 64, 3)  # the part read before the death is still whole and readable
    assert int(first.frames.sum()) > 0


class SentParts:
    """A `PartSender` that keeps what the decode stage's sink sends (pickled, as the worker sends it)."""

    def __init__(self) -> None:
        self.sent: list[bytes] = []

    def send(self, part: object) -> None:
        self.sent.append(bytes(ForkingPickler.dumps(part)))

    def received(self) -> list[FramesPart]:
        parts = [ForkingPickler.loads(data) for data in self.sent]
        assert all(isinstance(part, FramesPart) for part in parts)
        return parts


def frames(count: int, value: int) -> npt.NDArray[np.uint8]:
    return np.full((count, 8, 8, 3), value, dtype=np.uint8)


def test_a_chunks_parts_and_its_reply_travel_in_one_shared_segment() -> None:
    sender = SentParts()
    sink = ChunkParts(sender)
    sink.begin(0, 3)  # chunk 0 of 3 latent frames: 1 + 4 + 4 frames
    for offset, count in ((0, 1), (1, 4), (5, 4)):
        sink("s", 0, offset, frames(count, offset + 1))
    whole = np.concatenate([frames(1, 1), frames(4, 2), frames(4, 6)])
    reply = ForkingPickler.loads(bytes(ForkingPickler.dumps(sink.finish(FramesArtifact(0, whole, SNAPSHOT)))))

    parts = sender.received()
    assert [(part.offset, len(part.frames)) for part in parts] == [(0, 1), (1, 4), (5, 4)]
    assert np.array_equal(np.concatenate([part.frames for part in parts]), whole)
    assert np.array_equal(reply.frames, whole)
    assert all(np.shares_memory(part.frames, reply.frames) for part in parts)  # no copy for the reply


def test_parts_off_the_chunk_contract_travel_in_segments_of_their_own() -> None:
    sender = SentParts()
    sink = ChunkParts(sender)
    sink.begin(1, 3)  # 12 frames by the contract; this decoder yields 5 + 5 + 5
    for offset in (0, 5, 10):
        sink("s", 1, offset, frames(5, offset + 1))
    whole = np.concatenate([frames(5, 1), frames(5, 6), frames(5, 11)])
    reply = ForkingPickler.loads(bytes(ForkingPickler.dumps(sink.finish(FramesArtifact(1, whole, SNAPSHOT)))))

    parts = sender.received()
    assert np.array_equal(np.concatenate([part.frames for part in parts]), whole)
    assert np.array_equal(reply.frames, whole)
    assert not np.shares_memory(parts[2].frames, reply.frames)
