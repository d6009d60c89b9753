"""Process-backed stage runtime: `ParallelWorker` runs one `Stage` in a group of spawned worker processes.

The worker owns `world_size` processes (one rank per entry of `devices`), forked from a forkserver that imported
torch and the stage's modules once (`pipeline.process.starter`), or spawned (`ParallelWorkerConfig.start_method`);
with more than one rank they form a torch.distributed process group (gloo on CPU, nccl on CUDA) over a TCP store
that the parent hosts on a free loopback port. Each child builds its stage with a picklable,
module-level `stage_factory(WorkerContext)` and then serves requests from its own bounded queue; every call goes to
every rank and rank 0's artifacts are the result. Replies come back on one pipe per rank, and one parent thread per
incarnation multiplexes those pipes with the process sentinels (`multiprocessing.connection.wait`), so a reply
written before a rank died is always delivered before that death. All bookkeeping happens on the event loop; the
thread only hands events over with `loop.call_soon_threadsafe`. When a rank dies the whole incarnation is torn
down, the calls in flight fail with `ActorDiedError`, death listeners are told, and a new incarnation is started
with exponential back-off. A stage may also answer a call in parts ahead of its result (`WorkerContext.parts`,
the protocol in `pipeline.process._protocol`): the watcher delivers them in pipe order and the part listeners
(`add_part_listener`) see them on the loop before the call resolves.

The records (`ParallelWorkerConfig`, `WorkerContext`, `WorkerState`, `WorkerStatistics`) live in
`pipeline.process.records`, the picklable wire protocol in `pipeline.process._protocol`, what each rank runs in
`pipeline.process._child`, the per-incarnation bookkeeping in `pipeline.process._incarnation`, spawning and ending
the ranks' processes in `pipeline.process._ranks` and the watcher thread in `pipeline.process._watcher`; this
module holds the parent's side on the loop (lifecycle, supervision, requests) and re-exports the public records.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import queue
from collections.abc import Callable, Mapping
from multiprocessing.reduction import ForkingPickler
from typing import cast

from pipeline.actor import DeathListener, StageCall
from pipeline.clock import Clock, MonotonicClock
from pipeline.errors import ActorDiedError, ActorUnavailableError, StageFailedError
from pipeline.process._incarnation import (
    Incarnation,
    Operation,
    describe_operation,
)
from pipeline.process._protocol import (
    CALL,
    FAILED,
    PART,
    READY,
    RELEASE,
    START_FAILED,
    Reply,
    Request,
    describe_exception,
    describe_exit,
)
from pipeline.process._ranks import close_ranks, spawn_ranks
from pipeline.process._watcher import Watcher
from pipeline.process.records import (
    WORKER_TRANSITIONS,
    ParallelWorkerConfig,
    PartListener,
    WorkerState,
    WorkerStatistics,
)

__all__ = ["ParallelWorker"]

logger = logging.getLogger(__name__)


class ParallelWorker:
    """Runs one stage in `world_size` spawned processes and exposes it as awaitable calls.

    Problem: a stage's torch work must not run on the event loop, may need several GPUs acting as one, and must
    survive a crashed process without taking the service down. The worker runs the stage in child processes,
    turns every request into an asyncio future, and supervises the children.

    Example::

        worker = ParallelWorker(ParallelWorkerConfig(name="decode", stage_factory=build_decoder, devices=("cuda:0",)))
        await worker.start()
        artifacts = await worker.invoke(StageCall("decode", "s1", 0, {"latent": ref}))
        await worker.release_session("s1")
        await worker.aclose()

    Ordering: every rank serves its requests in submission order, one at a time; results resolve in that order.
    Calls and releases share that order, so a release sent after a call runs after it. With two lanes
    (`ParallelWorkerConfig.lanes`) each lane keeps that order for its own calls (releases are lane 0's), and a call
    of lane 1 runs beside lane 0's: results of different lanes resolve in the order they finish.

    Backpressure: at most `capacity` calls are in flight; one more is rejected at once with
    `ActorUnavailableError` (the orchestrator never exceeds `capacity`). Releases wait for one of
    `max_pending_releases` slots. Request queues are sized to these bounds, so nothing queues without limit.

    Cancellation: cancelling `invoke` or `release_session` does not interrupt the child; the request finishes
    there, keeps its slot until then, and its result is dropped and counted in `stale_results`. `aclose()` is
    shielded: cancelling a caller of `aclose()` does not abort the shutdown, which a later `aclose()` awaits.

    Health: a rank that exits while the worker runs fails every call in flight with `ActorDiedError`, terminates
    the other ranks, tells the death listeners `(name, dead incarnation, reason)`, and restarts the group after a
    back-off that doubles from `restart_backoff_initial_s` to `restart_backoff_max_s` (and resets once an
    incarnation ran for `restart_backoff_reset_s`). While restarting, `invoke` raises `ActorUnavailableError` at once.
    Per-session state does not survive an incarnation, so `release_session` succeeds trivially while no
    incarnation runs. With `call_timeout_s`, a rank that works on one operation longer than that (stuck: it never
    answers) counts as dead too, so a hung rank costs one timeout, never a wait forever.

    Parts: a stage may send partial results of a call (`WorkerContext.parts.send`); each reaches every part listener
    (`add_part_listener`) on the loop, in order, before the call's result, or is dropped with its call (cancelled,
    dead incarnation). Parts already delivered stay delivered when the call then fails or its rank dies.

    All methods must be called from the event loop that ran `start()`.
    """

    def __init__(self, config: ParallelWorkerConfig, *, clock: Clock | None = None) -> None:
        self._config = config
        self._clock: Clock = clock if clock is not None else MonotonicClock()
        self._state = WorkerState.CREATED
        self._incarnation = 0
        self._current: Incarnation | None = None
        self._listeners: list[DeathListener] = []
        self._part_listeners: list[PartListener] = []
        self._ops: dict[int, Operation] = {}
        self._op_ids = itertools.count(1)
        self._calls_in_flight = 0
        self._lane_calls = [0] * config.lanes  # calls in flight per lane
        self._release_slots = asyncio.Semaphore(config.max_pending_releases)
        self._supervisor: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._backoff_s = config.restart_backoff_initial_s
        self._watchdog: asyncio.TimerHandle | None = None  # the call timeout of the oldest operation in flight
        self._calls = 0
        self._failures = 0
        self._lost_calls = 0
        self._stale = 0
        self._deaths = 0
        self._restarts = 0
        self._parts = 0
        self._dropped_parts = 0

    # --- read-only view ---

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def capacity(self) -> int:
        return self._config.capacity

    @property
    def world_size(self) -> int:
        return self._config.world_size

    @property
    def state(self) -> WorkerState:
        return self._state

    @property
    def healthy(self) -> bool:
        return self._state is WorkerState.RUNNING

    @property
    def incarnation(self) -> int:
        """0 before the first start; every start of a new group of processes adds one."""
        return self._incarnation

    @property
    def pids(self) -> tuple[int, ...]:
        """The process ids of the current incarnation's ranks, in rank order (empty while none is up)."""
        live = (WorkerState.STARTING, WorkerState.RUNNING, WorkerState.STOPPING)
        if self._current is None or self._state not in live or self._current.closer is not None:
            return ()
        return self._current.pids

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            name=self.name,
            state=self._state,
            healthy=self.healthy,
            incarnation=self._incarnation,
            world_size=self.world_size,
            pids=self.pids,
            capacity=self.capacity,
            in_flight=self._calls_in_flight,
            pending_releases=len(self._ops) - self._calls_in_flight,
            calls=self._calls,
            failures=self._failures,
            lost_calls=self._lost_calls,
            stale_results=self._stale,
            deaths=self._deaths,
            restarts=self._restarts,
            backoff_s=self._backoff_s,
            parts=self._parts,
            dropped_parts=self._dropped_parts,
            ready_report=self._current.ready_report if self._current is not None else None,
        )

    def add_death_listener(self, listener: DeathListener) -> None:
        """`listener(name, dead_incarnation, reason)` runs on the event loop when a running incarnation dies."""
        self._listeners.append(listener)

    def add_part_listener(self, listener: PartListener) -> None:
        """`listener(call, part)` runs on the event loop for each part a stage sends (the class docstring)."""
        self._part_listeners.append(listener)

    # --- lifecycle ---

    async def start(self) -> None:
        """Spawn the first incarnation and wait until every rank is ready.

        Raises `ActorDiedError` if a rank fails to build its stage, exits or misses `start_timeout_s`; the worker is
        then STOPPED (a stage that cannot start is not retried). Raises `ActorUnavailableError` if not CREATED.
        """
        if self._state is not WorkerState.CREATED:
            raise ActorUnavailableError(f"worker {self.name!r} cannot start: it is {self._state.value}")
        try:
            await self._launch()
        except ActorDiedError:
            self._transition(WorkerState.STOPPED)
            raise
        except asyncio.CancelledError:
            self._begin_stop()  # the caller gave up: leave no process behind (a later aclose() awaits it)
            raise

    async def aclose(self) -> None:
        """Stop gracefully, then by force; idempotent.

        Each rank gets a stop request behind its queued work, so calls in flight finish if they can within
        `stop_timeout_s`; ranks still alive are then terminated and, after `kill_grace_s`, killed. Calls that did not
        finish fail with `ActorUnavailableError`. Afterwards no process, watcher thread or queue feeder thread is left.
        """
        await asyncio.shield(self._begin_stop())

    def _begin_stop(self) -> asyncio.Task[None]:
        if self._stop_task is None:
            self._stop_task = asyncio.get_running_loop().create_task(self._stop(), name=f"stop worker {self.name}")
        return self._stop_task

    async def _stop(self) -> None:
        if self._state is WorkerState.STOPPED:
            return
        graceful = self._state is WorkerState.RUNNING
        self._transition(WorkerState.STOPPING)
        supervisor, self._supervisor = self._supervisor, None
        if supervisor is not None:
            supervisor.cancel()
            await asyncio.wait([supervisor])
        if self._current is not None:
            await self._close_incarnation(self._current, graceful=graceful)
        self._fail_operations(
            lambda op: ActorUnavailableError(f"worker {self.name!r} stopped before {describe_operation(op)} finished")
        )
        self._transition(WorkerState.STOPPED)
        logger.info("worker %r stopped", self.name)

    def _transition(self, target: WorkerState) -> None:
        if target not in WORKER_TRANSITIONS[self._state]:
            raise RuntimeError(f"worker {self.name!r} cannot go from {self._state.value} to {target.value}")
        logger.debug("worker %r: %s -> %s", self.name, self._state.value, target.value)
        self._state = target

    async def _launch(self) -> None:
        """Spawn a new incarnation and wait until it is ready (STARTING → RUNNING).

        Raises `ActorDiedError` when the start fails (the incarnation is closed again) and
        `ActorUnavailableError` when `aclose()` took over meanwhile.
        """
        loop = asyncio.get_running_loop()
        self._incarnation += 1
        inc = Incarnation(self._incarnation, loop.create_future())
        self._current = inc
        self._transition(WorkerState.STARTING)
        failure: str | None
        try:
            watcher = Watcher(
                self.name,
                loop,
                self._config.kill_grace_s,
                on_reply=self._on_reply,
                on_exit=self._on_exit,
                on_broken=self._on_broken,
            )
            # Off the loop: the first start through the forkserver waits for it to import torch (seconds).
            inc.spawner = asyncio.ensure_future(asyncio.to_thread(spawn_ranks, self._config, inc, watcher.run))
            await asyncio.shield(inc.spawner)
        except Exception as exc:
            failure = f"could not spawn the ranks: {describe_exception(exc)}"
        else:
            try:
                async with asyncio.timeout(self._config.start_timeout_s):
                    failure = await inc.ready
            except TimeoutError:
                failure = f"not every rank was ready within {self._config.start_timeout_s:g} s"
            # A rank may have exited after the last "ready" was delivered but before this task resumed.
            failure = failure or inc.broken
        if self._state is not WorkerState.STARTING or inc is not self._current:
            raise ActorUnavailableError(f"worker {self.name!r} was stopped while starting")
        if failure is not None:
            await self._close_incarnation(inc, graceful=False)
            raise ActorDiedError(f"worker {self.name!r} incarnation {inc.number} failed to start: {failure}")
        inc.running = True
        inc.ready_at = self._clock.now()
        self._transition(WorkerState.RUNNING)
        logger.info("worker %r incarnation %d running (pids %s)", self.name, inc.number, inc.pids)

    async def _close_incarnation(self, inc: Incarnation, *, graceful: bool) -> None:
        """End one incarnation's processes and free its resources; concurrent callers share one closer."""
        if inc.closer is None:
            inc.running = False
            if not inc.ready.done():
                inc.ready.set_result("it was closed before every rank was ready")
            inc.closer = asyncio.ensure_future(self._close_after_spawn(inc, graceful))
        await asyncio.shield(inc.closer)

    async def _close_after_spawn(self, inc: Incarnation, graceful: bool) -> None:
        if inc.spawner is not None:  # a start still spawning (its caller was cancelled): close what it started
            await asyncio.wait([inc.spawner])
            if not inc.spawner.cancelled():
                inc.spawner.exception()  # retrieved: `_launch` reports it when it is still waiting
        await asyncio.to_thread(self._close_logged, inc, graceful)

    def _close_logged(self, inc: Incarnation, graceful: bool) -> None:
        try:
            close_ranks(self._config, inc, graceful)
        except Exception:  # aclose() must complete; what could not be freed is logged
            logger.exception("worker %r incarnation %d: closing failed", self.name, inc.number)

    # --- the watcher thread ---

    # --- events, on the loop ---

    def _on_reply(self, inc: Incarnation, reply: Reply, value: object) -> None:
        if reply.kind == READY:
            if reply.rank == 0:
                inc.ready_report = value
            inc.ranks_ready.add(reply.rank)
            if len(inc.ranks_ready) == len(inc.processes) and not inc.ready.done():
                inc.ready.set_result(None)
            return
        if reply.kind == START_FAILED:
            logger.debug("worker %r rank %d stage_factory traceback:\n%s", self.name, reply.rank, reply.detail)
            if not inc.ready.done():
                inc.ready.set_result(f"rank {reply.rank}: stage_factory raised {reply.error}")
            return
        if reply.kind == PART:
            self._on_part(inc, reply, value)
            return
        op = self._ops.get(reply.op_id) if inc is self._current else None
        if op is None:
            self._stale += 1
            logger.debug("worker %r: dropped a reply for request %d of a closed incarnation", self.name, reply.op_id)
            return
        op.remaining.discard(reply.rank)
        if reply.kind == FAILED:
            op.errors.append((reply.rank, reply.error))
            if reply.detail:
                logger.debug(
                    "worker %r rank %d: %s failed:\n%s", self.name, reply.rank, describe_operation(op), reply.detail
                )
        elif reply.rank == 0:
            op.value = value
        if not op.remaining:
            self._finish(op)

    def _on_part(self, inc: Incarnation, reply: Reply, value: object) -> None:
        op = self._ops.get(reply.op_id) if inc is self._current else None
        call = None if op is None else op.call
        if op is None or call is None or op.future.done() or op.parts_broken or reply.rank != 0:
            self._dropped_parts += 1
            logger.debug("worker %r: dropped a part of request %d nobody waits for", self.name, reply.op_id)
            return
        if reply.error or not self._part_listeners:
            self._dropped_parts += 1
            if reply.error:
                op.parts_broken = True
                op.errors.append((reply.rank, reply.error))
            return
        for listener in list(self._part_listeners):
            try:
                listener(call, value)
            except Exception as exc:
                logger.exception("worker %r: part listener %r failed", self.name, listener)
                op.parts_broken = True
                op.errors.append((reply.rank, f"a part listener failed: {describe_exception(exc)}"))
                return
        self._parts += 1

    def _finish(self, op: Operation) -> None:
        self._retire(op)
        if op.future.done():
            self._stale += 1
            logger.debug("worker %r: dropped the result of cancelled %s", self.name, describe_operation(op))
            return
        if op.errors:
            if self.world_size == 1:
                cause = op.errors[0][1]
            else:
                cause = "; ".join(f"rank {rank}: {error}" for rank, error in sorted(op.errors))
            if op.call is not None:
                self._failures += 1
                op.future.set_exception(
                    StageFailedError(op.call.stage_id, op.call.session_id, op.call.sequence_id, cause)
                )
            else:  # a release is not a sequence item: sequence_id -1
                op.future.set_exception(StageFailedError(self.name, op.session_id, -1, f"release failed: {cause}"))
            return
        if op.call is not None and not isinstance(op.value, Mapping):
            self._failures += 1
            cause = f"rank 0 returned {type(op.value).__name__}, not a mapping of artifacts"
            op.future.set_exception(StageFailedError(op.call.stage_id, op.call.session_id, op.call.sequence_id, cause))
            return
        op.future.set_result(op.value)

    def _retire(self, op: Operation) -> None:
        del self._ops[op.op_id]
        if op.kind == CALL:
            self._calls_in_flight -= 1
            self._lane_calls[op.lane] -= 1
        else:
            self._release_slots.release()
        self._arm_watchdog()

    def _arm_watchdog(self) -> None:
        """Time the oldest operation in flight (the one the ranks work on now: they serve in submission order).

        Re-armed whenever an operation retires, so each operation's own service time is what is measured.
        """
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        timeout = self._config.call_timeout_s
        if timeout is None or not self._ops or self._current is None:
            return
        oldest = next(iter(self._ops.values()))
        self._watchdog = asyncio.get_running_loop().call_later(
            timeout, self._on_stuck, self._current, oldest.op_id, timeout
        )

    def _on_stuck(self, inc: Incarnation, op_id: int, timeout: float) -> None:
        self._watchdog = None
        op = self._ops.get(op_id)
        if op is None or inc is not self._current:
            return
        silent = ", ".join(str(rank) for rank in sorted(op.remaining))
        self._on_broken(inc, f"rank(s) {silent} did not finish {describe_operation(op)} within {timeout:g} s (stuck)")

    def _on_exit(self, inc: Incarnation, rank: int, pid: int | None, exitcode: int | None) -> None:
        self._on_broken(inc, f"rank {rank} (pid {pid}) exited with {describe_exit(exitcode)}")

    def _on_broken(self, inc: Incarnation, reason: str) -> None:
        if inc is not self._current or inc.closer is not None:
            return  # expected: the incarnation is being closed
        if self._state is WorkerState.STARTING:
            inc.broken = inc.broken or reason
            if not inc.ready.done():
                inc.ready.set_result(reason)
            return
        if self._state is WorkerState.RUNNING and inc.running:
            self._on_died(inc, reason)

    def _on_died(self, inc: Incarnation, reason: str) -> None:
        now = self._clock.now()
        self._deaths += 1
        inc.running = False
        self._transition(WorkerState.RESTARTING)
        if inc.ready_at is not None and now - inc.ready_at >= self._config.restart_backoff_reset_s:
            self._backoff_s = self._config.restart_backoff_initial_s
        logger.error("worker %r incarnation %d died: %s", self.name, inc.number, reason)
        for listener in list(self._listeners):
            try:
                listener(self.name, inc.number, reason)
            except Exception:
                logger.exception("worker %r: death listener %r failed", self.name, listener)
        self._fail_operations(
            lambda op: ActorDiedError(
                f"worker {self.name!r} incarnation {inc.number} died during {describe_operation(op)}: {reason}"
            )
        )
        self._supervisor = asyncio.get_running_loop().create_task(
            self._restart(inc), name=f"restart worker {self.name}"
        )
        self._supervisor.add_done_callback(self._supervisor_done)

    def _fail_operations(self, error: Callable[[Operation], Exception]) -> None:
        """Resolve every operation in flight: calls fail; releases succeed, since the state they drop is gone."""
        for op in list(self._ops.values()):
            self._retire(op)
            if op.future.done():
                continue
            if op.call is not None:
                self._lost_calls += 1
                op.future.set_exception(error(op))
            else:
                op.future.set_result(None)

    async def _restart(self, dead: Incarnation) -> None:
        await self._close_incarnation(dead, graceful=False)
        while True:
            delay = self._backoff_s
            self._backoff_s = min(delay * 2, self._config.restart_backoff_max_s)
            logger.warning("worker %r restarts in %.2f s", self.name, delay)
            await asyncio.sleep(delay)
            try:
                await self._launch()
            except ActorDiedError as exc:
                logger.warning("%s", exc)
                self._transition(WorkerState.RESTARTING)
                continue
            self._restarts += 1
            return

    def _supervisor_done(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            logger.error("worker %r: restart supervisor failed", self.name, exc_info=task.exception())

    # --- requests ---

    async def invoke(self, call: StageCall, *, lane: int = 0) -> Mapping[str, object]:
        """Run `call` on every rank (on `lane`: `ParallelWorkerConfig.lanes`) and return rank 0's artifacts.

        Raises `StageFailedError` (a rank's stage raised, or the inputs/artifacts are not picklable; the worker stays
        healthy), `ActorDiedError` (the incarnation died meanwhile) or `ActorUnavailableError` (not running, or the
        lane at capacity). Cancelling does not interrupt the ranks; see the class docstring.
        """
        if not 0 <= lane < self._config.lanes:
            raise ValueError(f"worker {self.name!r} has {self._config.lanes} lane(s), not lane {lane}")
        inc = self._running_incarnation()
        if self._lane_calls[lane] >= self.capacity:
            where = f" on lane {lane}" if self._config.lanes > 1 else ""
            raise ActorUnavailableError(
                f"worker {self.name!r} is at capacity: {self._lane_calls[lane]} call(s) in flight{where}"
                f" (capacity {self.capacity}); wait for one to finish"
            )
        try:
            payload = bytes(ForkingPickler.dumps(call))
        except Exception as exc:
            raise StageFailedError(
                call.stage_id,
                call.session_id,
                call.sequence_id,
                f"the inputs are not picklable: {describe_exception(exc)}",
            ) from exc
        self._calls_in_flight += 1
        self._lane_calls[lane] += 1
        self._calls += 1
        op = self._submit(inc, CALL, payload, call.session_id, call, lane)
        return cast(Mapping[str, object], await op.future)

    async def release_session(self, session_id: str) -> None:
        """Run `stage.release(session_id)` on every rank.

        Raises `StageFailedError` (sequence_id -1) naming the ranks whose release raised. Returns at once when no
        incarnation runs: its per-session state died with it.
        """
        if self._state is not WorkerState.RUNNING:
            logger.debug("worker %r: release of %r needs nothing (%s)", self.name, session_id, self._state.value)
            return
        await self._release_slots.acquire()
        if not self.healthy:  # it may have died while we waited for a slot
            self._release_slots.release()
            return
        op = self._submit(self._running_incarnation(), RELEASE, b"", session_id, None)
        await op.future

    def _running_incarnation(self) -> Incarnation:
        if self._state is not WorkerState.RUNNING or self._current is None:
            raise ActorUnavailableError(f"worker {self.name!r} takes no calls: it is {self._state.value}")
        return self._current

    def _submit(
        self, inc: Incarnation, kind: str, payload: bytes, session_id: str, call: StageCall | None, lane: int = 0
    ) -> Operation:
        loop = asyncio.get_running_loop()
        op = Operation(next(self._op_ids), kind, session_id, call, loop.create_future(), len(inc.processes), lane)
        self._ops[op.op_id] = op
        if self._watchdog is None:
            self._arm_watchdog()
        request = Request(kind, op.op_id, payload, session_id, lane)
        for rank, requests in enumerate(inc.request_queues):
            try:
                requests.put_nowait(request)
            except queue.Full:
                # The bounds above make this impossible unless a rank stopped reading: the ranks have diverged.
                self._on_died(inc, f"the request queue of rank {rank} overflowed")
                break
        return op
