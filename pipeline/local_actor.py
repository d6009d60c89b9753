"""`LocalStageActor`: runs one stateful stage serially on its own thread of this process.

A call hops twice: the event loop hands it to the stage's thread through a `queue.SimpleQueue` (one wake-up of that
thread), and the thread hands the outcome back through the loop's completion inbox (`_LoopInbox`), which every
local actor on the loop shares: results that finish while the loop is busy are delivered together, with one
wake-up of the loop per batch instead of one per call. The orchestrator starts calls with `start_call` and is
called back from the inbox with the outcome (no future, no task per call); `invoke` is the same hop awaited.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from pipeline.actor import ActorStatistics, CallDone, DeathListener, Stage, StageCall
from pipeline.errors import ActorUnavailableError, StageFailedError

__all__ = ["FunctionStage", "LocalStageActor"]

logger = logging.getLogger(__name__)


# Called on the loop with a call's outcome: (result, None) or (None, error).
_Outcome = Callable[[Any, BaseException | None], None]


class _LoopInbox:
    """Outcomes from stage threads to one event loop: any thread `post`s, the loop delivers them in batches.

    Problem: `loop.call_soon_threadsafe` per result writes the loop's self-pipe and wakes it once per call; three
    stage threads finishing while the loop is busy would wake it three times. Here a thread appends its outcome to
    a deque and schedules a delivery only if none is pending, so one wake-up delivers every outcome posted meanwhile.
    Ordering: outcomes are delivered in the order they were posted, each by calling its callback in the call's
    context. No lock: under the GIL `deque.append` and `popleft` are atomic and the flag's writes are seen in order,
    and `pending` is cleared before the deque is emptied, so an outcome posted during a delivery is either taken by
    it or schedules the next one (at worst a delivery finds nothing). A callback that raises is logged and the
    delivery goes on with the next outcome.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # weak: the registry of inboxes is keyed by the loop
        self._outcomes: deque[tuple[_Outcome, Any, BaseException | None, contextvars.Context]] = deque()
        self._pending = False

    def post(self, done: _Outcome, result: Any, error: BaseException | None, context: contextvars.Context) -> None:
        """From any thread: call `done(result, error)` in `context` on the loop."""
        self._outcomes.append((done, result, error, context))
        if not self._pending:
            self._pending = True
            loop = self._loop()
            try:
                if loop is not None:
                    loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop is closed: nobody waits for the outcome any more
                self._pending = False

    def _deliver(self) -> None:
        self._pending = False
        outcomes = self._outcomes
        while outcomes:
            done, result, error, context = outcomes.popleft()
            try:
                context.run(done, result, error)
            except Exception:
                logger.exception("delivering a stage outcome failed")


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """An outcome for a future; a future cancelled meanwhile (its caller went away) gets nothing."""
    if future.done():
        return
    if error is None:
        future.set_result(result)
    else:
        future.set_exception(error)


_INBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopInbox] = weakref.WeakKeyDictionary()


def _inbox(loop: asyncio.AbstractEventLoop) -> _LoopInbox:
    inbox = _INBOXES.get(loop)
    if inbox is None:
        inbox = _INBOXES[loop] = _LoopInbox(loop)
    return inbox


# A unit of work for the stage thread: the function and its argument, where its outcome goes, the context it runs
# in (and its outcome is delivered in); None stops.
_Work = tuple[Callable[[Any], Any], Any, _Outcome, contextvars.Context] | None


class _StageThread:
    """One thread that runs work items from a FIFO queue, each in a copy of its context, and posts the outcomes."""

    def __init__(self, name: str, inbox: _LoopInbox) -> None:
        self._inbox = inbox
        self._work: queue.SimpleQueue[_Work] = queue.SimpleQueue()
        self._done: asyncio.Future[None] | None = None
        # Daemon: a process that exits without `aclose()` is not held up by a thread waiting for work.
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[Any], Any], arg: Any, done: _Outcome, context: contextvars.Context) -> None:
        self._work.put((fn, arg, done, context))

    def stop(self, done: asyncio.Future[None]) -> None:
        """Finish the work already queued, then post None to `done` and end."""
        self._done = done
        self._work.put(None)

    def join(self) -> None:
        self._thread.join()

    def _loop(self) -> None:
        post = self._inbox.post
        get = self._work.get
        while True:
            work = get()
            if work is None:
                if self._done is not None:
                    post(functools.partial(_settle, self._done), None, None, contextvars.Context())
                return
            fn, arg, done, context = work
            try:
                # In a copy: what the stage sets in its context stays with the call, not with the outcome's delivery.
                result = context.copy().run(fn, arg)
            except BaseException as exc:
                post(done, None, exc, context)
            else:
                post(done, result, None, context)


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
        await actor.aclose()

    Ordering: calls and releases run in the order they were made (one thread, FIFO). Each runs in a copy of its
    caller's context (`start_call`: in the context it is given), so its log lines carry the caller's session.
    Backpressure: the actor's capacity is 1; the orchestrator never has more than one call in flight on it (more
    would queue on the thread). Cancellation: cancelling `invoke` does not interrupt the stage; the call in flight
    finishes on the thread and its result is dropped. `stop` waits for the call in flight (and anything queued) to
    finish, so every `start_call` has had its outcome delivered when `stop` returns. A thread cannot die on its
    own, so the actor stays healthy from `start` to `stop` and its incarnation is always 1. Outcomes reach the loop
    through its shared inbox (see the module docstring): one wake-up per batch of results.
    """

    def __init__(self, name: str, stage: Stage) -> None:
        self._name = name
        self._stage = stage
        self._thread: _StageThread | None = None
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
        return self._thread is not None

    @property
    def incarnation(self) -> int:
        return 1

    def add_death_listener(self, listener: DeathListener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        if self._thread is None:
            self._thread = _StageThread(f"stage-{self._name}", _inbox(asyncio.get_running_loop()))

    async def invoke(self, call: StageCall) -> Mapping[str, object]:
        thread = self._require_started()
        future: asyncio.Future[Mapping[str, object]] = asyncio.get_running_loop().create_future()
        self._start(thread, call, functools.partial(_settle, future), contextvars.copy_context())
        return await future

    def start_call(self, call: StageCall, done: CallDone, context: contextvars.Context) -> None:
        """Run `call` on the stage's thread in `context`; `done` gets its outcome on the loop (see `CallDone`).

        Not started (or stopped): `done(None, ActorUnavailableError)` is called soon, on the loop.
        """
        thread = self._thread
        if thread is None:
            error = ActorUnavailableError(f"actor {self._name!r} is not started")
            asyncio.get_running_loop().call_soon(done, None, error, context=context)
            return
        self._start(thread, call, done, context)

    async def release_session(self, session_id: str) -> None:
        thread = self._require_started()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        thread.submit(self._stage.release, session_id, functools.partial(_settle, future), contextvars.copy_context())
        await future

    async def aclose(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            thread.stop(done)
            await asyncio.shield(done)
            thread.join()  # it has posted its last result: it is returning

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

    def _start(self, thread: _StageThread, call: StageCall, done: _Outcome, context: contextvars.Context) -> None:
        self._in_flight += 1
        self._calls += 1
        thread.submit(self._run, call, functools.partial(self._finished, done), context)

    def _finished(self, done: _Outcome, result: Any, error: BaseException | None) -> None:
        self._in_flight -= 1
        done(result, error)

    def _require_started(self) -> _StageThread:
        if self._thread is None:
            raise ActorUnavailableError(f"actor {self._name!r} is not started")
        return self._thread

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
