"""The wire protocol between a `ParallelWorker` and its ranks: picklable requests, replies and the bootstrap.

The parent puts `Request`s (a call, a release or a stop) on each rank's bounded queue; each rank answers with
`Reply`s on its own pipe, and only rank 0's reply carries the artifacts. With more than one rank, `Bootstrap`
tells the ranks where the parent's TCP store listens and which torch.distributed backend to use. Everything here is
module level because both sides pickle it by reference. `describe_exception` and `describe_exit` turn an exception or an
exit status into the one line that replies and errors carry. Package-private: `pipeline.process.worker` and
`pipeline.process._child` import these names directly.

Partial replies (`PART`). While a call runs, its stage may hand results over ahead of the call's final reply with
`WorkerContext.parts.send(part)` (progressive decode: a chunk's frames one latent frame at a time). A part travels
exactly like the final reply's artifacts: pickled in the rank with `ForkingPickler` (so a CPU tensor in it moves to
shared memory and the pipe carries its handle, a CUDA tensor an IPC handle), as a `Reply(rank, PART, op_id, payload)`
on the same reply pipe, unpickled by the parent's watcher thread as soon as it is read, and handed to the loop in
pipe order. Guarantees:
- Ordering: a rank serves one call at a time and writes its parts and then its final reply to one pipe, which the
  watcher reads in order and posts to the loop in order; so the part listeners see a call's parts in the order they
  were sent, all of them before the call's future resolves.
- One rank: only rank 0's parts are sent, like its artifacts (a part sent on another rank is dropped there, never
  pickled); `send` outside a call raises `RuntimeError`, and a part that cannot be pickled raises in the stage, so
  it fails the call like any stage exception.
- Dropped, never half-delivered: parts of a call nobody waits for any more (cancelled, or of an incarnation that is
  gone) are dropped on the loop and counted (`WorkerStatistics.dropped_parts`). A part that cannot be unpickled in
  the parent, or whose listener raises, fails its call (`StageFailedError` once the final reply comes) and the
  call's later parts are dropped, so a listener never sees a gap.
- A call that fails after some parts: the parts already delivered stay delivered (the listener owns them); the call
  fails as any call does. A rank that dies mid-call: everything it wrote before it died is read and delivered
  before its death is (the watcher drains the pipe first), then the call fails with `ActorDiedError`.
- Memory: a part's shared memory is the final reply's kind: the parent always unpickles what it reads (dropped
  parts too), which takes the rank's descriptor, so nothing stays registered in the rank; the parent's mapping is
  freed when the last reference to the part's tensor (or a numpy view of it) goes.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

import torch

__all__: list[str] = []

# torch.distributed imports TCPStore from its C extension without re-exporting it for type checkers.
TCPStore: Any = torch.distributed.TCPStore  # type: ignore[attr-defined]

CALL = "call"
RELEASE = "release"
STOP = "stop"
READY = "ready"
START_FAILED = "start_failed"
DONE = "done"
PART = "part"  # a partial result of the call in flight, ahead of its DONE or FAILED
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Request:
    kind: str
    op_id: int = 0
    payload: bytes = b""  # a call: the StageCall, pickled in the parent so pickling errors surface in invoke()
    session_id: str = ""
    lane: int = 0  # a call's lane (`ParallelWorkerConfig.lanes`); releases and stops run on lane 0


@dataclass(frozen=True, slots=True)
class Reply:
    rank: int
    kind: str
    op_id: int = 0
    payload: bytes | None = None  # rank 0's artifacts (or a part), pickled in the child
    error: str = ""  # "<ExcType>: message"
    detail: str = ""  # the child's traceback, logged at DEBUG in the parent


@dataclass(frozen=True, slots=True)
class Bootstrap:
    store_port: int
    backend: str
    timeout_s: float


def describe_exception(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "an unknown status"
    if exitcode < 0:
        try:
            return f"exit code {exitcode} ({signal.Signals(-exitcode).name})"
        except ValueError:
            return f"exit code {exitcode} (signal {-exitcode})"
    return f"exit code {exitcode}"
