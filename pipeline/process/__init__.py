"""Stages in worker processes: `ParallelWorker` (a group of spawned ranks, `worker.py`, its records in `records.py`),
`ParallelWorkerStageActor` (its only owner, `actor.py`) and `WorkerTensorChannel` (tensors between worker groups,
`tensor_channel.py`). A stage may answer a call in parts ahead of its result (`PartSender`, `PartListener`). The
parent-rank wire messages (`_protocol.py`), the rank's side (`_child.py`) and one incarnation's processes
(`_incarnation.py`) are private to this package.

This subpackage loads torch; `import pipeline` does not, so import it where processes are wanted:
`from pipeline.process import ParallelWorker`.
"""

from __future__ import annotations

from pipeline.process.actor import ParallelWorkerStageActor, WorkerLaneActor
from pipeline.process.records import (
    ParallelWorkerConfig,
    PartListener,
    PartSender,
    ReportsReady,
    StageFactory,
    WorkerContext,
    WorkerState,
    WorkerStatistics,
)
from pipeline.process.tensor_channel import (
    ChannelStatistics,
    TensorRef,
    TensorRefCarrier,
    WorkerTensorChannel,
    validate_ref,
)
from pipeline.process.worker import ParallelWorker

__all__ = [
    "ChannelStatistics",
    "ParallelWorker",
    "ParallelWorkerConfig",
    "ParallelWorkerStageActor",
    "PartListener",
    "PartSender",
    "ReportsReady",
    "StageFactory",
    "TensorRef",
    "TensorRefCarrier",
    "WorkerContext",
    "WorkerLaneActor",
    "WorkerState",
    "WorkerStatistics",
    "WorkerTensorChannel",
    "validate_ref",
]
