"""Fake stage actors at the `StageActor` seam: scripted calls, failures, deaths and releases."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from pipeline.actor import ActorStatistics, DeathListener, StageCall
from pipeline.errors import ActorDiedError, ActorUnavailableError, StageFailedError

StageFn = Callable[[StageCall], Mapping[str, object]]


def passthrough(produces: tuple[str, ...]) -> StageFn:
    """A stage function that returns, for every produced artifact, the tuple of its inputs' payloads."""

    def fn(call: StageCall) -> Mapping[str, object]:
        value = tuple(call.inputs[k] for k in sorted(call.inputs))
        return dict.fromkeys(produces, value[0] if len(value) == 1 else value)

    return fn


class FakeActor:
    """A `StageActor` on the event loop. With `gated=True` every call waits until the test finishes it."""

    def __init__(self, name: str, fn: StageFn, *, capacity: int = 1, gated: bool = False) -> None:
        self._name = name
        self._fn = fn
        self._capacity = capacity
        self.gated = gated
        self.calls: list[StageCall] = []
        self.pending: dict[tuple[str, int], asyncio.Future[Mapping[str, object]]] = {}
        self.call_started = asyncio.Event()
        self.released: list[str] = []
        self.release_log: list[str] | None = None  # shared log across actors, to check release order
        self.release_failures: dict[str, int] = {}  # session id -> how many more releases fail
        self._healthy = True
        self._incarnation = 1
        self._listeners: list[DeathListener] = []
        self.failures = 0

    @property
    def name(self) -> str:
        return self._name

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def healthy(self) -> bool:
        return self._healthy

    @property
    def incarnation(self) -> int:
        return self._incarnation

    def add_death_listener(self, listener: DeathListener) -> None:
        self._listeners.append(listener)

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ActorUnavailableError(f"{self._name} stopped"))

    async def invoke(self, call: StageCall) -> Mapping[str, object]:
        if not self._healthy:
            raise ActorUnavailableError(f"{self._name} is restarting")
        self.calls.append(call)
        self.call_started.set()
        if self.gated:
            future: asyncio.Future[Mapping[str, object]] = asyncio.get_running_loop().create_future()
            self.pending[(call.session_id, call.sequence_id)] = future
            try:
                return await future
            finally:
                self.pending.pop((call.session_id, call.sequence_id), None)
        try:
            return self._fn(call)
        except Exception as exc:
            self.failures += 1
            raise StageFailedError(call.stage_id, call.session_id, call.sequence_id, repr(exc)) from exc

    def finish(self, session_id: str, sequence_id: int, exc: Exception | None = None) -> None:
        """Complete a gated call with the stage function's result (or with `exc`)."""
        future = self.pending[(session_id, sequence_id)]
        call = next(c for c in reversed(self.calls) if (c.session_id, c.sequence_id) == (session_id, sequence_id))
        if exc is not None:
            future.set_exception(exc)
        else:
            try:
                future.set_result(self._fn(call))
            except Exception as err:
                future.set_exception(StageFailedError(call.stage_id, session_id, sequence_id, repr(err)))

    def die(self, reason: str = "killed") -> None:
        """The runtime dies: in-flight calls raise ActorDiedError, listeners hear of it, the actor restarts."""
        dead = self._incarnation
        self._healthy = False
        for future in self.pending.values():
            if not future.done():
                future.set_exception(ActorDiedError(f"{self._name} died: {reason}"))
        for listener in self._listeners:
            listener(self._name, dead, reason)

    def restart(self) -> None:
        self._incarnation += 1
        self._healthy = True

    async def release_session(self, session_id: str) -> None:
        await asyncio.sleep(0)
        remaining = self.release_failures.get(session_id, 0)
        if remaining:
            self.release_failures[session_id] = remaining - 1
            raise RuntimeError(f"{self._name} could not free {session_id}")
        self.released.append(session_id)
        if self.release_log is not None:
            self.release_log.append(self._name)

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(self._name, self._healthy, self._incarnation, len(self.pending), len(self.calls), 0, 0)


class StaticActorView:
    """An `ActorView` for driving `SchedulerCore` directly."""

    def __init__(self, capacity: int = 1) -> None:
        self.capacities: dict[str, int] = {}
        self.default_capacity = capacity
        self.down: set[str] = set()
        self.incarnations: dict[str, int] = {}

    def available(self, stage_id: str) -> bool:
        return stage_id not in self.down

    def capacity(self, stage_id: str) -> int:
        return self.capacities.get(stage_id, self.default_capacity)

    def incarnation(self, stage_id: str) -> int:
        return self.incarnations.get(stage_id, 1)
