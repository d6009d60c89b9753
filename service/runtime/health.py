"""`WorkerHealth`: the model workers' start-up, their readiness as admission sees it, and their stop.

Each worker starts in the background (`start_all`, all at once); one that fails to start keeps its error and admits
nothing. A started worker is healthy while its `ready` says so; every change is reported to admission at once
(`report(index, healthy)`: an unhealthy worker is given no sessions) and logged. Readiness is read on every create,
every /readyz and every `interval_s` (`monitor`), so a worker that goes down stops admitting within that interval
even when nobody asks. `problem()` is the workers' part of the runtime's readiness: None when every worker is up.
Everything runs on the event loop; a worker's own start and stop are its business (threads, processes).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from pipeline.bidirectional import BidirectionalService

__all__ = ["WorkerHealth"]

logger = logging.getLogger(__name__)


class WorkerHealth:
    """The model workers of one runtime, by index: started, failed to start, healthy."""

    def __init__(
        self, workers: Sequence[BidirectionalService], report: Callable[[int, bool], None], *, interval_s: float
    ) -> None:
        self._workers = tuple(workers)
        self._report = report
        self._interval_s = interval_s
        self._started = [False] * len(self._workers)
        self._errors: dict[int, str] = {}
        self._healthy = [False] * len(self._workers)
        self._all_tried = asyncio.Event()

    def __len__(self) -> int:
        return len(self._workers)

    def __getitem__(self, index: int) -> BidirectionalService:
        return self._workers[index]

    def report_all_unhealthy(self) -> None:
        """Before admission starts: no worker takes sessions until it has started."""
        for index in range(len(self._workers)):
            self._report(index, False)

    async def start_all(self) -> None:
        """Start every worker at once; returns when each has started or failed to (`wait_started` wakes then)."""

        async def start_one(index: int, worker: BidirectionalService) -> None:
            try:
                await worker.start()
            except Exception as exc:
                logger.exception("model worker %d failed to start", index)
                self._errors[index] = f"{type(exc).__name__}: {exc}"
                return
            self._started[index] = True
            self.refresh()

        try:
            async with asyncio.TaskGroup() as group:
                for index, worker in enumerate(self._workers):
                    group.create_task(start_one(index, worker), name=f"start-worker-{index}")
        finally:
            self._all_tried.set()
        logger.info("model workers started: %d of %d", sum(self._started), len(self._workers))

    async def wait_started(self) -> None:
        """Wait until every worker has started or failed to."""
        await self._all_tried.wait()

    async def monitor(self) -> None:
        """Read every worker's readiness each `interval_s`, forever (cancel to stop)."""
        while True:
            self.refresh()
            await asyncio.sleep(self._interval_s)

    def refresh(self) -> None:
        """Read every worker's readiness now and report each change."""
        for index, worker in enumerate(self._workers):
            try:
                healthy = self._started[index] and bool(worker.ready)
            except Exception:
                logger.exception("model worker %d: reading readiness failed", index)
                healthy = False
            if healthy != self._healthy[index]:
                self._healthy[index] = healthy
                if not healthy and self._started[index]:
                    logger.error("model worker %d is not ready; it admits no sessions", index)
                self._report(index, healthy)

    def any_healthy(self) -> bool:
        """Whether some worker takes sessions now (read afresh)."""
        self.refresh()
        return any(self._healthy)

    def problem(self) -> str | None:
        """Why the workers keep the instance unready (read afresh), or None when every one is up."""
        self.refresh()
        if self._errors:
            index, error = min(self._errors.items())
            return f"model worker {index} failed to start: {error}"
        if not all(self._started):
            return "model workers are starting"
        down = [str(index) for index, healthy in enumerate(self._healthy) if not healthy]
        if down:
            return f"model worker(s) {', '.join(down)} not ready"
        return None

    async def aclose(self) -> None:
        """Stop every worker, one after the other; a worker that fails to stop is logged, the others still stop."""
        for index, worker in enumerate(self._workers):
            try:
                await worker.aclose()
            except Exception:
                logger.exception("shutdown: model worker %d failed to stop", index)
