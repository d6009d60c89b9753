"""Errors raised by the streaming pipeline.

PipelineError
├── PipelineSpecError            the graph or a spec is invalid (message names the culprit)
├── SessionError                 a session-level misuse
│   ├── UnknownSessionError      no such open session
│   ├── SessionExistsError       the id is open already
│   ├── SessionPoisonedError     the id's release failed; retry the release before reusing it
│   ├── SessionClosedError       the session no longer accepts input
│   ├── UnknownArtifactError     a submission names an artifact that is not an external input
│   ├── SessionFailedError       read from a session that failed (its emitted outputs were read first)
│   └── SequenceError            a gap or a replay in an external artifact's sequence ids
├── StageFailedError             a stage raised for one session (the session fails, others go on)
├── ActorDiedError               the actor (e.g. its worker process) died; the sessions that depend on it fail
├── ActorUnavailableError        the actor is stopped or restarting and takes no calls now
└── ChannelError                 a WorkerTensorChannel transfer failed validation
"""

from __future__ import annotations

__all__ = [
    "ActorDiedError",
    "ActorUnavailableError",
    "ChannelError",
    "PipelineError",
    "PipelineSpecError",
    "SequenceError",
    "SessionClosedError",
    "SessionError",
    "SessionExistsError",
    "SessionFailedError",
    "SessionPoisonedError",
    "StageFailedError",
    "UnknownArtifactError",
    "UnknownSessionError",
]


class PipelineError(Exception):
    """Root of every error the pipeline package raises."""


class PipelineSpecError(PipelineError):
    """The pipeline graph or a spec is invalid."""


class SessionError(PipelineError):
    """A session-level misuse of the orchestrator."""


class UnknownSessionError(SessionError):
    """No open session has this id."""


class SessionExistsError(SessionError):
    """A session with this id is open already."""


class SessionPoisonedError(SessionError):
    """The session's release failed; the id is unusable until a retry of the failed stages succeeds."""


class SessionClosedError(SessionError):
    """The session is closing, closed or failed and accepts no more input."""


class SessionFailedError(SessionError):
    """The session failed (a stage raised or an actor died); `reason` says which and why."""

    def __init__(self, session_id: str, reason: str) -> None:
        super().__init__(f"session {session_id!r} failed: {reason}")
        self.session_id = session_id
        self.reason = reason


class UnknownArtifactError(SessionError):
    """A submission names an artifact that is not one of the pipeline's external inputs."""


class SequenceError(SessionError):
    """An external artifact's sequence id is not the next dense id (a gap or a replay)."""


class StageFailedError(PipelineError):
    """A stage raised while processing one session's item; only that session fails."""

    def __init__(self, stage_id: str, session_id: str, sequence_id: int, cause: str) -> None:
        super().__init__(f"stage {stage_id!r} failed for session {session_id!r} at sequence {sequence_id}: {cause}")
        self.stage_id = stage_id
        self.session_id = session_id
        self.sequence_id = sequence_id
        self.cause = cause


class ActorDiedError(PipelineError):
    """The actor died (e.g. its worker process exited); per-session state it held is lost."""


class ActorUnavailableError(PipelineError):
    """The actor is stopped or restarting and cannot take a call now."""


class ChannelError(PipelineError):
    """A tensor transfer between worker groups failed validation."""
