"""The generic streaming scheduler: specs, graph validation, bounded edges, stage actors, lifecycle, metrics.

Importing it loads no torch: the process machinery (`ParallelWorker`, its actor, the tensor channel) is the
`pipeline.process` subpackage, imported where it is used."""

from __future__ import annotations

from pipeline.actor import ActorStatistics, DeathListener, Stage, StageActor, StageCall
from pipeline.bidirectional import (
    BidirectionalService,
    ChunkOutput,
    ControlMessage,
    ControlState,
    PreparedSession,
    ResetPose,
    ServiceStatistics,
    SessionCloseMode,
    SessionSummary,
    Stop,
)
from pipeline.clock import Clock, MonotonicClock
from pipeline.core import SchedulerCore
from pipeline.core.records import CloseMode, CloseReport, CoreStatistics, OutputItem, ResultKind, SessionState
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
from pipeline.orchestrator import OrchestratorStatistics, OutputStream, StageListener, StreamingPipelineOrchestrator
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
    "BidirectionalService",
    "ChannelError",
    "ChunkOutput",
    "Clock",
    "CloseMode",
    "CloseReport",
    "ControlMessage",
    "ControlState",
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
    "PreparedSession",
    "ResetPose",
    "ResultKind",
    "SchedulerCore",
    "SequenceError",
    "ServiceStatistics",
    "SessionCloseMode",
    "SessionClosedError",
    "SessionDiagnostics",
    "SessionError",
    "SessionExistsError",
    "SessionFailedError",
    "SessionMetricsSnapshot",
    "SessionPoisonedError",
    "SessionState",
    "SessionSummary",
    "Stage",
    "StageActor",
    "StageCall",
    "StageFailedError",
    "StageListener",
    "StageOrdering",
    "StageTiming",
    "Stop",
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
