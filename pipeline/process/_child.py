"""The child side of a `ParallelWorker`: what one spawned rank runs, from building its stage to its last reply.

`worker_main` is the process target. The "spawn" context pickles it by its qualified name and every rank imports
this module to find it, so it and everything it calls stay module level. A rank ignores SIGINT (the parent stops
the ranks in order), exits at once if the parent dies, joins the process group when there is more than one rank,
builds its stage with the `stage_factory`, reports ready, and then serves its request queue in order until a stop
request, replying on its own pipe. With two lanes (`WorkerContext.lanes`), a reader thread takes the requests off the
queue and hands lane 1's calls to a second thread (its own CUDA stream on a CUDA device), which serves them in order
beside the main thread's; a stop lets that thread finish what it was handed, then ends it. While a call runs,
`_PartWriter` (the stage's `WorkerContext.parts`) writes the call's partial replies to that pipe ahead of its final
reply (`pipeline.process._protocol`). Package-private:
`pipeline.process.worker` starts `worker_main`.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
import signal
import threading
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from datetime import timedelta
from multiprocessing.connection import Connection
from multiprocessing.queues import Queue
from multiprocessing.reduction import ForkingPickler

import torch

from pipeline.actor import Stage
from pipeline.process._protocol import (
    CALL,
    DONE,
    FAILED,
    PART,
    READY,
    RELEASE,
    START_FAILED,
    STOP,
    Bootstrap,
    Reply,
    Request,
    TCPStore,
    describe_exception,
)
from pipeline.process.records import ReportsReady, StageFactory, WorkerContext

__all__: list[str] = []

_PARENT_GONE_EXIT_CODE = 70


def worker_main(
    context: WorkerContext,
    factory: StageFactory,
    requests: Queue[Request],
    replies: Connection,
    bootstrap: Bootstrap | None,
) -> None:
    """Entry point of one rank: build the stage, report ready, serve requests until told to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which stops the ranks in order
    _exit_with_parent()

    lock = threading.Lock()  # parts may come from a thread the stage started; a reply is one write

    def send(reply: Reply) -> None:
        data = bytes(ForkingPickler.dumps(reply))
        with lock:
            replies.send_bytes(data)

    parts = _PartWriter(context.rank, send)
    context = replace(context, parts=parts)
    distributed = False
    try:
        try:
            torch.set_num_threads(context.torch_threads)
            if context.device.startswith("cuda:"):
                torch.cuda.set_device(torch.device(context.device))
            if bootstrap is not None:
                _join_process_group(context, bootstrap)
                distributed = True
            stage = factory(context)
            if not isinstance(stage, Stage):
                raise TypeError(f"stage_factory returned {type(stage).__name__}, which has no process()/release()")
            report = None  # rank 0 answers for the group (ReportsReady)
            if context.rank == 0 and isinstance(stage, ReportsReady):
                report = bytes(ForkingPickler.dumps(stage.ready_report()))
        except Exception as exc:
            send(Reply(context.rank, START_FAILED, error=describe_exception(exc), detail=traceback.format_exc()))
            return
        send(Reply(context.rank, READY, payload=report))
        if context.lanes > 1:
            _serve_lanes(stage, requests, context, parts, send)
            return
        while True:
            request = requests.get()
            if request.kind == STOP:
                return
            send(_serve(stage, request, context.rank, parts))
    finally:
        if distributed:
            with contextlib.suppress(Exception):
                torch.distributed.destroy_process_group()
        replies.close()


