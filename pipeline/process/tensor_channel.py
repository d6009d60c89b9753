"""Tensor hand-off between worker groups: `WorkerTensorChannel` moves tensors from the processes of one
`ParallelWorker` to those of another without the parent process ever holding them.

The parent creates the channel (a spawn-context torch.multiprocessing pipe bounded by a slot semaphore) and passes
it to the stage factories of both groups through `ParallelWorkerConfig.options`. The producing stage calls
`send(key, tensor)`, which publishes the tensor through torch's multiprocessing reductions (CPU tensors move to
shared memory, CUDA tensors travel as CUDA IPC handles) and returns a `TensorRef`: plain metadata (key, shape,
dtype, bytes, device type) that the stage returns as its artifact, so the scheduler only ever sees and checks
metadata (`validate_ref`). The consuming stage calls `receive(ref)`, which takes tensors off the pipe until
`ref.key` arrives, keeps a few early arrivals in a bounded local stash, and checks the tensor against the ref.
"""

from __future__ import annotations

import logging
import math
import select
import time
from collections import deque
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any, Protocol, runtime_checkable

import torch
import torch.multiprocessing as torch_mp

from pipeline.errors import ChannelError, PipelineSpecError

__all__ = ["ChannelStatistics", "TensorRef", "TensorRefCarrier", "WorkerTensorChannel", "validate_ref"]

logger = logging.getLogger(__name__)

MAX_KEY_LENGTH = 512
_REMEMBERED_DISCARDS = 64
# A pipe write of at most PIPE_BUF bytes is atomic, so writers need no lock; `send_bytes` writes a 4-byte length
# header and a payload this small in one write.
_ATOMIC_PAYLOAD_BYTES = select.PIPE_BUF - 4
_DEVICE_TYPES = frozenset({"cpu", "cuda"})


@dataclass(frozen=True, slots=True)
class TensorRef:
    """The metadata of one tensor in a `WorkerTensorChannel`: what the producing stage returns as its artifact.

    `dtype` is the torch dtype's name without the `torch.` prefix ("float32"); `nbytes` is `numel * itemsize`;
    `device_type` is "cpu" or "cuda". A ref that crossed a process boundary is untrusted: check it with
    `validate_ref`.
    """

    key: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    device_type: str

    @classmethod
    def describe(cls, key: str, tensor: torch.Tensor) -> TensorRef:
        """The ref of `tensor` under `key`."""
        return cls(
            key=key,
            shape=tuple(int(size) for size in tensor.shape),
            dtype=_dtype_name(tensor.dtype),
            nbytes=tensor.numel() * tensor.element_size(),
            device_type=tensor.device.type,
        )


@runtime_checkable
class TensorRefCarrier(Protocol):
    """An artifact that carries `TensorRef`s inside a richer record (e.g. a latent ref with its chunk index), so
    that the actor checks them like a bare ref before the scheduler sees the artifact."""

    def tensor_refs(self) -> tuple[TensorRef, ...]: ...


def validate_ref(obj: object) -> TensorRef:
    """Return `obj` if it is a well-formed `TensorRef`, else raise `ChannelError` saying what is wrong.

    Checks: a non-empty key of at most 512 characters, non-negative integer dimensions, a known torch dtype,
    `nbytes == numel * itemsize` and a supported device type. Cheap: no tensor is touched.
    """
    if not isinstance(obj, TensorRef):
        raise ChannelError(f"expected a TensorRef, got {type(obj).__name__}")
    if not isinstance(obj.key, str) or not obj.key or len(obj.key) > MAX_KEY_LENGTH:
        raise ChannelError(
            f"TensorRef key must be a non-empty string of at most {MAX_KEY_LENGTH} characters, got {obj.key!r}"
        )
    where = f"TensorRef {obj.key!r}"
    if not isinstance(obj.shape, tuple) or not all(_is_int(size) and size >= 0 for size in obj.shape):
        raise ChannelError(f"{where}: shape must be a tuple of non-negative integers, got {obj.shape!r}")
    dtype = _dtype_from_name(obj.dtype)
    if dtype is None:
        raise ChannelError(f"{where}: unknown dtype {obj.dtype!r}")
    expected = math.prod(obj.shape) * dtype.itemsize
    if not _is_int(obj.nbytes) or obj.nbytes != expected:
        raise ChannelError(
            f"{where}: nbytes {obj.nbytes!r} does not match shape {obj.shape} of {obj.dtype}"
            f" ({dtype.itemsize} bytes each) = {expected}"
        )
    if obj.device_type not in _DEVICE_TYPES:
        raise ChannelError(f"{where}: unsupported device type {obj.device_type!r} (expected one of cpu, cuda)")
    return obj


