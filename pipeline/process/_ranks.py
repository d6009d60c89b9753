"""The ranks of one incarnation as processes: spawning them (with their pipes, queues and TCP store) and ending them.

Package-private (only `pipeline.process.worker` uses it). Both run on a thread (`asyncio.to_thread`), off the event
loop: `spawn_ranks` may wait for the forkserver to start (`pipeline.process.starter`), `close_ranks` for exits. The
watcher thread that reads the ranks' replies is `pipeline.process._watcher`; the bookkeeping they fill is
`pipeline.process._incarnation.Incarnation`.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.queues import Queue

from pipeline.process._child import worker_main
from pipeline.process._incarnation import Incarnation, drain_requests, kill_process, terminate_process
from pipeline.process._protocol import STOP, Bootstrap, Request, TCPStore
from pipeline.process.records import ParallelWorkerConfig, WorkerContext
from pipeline.process.starter import process_context, rank_process

__all__ = ["await_exits", "close_ranks", "has_exited", "spawn_ranks"]

logger = logging.getLogger(__name__)


def spawn_ranks(config: ParallelWorkerConfig, inc: Incarnation, watch: Callable[[Incarnation], None]) -> None:
    """Start the incarnation's ranks (and, with more than one, the TCP store they meet on), then its watcher thread
    running `watch(inc)`. Raises what starting a process raises; what was started is in `inc` for `close_ranks`."""
    ctx = process_context(config)
    bootstrap: Bootstrap | None = None
    if config.world_size > 1:
        timeout = timedelta(seconds=config.start_timeout_s)
        # Port 0 lets the OS pick a free port while the parent already listens on it: no probe-then-bind race.
        inc.store = TCPStore("127.0.0.1", 0, None, True, timeout, wait_for_workers=False)
        backend = "nccl" if config.devices[0].startswith("cuda") else "gloo"
        bootstrap = Bootstrap(inc.store.port, backend, config.start_timeout_s)
    # Room for every call and release the parent lets through, plus the stop request.
    queue_size = config.capacity * config.lanes + config.max_pending_releases + 1
    for rank, device in enumerate(config.devices):
        requests: Queue[Request] = ctx.Queue(maxsize=queue_size)
        reply_r, reply_w = ctx.Pipe(duplex=False)
        inc.request_queues.append(requests)
        inc.reply_conns.append(reply_r)
        context = WorkerContext(
            config.name,
            rank,
            config.world_size,
            device,
            config.torch_threads,
            inc.number,
            config.options,
            lanes=config.lanes,
        )
        process = rank_process(
            config,
            ctx,
            worker_main,
            (context, config.stage_factory, requests, reply_w, bootstrap),
            f"lingstream-{config.name}-{inc.number}-r{rank}",
        )
        try:
            process.start()
        finally:
            reply_w.close()  # the rank now holds the only write end: its death reads as EOF here
        inc.processes.append(process)
        inc.exited.append(threading.Event())
    inc.pids = tuple(p.pid for p in inc.processes if p.pid is not None)
    inc.watcher = threading.Thread(
        target=watch, args=(inc,), name=f"lingstream-worker-{config.name}-{inc.number}", daemon=True
    )
    inc.watcher.start()


def close_ranks(config: ParallelWorkerConfig, inc: Incarnation, graceful: bool) -> None:
    """End the incarnation's ranks (with `graceful`, a stop request first, then terminate and kill what is left),
    join its watcher, and free its pipes, queues and store. Blocking: run it on a thread."""
    name = config.name
    if graceful:
        for rank, requests in enumerate(inc.request_queues[: len(inc.processes)]):
            try:
                requests.put_nowait(Request(STOP))
            except (queue.Full, ValueError, OSError) as exc:
                logger.warning("worker %r rank %d: could not send the stop request: %s", name, rank, exc)
        await_exits(inc, config.stop_timeout_s)
    for signal_name, send in (("terminate", terminate_process), ("kill", kill_process)):
        survivors = [r for r in range(len(inc.processes)) if not has_exited(inc, r)]
        if not survivors:
            break
        # Expected when tearing down a dead or failed incarnation; worth a warning when a graceful stop timed out.
        level = logging.WARNING if graceful else logging.INFO
        for rank in survivors:
            logger.log(level, "worker %r incarnation %d: %s rank %d", name, inc.number, signal_name, rank)
            send(inc.processes[rank])
        await_exits(inc, config.kill_grace_s)
    # Every rank is gone, so the watcher can deliver the last replies and end.
    with contextlib.suppress(OSError):
        inc.wake_w.send_bytes(b"\0")
    if inc.watcher is not None:
        inc.watcher.join()
    # From here on this thread alone touches the Process objects.
    for rank, process in enumerate(inc.processes):
        process.join(config.kill_grace_s)
        if process.exitcode is None:
            logger.error("worker %r rank %d (pid %s) did not exit", name, rank, process.pid)
        else:
            process.close()
    for conn in (*inc.reply_conns, inc.wake_r, inc.wake_w):
        conn.close()
    for requests in inc.request_queues:
        drain_requests(requests)  # a dead rank may have left requests unread: free the pipe so the feeder can finish
        requests.close()
        requests.join_thread()
    inc.store = None  # the parent's TCP store stops listening when it is freed
    logger.debug("worker %r incarnation %d closed", name, inc.number)


def await_exits(inc: Incarnation, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for rank, process in enumerate(inc.processes):
        remaining = max(0.0, deadline - time.monotonic())
        if inc.watcher is not None:
            inc.exited[rank].wait(remaining)
        else:
            process.join(remaining)


def has_exited(inc: Incarnation, rank: int) -> bool:
    if inc.watcher is not None:
        return inc.exited[rank].is_set()
    return inc.processes[rank].exitcode is not None
