"""`TaskSet`: the owner of the service's background tasks, so that none is ever orphaned.

The runtime's tasks start and end at unrelated times (one runner per admitted session, the drain, the health
monitor), which a lexical `asyncio.TaskGroup` cannot express across the app's lifespan. A `TaskSet` holds strong
references to every task it spawned, logs a task that dies with an exception (it does not cancel its siblings: one
session's failure must not end the others), and `aclose()` cancels and awaits whatever is still running.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["TaskSet"]

logger = logging.getLogger(__name__)

T = TypeVar("T")


class TaskSet:
    """Spawns, tracks, and finally cancels and awaits background tasks.

    Example::

        tasks = TaskSet("runtime")
        tasks.spawn(run_session(session), name=f"session-{session.id}")
        ...
        await tasks.aclose()     # cancels what still runs and waits for all of it

    Cancellation: `aclose()` cancels every task once and awaits them all; a task that handles cancellation (e.g.
    to publish a final status) finishes its cleanup before `aclose()` returns. Spawning after `aclose()` raises.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(
        self, coro: Coroutine[Any, Any, T], *, name: str, context: contextvars.Context | None = None
    ) -> asyncio.Task[T]:
        if self._closed:
            coro.close()
            raise RuntimeError(f"task set {self._name!r} is closed; cannot spawn {name!r}")
        task = asyncio.get_running_loop().create_task(coro, name=name, context=context)
        self._tasks.add(task)
        task.add_done_callback(self._done)
        return task

    async def aclose(self) -> None:
        """Cancel every task still running and await them all. Idempotent."""
        self._closed = True
        while self._tasks:
            tasks = list(self._tasks)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            logger.error("%s: task %s failed", self._name, task.get_name(), exc_info=error)
