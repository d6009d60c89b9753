"""Decode off the critical path (issue #32): chunk k + 1 denoises while chunk k decodes, on threads.

The decoder here holds chunk `HOLD`'s decode until the denoise of chunk `HOLD + 1` has started (or a timeout): a
session that kept one chunk in flight, or a lease that covered the decode, would never start that denoise, so the
hold times out and `overlapped` stays False. Frames are compared bit for bit with the order before the change
(`chunks_in_flight=1`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from admission import ExecutionLease
from pipeline.bidirectional import ChunkOutput, CloseMode, ControlState
from pipeline.errors import SessionFailedError
from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceWorldModel

SMALL = {"width": 64, "height": 48, "chunk_size": 2, "hud": False}
HOLD = 1
HOLD_TIMEOUT_S = 10.0


class OverlapProbe:
    """The reference model with a denoiser that says when each chunk starts and a decoder that holds chunk `HOLD`
    until the next chunk's denoise started (then finishes it, or raises with `fail`)."""

    def __init__(self, *, fail: bool = False, hold_s: float = HOLD_TIMEOUT_S) -> None:
        base = ReferenceWorldModel("cpu")
        self.encoder = base.encoder
        self.denoiser = _Denoiser(base.denoiser, self)
        self.decoder = _Decoder(base.decoder, self)
        self.fail = fail
        self.hold_s = hold_s
        self.next_denoise_started = threading.Event()
        self.decode_held = threading.Event()
        self.overlapped: bool | None = None
        self.release = threading.Event()  # set by a test that wants the held decode to wait for it too
        self.release.set()

    def hold(self, chunk_index: int) -> None:
        if chunk_index != HOLD:
            return
        self.decode_held.set()
        self.overlapped = self.next_denoise_started.wait(self.hold_s)
        self.release.wait(HOLD_TIMEOUT_S)
        if self.fail:
            raise RuntimeError(f"decode of chunk {chunk_index} broke")


class _Denoiser:
    def __init__(self, inner: Any, probe: OverlapProbe) -> None:
        self._inner = inner
        self._probe = probe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        if chunk_index == HOLD + 1:
            self._probe.next_denoise_started.set()
        return self._inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)  # type: ignore[no-any-return]


class _Decoder:
    def __init__(self, inner: Any, probe: OverlapProbe) -> None:
        self._inner = inner
        self._probe = probe

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def decode_chunk(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> torch.Tensor:
        self._probe.hold(chunk_index)
        return self._inner.decode_chunk(session_id, chunk_index, latent)  # type: ignore[no-any-return]

    def decode_parts(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> Iterator[torch.Tensor]:
        self._probe.hold(chunk_index)
        return self._inner.decode_parts(session_id, chunk_index, latent)  # type: ignore[no-any-return]


async def _chunks(model: Any, n: int, **kwargs: Any) -> list[ChunkOutput]:
    service = LingBotService(model, lease=ExecutionLease(), realtime=False, **kwargs)
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, frozenset({"w", "l"})))
        outputs = service.outputs("s")
        chunks = [await anext(outputs) for _ in range(n)]
        summary = await service.close_session("s", CloseMode.CANCEL)
        assert summary.failure is None
        assert summary.slot_leaks == 0
        return chunks
    finally:
        await service.aclose()


async def test_the_next_chunk_denoises_while_the_previous_decodes_and_the_frames_equal_one_chunk_in_flight() -> None:
    probe = OverlapProbe()
    overlapped = await _chunks(probe, 5)
    assert probe.overlapped is True  # chunk 2's DiT started while chunk 1 was decoding
    before = await _chunks(ReferenceWorldModel("cpu"), 5, chunks_in_flight=1)
    assert [c.index for c in overlapped] == [0, 1, 2, 3, 4]
    for old, new in zip(before, overlapped, strict=True):
        assert np.array_equal(old.frames, new.frames), f"chunk {old.index} differs"
        assert (old.first_frame_index, old.applied_seq, old.keys) == (new.first_frame_index, new.applied_seq, new.keys)


async def test_in_real_time_a_chunk_running_late_lets_the_next_one_start_while_it_decodes() -> None:
    """The just-in-time schedule (the service's default): chunk 1's decode is held, so it runs later than its
    playback slot; chunk 2 is then due (from where chunk 1's playback was expected to end) and starts while chunk 1
    still decodes. A schedule that waited for chunk 1 to be out would leave the hold to time out."""
    probe = OverlapProbe()
    service = LingBotService(probe, lease=ExecutionLease())  # realtime, just in time
    await service.start()
    try:
        await service.create_session("s", service.prepare(SMALL, None))
        service.push_control("s", ControlState(1, frozenset({"w"})))
        outputs = service.outputs("s")
        chunks = [await anext(outputs) for _ in range(3)]
        assert probe.overlapped is True
        assert [c.index for c in chunks] == [0, 1, 2]
        assert "underrun" in chunks[1].timings  # chunk 1 came late: counted, as before
    finally:
        await service.aclose()


