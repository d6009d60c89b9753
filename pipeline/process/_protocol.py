"""The wire protocol between a `ParallelWorker` and its ranks: picklable requests, replies and the bootstrap.

The parent puts `Request`s (a call, a release or a stop) on each rank's bounded queue; each rank answers with
`Reply`s on its own pipe, and only rank 0's reply carries the artifacts. With more than one rank, `Bootstrap`
tells the ranks where the parent's TCP store listens and which torch.distributed backend to use. Everything here is
module level because both sides pickle it by reference. `describe_exception` and `describe_exit` turn an exception or an
exit status into the one line that replies and errors carry. Package-private: `pipeline.process.worker` and
`pipeline.process._child` import these names directly.
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
FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Request:
    kind: str
    op_id: int = 0
    payload: bytes = b""  # a call: the StageCall, pickled in the parent so pickling errors surface in invoke()
    session_id: str = ""


@dataclass(frozen=True, slots=True)
class Reply:
    rank: int
    kind: str
    op_id: int = 0
    payload: bytes | None = None  # rank 0's artifacts, pickled in the child
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
