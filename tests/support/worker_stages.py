"""Stage factories and shared helpers for the process-worker tests.

Spawned worker processes import this module by name (`tests.support.worker_stages`), so everything here is
module level and picklable by reference. A test steers a stage through `call.inputs["op"]`, and synchronises with
it through spawn-context `multiprocessing.Event`s passed in `ParallelWorkerConfig.options`.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.multiprocessing as torch_mp

from pipeline.actor import StageCall
from pipeline.process import TensorRef, WorkerContext, WorkerTensorChannel

GATE_TIMEOUT_S = 30.0


class CounterStage:
    """Counts calls per session; other ops fail, block, or return odd artifacts on demand."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._counts: dict[str, int] = {}
        self._released: list[str] = []
        self._preloaded = frozenset(sys.modules)

    def process(self, call: StageCall) -> Mapping[str, object]:
        op = call.inputs.get("op", "count")
        if op == "count":
            count = self._counts.get(call.session_id, 0) + 1
            self._counts[call.session_id] = count
            return {
                "count": count,
                "pid": os.getpid(),
                "rank": self._ctx.rank,
                "incarnation": self._ctx.incarnation,
                "threads": torch.get_num_threads(),
            }
        if op == "fail":
            raise ValueError(f"boom at {call.sequence_id}")
        if op == "block":
            # Tell the test the call is running, then wait until it opens the gate (or for good when there is none).
            self._event("started").set()
            gate = self._ctx.options.get("gate")
            if gate is None:
                time.sleep(GATE_TIMEOUT_S)
                return {"unblocked": False}
            return {"unblocked": self._event("gate").wait(GATE_TIMEOUT_S)}
        if op == "modules":  # what the rank found imported when it started (the forkserver's preload, no main)
            main_file = getattr(sys.modules["__main__"], "__file__", None)  # the parent's main, when it was run here
            return {"main_file": main_file, "torch": "torch" in self._preloaded}
        if op == "released":
            return {"released": list(self._released)}
        if op == "unpicklable":
            return {"fn": lambda: None}
        if op == "bad_ref":
            return {"latent": TensorRef(key="k", shape=(2, 3), dtype="float32", nbytes=7, device_type="cpu")}
        raise KeyError(f"unknown op {op!r}")

    def release(self, session_id: str) -> None:
        if session_id.startswith("unreleasable"):
            raise RuntimeError(f"cannot release {session_id}")
        self._counts.pop(session_id, None)
        self._released.append(session_id)

    def _event(self, name: str) -> Any:
        return self._ctx.options[name]


def counter_stage(ctx: WorkerContext) -> CounterStage:
    return CounterStage(ctx)


def exploding_factory(ctx: WorkerContext) -> CounterStage:
    raise ValueError(f"factory exploded on rank {ctx.rank}")


