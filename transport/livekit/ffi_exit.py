"""Leaving a process that has loaded the LiveKit FFI (`livekit.rtc`) without the abort it can die of at exit.

The FFI's tokio threads call back into Python (events, log records) through a ctypes callback. The SDK disposes the
FFI in an `atexit` hook, but a callback can still come after it: once `Py_FinalizeEx` has begun, CPython 3.11
ends any non-main thread that asks for the GIL with `pthread_exit`, whose forced unwind meets the Rust thread's
`extern "C"` start frame, and Rust aborts the whole process ("panic in a function that cannot unwind", SIGABRT,
exit status -6, a core file). Seen here: 1 exit in 11 of the Python client under CPU load (a core's main thread in
`finalize_modules`, the aborting tokio worker unwinding from its thread start), and twice in one CI run.

`exit_process(code)` runs the `atexit` hooks (the SDK's disposal among them), flushes the standard streams and the
logging handlers, then ends the process with `os._exit(code)`: no finalization, so no thread can be ended mid-call.
In a process that never loaded `livekit.rtc` it is a plain `sys.exit(code)`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
from typing import NoReturn

__all__ = ["exit_process", "ffi_loaded"]

_FFI_MODULE = "livekit.rtc"


def ffi_loaded() -> bool:
    """Whether this process has imported `livekit.rtc` (and so may have the FFI's threads running)."""
    return _FFI_MODULE in sys.modules


def exit_process(code: int) -> NoReturn:
    """End the process with `code`: past the FFI's exit race when `livekit.rtc` is loaded, else `sys.exit`."""
    if not ffi_loaded():
        sys.exit(code)
    atexit._run_exitfuncs()  # the SDK's FFI disposal, and every other hook a normal exit would run
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed or broken: nothing more to say on it
            stream.flush()
    os._exit(code)
