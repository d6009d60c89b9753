"""`ParallelWorkerStageActor`: the `StageActor` that runs a stage in worker processes.

It is the only owner of one `ParallelWorker`: it builds the worker from a `ParallelWorkerConfig` and nothing else
ever holds a reference to it, so the worker's lifecycle (start, restarts, stop) has exactly one driver. On top of
the worker it adds what the orchestrator's seam promises: `ActorStatistics`, and a check that every `TensorRef`
artifact coming back from the processes is well-formed before the scheduler sees it.

A worker with two call lanes (`ParallelWorkerConfig.lanes`) serves a second stage of the graph beside the owner's:
`lane_actor(stage)` gives the orchestrator a `WorkerLaneActor` for it, a view that sends its calls on lane 1 of the
same worker and reports its own call counts. The view owns nothing: starting, stopping and restarting the processes
stay with the owner, and a death of the worker reaches the view's death listeners as it reaches the owner's.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING

from pipeline.actor import ActorStatistics, DeathListener, StageCall
from pipeline.clock import Clock
from pipeline.errors import ChannelError, StageFailedError
from pipeline.process.records import ParallelWorkerConfig, PartListener, WorkerState, WorkerStatistics
from pipeline.process.tensor_channel import TensorRef, TensorRefCarrier, validate_ref
from pipeline.process.worker import ParallelWorker

if TYPE_CHECKING:
    from pipeline.actor import StageActor

__all__ = ["ParallelWorkerStageActor", "WorkerLaneActor"]

logger = logging.getLogger(__name__)


class ParallelWorkerStageActor:
    """Runs one stage in a `ParallelWorker` (one or more spawned processes) for the orchestrator.

    Problem: heavy stages (DiT denoise, VAE decode) must run outside the service's process, possibly across several
    GPUs, and a crashed process must cost only the sessions that lived in it. Example::

        actor = ParallelWorkerStageActor(
            ParallelWorkerConfig(name="denoise", stage_factory=build_dit, devices=("cuda:0", "cuda:1"))
        )
        actor.add_death_listener(on_death)
        await actor.start()
        artifacts = await actor.invoke(StageCall("denoise", "s1", 0, {"condition": c, "control": u}))
        await actor.release_session("s1")
        await actor.aclose()

    Ordering: calls and releases reach every rank in the order they were made and run there one at a time.

    Backpressure: `capacity` calls in flight (`ParallelWorkerConfig.capacity`, 1 by default); one more is rejected
    with `ActorUnavailableError`. Releases wait for a slot.

    Cancellation contract: cancelling `invoke` does not interrupt the worker processes. The call finishes there,
    keeps its capacity slot until then, and its result is dropped (counted as a stale result). The same holds for
    `release_session`. Cancelling a caller of `aclose()` does not abort the shutdown.

    Failures: a stage exception → `StageFailedError` for that call, the actor stays healthy; a malformed
    `TensorRef` artifact (bare, or inside a `TensorRefCarrier`) → `StageFailedError` too. A dead process (or a
    stuck one, past `call_timeout_s`) → `ActorDiedError` for the calls in flight, death listeners get `(name, dead
    incarnation, reason)`, and the worker restarts with back-off (`incarnation` + 1); meanwhile `invoke` raises
    `ActorUnavailableError`. `release_session` succeeds at once while no incarnation
    runs, since the state it would drop died with the processes.

    Parts: what the stage sends with `WorkerContext.parts` reaches the part listeners on the loop, in order, before
    the call's result; parts of a cancelled call are dropped, parts already delivered stay when the call then fails.
    """

    def __init__(self, config: ParallelWorkerConfig, *, clock: Clock | None = None) -> None:
        self._worker = ParallelWorker(config, clock=clock)
        self._worker_lanes = config.lanes

    @property
    def name(self) -> str:
        return self._worker.name

    @property
    def capacity(self) -> int:
        return self._worker.capacity

    @property
    def healthy(self) -> bool:
        return self._worker.healthy

    @property
    def incarnation(self) -> int:
        return self._worker.incarnation

    @property
    def state(self) -> WorkerState:
        return self._worker.state

    def add_death_listener(self, listener: DeathListener) -> None:
        self._worker.add_death_listener(listener)

    def add_part_listener(self, listener: PartListener) -> None:
        """`listener(call, part)` on the loop for each part the stage sends ahead of a call's result
        (`WorkerContext.parts`; ordering and dropping in `pipeline.process._protocol`)."""
        self._worker.add_part_listener(listener)

    async def start(self) -> None:
        """Start the worker's first incarnation; a second call (the worker already started) returns at once, so an
        owner may start several actors together before the orchestrator's own `start()` reaches them."""
        if self._worker.state is not WorkerState.CREATED:
            return
        await self._worker.start()

    async def invoke(self, call: StageCall) -> Mapping[str, object]:
        return _checked(call, await self._worker.invoke(call))

    def lane_actor(self, stage: str) -> WorkerLaneActor:
        """The actor of `stage`, whose calls run on this worker's lane 1 beside this actor's (the module docstring).
        Raises `ValueError` when the worker has one lane."""
        if self._worker_lanes < 2:
            raise ValueError(f"worker {self.name!r} has one call lane: set ParallelWorkerConfig.lanes=2")
        return WorkerLaneActor(stage, self._worker)

    async def release_session(self, session_id: str) -> None:
        await self._worker.release_session(session_id)

    async def aclose(self) -> None:
        await self._worker.aclose()

    def statistics(self) -> ActorStatistics:
        stats = self._worker.statistics()
        return ActorStatistics(
            name=stats.name,
            healthy=stats.healthy,
            incarnation=stats.incarnation,
            in_flight=stats.in_flight,
            calls=stats.calls,
            failures=stats.failures + stats.lost_calls,
            restarts=stats.restarts,
        )

    def worker_statistics(self) -> WorkerStatistics:
        """The worker's own snapshot: process ids, stale results, back-off, and the rest."""
        return self._worker.statistics()


