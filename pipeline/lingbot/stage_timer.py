"""How long a model stage's call took on the device it ran on: host time on the CPU, CUDA events on a GPU.

A CUDA kernel launch returns at once, so host `perf_counter` around a denoise call measures the launches, and the
work lands on whichever later call first waits for the device — the decode's `.cpu()`, which then books about one
DiT forward as decode. On CUDA a span is therefore two `torch.cuda.Event`s recorded on the device's current stream
around the call; `stop()` waits for the end event, so the span reads the device's own time for the call's work and
the call returns only once that work is done (the next stage starts on an idle stream; what it times is its own).
On the CPU and on `meta` a span is host time.

    timer = stage_timer(part.device)      # or timer_for(part): the part's device when it names one
    span = timer.start()
    latent = part.denoise_chunk(...)
    seconds = span.stop()

`StageTimer` and `DeviceEvent` are the seams: a stage takes any `StageTimer` (tests inject their own), and
`CudaEventTimer` takes its events from an injectable factory, so its arithmetic and order are tested on a CPU.
Spans are not shared between threads: one stage thread starts and stops its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

__all__ = [
    "CudaEventTimer",
    "DeviceBound",
    "DeviceEvent",
    "HostTimer",
    "RunningSpan",
    "StageTimer",
    "stage_timer",
    "timer_for",
]


class RunningSpan(Protocol):
    def stop(self) -> float:
        """Seconds since the span started (on a device: its work between start and now, waiting for it)."""
        ...


class StageTimer(Protocol):
    def start(self) -> RunningSpan: ...


@runtime_checkable
class DeviceBound(Protocol):
    """A model part that says which device its calls run on."""

    @property
    def device(self) -> torch.device: ...


class DeviceEvent(Protocol):
    """A point in a device stream's work (what `torch.cuda.Event(enable_timing=True)` is)."""

    def record(self) -> None:
        """Marks the stream's work launched so far."""
        ...

    def synchronize(self) -> None:
        """Waits until the stream has reached this event."""
        ...

    def elapsed_time(self, end: DeviceEvent) -> float:
        """Milliseconds of stream time from this event to `end` (both reached)."""
        ...


class _HostSpan:
    __slots__ = ("_started",)

    def __init__(self) -> None:
        self._started = time.perf_counter()

    def stop(self) -> float:
        return time.perf_counter() - self._started


class HostTimer:
    """Host wall time (`time.perf_counter`): right wherever a call returns only when its work is done (the CPU)."""

    def start(self) -> RunningSpan:
        return _HostSpan()


class _CudaEvent:
    """A timing `torch.cuda.Event` recorded on `device`'s current stream (not the current device's)."""

    __slots__ = ("_device", "_event")

    def __init__(self, device: torch.device) -> None:
        self._device = device
        self._event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]

    def record(self) -> None:
        self._event.record(torch.cuda.current_stream(self._device))

    def synchronize(self) -> None:
        self._event.synchronize()

    def elapsed_time(self, end: DeviceEvent) -> float:
        if not isinstance(end, _CudaEvent):
            raise TypeError(f"a CUDA event's time to a {type(end).__name__} is not defined")
        return float(self._event.elapsed_time(end._event))


class _EventSpan:
    __slots__ = ("_begin", "_new_event")

    def __init__(self, new_event: Callable[[], DeviceEvent]) -> None:
        self._new_event = new_event
        self._begin = new_event()
        self._begin.record()

    def stop(self) -> float:
        end = self._new_event()
        end.record()
        end.synchronize()
        return self._begin.elapsed_time(end) / 1000.0


class CudaEventTimer:
    """Device time of a call on a CUDA device's current stream, from two events (the module docstring). `new_event`
    makes the events (default: timing `torch.cuda.Event`s on `device`'s current stream); nothing touches CUDA before
    the first `start()`."""

    def __init__(self, device: torch.device, new_event: Callable[[], DeviceEvent] | None = None) -> None:
        self._device = device
        self._new_event = new_event if new_event is not None else self._cuda_event

    @property
    def device(self) -> torch.device:
        return self._device

    def start(self) -> RunningSpan:
        return _EventSpan(self._new_event)

    def _cuda_event(self) -> DeviceEvent:
        return _CudaEvent(self._device)


def stage_timer(device: torch.device | str) -> StageTimer:
    """CUDA events for a CUDA device, host time for every other (the CPU, `meta`)."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaEventTimer(device)
    return HostTimer()


def timer_for(part: object) -> StageTimer:
    """The timer for a model part's calls: `stage_timer(part.device)` for a `DeviceBound` part, else host time."""
    if isinstance(part, DeviceBound):
        return stage_timer(part.device)
    return HostTimer()
