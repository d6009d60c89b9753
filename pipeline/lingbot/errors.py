"""Errors raised by the LingBot building blocks (`pipeline.lingbot`).

    PipelineError                    (pipeline.errors)
    └── LingBotError                 root of everything raised by pipeline.lingbot
        ├── ChunkContractError       a frame count or chunk index breaks the chunk contract (names valid neighbours)
        ├── ControlError             a control snapshot names unknown keys or has a bad sequence number
        ├── SessionConfigError       a session config field is missing its type or range (names field and range)
        ├── ImageInputError          a reference image is too large, not an image, or in an unsupported format
        ├── PlacementError           a model runtime config or placement request is inconsistent
        ├── ModelInputError          a tensor handed to a model stage has the wrong shape, dtype or values
        ├── ModelSessionError        a per-session model cache misuse: unknown id, duplicate create, chunk order
        └── CheckpointVersionError   a serialised session checkpoint of an unknown version (or not one at all)

Every error about bad input (all but `ModelSessionError`) is also a `ValueError`, so generic callers that only know
"the value was wrong" can still catch it.
"""

from __future__ import annotations

from pipeline.errors import PipelineError

__all__ = [
    "CheckpointVersionError",
    "ChunkContractError",
    "ControlError",
    "ImageInputError",
    "LingBotError",
    "ModelInputError",
    "ModelSessionError",
    "PlacementError",
    "SessionConfigError",
]


class LingBotError(PipelineError):
    """Root of every error raised by `pipeline.lingbot`."""


class ChunkContractError(LingBotError, ValueError):
    """A frame count, chunk size or chunk index breaks the chunk contract; the message names valid neighbours."""


class ControlError(LingBotError, ValueError):
    """A control snapshot is malformed: unknown keys (named in the message) or a bad sequence number."""


class SessionConfigError(LingBotError, ValueError):
    """A session config field has the wrong type or is out of range; the message names the field and the range."""


class ImageInputError(LingBotError, ValueError):
    """A reference image was rejected: too many bytes or pixels, not an image, or an unsupported format."""


class PlacementError(LingBotError, ValueError):
    """A model runtime config is inconsistent (e.g. world_size != len(devices)) or the placement is impossible."""


class ModelInputError(LingBotError, ValueError):
    """A tensor handed to a model stage has the wrong shape, dtype or values for the session."""


class ModelSessionError(LingBotError):
    """A per-session model cache was misused: unknown session, a second create, or a chunk out of order."""


class CheckpointVersionError(LingBotError, ValueError):
    """A serialised session checkpoint (`continuity.SessionCheckpoint.to_bytes`) of a version this code does not read,
    or bytes that are not a checkpoint."""
