"""What a `ParallelWorker` keeps per start of its processes: the `Incarnation` and the `Operation`s in flight on it.

An incarnation is one group of spawned ranks with their request queues, reply pipes, exit events and watcher thread;
an operation is one call or release sent to every rank of it and resolved on the event loop once every rank has
replied. `terminate_process`, `kill_process` and `drain_requests` end an incarnation's processes and
empty its queues, ignoring ones already gone. Package-private: `pipeline.process.worker` imports these names directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import queue
import threading
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from typing import Any

from pipeline.actor import StageCall
from pipeline.process._protocol import Request

__all__: list[str] = []


class Operation:
    """One call or release handed to every rank of one incarnation; owned by the event loop."""

    __slots__ = (
        "call",
        "errors",
        "future",
        "kind",
        "lane",
        "op_id",
        "parts_broken",
        "remaining",
        "session_id",
        "value",
    )

    def __init__(
        self,
        op_id: int,
        kind: str,
        session_id: str,
        call: StageCall | None,
        future: asyncio.Future[object],
        ranks: int,
        lane: int = 0,
    ) -> None:
        self.op_id = op_id
        self.lane = lane
        self.kind = kind
        self.session_id = session_id
        self.call = call
        self.future = future
        self.remaining = set(range(ranks))
        self.errors: list[tuple[int, str]] = []
        self.value: object = None
        self.parts_broken = (
            False  # a part was lost (unreadable, or a listener raised): the call fails, later parts drop
        )


class Incarnation:
    """The processes, queues, pipes and watcher thread of one start of the worker.

    The event loop owns the bookkeeping fields; the watcher thread owns the reply pipes and reaps the processes
    until the closer (run in a thread by `ParallelWorker._close_incarnation`) has joined it.
    """

    def __init__(self, number: int, ready: asyncio.Future[str | None]) -> None:
        self.number = number
        self.ready = ready  # None once every rank is ready, else why the start failed
        self.ranks_ready: set[int] = set()
        self.processes: list[BaseProcess] = []
        self.pids: tuple[int, ...] = ()
        self.request_queues: list[Queue[Request]] = []
        self.reply_conns: list[Connection] = []
        self.exited: list[threading.Event] = []
        self.wake_r, self.wake_w = multiprocessing.Pipe(duplex=False)
        self.watcher: threading.Thread | None = None
        self.store: Any = None  # torch.distributed.TCPStore hosted by the parent
        self.running = False
        self.broken: str | None = None  # why a rank failed while STARTING, even after `ready` resolved
        self.ready_at: float | None = None
        self.ready_report: object = None  # rank 0's stage's `ReportsReady.ready_report()`
        self.spawner: asyncio.Future[None] | None = None  # `spawn_ranks` on its thread
        self.closer: asyncio.Future[None] | None = None


def describe_operation(op: Operation) -> str:
    if op.call is not None:
        return f"stage {op.call.stage_id!r} session {op.call.session_id!r} sequence {op.call.sequence_id}"
    return f"the release of session {op.session_id!r}"


def terminate_process(process: BaseProcess) -> None:
    with contextlib.suppress(ProcessLookupError, ValueError):
        process.terminate()


def kill_process(process: BaseProcess) -> None:
    with contextlib.suppress(ProcessLookupError, ValueError):
        process.kill()


def drain_requests(requests: Queue[Request]) -> None:
    with contextlib.suppress(queue.Empty, OSError, EOFError, ValueError):
        while True:
            requests.get_nowait()
