"""`ProcessWorld`: a minimal `BidirectionalService` whose only stage runs in a spawned worker process
(`ParallelWorkerStageActor` under a `StreamingPipelineOrchestrator`), so a test can kill that process with SIGKILL
while a chunk is in flight. Spawned processes import this module by name: it stays light (no service, no LingBot).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from pipeline import (
    CloseMode,
    SessionFailedError,
    StreamingEdgeSpec,
    StreamingPipelineOrchestrator,
    StreamingPipelineSpec,
    StreamingStageSpec,
)
from pipeline.actor import StageCall
from pipeline.bidirectional import (
    ChunkOutput,
    ControlMessage,
    PreparedSession,
    ServiceStatistics,
    SessionSummary,
)
from pipeline.errors import PipelineError
from pipeline.process import ParallelWorkerConfig, ParallelWorkerStageActor, WorkerContext

SPEC = StreamingPipelineSpec(
    stages=(StreamingStageSpec("render", consumes=("tick",), produces=("frames",)),),
    edges=(StreamingEdgeSpec("tick", target="render", capacity=2),),
    outputs=("frames",),
)
FRAME = 8


class RenderStage:
    """Runs in the worker process: one flat 8x8 frame per tick; a tick marked `block` signals and hangs."""

    def __init__(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    def process(self, call: StageCall) -> Mapping[str, object]:
        tick: Any = call.inputs["tick"]
        if tick.get("block"):
            started: Any = self._ctx.options["started"]
            started.set()
            time.sleep(60.0)  # killed long before
        time.sleep(0.005)
        return {"frames": np.full((1, FRAME, FRAME, 3), tick["index"] % 256, dtype=np.uint8)}

    def release(self, session_id: str) -> None:
        return None


def render_stage(ctx: WorkerContext) -> RenderStage:
    return RenderStage(ctx)


@dataclass
class _Session:
    prepared: PreparedSession
    block_at: int | None
    chunks: int = 0


class ProcessWorld:
    """`BidirectionalService` over one `ParallelWorkerStageActor`: every session renders a tick every `pace_s`.

    Config: `{"block_at": N}` makes the session's chunk N hang in the worker process (it sets `started` first), so a
    test can kill the process while that chunk is in flight.
    """

    def __init__(self, started: Any, *, pace_s: float = 0.02) -> None:
        self.actor = ParallelWorkerStageActor(
            ParallelWorkerConfig(
                name="render",
                stage_factory=render_stage,
                options={"started": started},
                stop_timeout_s=1.0,
                kill_grace_s=1.0,
                restart_backoff_initial_s=0.1,
            )
        )
        self._orchestrator = StreamingPipelineOrchestrator(SPEC, {"render": self.actor})
        self._pace_s = pace_s
        self._sessions: dict[str, _Session] = {}
        self._summaries: dict[str, SessionSummary] = {}
        self.controls: dict[str, list[ControlMessage]] = {}

    @property
    def orchestrator(self) -> StreamingPipelineOrchestrator:
        return self._orchestrator

    @property
    def ready(self) -> bool:
        return self._orchestrator.ready

    def session_ids(self) -> list[str]:
        return list(self._sessions)

    async def start(self) -> None:
        await self._orchestrator.start()

    async def aclose(self) -> None:
        await self._orchestrator.aclose()

    def prepare(self, config: Mapping[str, object], image: bytes | None) -> PreparedSession:
        unknown = sorted(set(config) - {"block_at"})
        if unknown:
            raise ValueError(f"unknown config field(s) {unknown}")
        block_at = config.get("block_at")
        if block_at is not None and (isinstance(block_at, bool) or not isinstance(block_at, int)):
            raise ValueError("block_at must be an integer")
        return PreparedSession(
            config={"block_at": block_at}, width=FRAME, height=FRAME, fps=20.0, frame_limit=None, image=None
        )

    async def create_session(self, session_id: str, prepared: PreparedSession) -> None:
        assert isinstance(prepared.config, dict)
        self._orchestrator.open_session(session_id)
        self._sessions[session_id] = _Session(prepared, prepared.config["block_at"])
        self.controls[session_id] = []

    def push_control(self, session_id: str, message: ControlMessage) -> None:
        self.controls[session_id].append(message)

    async def outputs(self, session_id: str, *, parts: bool = False) -> AsyncIterator[ChunkOutput]:
        session = self._sessions[session_id]
        stream = self._orchestrator.outputs(session_id)
        index = 0
        while True:
            tick = {"index": index, "block": index == session.block_at}
            try:
                await self._orchestrator.submit(session_id, {"tick": (index, tick)})
                item = await anext(stream)
            except StopAsyncIteration:
                return
            except SessionFailedError:
                raise
            except PipelineError:
                return  # closed while submitting
            payload: Any = item.payload
            session.chunks += 1
            yield ChunkOutput(
                session_id=session_id,
                index=index,
                frames=payload,
                fps=20.0,
                first_frame_index=index,
                applied_seq=-1,
                keys=frozenset(),
            )
            index += 1
            await asyncio.sleep(self._pace_s)

    async def close_session(self, session_id: str, mode: CloseMode = CloseMode.DRAIN) -> SessionSummary:
        summary = self._summaries.get(session_id)
        if summary is not None:
            return summary
        session = self._sessions[session_id]
        report = await self._orchestrator.close_session(session_id, mode, drain_timeout=5.0)
        summary = SessionSummary(session_id, session.chunks, report.failure, report.failed_stages, report.slot_leaks)
        self._summaries[session_id] = summary
        with contextlib.suppress(KeyError):
            del self._sessions[session_id]
        return summary

    def statistics(self) -> ServiceStatistics:
        return ServiceStatistics(
            ready=self.ready,
            sessions=len(self._sessions),
            chunks=sum(s.chunks for s in self._sessions.values()),
            stale_controls=0,
            orchestrator=self._orchestrator.statistics(),
        )
