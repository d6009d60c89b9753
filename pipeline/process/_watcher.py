"""The watcher thread of one incarnation: it hands the ranks' replies and exits over to the event loop.

Package-private (only `pipeline.process.worker` uses it). One thread per incarnation multiplexes the ranks' reply
pipes with their process sentinels (`multiprocessing.connection.wait`), so a reply written before a rank died is
always delivered before that death. It touches no state of the worker: every event goes to the loop through
`loop.call_soon_threadsafe` (dropped once the loop is closed), where the worker's callbacks run.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing.connection as mp_connection
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from typing import Any

from pipeline.process._incarnation import Incarnation
from pipeline.process._protocol import FAILED, PART, Reply, describe_exception

__all__ = ["Watcher"]

logger = logging.getLogger(__name__)


class Watcher:
    """Reads one worker's incarnations for it: `run(inc)` is the thread's target (see the module docstring).

    `on_reply(inc, reply, value)` gets every reply with its unpickled payload (a payload that cannot be unpickled
    turns the reply into a failure), `on_exit(inc, rank, pid, exitcode)` every rank's exit, `on_broken(inc,
    reason)` an unreadable reply or the watcher's own failure; all three run on `loop`.
    """

    def __init__(
        self,
        name: str,
        loop: asyncio.AbstractEventLoop,
        kill_grace_s: float,
        *,
        on_reply: Callable[[Incarnation, Reply, object], None],
        on_exit: Callable[[Incarnation, int, int | None, int | None], None],
        on_broken: Callable[[Incarnation, str], None],
    ) -> None:
        self._name = name
        self._loop = loop
        self._kill_grace_s = kill_grace_s
        self._on_reply = on_reply
        self._on_exit = on_exit
        self._on_broken = on_broken

    def run(self, inc: Incarnation) -> None:
        """Deliver replies and rank exits of one incarnation to the loop until every rank is gone or it is woken."""
        conns: dict[Connection, int] = dict(zip(inc.reply_conns, range(len(inc.processes)), strict=True))
        sentinels: dict[int, int] = {p.sentinel: rank for rank, p in enumerate(inc.processes)}
        try:
            while conns or sentinels:
                ready = mp_connection.wait([*conns, *sentinels, inc.wake_r])
                for obj in ready:
                    if isinstance(obj, Connection) and obj in conns and not self._read_replies(inc, obj, conns):
                        del conns[obj]
                for obj in ready:
                    if isinstance(obj, int) and obj in sentinels:
                        rank = sentinels.pop(obj)
                        conn = inc.reply_conns[rank]
                        # Everything the rank wrote before it died is in the pipe: deliver it before the death.
                        if conn in conns and not self._read_replies(inc, conn, conns):
                            del conns[conn]
                        self._reap(inc, rank)
                if inc.wake_r in ready:
                    break
        except Exception:
            logger.exception("worker %r incarnation %d: watcher failed", self._name, inc.number)
            self._post(self._on_broken, inc, "its watcher thread failed")
        finally:
            for conn in list(conns):
                self._read_replies(inc, conn, conns)

    def _read_replies(self, inc: Incarnation, conn: Connection, conns: dict[Connection, int]) -> bool:
        """Deliver every complete reply waiting on `conn`; False once the rank's end is closed."""
        rank = conns[conn]
        try:
            while conn.poll(0):
                data = conn.recv_bytes()
                try:
                    reply = ForkingPickler.loads(data)
                    if not isinstance(reply, Reply):
                        raise TypeError(f"expected a reply, got {type(reply).__name__}")
                except Exception as exc:
                    self._post(self._on_broken, inc, f"rank {rank} sent an unreadable reply: {describe_exception(exc)}")
                    continue
                value: object = None
                if reply.payload is not None:
                    try:
                        value = ForkingPickler.loads(reply.payload)
                    except Exception as exc:
                        if reply.kind == PART:  # the call goes on in the rank; it fails once it finishes
                            error = f"a part could not be unpickled in the parent: {describe_exception(exc)}"
                            reply = replace(reply, payload=None, error=error)
                        else:
                            error = f"the artifacts could not be unpickled in the parent: {describe_exception(exc)}"
                            reply = replace(reply, kind=FAILED, payload=None, error=error)
                self._post(self._on_reply, inc, reply, value)
        except (EOFError, OSError):
            return False
        return True

    def _reap(self, inc: Incarnation, rank: int) -> None:
        process = inc.processes[rank]
        deadline = time.monotonic() + self._kill_grace_s
        # The sentinel fired, so the exit status follows at once; another thread's waitpid may race us for it.
        process.join(self._kill_grace_s)
        while process.exitcode is None and time.monotonic() < deadline:
            process.join(0.01)
        inc.exited[rank].set()
        self._post(self._on_exit, inc, rank, process.pid, process.exitcode)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            logger.debug("event loop closed; dropped an event for %r", callback)
