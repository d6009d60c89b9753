"""`transport.livekit.ffi_exit.exit_process`: past the LiveKit FFI's exit race once `livekit.rtc` is loaded (the
atexit hooks run, the streams are flushed, the status is the one given, and Python's finalization never starts), a
plain `sys.exit` otherwise. The child processes stand a module in for `livekit.rtc` (the marker `ffi_loaded` reads):
the race itself needs the FFI's threads to call back at the wrong instant, 1 exit in 11 under load here."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.support.serving import ROOT
from transport.livekit.ffi_exit import exit_process, ffi_loaded

_CHILD = textwrap.dedent(
    """
    import atexit, sys, types

    class Finalized:
        def __del__(self):
            sys.__stderr__.write("finalized\\n")

    KEEP = Finalized()  # a module global: the interpreter's finalization would delete it and run __del__
    if {stand_in}:
        sys.modules["livekit.rtc"] = types.ModuleType("livekit.rtc")
    atexit.register(lambda: sys.__stderr__.write("atexit ran\\n"))
    sys.stdout.write("buffered report")  # no newline, not flushed: exit_process must flush it
    from transport.livekit.ffi_exit import exit_process
    exit_process(3)
    """
)


def _child(*, stand_in: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _CHILD.format(stand_in=stand_in)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_with_the_ffi_loaded_it_runs_the_hooks_flushes_and_exits_without_finalizing() -> None:
    run = _child(stand_in=True)
    assert run.returncode == 3, run.stderr
    assert run.stdout == "buffered report"
    assert "atexit ran" in run.stderr
    assert "finalized" not in run.stderr, "the interpreter's finalization ran"


def test_without_the_ffi_it_is_a_normal_exit() -> None:
    run = _child(stand_in=False)
    assert run.returncode == 3, run.stderr
    assert run.stdout == "buffered report"
    assert "atexit ran" in run.stderr
    assert "finalized" in run.stderr, "a normal exit finalizes the interpreter"


def test_in_a_process_without_livekit_rtc_it_raises_system_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    # A module run earlier on this xdist worker may have loaded the FFI (test_livekit_caller_token's viewer does):
    # the marker is taken away for this call only.
    monkeypatch.delitem(sys.modules, "livekit.rtc", raising=False)
    assert not ffi_loaded()
    with pytest.raises(SystemExit) as raised:
        exit_process(5)
    assert raised.value.code == 5
