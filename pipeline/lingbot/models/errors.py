"""Errors raised by the LingBot-World-Fast model core (`pipeline.lingbot.models`).

    LingBotError                     (pipeline.lingbot.errors)
    ├── ModelConfigError             a DiT or cache configuration is inconsistent (names the field and the rule)
    ├── CheckpointError              a checkpoint directory is missing files, keys or shards, or has wrong shapes,
    │                                dtypes or unexpected keys (names every problem it found)
    └── ModelContextExhaustedError   a session ran past what its cache can position (reason
                                     `model_context_exhausted`); only a cache without a window raises it

Misuse of a session's cache (a stale chunk slot) raises `pipeline.lingbot.errors.ModelSessionError`, and a tensor
of the wrong shape `pipeline.lingbot.errors.ModelInputError`, like the rest of the model seam.
"""

from __future__ import annotations

from pipeline.lingbot.errors import LingBotError

__all__ = ["CONTEXT_EXHAUSTED_REASON", "CheckpointError", "ModelConfigError", "ModelContextExhaustedError"]

CONTEXT_EXHAUSTED_REASON = "model_context_exhausted"
"""The stable reason a session ends with when its model can place no further chunk."""


class ModelConfigError(LingBotError, ValueError):
    """A DiT or cache configuration breaks a rule (e.g. head_dim // 3 odd, sink not smaller than the window)."""


class CheckpointError(LingBotError, ValueError):
    """A DiT checkpoint cannot be loaded strictly; the message names the directory and every problem found."""


class ModelContextExhaustedError(LingBotError):
    """A session's next chunk cannot be placed: a cache without a window is full, or the RoPE table has ended."""

    reason = CONTEXT_EXHAUSTED_REASON
