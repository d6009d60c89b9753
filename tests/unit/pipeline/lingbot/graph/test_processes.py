"""LingBotService on worker processes: the placement plan becomes process groups, the reference DiT's work is split
across its ranks and gathered, and the frames equal the threads placement's bit for bit; between groups the service
process handles only tensor refs. With progressive decode (the default) the decoding process hands each chunk over
in parts ahead of it, and the parts are the whole-chunk decode's frames bit for bit. The text prompt crosses into the
DiT group with each chunk's control (the session's prompt grades every chunk identically on every placement).

One module-scoped pair of services (1 rank with decode co-located, 2 ranks with decode in its own group) serves
every test: each group spawns interpreters that import torch, which is the expensive part.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import pytest_asyncio
import torch

from admission import ExecutionLease
from pipeline.actor import StageCall
from pipeline.bidirectional import ChunkOutput, ChunkPart, CloseMode, ControlState
from pipeline.lingbot.graph.actors import ProcessPlacement
from pipeline.lingbot.graph.group_stages import LATENT_CHANNEL_TIMING, RemoteCondition, RemoteLatent
from pipeline.lingbot.graph.placement import ModelRuntimeConfig, plan_placement
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.model import ReferenceModelFactory, ReferenceWorldModel, rows_of
from pipeline.process import ParallelWorkerStageActor, TensorRef
from tests.support.worker_stages import pids_gone

in_module_loop = pytest.mark.asyncio(loop_scope="module")

CONFIG = {"width": 128, "height": 96, "fps": 16, "chunk_size": 3, "seed": 11, "hud": True, "prompt": "golden dusk"}
KEYS = [frozenset({"w", "l"}), frozenset({"w", "l"}), frozenset({"a", "i"}), frozenset()]


def placement(ranks: int, devices: str = "cpu") -> ProcessPlacement:
    def runtime(*names: str) -> ModelRuntimeConfig:
        return ModelRuntimeConfig(devices=names, world_size=len(names), dtype="float32", torch_threads=1)

    if devices == "cpu":
        dit = runtime(*(("cpu",) * ranks))
        vae = runtime("cpu")
    else:
        dit = runtime(*(f"cuda:{index}" for index in range(ranks)))
        vae = dit
    plan = plan_placement(runtime(dit.devices[0]), dit, vae)
    return ProcessPlacement(plan, ReferenceModelFactory(), call_timeout_s=30.0)


def service(model: ReferenceWorldModel | ProcessPlacement) -> LingBotService:
    return LingBotService(model, lease=ExecutionLease(), realtime=False)


@dataclass
class Chunks:
    frames: list[npt.NDArray[np.uint8]]
    timings: list[Mapping[str, float]]


async def generate(worker: LingBotService, session_id: str) -> Chunks:
    await worker.create_session(session_id, worker.prepare(CONFIG, None))
    outputs = worker.outputs(session_id)
    chunks = Chunks([], [])
    for seq, keys in enumerate(KEYS):
        worker.push_control(session_id, ControlState(seq, keys))
        chunk = await anext(outputs)
        assert chunk.prompt == CONFIG["prompt"]
        chunks.frames.append(chunk.frames)
        chunks.timings.append(chunk.timings)
    summary = await worker.close_session(session_id, CloseMode.CANCEL)
    assert summary.failure is None
    return chunks


@dataclass
class Services:
    one_rank: LingBotService
    two_ranks: LingBotService


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def services() -> AsyncIterator[Services]:
    pair = Services(service(placement(1)), service(placement(2)))
    await asyncio.gather(pair.one_rank.start(), pair.two_ranks.start())
    yield pair
    await asyncio.gather(pair.one_rank.aclose(), pair.two_ranks.aclose())


@in_module_loop
async def test_the_plan_becomes_one_process_group_per_worker_group(services: Services) -> None:
    assert services.one_rank.stages == ("encode", "denoise", "decode")
    assert set(services.one_rank.worker_statistics()) == {"encode", "denoise"}  # co-located: decode on its lane 1
    assert services.two_ranks.stages == ("encode", "denoise", "decode")
    groups = services.two_ranks.worker_statistics()
    assert {stage: stats.world_size for stage, stats in groups.items()} == {"encode": 1, "denoise": 2, "decode": 1}
    assert {stage: stats.name for stage, stats in groups.items()} == {
        "encode": "vae_encode",
        "denoise": "dit",
        "decode": "vae_decode",
    }
    pids = [pid for stats in groups.values() for pid in stats.pids]
    assert len(set(pids)) == 4
    assert os.getpid() not in pids
    assert services.two_ranks.ready


@in_module_loop
async def test_frames_on_one_or_two_ranks_equal_the_threads_frames_bit_for_bit(services: Services) -> None:
    threads = service(ReferenceWorldModel("cpu"))
    await threads.start()
    try:
        expected = await generate(threads, "threads")
    finally:
        await threads.aclose()
    one = await generate(services.one_rank, "one-rank")
    two = await generate(services.two_ranks, "two-ranks")

    for chunks in (one, two):
        assert len(chunks.frames) == len(expected.frames)
        for index, (got, want) in enumerate(zip(chunks.frames, expected.frames, strict=True)):
            assert got.shape == want.shape
            assert np.array_equal(got, want), f"chunk {index} differs"
    # Only the 2-rank placement moves latents between groups; the chunk's timings say how long that took.
    assert all(timings[LATENT_CHANNEL_TIMING] > 0 for timings in two.timings)
    assert not any(LATENT_CHANNEL_TIMING in timings for timings in one.timings)


async def generate_in_parts(worker: LingBotService, session_id: str) -> tuple[list[ChunkOutput], list[list[ChunkPart]]]:
    """`generate`'s chunks read with their parts: the chunks, and the parts that came ahead of each."""
    await worker.create_session(session_id, worker.prepare(CONFIG, None))
    outputs = worker.outputs(session_id, parts=True)
    chunks: list[ChunkOutput] = []
    parts: list[list[ChunkPart]] = []
    for seq, keys in enumerate(KEYS):
        worker.push_control(session_id, ControlState(seq, keys))
        ahead: list[ChunkPart] = []
        while not isinstance(item := await anext(outputs), ChunkOutput):
            ahead.append(item)
        chunks.append(item)
        parts.append(ahead)
    summary = await worker.close_session(session_id, CloseMode.CANCEL)
    assert summary.failure is None
    return chunks, parts


