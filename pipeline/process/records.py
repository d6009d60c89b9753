"""The records of a `ParallelWorker`: its configuration, what each rank's stage factory receives, its lifecycle and
its statistics.

`ParallelWorkerConfig` is validated on construction (`PipelineSpecError` names the field). `WorkerContext` and the
`stage_factory` travel into every spawned rank, so both must be picklable. `WorkerState` is the worker's lifecycle
with its transition table, and `WorkerStatistics` the frozen snapshot `ParallelWorker.statistics()` returns.
`pipeline` and `pipeline.process.worker` re-export the public names.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from pipeline.actor import Stage, StageCall
from pipeline.errors import PipelineSpecError

__all__ = [
    "ParallelWorkerConfig",
    "PartListener",
    "PartSender",
    "ReportsReady",
    "StageFactory",
    "WorkerContext",
    "WorkerState",
    "WorkerStatistics",
]


class PartSender(Protocol):
    """Where a stage in a worker process hands partial results of the call it is running (`WorkerContext.parts`)."""

    def send(self, part: object) -> None:
        """Hand `part` to the parent's part listeners ahead of the call's result (`pipeline.process._protocol`).

        Only while `process()` runs; pickled at once (a CPU tensor in it moves to shared memory, like artifacts), so
        the stage may reuse its own buffers afterwards. Raises `RuntimeError` outside a call and `TypeError` if the
        part cannot be pickled. On ranks other than 0 it does nothing: only rank 0 answers for the group.
        """
        ...


class _NoParts:
    """`WorkerContext.parts` outside a worker process (the parent's copy): nothing to send parts to."""

    def send(self, part: object) -> None:
        raise RuntimeError("parts can only be sent by a stage running in a worker process")


_NO_PARTS: PartSender = _NoParts()

PartListener = Callable[[StageCall, object], None]
"""`listener(call, part)`: a part of `call`, on the event loop, in the order the stage sent them, before the call's
result; it must not block. A listener that raises fails the call (its later parts are dropped)."""


@dataclass(frozen=True, slots=True)
class WorkerContext:
    """What `stage_factory` receives inside each worker process (it is pickled into the child at spawn time).

    `options` is `ParallelWorkerConfig.options` as given: picklable objects the stage needs, e.g. a
    `WorkerTensorChannel` shared with another worker group. `parts` is set in the rank: where the stage hands
    partial results of the call it is running (`PartSender`).
    """

    name: str
    rank: int
    world_size: int
    device: str
    torch_threads: int
    incarnation: int
    options: Mapping[str, object]
    parts: PartSender = _NO_PARTS
    lanes: int = 1
    """`ParallelWorkerConfig.lanes`: with 2, the rank runs lane 1's calls on a second thread beside lane 0's."""


StageFactory = Callable[[WorkerContext], Stage]
"""Builds the stage inside a child. Must be picklable by reference: a module-level function or class."""


@dataclass(frozen=True, slots=True)
class ParallelWorkerConfig:
    """Everything a `ParallelWorker` needs; validated on construction (`PipelineSpecError` names the field)."""

    name: str
    stage_factory: StageFactory
    devices: tuple[str, ...] = ("cpu",)
    """One rank per entry: "cpu", "cuda" or "cuda:N". CPU and CUDA ranks cannot be mixed in one group."""
    torch_threads: int = 1
    """`torch.set_num_threads` in every rank."""
    capacity: int = 1
    """Calls in flight at once, per lane. A lane runs its calls serially, so more than 1 only queues calls inside the
    children."""
    lanes: int = 1
    """Call lanes (1 or 2). Lane 0 runs on each rank's main thread; with 2, lane 1's calls run on a second thread of
    every rank beside lane 0's (on a CUDA device with its own CUDA stream), each lane in its own submission order.
    A stage that takes lane-1 calls must make them safe beside lane 0's (e.g. a co-located decode beside the DiT,
    `pipeline.lingbot.graph.group_stages`); releases run on lane 0."""
    max_pending_releases: int = 8
    """`release_session` calls in flight at once; further ones wait for a slot."""
    options: Mapping[str, object] = field(default_factory=dict)
    start_timeout_s: float = 120.0
    """How long a new incarnation may take until every rank has built its stage (process group included); with
    more than one rank it is also the process group's timeout for a collective that not every rank reaches."""
    stop_timeout_s: float = 10.0
    """How long `aclose()` waits for the ranks to finish their calls and exit before it terminates them."""
    kill_grace_s: float = 2.0
    """How long a terminated (SIGTERM) rank gets before it is killed (SIGKILL)."""
    restart_backoff_initial_s: float = 0.2
    restart_backoff_max_s: float = 30.0
    restart_backoff_reset_s: float = 60.0
    """An incarnation that ran this long before it died restarts after the initial back-off again."""
    start_method: str = "forkserver"
    """How the ranks' processes start (`pipeline.process.starter`): "forkserver" (forked from a server that
    imported torch and the stage's modules once: a restart in well under a second) or "spawn" (a fresh interpreter
    per rank, which imports them itself: seconds)."""
    preload: tuple[str, ...] = ()
    """Modules the forkserver imports once for every rank, besides torch and the stage factory's module (the model
    code the factory imports when it builds the stage). They must not initialise CUDA or start threads at import."""
    call_timeout_s: float | None = None
    """How long the ranks may work on one call or release (timed from when the operation ahead of it finished, so
    queued work does not count) before the worker declares the incarnation stuck: a rank that never answers (a hung
    kernel, a collective a peer never joined) is then treated like a dead one (the calls in flight fail with
    `ActorDiedError`, the group is killed and restarted with back-off). None: no limit."""

    def __post_init__(self) -> None:
        if not self.name:
            raise PipelineSpecError("ParallelWorkerConfig.name must not be empty")
        if not callable(self.stage_factory):
            raise PipelineSpecError(f"worker {self.name!r}: stage_factory must be callable")
        if not self.devices:
            raise PipelineSpecError(f"worker {self.name!r}: devices must name at least one device")
        kinds = {_device_kind(self.name, device) for device in self.devices}
        if len(kinds) > 1:
            raise PipelineSpecError(f"worker {self.name!r}: devices {self.devices} mix CPU and CUDA ranks")
        if kinds == {"cuda"} and len(self.devices) > 1 and len(set(self.devices)) != len(self.devices):
            raise PipelineSpecError(f"worker {self.name!r}: NCCL needs one CUDA device per rank, got {self.devices}")
        for field_name in ("torch_threads", "capacity", "max_pending_releases"):
            if getattr(self, field_name) < 1:
                raise PipelineSpecError(f"worker {self.name!r}: {field_name} must be at least 1")
        if self.lanes not in (1, 2):
            raise PipelineSpecError(f"worker {self.name!r}: lanes must be 1 or 2, got {self.lanes}")
        for field_name in (
            "start_timeout_s",
            "stop_timeout_s",
            "kill_grace_s",
            "restart_backoff_initial_s",
            "restart_backoff_max_s",
            "restart_backoff_reset_s",
        ):
            if not getattr(self, field_name) > 0:
                raise PipelineSpecError(f"worker {self.name!r}: {field_name} must be positive")
        if self.start_method not in ("forkserver", "spawn"):
            raise PipelineSpecError(
                f"worker {self.name!r}: start_method must be 'forkserver' or 'spawn', not {self.start_method!r}"
            )
        if self.call_timeout_s is not None and not self.call_timeout_s > 0:
            raise PipelineSpecError(f"worker {self.name!r}: call_timeout_s must be positive (or None: no limit)")
        if self.restart_backoff_max_s < self.restart_backoff_initial_s:
            raise PipelineSpecError(f"worker {self.name!r}: restart_backoff_max_s is below restart_backoff_initial_s")

    @property
    def world_size(self) -> int:
        return len(self.devices)


def _device_kind(name: str, device: str) -> str:
    if device == "cpu":
        return "cpu"
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        return "cuda"
    raise PipelineSpecError(f"worker {name!r}: unsupported device {device!r} (use 'cpu', 'cuda' or 'cuda:N')")


class WorkerState(enum.Enum):
    CREATED = "created"  # constructed; no process exists yet
    STARTING = "starting"  # an incarnation is spawned; waiting until every rank has built its stage
    RUNNING = "running"  # every rank is ready; calls are accepted
    RESTARTING = "restarting"  # an incarnation died: tearing it down, backing off, then STARTING again
    STOPPING = "stopping"  # aclose() is finishing the calls in flight and ending the processes
    STOPPED = "stopped"  # no process left; terminal


WORKER_TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = {
    WorkerState.CREATED: frozenset({WorkerState.STARTING, WorkerState.STOPPING}),
    # STARTING → STOPPED only when the very first start fails.
    WorkerState.STARTING: frozenset(
        {WorkerState.RUNNING, WorkerState.RESTARTING, WorkerState.STOPPING, WorkerState.STOPPED}
    ),
    WorkerState.RUNNING: frozenset({WorkerState.RESTARTING, WorkerState.STOPPING}),
    WorkerState.RESTARTING: frozenset({WorkerState.STARTING, WorkerState.STOPPING}),
    WorkerState.STOPPING: frozenset({WorkerState.STOPPED}),
    WorkerState.STOPPED: frozenset(),
}
_TERMINAL_STATES = frozenset({WorkerState.STOPPED})


@runtime_checkable
class ReportsReady(Protocol):
    """A stage with something to say once it is built (e.g. how long its model warmed up): rank 0's
    `ready_report()`, pickled, rides on its "ready" reply and is kept as `WorkerStatistics.ready_report` of that
    incarnation. A report that cannot be pickled fails the start like a stage factory that raised."""

    def ready_report(self) -> object: ...


@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    """A snapshot of one `ParallelWorker`.

    `calls` counts calls handed to the ranks; `failures` those that ended in `StageFailedError`; `lost_calls`
    those that ended because their incarnation died or the worker stopped. `in_flight` includes cancelled calls
    that still run in the children. `stale_results` counts replies nobody waited for any more (cancelled calls, dead
    incarnations). `deaths` counts incarnations that died while running, `restarts` successful restarts. `parts`
    counts partial results handed to the part listeners, `dropped_parts` those that were not (their call was
    cancelled or failed, their incarnation is gone, or no listener is registered).
    """

    name: str
    state: WorkerState
    healthy: bool
    incarnation: int
    world_size: int
    pids: tuple[int, ...]
    capacity: int
    in_flight: int
    pending_releases: int
    calls: int
    failures: int
    lost_calls: int
    stale_results: int
    deaths: int
    restarts: int
    backoff_s: float
    parts: int
    dropped_parts: int
    ready_report: object = None
    """What rank 0's stage reported when it was built (`ReportsReady`), for the incarnation now running; None: none."""
