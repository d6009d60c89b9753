"""WorkerTensorChannel: tensors move between two worker groups while the parent only handles TensorRefs; refs and
received tensors are validated."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import torch

from pipeline.actor import StageCall
from pipeline.errors import ActorDiedError, ChannelError, PipelineSpecError, StageFailedError
from pipeline.process import (
    ChannelStatistics,
    ParallelWorker,
    ParallelWorkerConfig,
    TensorRef,
    WorkerTensorChannel,
    validate_ref,
)
from tests.support.waits import until
from tests.support.worker_stages import WAIT_S, consumer_stage, make_gates, producer_stage

in_module_loop = pytest.mark.asyncio(loop_scope="module")


class Groups:
    """A producer worker group and a consumer worker group joined by one channel."""

    def __init__(self, device: str, channel: WorkerTensorChannel) -> None:
        self.gates = make_gates()
        options = {"channel": channel, "started": self.gates.started}
        self.channel = channel
        self.producer = ParallelWorker(ParallelWorkerConfig("producer", producer_stage, (device,), options=options))
        self.consumer = ParallelWorker(ParallelWorkerConfig("consumer", consumer_stage, (device,), options=options))

    async def start(self) -> None:
        await asyncio.gather(self.producer.start(), self.consumer.start())

    async def aclose(self) -> None:
        await asyncio.gather(self.producer.aclose(), self.consumer.aclose())
        self.channel.close()

    async def produce(self, key: str, n: int, scale: float = 1.0) -> TensorRef:
        artifacts = await self.producer.invoke(StageCall("producer", "s", 0, {"n": n, "scale": scale, "key": key}))
        assert not any(isinstance(value, torch.Tensor) for value in artifacts.values())
        ref = artifacts["latent"]
        assert isinstance(ref, TensorRef)
        return validate_ref(ref)

    async def consume(self, ref: TensorRef, timeout_s: float | None = None) -> dict[str, Any]:
        inputs = {"latent": ref, "timeout_s": timeout_s}
        return dict(await self.consumer.invoke(StageCall("consumer", "s", 0, inputs)))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def groups() -> AsyncIterator[Groups]:
    groups = Groups("cpu", WorkerTensorChannel("latent", capacity=4, stash_size=2, receive_timeout_s=0.5))
    await groups.start()
    yield groups
    await groups.aclose()


@in_module_loop
async def test_tensor_crosses_worker_groups_while_the_parent_sees_only_its_ref(groups: Groups) -> None:
    ref = await groups.produce("s/0/latent", n=5, scale=2.0)

    assert ref == TensorRef(key="s/0/latent", shape=(5,), dtype="float32", nbytes=20, device_type="cpu")
    assert await groups.consume(ref) == {"sum": 20.0, "device_type": "cpu"}  # 2 * (0 + 1 + 2 + 3 + 4)


@in_module_loop
async def test_out_of_order_keys_wait_in_the_stash(groups: Groups) -> None:
    first = await groups.produce("order/a", n=3)
    second = await groups.produce("order/b", n=4)

    assert (await groups.consume(second))["sum"] == 6.0
    assert (await groups.consume(first))["sum"] == 3.0


@in_module_loop
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shape": (2, 2)}, r"shape \(4,\) \(expected \(2, 2\)\)"),
        ({"dtype": "int32"}, r"dtype 'float32' \(expected 'int32'\)"),
    ],
)
async def test_received_tensor_that_does_not_match_its_ref_fails_the_call(
    groups: Groups, change: dict[str, object], message: str
) -> None:
    ref = await groups.produce("mismatch", n=4)

    with pytest.raises(StageFailedError, match=f"ChannelError: channel 'latent': tensor 'mismatch' .*{message}"):
        await groups.consume(dataclasses.replace(ref, **change))  # type: ignore[arg-type]


@in_module_loop
async def test_missing_key_times_out_naming_it_and_the_stashed_keys(groups: Groups) -> None:
    sent = await groups.produce("missing/sent", n=2)
    never_sent = dataclasses.replace(sent, key="missing/never")

    with pytest.raises(StageFailedError, match=r"no tensor with key 'missing/never' arrived .* \['missing/sent'\]"):
        await groups.consume(never_sent)
    assert (await groups.consume(sent))["sum"] == 1.0  # the stashed tensor is still there


@in_module_loop
async def test_full_stash_evicts_its_oldest_entry_for_the_arrival(groups: Groups) -> None:
    refs = [await groups.produce(f"stash/{i}", n=i + 1) for i in range(3)]
    absent = dataclasses.replace(refs[0], key="stash/absent")

    with pytest.raises(StageFailedError, match=r"no tensor with key 'stash/absent' .*\['stash/1', 'stash/2'\]"):
        await groups.consume(absent)  # stash/0 was evicted to make room for stash/2
    assert [(await groups.consume(ref))["sum"] for ref in refs[1:]] == [1.0, 3.0]
    with pytest.raises(StageFailedError, match="no tensor with key 'stash/0'"):
        await groups.consume(refs[0])
    stats = (await groups.consumer.invoke(StageCall("consumer", "s", 0, {"op": "stats"})))["stats"]
    assert isinstance(stats, ChannelStatistics)
    assert stats.evicted == 1
    assert stats.receive_s > 0


@in_module_loop
async def test_released_session_discards_its_stashed_and_later_tensors(groups: Groups) -> None:
    dropped = [await groups.produce(f"gone/{i}/latent", n=2) for i in range(2)]
    kept = await groups.produce("kept/0/latent", n=3)
    assert (await groups.consume(kept))["sum"] == 3.0  # both "gone" tensors wait in the stash now

    await groups.consumer.release_session("gone")
    late = await groups.produce("gone/2/latent", n=2)  # sent after the release: dropped on arrival
    kept = await groups.produce("kept/1/latent", n=4)
    assert (await groups.consume(kept))["sum"] == 6.0

    stats = (await groups.consumer.invoke(StageCall("consumer", "s", 0, {"op": "stats"})))["stats"]
    assert isinstance(stats, ChannelStatistics)
    assert (stats.stashed, stats.discarded) == (0, 3)
    assert [ref.key for ref in (*dropped, late)] == ["gone/0/latent", "gone/1/latent", "gone/2/latent"]


@in_module_loop
async def test_consumer_killed_while_waiting_leaves_the_channel_usable_after_restart(groups: Groups) -> None:
    groups.gates.clear()
    waiting = asyncio.create_task(groups.consume(dataclasses.replace(GOOD, key="never/0"), timeout_s=30.0))
    await groups.gates.wait_started()  # it is about to block waiting: where a multiprocessing.Queue holds a lock

    os.kill(groups.consumer.pids[0], signal.SIGKILL)
    with pytest.raises(ActorDiedError):
        await waiting
    await until(lambda: groups.consumer.healthy, "the consumer group to be healthy", within=WAIT_S)

    ref = await groups.produce("after-restart/0/latent", n=4)
    assert (await groups.consume(ref, timeout_s=5.0))["sum"] == 6.0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device for CUDA IPC")
async def test_cuda_tensor_crosses_worker_groups_through_cuda_ipc() -> None:
    groups = Groups("cuda:0", WorkerTensorChannel("latent-cuda", capacity=2, receive_timeout_s=10.0))
    await groups.start()
    try:
        ref = await groups.produce("cuda/0", n=8, scale=0.5)
        result = await groups.consume(ref)
    finally:
        await groups.aclose()

    assert ref == TensorRef(key="cuda/0", shape=(8,), dtype="float32", nbytes=32, device_type="cuda")
    assert result == {"sum": 14.0, "device_type": "cuda"}


GOOD = TensorRef(key="k", shape=(2, 3), dtype="float32", nbytes=24, device_type="cpu")


def test_valid_ref_passes_and_describe_matches_the_tensor() -> None:
    assert validate_ref(GOOD) is GOOD
    assert TensorRef.describe("k", torch.zeros(2, 3)) == GOOD
    assert validate_ref(TensorRef("empty", (0, 4), "bfloat16", 0, "cuda")).nbytes == 0


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ("not a ref", "expected a TensorRef, got str"),
        (dataclasses.replace(GOOD, key=""), "key must be a non-empty string"),
        (dataclasses.replace(GOOD, shape=(2, -3)), r"shape must be a tuple of non-negative integers, got \(2, -3\)"),
        (dataclasses.replace(GOOD, shape=[2, 3]), "shape must be a tuple"),  # type: ignore[arg-type]  # the point
        (dataclasses.replace(GOOD, shape=(2, True)), "shape must be a tuple of non-negative integers"),
        (dataclasses.replace(GOOD, dtype="float33"), "unknown dtype 'float33'"),
        (dataclasses.replace(GOOD, dtype="Tensor"), "unknown dtype 'Tensor'"),
        (
            dataclasses.replace(GOOD, nbytes=23),
            r"nbytes 23 does not match shape \(2, 3\) of float32 \(4 bytes each\) = 24",
        ),
        (dataclasses.replace(GOOD, device_type="mps"), "unsupported device type 'mps'"),
    ],
)
def test_invalid_ref_is_rejected_with_the_reason(ref: object, message: str) -> None:
    with pytest.raises(ChannelError, match=message):
        validate_ref(ref)


def test_send_rejects_what_it_cannot_share() -> None:
    channel = WorkerTensorChannel("local")
    try:
        with pytest.raises(ChannelError, match="can only send tensors, got list"):
            channel.send("k", [1, 2])  # type: ignore[arg-type]
        with pytest.raises(ChannelError, match="cannot share meta tensors"):
            channel.send("k", torch.empty(2, device="meta"))
        with pytest.raises(ChannelError, match="TensorRef key must be a non-empty string"):
            channel.send("", torch.zeros(1))
        with pytest.raises(ChannelError, match="an empty prefix would discard everything"):
            channel.discard("")
        assert channel.statistics().sent == 0
    finally:
        channel.close()


def test_channel_rejects_invalid_bounds() -> None:
    with pytest.raises(PipelineSpecError, match="capacity and stash_size must be at least 1"):
        WorkerTensorChannel("bad", stash_size=0)
    with pytest.raises(PipelineSpecError, match="timeouts must be positive"):
        WorkerTensorChannel("bad", receive_timeout_s=0.0)
