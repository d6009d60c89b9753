"""The generic streaming scheduler: specs, graph validation, bounded edges, stage actors, lifecycle, metrics.

Importing it loads no torch: the process machinery (`ParallelWorker`, its actor, the tensor channel) is the
`pipeline.process` subpackage, imported where it is used. The scheduler's session lifecycle (`pipeline.core`'s
`SessionState`) is exported here as `PipelineSessionState`, so that it is not mistaken for the service's own."""

from __future__ import annotations

from pipeline.actor import ActorStatistics, DeathListener, Stage, StageActor, StageCall
from pipeline.bidirectional import (
    CANONICAL_KEYS,
    KEY_ALIASES,
    MAX_KEYS_PER_SNAPSHOT,
    MAX_SEQ,
    BidirectionalService,
    ChunkOutput,
    CloseMode,
    ControlMessage,
    ControlState,
    PreparedSession,
    ResetPose,
    ServiceStatistics,
    SessionSummary,
    Stop,
    canonical_key,
)
from pipeline.clock import Clock, MonotonicClock
from pipeline.core import SchedulerCore
from pipeline.core.records import CloseReport, CoreStatistics, OutputItem, ResultKind
from pipeline.core.records import SessionState as PipelineSessionState
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
    "CANONICAL_KEYS",
    "KEY_ALIASES",
    "MAX_KEYS_PER_SNAPSHOT",
    "MAX_SEQ",
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
    "PipelineSessionState",
    "PipelineSpecError",
    "PreparedSession",
    "ResetPose",
    "ResultKind",
    "SchedulerCore",
    "SequenceError",
    "ServiceStatistics",
    "SessionClosedError",
    "SessionDiagnostics",
    "SessionError",
    "SessionExistsError",
    "SessionFailedError",
    "SessionMetricsSnapshot",
    "SessionPoisonedError",
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
    "canonical_key",
    "validate_pipeline",
]