@dataclass(frozen=True, slots=True)
class ChannelStatistics:
    """This process's view of one channel (every process that holds the channel counts for itself)."""

    name: str
    capacity: int
    stash_size: int
    sent: int
    received: int
    stashed: int
    stashed_keys: tuple[str, ...]
    discarded: int
    evicted: int
    """Stashed tensors dropped, oldest first, to make room for an arrival (see the class docstring)."""
    send_s: float
    """Seconds spent in `send` (moving to shared memory or making the IPC handle, writing the item)."""
    receive_s: float
    """Seconds spent in `receive` (reading items, opening them, checking the one asked for)."""


class WorkerTensorChannel:
    """A bounded one-way path for tensors between worker processes; the parent only ever sees `TensorRef`s.

    Problem: a latent produced by one worker group (e.g. DiT denoise) is consumed by another (e.g. VAE decode).
    Returning the tensor through the parent would copy it twice and put it on the event loop's process; the
    channel hands it over directly (shared memory on CPU, CUDA IPC on GPU) while the scheduler moves metadata.

    Example::

        channel = WorkerTensorChannel("latent", capacity=2)  # in the parent, before the workers start
        denoise = ParallelWorker(ParallelWorkerConfig("denoise", build_dit, options={"latent": channel}))
        decode = ParallelWorker(ParallelWorkerConfig("decode", build_vae, options={"latent": channel}))
        # producing stage:  return {"latent": ctx.options["latent"].send(f"{sid}/{seq}/latent", latent)}
        # consuming stage:  latent = ctx.options["latent"].receive(call.inputs["latent"])

    Ordering: first in, first out across all producers. `receive(ref)` takes tensors in arrival order until
    `ref.key` arrives; earlier arrivals for other keys wait in a local stash of `stash_size` entries.

    Backpressure: at most `capacity` tensors are in flight (sent, not yet taken by the consumer); `send` blocks up
    to `send_timeout_s` for a slot, then raises `ChannelError`. The stash drops its oldest entry when an arrival
    finds it full (counted in `evicted`, logged): the oldest entries are the likeliest leftovers of a session whose
    consumer died with its release (a restarted consumer inherits what was in the pipe), and a live key that was
    evicted surfaces as its `receive` timing out with a message naming it.

    Cancellation: `send` and `receive` run inside a stage call and block its thread; they end by their timeouts,
    never half-way (a tensor is either in the pipe or not).

    Why not a multiprocessing.Queue: its reader lock is held for the whole of a blocking `get`, so a consumer killed
    while waiting would leave the lock taken and wedge the channel for its restarted successor. Here the single
    consumer reads without a lock, and producers write small items atomically (larger ones under a lock held only
    for the write). A process killed between taking a slot and writing, or between reading and freeing the slot,
    costs one slot of capacity.

    Ownership: after `send` the consumer reads the producer's memory; the producer must not write to the tensor
    again (send a clone if it must). A CUDA tensor must stay allocated in the producer until the consumer dropped
    it, which torch's CUDA IPC reference counting ensures as long as the producing process lives. Sending moves a
    CPU tensor's storage into shared memory; a view of a larger or non-contiguous storage is copied first so only
    its own bytes travel.

    One consuming process per channel: with several consuming ranks, receive on one and broadcast, or use one
    channel per rank. Keys must be unique while in flight; use "session/sequence/artifact", so that the consuming
    stage's `release(session_id)` can call `discard(f"{session_id}/")` for refs the scheduler dropped (a cancelled
    session), which would otherwise sit in the stash. Size `stash_size` for the keys that can overtake each other:
    sessions × the capacity of the edge that carries the refs. The parent keeps the channel open while either group
    may (re)start, and calls `close()` after stopping both.
    """

    def __init__(
        self,
        name: str,
        *,
        capacity: int = 4,
        stash_size: int = 8,
        send_timeout_s: float = 30.0,
        receive_timeout_s: float = 30.0,
    ) -> None:
        if capacity < 1 or stash_size < 1:
            raise PipelineSpecError(f"channel {name!r}: capacity and stash_size must be at least 1")
        if not send_timeout_s > 0 or not receive_timeout_s > 0:
            raise PipelineSpecError(f"channel {name!r}: timeouts must be positive")
        self._name = name
        self._capacity = capacity
        self._stash_size = stash_size
        self._send_timeout_s = send_timeout_s
        self._receive_timeout_s = receive_timeout_s
        ctx = torch_mp.get_context("spawn")
        self._reader, self._writer = ctx.Pipe(duplex=False)
        self._slots = ctx.BoundedSemaphore(capacity)
        self._write_lock = ctx.Lock()
        self._reset_local_state()

    def _reset_local_state(self) -> None:
        self._stash: dict[str, torch.Tensor] = {}
        self._discarded_prefixes: deque[str] = deque(maxlen=_REMEMBERED_DISCARDS)
        self._sent = 0
        self._received = 0
        self._discarded = 0
        self._evicted = 0
        self._send_s = 0.0
        self._receive_s = 0.0

    _SHARED = ("_name", "_capacity", "_stash_size", "_send_timeout_s", "_receive_timeout_s")
    _HANDLES = ("_reader", "_writer", "_slots", "_write_lock")

    def __getstate__(self) -> dict[str, Any]:
        # The handles pickle only while a worker process is being spawned; the stash stays in its process.
        return {name: getattr(self, name) for name in (*self._SHARED, *self._HANDLES)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)
        self._reset_local_state()

    @property
    def name(self) -> str:
        return self._name

    def statistics(self) -> ChannelStatistics:
        return ChannelStatistics(
            name=self._name,
            capacity=self._capacity,
            stash_size=self._stash_size,
            sent=self._sent,
            received=self._received,
            stashed=len(self._stash),
            stashed_keys=tuple(self._stash),
            discarded=self._discarded,
            evicted=self._evicted,
            send_s=self._send_s,
            receive_s=self._receive_s,
        )

    def send(self, key: str, tensor: torch.Tensor, *, timeout_s: float | None = None) -> TensorRef:
        """Publish `tensor` under `key` and return its ref; raises `ChannelError` if it cannot be sent."""
        started = time.perf_counter()
        try:
            return self._send(key, tensor, timeout_s)
        finally:
            self._send_s += time.perf_counter() - started

    def _send(self, key: str, tensor: torch.Tensor, timeout_s: float | None) -> TensorRef:
        if not isinstance(tensor, torch.Tensor):
            raise ChannelError(f"channel {self._name!r}: can only send tensors, got {type(tensor).__name__}")
        device_type = tensor.device.type
        if device_type == "cuda":
            # CUDA IPC only: the handle opens in another process on the same machine; nothing else changes.
            if not torch.cuda.is_available():
                raise ChannelError(f"channel {self._name!r}: tensor {key!r} is on CUDA but CUDA is unavailable")
        elif device_type != "cpu":
            raise ChannelError(f"channel {self._name!r}: cannot share {device_type} tensors (only cpu and cuda)")
        tensor = tensor.detach()
        if not tensor.is_contiguous() or tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.clone(memory_format=torch.contiguous_format)
        ref = validate_ref(TensorRef.describe(key, tensor))
        try:
            payload = bytes(ForkingPickler.dumps((key, tensor)))
        except Exception as exc:
            raise ChannelError(f"channel {self._name!r}: could not share tensor {key!r}: {exc}") from exc
        timeout = self._send_timeout_s if timeout_s is None else timeout_s
        if not self._slots.acquire(timeout=timeout):
            raise ChannelError(
                f"channel {self._name!r} is full ({self._capacity} tensors in flight) and stayed full for"
                f" {timeout:g} s: is the consumer receiving?"
            )
        try:
            self._write(payload, timeout)
        except BaseException:
            self._slots.release()
            raise
        self._sent += 1
        logger.debug("channel %r: sent %r %s %s", self._name, key, ref.dtype, ref.shape)
        return ref

    def receive(self, ref: TensorRef, *, timeout_s: float | None = None) -> torch.Tensor:
        """Return the tensor sent under `ref.key`, checked against `ref`; raises `ChannelError` on any mismatch."""
        started = time.perf_counter()
        try:
            return self._receive(ref, timeout_s)
        finally:
            self._receive_s += time.perf_counter() - started

    def _receive(self, ref: TensorRef, timeout_s: float | None) -> torch.Tensor:
        validate_ref(ref)
        for prefix in [p for p in self._discarded_prefixes if ref.key.startswith(p)]:
            self._discarded_prefixes.remove(prefix)  # the id is in use again
        if ref.key in self._stash:
            return self._check(ref, self._stash.pop(ref.key))
        timeout = self._receive_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout
        while True:
            if not self._reader.poll(max(0.0, deadline - time.monotonic())):
                raise ChannelError(
                    f"channel {self._name!r}: no tensor with key {ref.key!r} arrived within {timeout:g} s"
                    f" (stashed keys: {sorted(self._stash)})"
                )
            payload = self._reader.recv_bytes()
            self._slots.release()
            key, tensor = self._unpack(payload)
            if key == ref.key:
                return self._check(ref, tensor)
            if any(key.startswith(prefix) for prefix in self._discarded_prefixes):
                self._discarded += 1
                continue
            if key in self._stash:
                raise ChannelError(f"channel {self._name!r}: key {key!r} arrived twice (dropped the second)")
            if len(self._stash) >= self._stash_size:
                oldest = next(iter(self._stash))
                del self._stash[oldest]
                self._evicted += 1
                logger.warning(
                    "channel %r: stash full (%d tensors) while waiting for %r; evicted the oldest, %r",
                    self._name,
                    self._stash_size,
                    ref.key,
                    oldest,
                )
            self._stash[key] = tensor

    def discard(self, prefix: str) -> int:
        """Drop the stashed tensors whose key starts with `prefix`, and those that arrive later; return how many.

        For the consuming stage's `release(session_id)`: refs the scheduler discarded are never received, so their
        tensors would otherwise fill the stash. The last 64 prefixes are remembered; receiving a key under a
        remembered prefix forgets it again (the id is in use anew).
        """
        if not prefix:
            raise ChannelError(f"channel {self._name!r}: an empty prefix would discard everything")
        dropped = [key for key in self._stash if key.startswith(prefix)]
        for key in dropped:
            del self._stash[key]
        if prefix not in self._discarded_prefixes:
            self._discarded_prefixes.append(prefix)
        self._discarded += len(dropped)
        return len(dropped)

    def close(self) -> None:
        """Close this process's ends of the pipe; call it in the parent once no worker group uses the channel."""
        self._reader.close()
        self._writer.close()
        self._stash.clear()

    def _write(self, payload: bytes, timeout: float) -> None:
        if len(payload) <= _ATOMIC_PAYLOAD_BYTES:
            self._writer.send_bytes(payload)
            return
        if not self._write_lock.acquire(timeout=timeout):
            raise ChannelError(f"channel {self._name!r}: another producer held the write lock for {timeout:g} s")
        try:
            self._writer.send_bytes(payload)
        finally:
            self._write_lock.release()

    def _unpack(self, payload: bytes) -> tuple[str, torch.Tensor]:
        try:
            item = ForkingPickler.loads(payload)
        except Exception as exc:  # e.g. the producer exited before its shared memory could be fetched
            raise ChannelError(f"channel {self._name!r}: could not open a received tensor: {exc!r}") from exc
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)):
            raise ChannelError(f"channel {self._name!r}: received a malformed item of type {type(item).__name__}")
        key, tensor = item
        if not isinstance(tensor, torch.Tensor):
            raise ChannelError(f"channel {self._name!r}: key {key!r} carried {type(tensor).__name__}, not a tensor")
        return key, tensor

    def _check(self, ref: TensorRef, tensor: torch.Tensor) -> torch.Tensor:
        actual = TensorRef.describe(ref.key, tensor)
        mismatches = [
            f"{name} {got!r} (expected {want!r})"
            for name, got, want in (
                ("shape", actual.shape, ref.shape),
                ("dtype", actual.dtype, ref.dtype),
                ("nbytes", actual.nbytes, ref.nbytes),
                ("device type", actual.device_type, ref.device_type),
            )
            if got != want
        ]
        if mismatches:
            raise ChannelError(
                f"channel {self._name!r}: tensor {ref.key!r} does not match its ref: {', '.join(mismatches)}"
            )
        self._received += 1
        return tensor


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: object) -> torch.dtype | None:
    if not isinstance(name, str) or not name.isidentifier():
        return None
    dtype = getattr(torch, name, None)
    return dtype if isinstance(dtype, torch.dtype) else None
