"""`LocalStageActor`: runs one stateful stage serially on its own thread of this process."""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor

from pipeline.actor import ActorStatistics, DeathListener, Stage, StageCall
from pipeline.errors import ActorUnavailableError, StageFailedError

__all__ = ["FunctionStage", "LocalStageActor"]

logger = logging.getLogger(__name__)


class FunctionStage:
    """A stateless stage from a function `call -> artifacts` (release is a no-op)."""

    def __init__(self, fn: Callable[[StageCall], Mapping[str, object]]) -> None:
        self._fn = fn

    def process(self, call: StageCall) -> Mapping[str, object]:
        return self._fn(call)

    def release(self, session_id: str) -> None:
        return None


class LocalStageActor:
    """Owns one `Stage` and runs its calls one at a time on a dedicated thread.

    Problem: a stage holds per-session state (caches, poses) and blocking torch work; it must never run on the
    event loop and never run two calls at once. Example::

        actor = LocalStageActor("decode", DecodeStage(model))
        await actor.start()
        outputs = await actor.invoke(StageCall("decode", "s1", 0, {"latent": z}))
        await actor.release_session("s1")
        await actor.stop()

    Ordering: calls and releases run in the order they were made (one thread, FIFO). Backpressure: the actor's
    capacity is 1; the orchestrator never has more than one call in flight on it (more would queue on the thread).
    Cancellation: cancelling `invoke` does not interrupt the stage; the call in flight finishes on the thread and
    its result is dropped. `stop` waits for the call in flight to finish. A thread cannot die on its own, so the
    actor stays healthy from `start` to `stop` and its incarnation is always 1.
    """

    def __init__(self, name: str, stage: Stage) -> None:
        self._name = name
        self._stage = stage
        self._executor: ThreadPoolExecutor | None = None
        self._in_flight = 0
        self._calls = 0
        self._failures = 0
        self._listeners: list[DeathListener] = []

    @property
    def name(self) -> str:
        return self._name

    @property
    def capacity(self) -> int:
        return 1

    @property
    def healthy(self) -> bool:
        return self._executor is not None

    @property
    def incarnation(self) -> int:
        return 1

    def add_death_listener(self, listener: DeathListener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stage-{self._name}")

    async def invoke(self, call: StageCall) -> Mapping[str, object]:
        executor = self._require_started()
        self._in_flight += 1
        self._calls += 1
        try:
            # The stage thread runs in a copy of the caller's context: its log lines carry the caller's session.
            context = contextvars.copy_context()
            return await asyncio.get_running_loop().run_in_executor(executor, context.run, self._run, call)
        finally:
            self._in_flight -= 1

    async def release_session(self, session_id: str) -> None:
        executor = self._require_started()
        context = contextvars.copy_context()
        await asyncio.get_running_loop().run_in_executor(executor, context.run, self._stage.release, session_id)

    async def stop(self) -> None:
        executor, self._executor = self._executor, None
        if executor is not None:
            await asyncio.get_running_loop().run_in_executor(None, executor.shutdown, True)

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(
            name=self._name,
            healthy=self.healthy,
            incarnation=1,
            in_flight=self._in_flight,
            calls=self._calls,
            failures=self._failures,
            restarts=0,
        )

    def _require_started(self) -> ThreadPoolExecutor:
        if self._executor is None:
            raise ActorUnavailableError(f"actor {self._name!r} is not started")
        return self._executor

    def _run(self, call: StageCall) -> Mapping[str, object]:
        try:
            return self._stage.process(call)
        except Exception as exc:
            self._failures += 1
            logger.warning(
                "stage %s failed for session %s seq %d: %r", self._name, call.session_id, call.sequence_id, exc
            )
            raise StageFailedError(
                call.stage_id, call.session_id, call.sequence_id, f"{type(exc).__name__}: {exc}"
            ) from exc
