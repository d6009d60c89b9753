"""The orchestrator's pure scheduling core: `SchedulerCore` (`scheduler.py`) and the records it exchanges with its
asyncio driver (`records.py`, `CloseMode` among them); the per-session bookkeeping (`_session.py`), the ready queues
(`_ready.py`) and the close path (`_close.py`) are private to the core."""

from __future__ import annotations

from pipeline.core.records import (
    ActorView,
    CloseMode,
    CloseReport,
    CoreStatistics,
    Dispatch,
    Notice,
    NoticeKind,
    OutputItem,
    PipelineSessionState,
    ResultKind,
)
from pipeline.core.scheduler import SchedulerCore

__all__ = [
    "ActorView",
    "CloseMode",
    "CloseReport",
    "CoreStatistics",
    "Dispatch",
    "Notice",
    "NoticeKind",
    "OutputItem",
    "PipelineSessionState",
    "ResultKind",
    "SchedulerCore",
]
