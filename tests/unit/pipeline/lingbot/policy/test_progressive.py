"""Progressive decode through the LingBot service: a chunk's parts reach the reader while the rest of the chunk is
still decoding, the whole chunk follows with the same frames, a failure mid-chunk fails the session as a failed
chunk does, and the whole-chunk mode hands over no parts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import numpy as np
import pytest
import torch

from pipeline.bidirectional import ChunkItem, ChunkOutput, ChunkPart, ControlState
from pipeline.errors import SessionFailedError
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceVAEDecoder, ReferenceWorldModel
from pipeline.lingbot.seam import ProgressiveDecoder, WorldModelParts
from tests.support.gated_world import PartsDecoder

SMALL = {"width": 64, "height": 48, "chunk_size": 3, "hud": True}


class GatedDecoder(PartsDecoder):
    """The reference decoder, whose every part after the first of chunk `gate_chunk` waits for `release` (a
    `threading.Event` the test sets), or fails there with `fail_at_part`."""

    def __init__(self, inner: ReferenceVAEDecoder, gate_chunk: int, *, fail: bool = False) -> None:
        super().__init__(inner)
        self._gate_chunk = gate_chunk
        self._fail = fail
        self.release = threading.Event()
        self.waiting = threading.Event()
        self.finished_parts = 0

    def decode_parts(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> Iterator[torch.Tensor]:
        for number, part in enumerate(self._inner.decode_parts(session_id, chunk_index, latent)):
            if chunk_index == self._gate_chunk and number == 1:
                self.waiting.set()
                assert self.release.wait(timeout=30), "the test never released the decoder"
                if self._fail:
                    raise RuntimeError("VAE ran out of memory mid-chunk")
            self.finished_parts += 1
            yield part


def gated_model(gate_chunk: int, *, fail: bool = False) -> tuple[WorldModelParts, GatedDecoder]:
    base = ReferenceWorldModel("cpu")
    decoder = GatedDecoder(base.decoder, gate_chunk, fail=fail)
    assert isinstance(decoder, ProgressiveDecoder)
    return WorldModelParts(base.encoder, base.denoiser, decoder), decoder


async def start(model: Any, **kwargs: Any) -> LingBotService:
    service = LingBotService(model, realtime=False, **kwargs)
    await service.start()
    return service


async def test_a_chunks_first_part_reaches_the_reader_before_its_last_part_is_decoded() -> None:
    model, decoder = gated_model(gate_chunk=1)
    service = await start(model)
    try:
        assert service.progressive_decode
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, frozenset({"w", "l"})))
        outputs: AsyncIterator[ChunkItem] = service.outputs("s", parts=True)
        items = [await anext(outputs) for _ in range(4)]  # chunk 0: three parts, then the whole chunk
        assert [type(item) for item in items] == [ChunkPart, ChunkPart, ChunkPart, ChunkOutput]
        first = await anext(outputs)  # chunk 1's first part, while its second waits for the test
        assert isinstance(first, ChunkPart)
        assert (first.index, first.offset, first.first_frame_index, len(first.frames)) == (1, 0, 9, 4)
        # Read while the chunk's second part cannot be decoded: it waits at the gate, which only the test opens.
        assert await asyncio.to_thread(decoder.waiting.wait, 10)
        assert decoder.finished_parts == 4  # 3 of chunk 0, 1 of chunk 1
        decoder.release.set()
        rest = [await anext(outputs) for _ in range(3)]
        whole = rest[-1]
        assert isinstance(whole, ChunkOutput)
        assert whole.index == 1
        parts = [first, *rest[:2]]
        assert [(p.offset, p.first_frame_index) for p in parts if isinstance(p, ChunkPart)] == [
            (0, 9),
            (4, 13),
            (8, 17),
        ]
        assert np.array_equal(np.concatenate([p.frames for p in parts]), whole.frames)  # the HUD drawn on each part
        for chunk in (items[3], whole):
            assert isinstance(chunk, ChunkOutput)
            assert 0 < chunk.timings["control_to_first_frame"] < chunk.timings["control_to_output"]
        await service.close_session("s")
    finally:
        decoder.release.set()
        await service.aclose()


async def test_a_reader_without_parts_sees_whole_chunks_only() -> None:
    model, _decoder = gated_model(gate_chunk=-1)
    service = await start(model)
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, frozenset({"w"})))
        outputs = service.outputs("s")
        chunks = [await anext(outputs) for _ in range(2)]
        assert [(c.index, len(c.frames)) for c in chunks] == [(0, 9), (1, 12)]
        await service.close_session("s")
    finally:
        await service.aclose()


async def test_a_decode_failure_mid_chunk_fails_the_session_like_a_failed_chunk_and_releases_everything() -> None:
    model, decoder = gated_model(gate_chunk=1, fail=True)
    service = await start(model)
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, frozenset({"d"})))
        outputs = service.outputs("s", parts=True)
        items = [await anext(outputs) for _ in range(4)]
        assert isinstance(items[-1], ChunkOutput)
        assert items[-1].index == 0
        first = await anext(outputs)
        assert isinstance(first, ChunkPart)
        assert first.index == 1
        decoder.release.set()
        with pytest.raises(SessionFailedError, match="ran out of memory mid-chunk"):
            await anext(outputs)  # no more parts of the failed chunk, and never the chunk itself
        summary = await service.close_session("s")
        assert summary.failure is not None
        assert "mid-chunk" in summary.failure
        assert summary.chunks == 1
        assert summary.slot_leaks == 0
        assert model.encoder.statistics().open_sessions == 0  # type: ignore[attr-defined]
        assert decoder._inner.statistics().open_sessions == 0
    finally:
        decoder.release.set()
        await service.aclose()


async def test_the_whole_chunk_mode_decodes_in_one_call_and_hands_over_no_parts() -> None:
    model, decoder = gated_model(gate_chunk=-1)
    calls: list[int] = []
    whole_only = decoder.decode_chunk

    def counted(session_id: str, chunk_index: int, latent: torch.Tensor) -> torch.Tensor:
        calls.append(chunk_index)
        return whole_only(session_id, chunk_index, latent)

    decoder.decode_chunk = counted  # type: ignore[method-assign]
    service = await start(model, progressive_decode=False)
    try:
        assert not service.progressive_decode
        await service.create_session("s", service.prepare(SMALL, None))
        outputs = service.outputs("s", parts=True)
        chunk = await anext(outputs)
        assert isinstance(chunk, ChunkOutput)
        assert chunk.timings["control_to_first_frame"] == chunk.timings["control_to_output"]
        assert calls == [0]
        await service.close_session("s")
    finally:
        await service.aclose()


async def test_parts_of_a_failed_chunk_the_reader_had_not_taken_are_dropped_with_it() -> None:
    model, decoder = gated_model(gate_chunk=1, fail=True)
    service = await start(model)
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, frozenset({"d"})))
        outputs = service.outputs("s", parts=True)
        items = [await anext(outputs) for _ in range(4)]
        assert isinstance(items[-1], ChunkOutput)
        assert items[-1].index == 0
        assert await asyncio.to_thread(decoder.waiting.wait, 10)  # chunk 1's first part is out, unread
        decoder.release.set()
        summary = await service.close_session("s")  # the chunk fails; the session ends
        assert summary.failure is not None
        assert "mid-chunk" in summary.failure
        with pytest.raises(SessionFailedError, match="mid-chunk"):
            await anext(outputs)  # not the unread part of chunk 1: the failure at once
    finally:
        decoder.release.set()
        await service.aclose()
