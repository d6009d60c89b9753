"""How a `ParallelWorker` starts its ranks' processes: a fresh "spawn" interpreter each, or a fork of a forkserver
that has already imported torch and the model code.

A spawned rank is a new interpreter that imports torch and the stage's modules before it can answer: 7.5-9.2 s on
the shared 2-core machine (docs/continuity.md), which is nearly all of a worker-loss recovery. A "forkserver" rank
is forked from a server process that imported them once, so its start is the fork and the unpickling of its
arguments (tens of milliseconds). The server is itself a fresh interpreter, started by fork-and-exec like a spawned
process, never a fork of the caller: it inherits no livekit state, no CUDA context and no threads of the service,
and it must not create any itself, so it imports only modules that do no such work at import (torch does not
initialise CUDA until asked). Each rank initialises its device after the fork, as a spawned one does.

The server is one per parent process (multiprocessing's own). It starts at the first rank started through it, with
the modules every config asked for until then (`forkserver_preload`: torch, the rank's entry point and the stage
factory's module, plus `ParallelWorkerConfig.preload`); a module asked for later is imported in each rank instead
(correct, only slower). Its ranks inherit the server's environment, fixed when it started: set the workers'
environment (`OMP_WAIT_POLICY`, ...) before the first worker starts, or call `start_forkserver` after setting it.
If the server dies, the next start begins a new one.
"""

from __future__ import annotations

import io
import logging
import multiprocessing.forkserver
import os
import threading
import time
from collections.abc import Callable
from multiprocessing import popen_forkserver, reduction, spawn, util
from multiprocessing.context import BaseContext, ForkServerProcess, set_spawning_popen
from multiprocessing.process import BaseProcess

import torch.multiprocessing as torch_mp

from pipeline.process.records import ParallelWorkerConfig

__all__ = ["forkserver_preload", "process_context", "rank_process", "start_forkserver"]

logger = logging.getLogger(__name__)

_BASE_PRELOAD = ("torch", "pipeline.process._child", "pipeline.process.starter")
_MAIN_KEYS = frozenset({"init_main_from_name", "init_main_from_path"})
_lock = threading.Lock()
_preload: list[str] = list(_BASE_PRELOAD)


def forkserver_preload(config: ParallelWorkerConfig) -> tuple[str, ...]:
    """The modules a forkserver should hold for `config`'s ranks: torch, the rank's entry point, the stage
    factory's module and `config.preload`."""
    wanted = [*_BASE_PRELOAD, _factory_module(config), *config.preload]
    return tuple(dict.fromkeys(name for name in wanted if name and name != "__main__"))


def process_context(config: ParallelWorkerConfig) -> BaseContext:
    """The multiprocessing context that starts `config`'s ranks. For "forkserver" the server runs when this
    returns (started with `config`'s modules when this is its first use: blocking for seconds, so call it off the
    event loop)."""
    if config.start_method == "spawn":
        return torch_mp.get_context("spawn")
    start_forkserver(forkserver_preload(config))
    return torch_mp.get_context("forkserver")


def rank_process(
    config: ParallelWorkerConfig, ctx: BaseContext, target: Callable[..., None], args: tuple[object, ...], name: str
) -> BaseProcess:
    """A daemon process (not started) of `ctx` running `target(*args)`. Through the forkserver, the rank does not
    import the parent's `__main__` (unless the stage factory lives there): multiprocessing would run it in every
    child, and a service's or a benchmark's main module imports the whole service (seconds per rank)."""
    if config.start_method == "spawn" or _factory_module(config) == "__main__":
        # daemon: the interpreter's exit handler ends forgotten workers instead of waiting for them
        return ctx.Process(target=target, args=args, name=name, daemon=True)  # type: ignore[attr-defined, no-any-return]
    return _RankProcess(target=target, args=args, name=name, daemon=True)


class _RankPopen(popen_forkserver.Popen):
    """The forkserver's launch, less the parent's `__main__` in the child's preparation data.

    The body is the standard library's (`popen_forkserver.Popen._launch`, CPython 3.11-3.13) but for the filter;
    the one place this package leans on multiprocessing's internals."""

    def _launch(self, process_obj: BaseProcess) -> None:
        prep_data = {
            key: value for key, value in spawn.get_preparation_data(process_obj.name).items() if key not in _MAIN_KEYS
        }
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = multiprocessing.forkserver.connect_to_new_process(self._fds)  # type: ignore[attr-defined]
        # A duplicate of the data pipe's write end: the child's sentinel of its parent (`parent_process()`).
        parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (parent_w, self.sentinel))  # type: ignore[attr-defined]
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        self.pid = multiprocessing.forkserver.read_signed(self.sentinel)


class _RankProcess(ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: BaseProcess) -> _RankPopen:
        return _RankPopen(process_obj)


def _factory_module(config: ParallelWorkerConfig) -> str:
    factory = config.stage_factory
    return str(getattr(factory, "__module__", None) or type(factory).__module__)


def start_forkserver(modules: tuple[str, ...] = ()) -> float:
    """Start this process's forkserver if it is not running, with `modules` imported in it besides those asked for
    before, and wait until it serves (it has imported them and forked a first child); returns the seconds that
    took, 0.0 when it was running already. Blocking (seconds for torch): call it at start-up or off the loop."""
    with _lock:
        for name in modules:
            if name not in _preload:
                _preload.append(name)
        server = multiprocessing.forkserver._forkserver
        server.set_forkserver_preload(list(_preload))
        before = server._forkserver_pid  # type: ignore[attr-defined]
        started = time.perf_counter()
        server.ensure_running()  # notices a dead server (and starts another)
        if server._forkserver_pid == before:  # type: ignore[attr-defined]
            return 0.0
        # The server imports its modules before it accepts: a first child returning means it serves.
        probe = _RankProcess(target=_probe, name="lingstream-forkserver-probe")
        probe.start()
        probe.join()
        elapsed = time.perf_counter() - started
        if probe.exitcode != 0:
            raise RuntimeError(f"the forkserver's first child exited with {probe.exitcode}")
    logger.info("forkserver ready in %.2f s, preloading %s", elapsed, ", ".join(_preload))
    return elapsed


def _probe() -> None:
    """The forkserver's first child: returns at once."""