@in_module_loop
async def test_progressive_decode_in_the_worker_processes_hands_each_chunk_over_in_parts_equal_to_whole_chunk_decode(
    services: Services,
) -> None:
    whole = LingBotService(ReferenceWorldModel("cpu"), lease=ExecutionLease(), realtime=False, progressive_decode=False)
    await whole.start()
    try:
        assert not whole.progressive_decode
        expected = await generate(whole, "whole")
    finally:
        await whole.aclose()
    for worker in (services.one_rank, services.two_ranks):
        assert worker.progressive_decode
        chunks, parts = await generate_in_parts(worker, "parts")
        for index, (chunk, ahead, want) in enumerate(zip(chunks, parts, expected.frames, strict=True)):
            # One part per latent frame (chunk 0's first is the reference frame alone), ahead of the chunk.
            assert [len(part.frames) for part in ahead] == ([1, 4, 4] if index == 0 else [4, 4, 4])
            assert [part.offset for part in ahead] == ([0, 1, 5] if index == 0 else [0, 4, 8])
            assert all(part.index == chunk.index for part in ahead)
            assert np.array_equal(np.concatenate([part.frames for part in ahead]), want), f"chunk {index} differs"
            assert np.array_equal(chunk.frames, want)


@in_module_loop
async def test_the_service_process_handles_only_tensor_refs_between_groups(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, object]] = []
    invoke = ParallelWorkerStageActor.invoke

    async def recording(actor: ParallelWorkerStageActor, call: StageCall) -> Mapping[str, object]:
        artifacts = await invoke(actor, call)
        seen.extend((call.stage_id, value) for value in artifacts.values())
        return artifacts

    monkeypatch.setattr(ParallelWorkerStageActor, "invoke", recording)
    await generate(services.two_ranks, "refs")

    conditions = [value for stage, value in seen if stage == "encode"]
    latents = [value for stage, value in seen if stage == "denoise"]
    assert all(isinstance(value, RemoteCondition) for value in conditions)
    assert all(isinstance(value, RemoteLatent) for value in latents)
    assert len(latents) >= len(KEYS)
    base = [value.base for value in conditions if isinstance(value, RemoteCondition) and value.base is not None]
    assert base == [TensorRef("refs/0/base", (16, 1, 12, 16), "float32", 16 * 12 * 16 * 4, "cpu")]
    assert isinstance(latents[0], RemoteLatent)
    assert latents[0].latent == TensorRef("refs/0/latent", (16, 3, 12, 16), "float32", 16 * 3 * 12 * 16 * 4, "cpu")
    assert not any(isinstance(value, torch.Tensor) for _, value in seen)


@in_module_loop
async def test_closing_a_session_mid_stream_releases_it_in_every_group(services: Services) -> None:
    worker = services.two_ranks
    await worker.create_session("cut", worker.prepare(CONFIG, None))
    worker.push_control("cut", ControlState(0, frozenset({"w"})))
    await anext(worker.outputs("cut"))
    report = await worker.close_session("cut", CloseMode.CANCEL)

    assert report.failure is None
    assert report.cleanup_failures == {}
    assert report.slot_leaks == 0
    assert (await generate(worker, "cut")).frames  # the id is usable again: nothing of it was left behind


@in_module_loop
async def test_stop_leaves_no_worker_process(services: Services) -> None:
    pids = [pid for stats in services.two_ranks.worker_statistics().values() for pid in stats.pids]
    await services.two_ranks.aclose()

    assert pids_gone(tuple(pids))
    assert services.two_ranks.worker_statistics()["denoise"].pids == ()


def test_every_row_goes_to_exactly_one_rank() -> None:
    for height in (1, 4, 30, 31):
        for world_size in (1, 2, 3, 5):
            bands = [rows_of(height, rank, world_size) for rank in range(world_size)]
            covered = [row for start, stop in bands for row in range(start, stop)]
            assert covered == list(range(height)), (height, world_size, bands)


CUDA = torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
async def test_on_cuda_the_process_groups_compute_the_threads_frames() -> None:
    ranks = min(2, torch.cuda.device_count())
    threads = service(ReferenceWorldModel("cuda:0"))
    processes = service(placement(ranks, "cuda"))
    await asyncio.gather(threads.start(), processes.start())
    try:
        expected = await generate(threads, "threads")
        got = await generate(processes, "processes")
        groups: dict[str, Any] = dict(processes.worker_statistics())
    finally:
        await asyncio.gather(threads.aclose(), processes.aclose())
    assert groups["denoise"].world_size == ranks  # same devices for DiT and decode: co-located
    assert "decode" not in groups
    for got_frames, want in zip(got.frames, expected.frames, strict=True):
        assert int(np.abs(got_frames.astype(np.int16) - want.astype(np.int16)).max()) <= 1