async def test_one_chunk_in_flight_never_overlaps() -> None:
    probe = OverlapProbe(hold_s=0.5)  # the hold gives up after 0.5 s: chunk 2 never starts while chunk 1 decodes
    chunks = await _chunks(probe, 3, chunks_in_flight=1)
    assert probe.overlapped is False
    assert [c.index for c in chunks] == [0, 1, 2]
    with pytest.raises(ValueError, match="chunks_in_flight"):
        LingBotService(probe, chunks_in_flight=0)


async def _held_service(probe: OverlapProbe) -> tuple[LingBotService, Any]:
    """A service whose session has chunk HOLD decoding (held) while chunk HOLD + 1 denoises."""
    probe.release.clear()
    service = LingBotService(probe, lease=ExecutionLease(), realtime=False)
    await service.start()
    await service.create_session("s", service.prepare(SMALL, None))
    service.push_control("s", ControlState(1, frozenset({"d"})))
    outputs = service.outputs("s")
    assert (await anext(outputs)).index == 0
    await asyncio.to_thread(probe.decode_held.wait, HOLD_TIMEOUT_S)
    await asyncio.to_thread(probe.next_denoise_started.wait, HOLD_TIMEOUT_S)
    return service, outputs


async def test_a_drain_while_chunk_k_decodes_and_k_plus_1_denoises_delivers_both_in_order() -> None:
    probe = OverlapProbe()
    service, outputs = await _held_service(probe)
    try:
        service.push_control("s", ControlState(2, frozenset()))  # would stop asking for chunks anyway
        closing = asyncio.create_task(service.close_session("s", CloseMode.DRAIN))
        probe.release.set()
        rest = [c.index async for c in outputs]
        assert rest[:2] == [HOLD, HOLD + 1]  # both chunks in flight come out, in order
        assert rest == list(range(HOLD, HOLD + len(rest)))
        summary = await closing
        assert summary.failure is None
        assert summary.slot_leaks == 0
        assert probe.decoder.statistics().open_sessions == 0
        assert probe.denoiser.statistics().open_sessions == 0
    finally:
        probe.release.set()
        await service.aclose()


async def test_a_cancel_while_chunk_k_decodes_and_k_plus_1_denoises_releases_everything() -> None:
    probe = OverlapProbe()
    service, _ = await _held_service(probe)
    try:
        closing = asyncio.create_task(service.close_session("s", CloseMode.CANCEL))
        await asyncio.sleep(0.05)  # the cancel reaches the chunk loop while the decode is held
        assert not closing.done()  # a cancel waits for the calls in flight
        probe.release.set()
        summary = await closing
        assert summary.failure is None
        assert summary.slot_leaks == 0
        assert probe.encoder.statistics().open_sessions == 0
        assert probe.decoder.statistics().open_sessions == 0
        assert probe.denoiser.statistics().open_sessions == 0
        lease = service.statistics().lease
        assert lease is not None
        assert lease.holder is None  # the grant went back with the cancelled loop
    finally:
        probe.release.set()
        await service.aclose()


async def test_a_decode_failure_while_the_next_chunk_denoises_fails_the_session_after_its_chunks() -> None:
    probe = OverlapProbe(fail=True)
    service, outputs = await _held_service(probe)
    try:
        probe.release.set()
        with pytest.raises(SessionFailedError, match=f"decode of chunk {HOLD} broke"):
            await anext(outputs)  # chunk 0 came; chunk 1's decode failed; chunk 2 (denoised) is dropped
        summary = await service.close_session("s")
        assert summary.failure is not None
        assert summary.slot_leaks == 0
        assert summary.chunks == 1
        assert probe.decoder.statistics().open_sessions == 0
        assert probe.denoiser.statistics().open_sessions == 0
    finally:
        await service.aclose()


async def test_the_tiny_lingbot_fast_models_frames_equal_one_chunk_in_flight(tmp_path: Any) -> None:
    pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
    pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
    from pipeline.lingbot.models import LingBotFastOptions, LingBotFastWorldModel, write_tiny_model

    root = write_tiny_model(tmp_path / "model", seed=0)
    config = {"width": 64, "height": 32, "hud": False}

    async def chunks(in_flight: int) -> list[ChunkOutput]:
        world = LingBotFastWorldModel.load(LingBotFastOptions(str(root)))
        service = LingBotService(world, realtime=False, chunks_in_flight=in_flight, torch_threads=1)
        await service.start()
        try:
            await service.create_session("s", service.prepare(config, None))
            service.push_control("s", ControlState(1, frozenset({"w", "j"})))
            outputs = service.outputs("s")
            got = [await anext(outputs) for _ in range(3)]
            await service.close_session("s", CloseMode.CANCEL)
            return got
        finally:
            await service.aclose()

    before, overlapped = await chunks(1), await chunks(2)
    assert [c.frames.shape[0] for c in overlapped] == [9, 12, 12]
    for old, new in zip(before, overlapped, strict=True):
        assert np.array_equal(old.frames, new.frames), f"chunk {old.index} differs"
