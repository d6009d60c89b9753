"""`StreamingPipelineOrchestrator`: the asyncio shell around the pure `SchedulerCore`.

The core decides; this module does: it starts each dispatched stage call (through the actor's `start_call` callback
where it has one, else a task awaiting `invoke`), feeds results and failures back, wakes submitters, readers and
closers when the core reports a change, and runs the close/release sequence through the owning actors. Everything
runs on one event loop; actors hop to their own threads or processes.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from types import TracebackType

from pipeline.actor import ActorStatistics, CallbackStageActor, DeathListener, StageActor
from pipeline.clock import Clock, MonotonicClock
from pipeline.core import (
    CloseMode,
    CloseReport,
    CoreStatistics,
    Dispatch,
    NoticeKind,
    OutputItem,
    PipelineSessionState,
    ResultKind,
    SchedulerCore,
)
from pipeline.errors import (
    ActorDiedError,
    ActorUnavailableError,
    PipelineError,
    PipelineSpecError,
    SessionClosedError,
    SessionFailedError,
    StageFailedError,
    UnknownSessionError,
)
from pipeline.metrics import StreamingSessionMetrics
from pipeline.spec import PipelineGraph, StreamingPipelineSpec, validate_pipeline

__all__ = ["OrchestratorStatistics", "OutputStream", "StageListener", "StreamingPipelineOrchestrator"]

logger = logging.getLogger(__name__)

_KEPT_REPORTS = 1024

StageListener = Callable[[str, int], None]


@dataclass(frozen=True, slots=True)
class OrchestratorStatistics:
    ready: bool
    core: CoreStatistics
    actors: Mapping[str, ActorStatistics]
    tasks: int  # tasks awaiting an actor's `invoke`
    calls_running: int  # stage calls started and not yet settled: those tasks and the `start_call`s still out


class _ActorsView:
    def __init__(self, actors: Mapping[str, StageActor]) -> None:
        self._actors = actors

    def available(self, stage_id: str) -> bool:
        return self._actors[stage_id].healthy

    def capacity(self, stage_id: str) -> int:
        return self._actors[stage_id].capacity

    def incarnation(self, stage_id: str) -> int:
        return self._actors[stage_id].incarnation


class OutputStream:
    """A session's outputs in sequence order: `async for item in stream`.

    Ends when the session is closed (after its last emitted output); if the session failed, the outputs it had
    emitted are read first and then `SessionFailedError` is raised. Reading frees output room, which is what lets
    the pipeline go on: an unread stream holds the session back (bounded by the output capacity).
    """

    def __init__(self, orchestrator: StreamingPipelineOrchestrator, session_id: str) -> None:
        self._orchestrator = orchestrator
        self._session_id = session_id
        self._readable = orchestrator._core.readable(session_id)
        self._ended = False
        self._failure: str | None = None

    @property
    def session_id(self) -> str:
        return self._session_id

    def __aiter__(self) -> AsyncIterator[OutputItem]:
        return self

    async def __anext__(self) -> OutputItem:
        while True:
            item = self.get_nowait()
            if item is not None:
                return item
            if self._finished():
                if self._failure is not None:
                    raise SessionFailedError(self._session_id, self._failure)
                raise StopAsyncIteration
            await self._orchestrator._wait(NoticeKind.OUTPUT, self._session_id)

    def get_nowait(self) -> OutputItem | None:
        """The next output if one is readable now, else None."""
        if not self._readable:
            return None
        item = self._readable.popleft()
        if not self._ended:
            self._orchestrator._core.output_read(self._session_id, item.artifact)
            self._orchestrator._advance()
        return item

    def _finished(self) -> bool:
        if self._ended:
            return True
        core = self._orchestrator._core
        if core.has_session(self._session_id):
            self._failure = core.failure(self._session_id)
        return core.stream_ended(self._session_id)

    def _end(self, failure: str | None) -> None:
        self._ended = True
        self._failure = failure


class StreamingPipelineOrchestrator:
    """Coordinates long-lived stateful generation pipelines executed as ordered chunks across sessions.

    Problem: control input keeps arriving while earlier chunks are still in encode, denoise or decode, and many
    sessions share the stage actors. Example::

        orchestrator = StreamingPipelineOrchestrator(spec, {"encode": enc, "denoise": dit, "decode": vae})
        async with orchestrator:
            stream = orchestrator.open_session("s1")
            await orchestrator.submit("s1", {"control": (0, ctl0), "condition": (0, cond0)})
            item = await anext(stream)
            report = await orchestrator.close_session("s1")

    Ordering: within a session each strict stage runs sequences 0, 1, 2, ... one at a time; outputs arrive in
    sequence order; across sessions the oldest eligible item goes first. Backpressure: every edge and output is
    bounded per session; `try_submit` is all-or-nothing and returns False when full, `submit` waits for room.
    Cancellation: cancelling `submit` leaves nothing submitted; cancelling a reader loses nothing (items stay
    readable); `close_session(mode=CANCEL)` discards queued work and waits for in-flight calls (their results are
    dropped); with DRAIN every accepted sequence is delivered first. A stage error fails only its session, once the
    session's calls for earlier sequences settled (so with sequence k on one stage and k + 1 on another, k's outputs
    still come before k + 1's failure); a dead actor fails the sessions whose state it held at once, and the actor
    restarts by itself.
    """

    def __init__(
        self,
        spec: StreamingPipelineSpec,
        actors: Mapping[str, StageActor],
        *,
        clock: Clock | None = None,
        metrics_window: int = 256,
        cancel_timeout: float = 30.0,
        kept_reports: int = _KEPT_REPORTS,
    ) -> None:
        if kept_reports < 1:
            raise ValueError(f"kept_reports must be at least 1, got {kept_reports}")
        self._graph: PipelineGraph = validate_pipeline(spec)
        stage_ids = {s.stage_id for s in spec.stages}
        if set(actors) != stage_ids:
            missing = sorted(stage_ids - set(actors))
            extra = sorted(set(actors) - stage_ids)
            raise PipelineSpecError(f"actors do not match the stages: missing {missing}, unknown {extra}")
        self._actors = dict(actors)
        # The actors that report outcomes by callback: their calls need no task (see `CallbackStageActor`).
        self._callback_actors = {s: a for s, a in self._actors.items() if isinstance(a, CallbackStageActor)}
        self._clock = clock or MonotonicClock()
        self._core = SchedulerCore(self._graph, _ActorsView(self._actors), self._clock, metrics_window=metrics_window)
        self._cancel_timeout = cancel_timeout
        self._tasks: set[asyncio.Task[None]] = set()
        self._held_failures: dict[int, str] = {}  # stage errors waiting for their session's earlier sequences
        self._callbacks_out = 0  # `start_call`s whose outcome has not come back
        self._waiters: dict[tuple[NoticeKind, str], list[asyncio.Future[None]]] = {}
        self._streams: dict[str, OutputStream] = {}
        self._closing: dict[str, asyncio.Task[CloseReport]] = {}
        self._reports: OrderedDict[str, CloseReport] = OrderedDict()
        self._kept_reports = kept_reports
        # Each session's context as it was at open: its stage calls, listeners and close run in a copy of it (so
        # a log line or span inside them belongs to that session, not to whichever session triggered the dispatch).
        self._contexts: dict[str, contextvars.Context] = {}
        self._stage_listeners: dict[str, list[StageListener]] = {}
        self._started = False

    @property
    def graph(self) -> PipelineGraph:
        return self._graph

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._started:
            return
        for stage_id, actor in self._actors.items():
            await actor.start()
            actor.add_death_listener(self._death_listener(stage_id))
        self._started = True

    async def aclose(self) -> None:
        """Cancel-close every session, then stop the actors. Safe to call twice."""
        if not self._started:
            return
        for session_id in self._core.session_ids():
            if self._core.state(session_id) in (PipelineSessionState.OPEN, PipelineSessionState.DRAINING):
                try:
                    await self.close_session(session_id, CloseMode.CANCEL)
                except PipelineError as exc:
                    logger.warning("closing session %s at stop failed: %s", session_id, exc)
        for closing in list(self._closing.values()):
            await asyncio.wait({closing}, timeout=self._cancel_timeout)
        for actor in self._actors.values():
            await actor.aclose()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self._started = False

    async def __aenter__(self) -> StreamingPipelineOrchestrator:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    @property
    def ready(self) -> bool:
        """True when started and every actor is healthy (a restarting actor makes it False)."""
        return self._started and all(actor.healthy for actor in self._actors.values())

    # -- sessions --------------------------------------------------------------------------------------------

    def open_session(self, session_id: str) -> OutputStream:
        if not self._started:
            raise SessionClosedError("the orchestrator is not started")
        self._core.open_session(session_id)
        self._reports.pop(session_id, None)
        self._contexts[session_id] = contextvars.copy_context()
        stream = OutputStream(self, session_id)
        self._streams[session_id] = stream
        return stream

    def outputs(self, session_id: str) -> OutputStream:
        stream = self._streams.get(session_id)
        if stream is None:
            raise UnknownSessionError(f"no open session {session_id!r}")
        return stream

    def try_submit(self, session_id: str, items: Mapping[str, tuple[int, object]]) -> bool:
        """Accept every item (artifact → (sequence id, payload)) or none; False when any edge is full."""
        accepted = self._core.try_submit(session_id, items)
        if accepted:
            self._advance()
        return accepted

    async def submit(self, session_id: str, items: Mapping[str, tuple[int, object]]) -> None:
        """Like `try_submit`, but waits for room. Raises `SessionClosedError` if the session stops accepting, also
        when it failed and was released (forgotten) before or while this waited, as a chunk loop waiting for its
        lease grant or for room finds it after a worker died: the caller learns why from its close report."""
        while True:
            report = self._reports.get(session_id)
            if report is not None and not self._core.has_session(session_id):
                raise SessionClosedError(f"session {session_id!r} was closed: {report.failure or 'closed'}")
            if self.try_submit(session_id, items):
                return
            await self._wait(NoticeKind.ROOM, session_id)

    def add_stage_listener(self, stage_id: str, listener: StageListener) -> None:
        """Call `listener(session_id, sequence_id)` on the loop each time `stage_id` delivers a result.

        Listeners run after the result moved on and may submit (e.g. a prefetch refill); they must not block.
        """
        if stage_id not in self._actors:
            raise PipelineSpecError(f"no stage {stage_id!r}")
        self._stage_listeners.setdefault(stage_id, []).append(listener)

    def has_room(self, session_id: str, artifacts: tuple[str, ...]) -> bool:
        return self._core.has_room(session_id, artifacts)

    def next_sequence(self, session_id: str, artifact: str) -> int:
        return self._core.next_sequence(session_id, artifact)

    def session_state(self, session_id: str) -> PipelineSessionState:
        return self._core.state(session_id)

    def metrics(self, session_id: str) -> StreamingSessionMetrics:
        return self._core.metrics(session_id)

    async def close_session(
        self, session_id: str, mode: CloseMode = CloseMode.DRAIN, *, drain_timeout: float | None = None
    ) -> CloseReport:
        """Close: stop input, drain or cancel, release stage state in reverse topological order, verify.

        With DRAIN and a `drain_timeout`, a drain that does not finish in time falls back to CANCEL. In-flight calls
        that do not return within `cancel_timeout` are abandoned (their held room is reported as slot leaks).
        Idempotent: a second call returns the same report.
        """
        report = self._reports.get(session_id)
        if report is not None and not self._core.has_session(session_id):
            return report
        task = self._closing.get(session_id)
        if task is None:
            if not self._core.has_session(session_id):
                raise UnknownSessionError(f"no open session {session_id!r}")
            task = self._spawn_close(session_id, mode, drain_timeout)
        elif mode is CloseMode.CANCEL and self._core.has_session(session_id):
            self._core.begin_close(session_id, CloseMode.CANCEL)
            self._advance()
        return await asyncio.shield(task)

    async def retry_release(self, session_id: str) -> CloseReport:
        """Retry the release of only the stages that failed; success clears the poison."""
        if self._core.state(session_id) is not PipelineSessionState.POISONED:
            raise PipelineError(f"session {session_id!r} is not poisoned")
        return await self._release(session_id)

    def statistics(self) -> OrchestratorStatistics:
        return OrchestratorStatistics(
            ready=self.ready,
            core=self._core.statistics(),
            actors={name: actor.statistics() for name, actor in self._actors.items()},
            tasks=len(self._tasks),
            calls_running=len(self._tasks) + self._callbacks_out,
        )

    # -- internals -------------------------------------------------------------------------------------------

    def _spawn_close(self, session_id: str, mode: CloseMode, drain_timeout: float | None) -> asyncio.Task[CloseReport]:
        coroutine = self._close(session_id, mode, drain_timeout)
        task = asyncio.get_running_loop().create_task(coroutine, context=self._context_of(session_id))
        self._closing[session_id] = task
        task.add_done_callback(lambda _t: self._closing.pop(session_id, None))
        return task

    async def _close(self, session_id: str, mode: CloseMode, drain_timeout: float | None) -> CloseReport:
        self._core.begin_close(session_id, mode)
        self._advance()
        if mode is CloseMode.DRAIN and not await self._wait_quiescent(session_id, drain_timeout):
            logger.warning("session %s: drain did not finish in %ss; cancelling", session_id, drain_timeout)
            self._core.begin_close(session_id, CloseMode.CANCEL)
            self._advance()
        # A cancel (asked for, or a drain that ran out of time) waits `cancel_timeout` for the calls in flight.
        if not await self._wait_quiescent(session_id, self._cancel_timeout):
            abandoned = self._core.abandon_in_flight(session_id)
            logger.error("session %s: abandoned %d in-flight calls after cancel timeout", session_id, abandoned)
        return await self._release(session_id)

    async def _wait_quiescent(self, session_id: str, limit: float | None) -> bool:
        try:
            async with asyncio.timeout(limit):
                while not self._core.is_quiescent(session_id):
                    await self._wait(NoticeKind.QUIESCENT, session_id)
        except TimeoutError:
            return False
        return True

    async def _release(self, session_id: str) -> CloseReport:
        stages = self._core.begin_release(session_id)
        self._advance()
        released: list[str] = []
        failures: dict[str, str] = {}
        for stage_id in stages:
            try:
                await self._actors[stage_id].release_session(session_id)
            except Exception as exc:
                failures[stage_id] = f"{type(exc).__name__}: {exc}"
                logger.error("session %s: releasing stage %s failed: %s", session_id, stage_id, exc)
            else:
                released.append(stage_id)
        failure = self._core.failure(session_id)
        report = self._core.finish_release(session_id, released, failures)
        stream = self._streams.pop(session_id, None)
        if stream is not None:
            stream._end(failure)
        self._reports[session_id] = report
        while len(self._reports) > self._kept_reports:
            self._reports.popitem(last=False)
        if not self._core.has_session(session_id):  # a poisoned session keeps it for the retry
            self._contexts.pop(session_id, None)
        self._advance()
        return report

    def _context_of(self, session_id: str) -> contextvars.Context | None:
        """A fresh copy of the session's context from open (None: the caller's, for a session never opened)."""
        context = self._contexts.get(session_id)
        return None if context is None else context.copy()

    async def _wait(self, kind: NoticeKind, session_id: str) -> None:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiters = self._waiters.setdefault((kind, session_id), [])
        waiters.append(future)
        try:
            await future
        finally:
            if not future.done():
                future.cancel()
            if future in waiters:
                waiters.remove(future)
            if not waiters:
                self._waiters.pop((kind, session_id), None)

    def _advance(self) -> None:
        """Start what the core dispatches and deliver its notices. Never recurses: it only schedules."""
        loop = asyncio.get_running_loop()
        for invocation_id, reason in list(self._held_failures.items()):
            if not self._core.earlier_in_flight(invocation_id):
                del self._held_failures[invocation_id]
                self._core.fail(invocation_id, reason)
        for dispatch in self._core.pump():
            call = dispatch.call
            context = self._context_of(call.session_id)
            actor = self._callback_actors.get(call.stage_id)
            if actor is not None:
                self._callbacks_out += 1
                actor.start_call(
                    call, _Outcome(self, dispatch, self._clock.now()), context or contextvars.copy_context()
                )
                continue
            task = loop.create_task(self._run(dispatch), context=context)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        for notice in self._core.take_notices():
            if notice.kind is NoticeKind.FAILED and notice.session_id not in self._closing:
                self._spawn_close(notice.session_id, CloseMode.CANCEL, None)
            for future in self._waiters.pop((notice.kind, notice.session_id), ()):
                if not future.done():
                    future.set_result(None)

    async def _run(self, dispatch: Dispatch) -> None:
        started = self._clock.now()
        try:
            outputs = await self._actors[dispatch.call.stage_id].invoke(dispatch.call)
        except asyncio.CancelledError:
            self._core.fail(dispatch.invocation_id, "the orchestrator stopped")
            self._advance()
            raise
        except Exception as exc:
            self._settle(dispatch, started, None, exc)
        else:
            self._settle(dispatch, started, outputs, None)

    def _settle(
        self, dispatch: Dispatch, started: float, outputs: Mapping[str, object] | None, error: BaseException | None
    ) -> None:
        """Feed a call's outcome to the core, tell the stage's listeners of a delivered result, and advance."""
        call = dispatch.call
        if error is None:
            assert outputs is not None
            kind = self._core.complete(dispatch.invocation_id, outputs, started)
            if kind is ResultKind.DELIVERED:
                for listener in self._stage_listeners.get(call.stage_id, ()):
                    try:
                        listener(call.session_id, call.sequence_id)
                    except Exception:
                        logger.exception("stage listener for %s failed", call.stage_id)
        elif isinstance(error, ActorDiedError | ActorUnavailableError):
            self._core.fail(dispatch.invocation_id, f"stage {call.stage_id!r}: {type(error).__name__}: {error}")
        else:
            if isinstance(error, StageFailedError):
                reason = str(error)
            else:
                logger.error("actor %s raised outside its contract", call.stage_id, exc_info=error)
                reason = f"stage {call.stage_id!r}: {type(error).__name__}: {error}"
            if self._core.earlier_in_flight(dispatch.invocation_id):
                self._held_failures[dispatch.invocation_id] = reason  # failed once the earlier sequences settle
            else:
                self._core.fail(dispatch.invocation_id, reason)
        self._advance()

    def _death_listener(self, stage_id: str) -> DeathListener:
        def on_death(_actor_name: str, incarnation: int, reason: str) -> None:
            failed = self._core.actor_died(stage_id, incarnation, reason)
            if failed:
                logger.warning("actor of stage %s died (%s); failed sessions %s", stage_id, reason, failed)
            self._advance()

        return on_death


class _Outcome:
    """Where a `start_call` reports: the orchestrator settles the dispatch with the outcome (a `CallDone`)."""

    __slots__ = ("_dispatch", "_orchestrator", "_started")

    def __init__(self, orchestrator: StreamingPipelineOrchestrator, dispatch: Dispatch, started: float) -> None:
        self._orchestrator = orchestrator
        self._dispatch = dispatch
        self._started = started

    def __call__(self, outputs: Mapping[str, object] | None, error: BaseException | None) -> None:
        self._orchestrator._callbacks_out -= 1
        self._orchestrator._settle(self._dispatch, self._started, outputs, error)