class WorkerLaneActor:
    """The `StageActor` of a second stage on a two-lane worker owned by a `ParallelWorkerStageActor` (`lane_actor`).

    Calls go to lane 1 (`ParallelWorker.invoke(..., lane=1)`): in order among themselves, beside the owner's calls.
    `capacity` is the worker's per-lane capacity. `start`/`aclose` do nothing (the owner drives the processes);
    `release_session` is the worker's release (the group's stage releases every stage's state of the session, so
    the owner's release and this one are each idempotent). Cancellation and failures: as the owner's.
    """

    def __init__(self, stage: str, worker: ParallelWorker) -> None:
        self._stage = stage
        self._worker = worker
        self._calls = 0
        self._failures = 0
        self._in_flight = 0

    @property
    def name(self) -> str:
        return f"{self._worker.name}/{self._stage}"

    @property
    def capacity(self) -> int:
        return self._worker.capacity

    @property
    def healthy(self) -> bool:
        return self._worker.healthy

    @property
    def incarnation(self) -> int:
        return self._worker.incarnation

    def add_death_listener(self, listener: DeathListener) -> None:
        self._worker.add_death_listener(listener)

    async def start(self) -> None:
        return None  # the owner starts the worker

    async def aclose(self) -> None:
        return None  # the owner stops it

    async def invoke(self, call: StageCall) -> Mapping[str, object]:
        self._calls += 1
        self._in_flight += 1
        try:
            return _checked(call, await self._worker.invoke(call, lane=1))
        except Exception:
            self._failures += 1
            raise
        finally:
            self._in_flight -= 1

    async def release_session(self, session_id: str) -> None:
        await self._worker.release_session(session_id)

    def statistics(self) -> ActorStatistics:
        stats = self._worker.statistics()
        return ActorStatistics(
            name=self.name,
            healthy=stats.healthy,
            incarnation=stats.incarnation,
            in_flight=self._in_flight,
            calls=self._calls,
            failures=self._failures,
            restarts=stats.restarts,
        )


def _checked(call: StageCall, artifacts: Mapping[str, object]) -> Mapping[str, object]:
    """`artifacts` once every `TensorRef` in them (bare, or in a `TensorRefCarrier`) is well-formed."""
    for artifact, value in artifacts.items():
        refs: tuple[object, ...] = ()
        if isinstance(value, TensorRef):
            refs = (value,)
        elif isinstance(value, TensorRefCarrier):
            refs = tuple(value.tensor_refs())
        for ref in refs:
            try:
                validate_ref(ref)
            except ChannelError as exc:
                raise StageFailedError(
                    call.stage_id, call.session_id, call.sequence_id, f"artifact {artifact!r}: {exc}"
                ) from exc
    return artifacts


if TYPE_CHECKING:

    def _conforms(actor: ParallelWorkerStageActor) -> StageActor:
        return actor  # mypy checks that the actor satisfies the StageActor protocol

    def _lane_conforms(actor: WorkerLaneActor) -> StageActor:
        return actor