class AllReduceStage:
    """Each rank contributes `rank + 1`; the all-reduce only completes when every rank runs the call."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    def process(self, call: StageCall) -> Mapping[str, object]:
        value = torch.tensor([float(self._ctx.rank + 1)])
        torch.distributed.all_reduce(value)
        return {"sum": value.item(), "rank": self._ctx.rank, "world_size": torch.distributed.get_world_size()}

    def release(self, session_id: str) -> None:
        return None


def all_reduce_stage(ctx: WorkerContext) -> AllReduceStage:
    return AllReduceStage(ctx)


class ReportingStage:
    """`ReportsReady`: says which rank built it and with which options (only rank 0's report reaches the parent)."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    def ready_report(self) -> object:
        return {"rank": self._ctx.rank, "world_size": self._ctx.world_size, "pid": os.getpid()}

    def process(self, call: StageCall) -> Mapping[str, object]:
        return {"rank": self._ctx.rank}

    def release(self, session_id: str) -> None:
        return None


def reporting_stage(ctx: WorkerContext) -> ReportingStage:
    return ReportingStage(ctx)


class ProducerStage:
    """Sends `arange(n) * scale` (on the rank's device) through the channel and returns only its `TensorRef`."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._device = torch.device(ctx.device)
        self._channel = cast(WorkerTensorChannel, ctx.options["channel"])

    def process(self, call: StageCall) -> Mapping[str, object]:
        n: Any = call.inputs["n"]
        scale: Any = call.inputs.get("scale", 1.0)
        tensor = torch.arange(int(n), dtype=torch.float32, device=self._device) * float(scale)
        key = str(call.inputs.get("key", f"{call.session_id}/{call.sequence_id}/latent"))
        return {"latent": self._channel.send(key, tensor)}

    def release(self, session_id: str) -> None:
        return None


class ConsumerStage:
    """Receives the tensor behind `inputs["latent"]` and reduces it to a float; op "stats" reports the channel.

    With `options["started"]`, it sets that event just before it starts waiting for the tensor.
    """

    def __init__(self, ctx: WorkerContext) -> None:
        self._channel = cast(WorkerTensorChannel, ctx.options["channel"])
        self._started: Any = ctx.options.get("started")

    def process(self, call: StageCall) -> Mapping[str, object]:
        if call.inputs.get("op") == "stats":
            return {"stats": self._channel.statistics()}
        ref = call.inputs["latent"]
        assert isinstance(ref, TensorRef)
        if self._started is not None:
            self._started.set()
        tensor = self._channel.receive(ref, timeout_s=cast(float | None, call.inputs.get("timeout_s")))
        return {"sum": float(tensor.sum().item()), "device_type": tensor.device.type}

    def release(self, session_id: str) -> None:
        self._channel.discard(f"{session_id}/")


class PartsStage:
    """Sends `inputs["parts"]` parts ahead of its result: part i is `(rank, i, a [frames, 16, 16, 3] uint8 tensor of
    i)`; from part `inputs["gate_at"]` on it first sets "started" and waits for the gate, then does `inputs["then"]`:
    "fail" raises, "exit" ends the process, "unpicklable" sends a part that cannot be pickled; anything else goes on.
    Op "fds" returns how many file descriptors the process holds (a part left unfetched would keep one)."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    def process(self, call: StageCall) -> Mapping[str, object]:
        if call.inputs.get("op") == "fds":
            return {"fds": len(os.listdir("/proc/self/fd"))}
        count: Any = call.inputs["parts"]
        frames: Any = call.inputs.get("frames", 2)
        gate_at = call.inputs.get("gate_at", -1)
        for index in range(int(count)):
            if index == gate_at:
                self._ctx.options["started"].set()  # type: ignore[attr-defined]
                self._ctx.options["gate"].wait(GATE_TIMEOUT_S)  # type: ignore[attr-defined]
                then = call.inputs.get("then")
                if then == "fail":
                    raise RuntimeError(f"failed after {index} parts")
                if then == "exit":
                    os._exit(3)
                if then == "unpicklable":
                    self._ctx.parts.send(lambda: None)
                if then == "unreadable":
                    self._ctx.parts.send(UnreadableInParent())
            part = torch.full((int(frames), 16, 16, 3), index, dtype=torch.uint8)
            self._ctx.parts.send((self._ctx.rank, index, part))
        return {"parts": count, "rank": self._ctx.rank}

    def release(self, session_id: str) -> None:
        return None


class UnreadableInParent:
    """Pickles in a worker process; unpickling it anywhere but in a worker process raises."""

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        return (_read_in_a_worker, ())


def _read_in_a_worker() -> UnreadableInParent:
    if multiprocessing.parent_process() is None:
        raise ValueError("this object cannot be read in the parent")
    return UnreadableInParent()


def parts_stage(ctx: WorkerContext) -> PartsStage:
    return PartsStage(ctx)


def producer_stage(ctx: WorkerContext) -> ProducerStage:
    return ProducerStage(ctx)


def consumer_stage(ctx: WorkerContext) -> ConsumerStage:
    return ConsumerStage(ctx)


# --- test-side helpers ---

SPAWN = torch_mp.get_context("spawn")
WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class Gates:
    started: Any  # multiprocessing.synchronize.Event: the child sets it when a "block" call runs
    gate: Any  # the test sets it to let the blocked call finish

    def clear(self) -> None:
        self.started.clear()
        self.gate.clear()

    async def wait_started(self) -> None:
        assert await asyncio.to_thread(self.started.wait, WAIT_S), "the blocking call never started"

    async def open(self) -> None:
        await asyncio.to_thread(self.gate.set)


def make_gates() -> Gates:
    return Gates(started=SPAWN.Event(), gate=SPAWN.Event())


def call(op: str = "count", session: str = "s", sequence: int = 0) -> StageCall:
    return StageCall(stage_id="counter", session_id=session, sequence_id=sequence, inputs={"op": op})


def pids_gone(pids: tuple[int, ...]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


class EchoStage:
    """`x` → `y = (x, n)` where n counts the session's calls; `x == "block"` signals "started" and hangs."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx
        self._counts: dict[str, int] = {}

    def process(self, call: StageCall) -> Mapping[str, object]:
        value = call.inputs["x"]
        if value == "block":
            started: Any = self._ctx.options["started"]  # a multiprocessing Event (see `Gates`)
            started.set()
            time.sleep(GATE_TIMEOUT_S)
        count = self._counts.get(call.session_id, 0) + 1
        self._counts[call.session_id] = count
        return {"y": (value, count)}

    def release(self, session_id: str) -> None:
        self._counts.pop(session_id, None)


def echo_stage(ctx: WorkerContext) -> EchoStage:
    return EchoStage(ctx)


class LaneStage:
    """Two call lanes in one rank: a `wait` call (lane 0) waits until the `signal` call (lane 1) of sequence
    `inputs["for"]` ran, up to `within` seconds, and says whether it saw it; a `signal` call sends one part (rank 0)
    and records its sequence."""

    def __init__(self, ctx: WorkerContext) -> None:
        import threading

        self._ctx = ctx
        self._changed = threading.Condition()
        self._order: list[int] = []

    def process(self, call: StageCall) -> Mapping[str, object]:
        import threading

        op = call.inputs["op"]
        if op == "wait":
            wanted = int(cast(int, call.inputs["for"]))
            within = float(cast(float, call.inputs.get("within", GATE_TIMEOUT_S)))
            with self._changed:
                seen = self._changed.wait_for(lambda: wanted in self._order, within)
            return {"out": {"seen": seen, "thread": threading.current_thread().name}}
        self._ctx.parts.send({"part_of": call.sequence_id})
        with self._changed:
            self._order.append(call.sequence_id)
            self._changed.notify_all()
        return {"out": {"order": list(self._order), "thread": threading.current_thread().name}}

    def release(self, session_id: str) -> None:
        return None


def lane_stage(ctx: WorkerContext) -> LaneStage:
    return LaneStage(ctx)
