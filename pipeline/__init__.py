"""The generic streaming scheduler: specs, graph validation, bounded edges, stage actors, lifecycle, metrics."""

from __future__ import annotations

from pipeline.actor import ActorStatistics, DeathListener, Stage, StageActor, StageCall
from pipeline.clock import Clock, MonotonicClock
from pipeline.core import CloseMode, CloseReport, CoreStatistics, OutputItem, ResultKind, SchedulerCore, SessionState
from pipeline.errors import (
    ActorDiedError,
    ActorUnavailableError,
    ChannelError,
    PipelineError,
    PipelineSpecError,
    SequenceError,
    SessionClosedError,
    SessionError,
    SessionExistsError,
    SessionFailedError,
    SessionPoisonedError,
    StageFailedError,
    UnknownArtifactError,
    UnknownSessionError,
)
from pipeline.local_actor import FunctionStage, LocalStageActor
from pipeline.metrics import (
    IdleInterval,
    IdleReason,
    SessionDiagnostics,
    SessionMetricsSnapshot,
    StageTiming,
    StreamingSessionMetrics,
    Summary,
)
from pipeline.orchestrator import OrchestratorStatistics, OutputStream, StreamingPipelineOrchestrator
from pipeline.spec import (
    PipelineGraph,
    StageOrdering,
    StreamingEdgeSpec,
    StreamingPipelineSpec,
    StreamingResourceGroupSpec,
    StreamingStageSpec,
    validate_pipeline,
)

__all__ = [
    "ActorDiedError",
    "ActorStatistics",
    "ActorUnavailableError",
    "ChannelError",
    "Clock",
    "CloseMode",
    "CloseReport",
    "CoreStatistics",
    "DeathListener",
    "FunctionStage",
    "IdleInterval",
    "IdleReason",
    "LocalStageActor",
    "MonotonicClock",
    "OrchestratorStatistics",
    "OutputItem",
    "OutputStream",
    "PipelineError",
    "PipelineGraph",
    "PipelineSpecError",
    "ResultKind",
    "SchedulerCore",
    "SequenceError",
    "SessionClosedError",
    "SessionDiagnostics",
    "SessionError",
    "SessionExistsError",
    "SessionFailedError",
    "SessionMetricsSnapshot",
    "SessionPoisonedError",
    "SessionState",
    "Stage",
    "StageActor",
    "StageCall",
    "StageFailedError",
    "StageOrdering",
    "StageTiming",
    "StreamingEdgeSpec",
    "StreamingPipelineOrchestrator",
    "StreamingPipelineSpec",
    "StreamingResourceGroupSpec",
    "StreamingSessionMetrics",
    "StreamingStageSpec",
    "Summary",
    "UnknownArtifactError",
    "UnknownSessionError",
    "validate_pipeline",
]