def _serve_lanes(
    stage: Stage,
    requests: Queue[Request],
    context: WorkerContext,
    parts: _PartWriter,
    send: Callable[[Reply], None],
) -> None:
    """Serve lane 0 on this thread and lane 1 on a second one; a reader thread feeds both, so a lane-1 call starts
    while a lane-0 call runs. Both local queues are bounded by what the parent lets through (its request queue's
    size); STOP reaches both, and lane 1 finishes its queued calls before this returns."""
    lane0: queue.Queue[Request] = queue.Queue()
    lane1: queue.Queue[Request] = queue.Queue()

    def read() -> None:
        while True:
            request = requests.get()
            if request.kind == STOP:
                lane1.put(request)
                lane0.put(request)
                return
            (lane1 if request.lane == 1 else lane0).put(request)

    def serve_lane1() -> None:
        stream = None
        if context.device.startswith("cuda"):
            stream = torch.cuda.Stream(torch.device(context.device))  # type: ignore[no-untyped-call]
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            while True:
                request = lane1.get()
                if request.kind == STOP:
                    return
                send(_serve(stage, request, context.rank, parts))

    reader = threading.Thread(target=read, name="lingstream-requests", daemon=True)
    second = threading.Thread(target=serve_lane1, name="lingstream-lane1", daemon=True)
    second.start()
    reader.start()
    while True:
        request = lane0.get()
        if request.kind == STOP:
            break
        send(_serve(stage, request, context.rank, parts))
    second.join()
    reader.join()


def _join_process_group(context: WorkerContext, bootstrap: Bootstrap) -> None:
    timeout = timedelta(seconds=bootstrap.timeout_s)
    store = TCPStore("127.0.0.1", bootstrap.store_port, is_master=False, timeout=timeout)
    torch.distributed.init_process_group(
        bootstrap.backend, store=store, rank=context.rank, world_size=context.world_size, timeout=timeout
    )


class _PartWriter:
    """The rank's `PartSender`: writes a part of the call in flight to the reply pipe, ahead of its final reply."""

    def __init__(self, rank: int, send: Callable[[Reply], None]) -> None:
        self._rank = rank
        self._send = send
        self._local = threading.local()  # the call in flight on this thread (`during`): one per lane

    @contextlib.contextmanager
    def during(self, op_id: int) -> Iterator[None]:
        """Parts sent inside this block, on this thread, belong to call `op_id`."""
        self._local.op_id = op_id
        try:
            yield
        finally:
            self._local.op_id = None

    def send(self, part: object) -> None:
        op_id: int | None = getattr(self._local, "op_id", None)
        if op_id is None:
            raise RuntimeError("a part can only be sent while the stage runs a call")
        if self._rank != 0:
            return  # only rank 0 answers for the group, parts included
        try:
            payload = bytes(ForkingPickler.dumps(part))
        except Exception as exc:
            raise TypeError(f"the part is not picklable: {describe_exception(exc)}") from exc
        self._send(Reply(self._rank, PART, op_id, payload=payload))


def _serve(stage: Stage, request: Request, rank: int, parts: _PartWriter) -> Reply:
    try:
        if request.kind == CALL:
            call = ForkingPickler.loads(request.payload)
            with parts.during(request.op_id):
                result = stage.process(call)
            if not isinstance(result, Mapping):
                raise TypeError(f"process() returned {type(result).__name__}, not a mapping of artifacts")
        elif request.kind == RELEASE:
            stage.release(request.session_id)
            result = None
        else:
            raise ValueError(f"unknown request kind {request.kind!r}")
    except Exception as exc:
        return Reply(rank, FAILED, request.op_id, error=describe_exception(exc), detail=traceback.format_exc())
    if result is None or rank != 0:
        return Reply(rank, DONE, request.op_id)
    try:
        payload = bytes(ForkingPickler.dumps(dict(result)))
    except Exception as exc:
        return Reply(rank, FAILED, request.op_id, error=f"the artifacts are not picklable: {describe_exception(exc)}")
    return Reply(rank, DONE, request.op_id, payload=payload)


def _exit_with_parent() -> None:
    """End this rank at once if the parent dies, so no worker outlives the service (a SIGKILLed parent included)."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return

    def watch() -> None:
        parent.join()
        os._exit(_PARENT_GONE_EXIT_CODE)

    threading.Thread(target=watch, name="lingstream-parent-watch", daemon=True).start()
