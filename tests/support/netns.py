"""Private network namespaces for the end-to-end tests that need a network of their own, with no way out.

Two ways in, for two kinds of test:
- `unshare_prefix()`: the `unshare` command line that runs a whole program in a fresh network and mount namespace
  (as root, or as the root of a new user namespace where unprivileged ones are allowed), or why there is none. The
  air-gap test runs its inside that way (`tests/e2e/airgap_session.py`).
- `PrivateNetwork`: the calling thread itself moves into a fresh network namespace that holds loopback and one veth
  pair (`HOST_A` ⇄ `HOST_B`, both ends inside, the default route on it), and moves back out on exit. Every process
  the thread starts meanwhile — a service, a test server, Chromium through Playwright, an SDK client — is born
  inside and can reach only those addresses; the test's own HTTP clients made on that thread reach them too. A
  veth pair rather than loopback alone because WebRTC stacks gather no loopback candidates (libwebrtc never, aioice
  skips 127.0.0.1). Moving a thread between network namespaces and back needs root in the initial user namespace;
  `private_network_support()` says why not where it is missing.

Linux namespaces are per thread: only the thread that entered is inside; other threads of the test process (an
executor's, pytest-timeout's) stay where they were.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Sequence
from functools import cache
from types import TracebackType

__all__ = [
    "HOST_A",
    "HOST_B",
    "PrivateNetwork",
    "links",
    "private_network_support",
    "run",
    "unshare_prefix",
]

HOST_A, HOST_B = "10.77.0.1", "10.77.0.2"
_LINK_A, _LINK_B = "lkveth0", "lkveth1"
_CLONE_NEWNET = 0x40000000
_TOOLS = ("unshare", "nsenter", "ip")


def run(*commands: Sequence[str]) -> None:
    """Run each command in turn; the first that fails raises `RuntimeError` with its stderr."""
    for command in commands:
        done = subprocess.run(list(command), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}: {done.stderr.strip()}")


def links(prefix: Sequence[str] = ()) -> list[str]:
    """The network interfaces (names, sorted) of the namespace `prefix` runs in (this one by default)."""
    listing = subprocess.run([*prefix, "ip", "-o", "link", "show"], check=True, capture_output=True, text=True).stdout
    return sorted(line.split(":")[1].strip().split("@")[0] for line in listing.splitlines())


@cache
def unshare_prefix() -> list[str] | str:
    """The unshare command line that gives a private network and mount namespace, or why there is none."""
    if not all(shutil.which(tool) for tool in _TOOLS):
        return "needs unshare and nsenter (util-linux) and ip (iproute2)"
    reasons = []
    for prefix in (
        ["unshare", "--net", "--mount"],
        ["unshare", "--user", "--map-root-user", "--net", "--mount"],
    ):
        probe = subprocess.run(
            [
                *prefix,
                "--",
                "sh",
                "-c",
                "ip tuntap add dev probe0 mode tun && ip link add probe1 type veth peer probe2",
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if probe.returncode == 0:
            return prefix
        reasons.append(f"{' '.join(prefix)}: {probe.stderr.strip()}")
    return "cannot create a private network namespace here (" + "; ".join(reasons) + ")"


@cache
def private_network_support() -> str | None:
    """None when `PrivateNetwork` can be entered here; otherwise why not (for a skip)."""
    if not all(shutil.which(tool) for tool in _TOOLS):
        return "needs unshare and nsenter (util-linux) and ip (iproute2)"
    if os.geteuid() != 0:
        return "needs root: a thread enters a private network namespace and returns (setns needs CAP_SYS_ADMIN)"
    probe = subprocess.run(
        ["unshare", "--net", "--", "ip", "link", "add", "probe0", "type", "veth", "peer", "probe1"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"cannot create a network namespace with a veth pair here: {probe.stderr.strip()}"
    return None


def _libc_call(name: str, *args: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{name}: {os.strerror(errno)}")


class PrivateNetwork:
    """The calling thread in a new network namespace: `lo` up and a veth pair `HOST_A/24` ⇄ `HOST_B/24`.

    Use as a context manager on the thread that will start the processes (a module fixture on pytest's main
    thread). Sockets keep the namespace they were created in: make the test's clients inside the block. Leaving it
    returns the thread to the namespace it came from; the private one lives on only while a process started in it
    does, so end them first.
    """

    def __init__(self) -> None:
        self._home: int | None = None

    def __enter__(self) -> PrivateNetwork:
        reason = private_network_support()
        if reason is not None:
            raise RuntimeError(reason)
        home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
        try:
            _libc_call("unshare", _CLONE_NEWNET)
        except BaseException:
            os.close(home)
            raise
        self._home = home
        try:
            run(
                ["ip", "link", "set", "lo", "up"],
                ["ip", "link", "add", _LINK_A, "type", "veth", "peer", _LINK_B],
                ["ip", "addr", "add", f"{HOST_A}/24", "dev", _LINK_A],
                ["ip", "addr", "add", f"{HOST_B}/24", "dev", _LINK_B],
                ["ip", "link", "set", _LINK_A, "up"],
                ["ip", "link", "set", _LINK_B, "up"],
                # Chromium gathers candidates only on the interface of the default route (it finds it by
                # connecting a UDP socket, which sends nothing). Nothing routed there can leave: the namespace
                # has no other link and does not forward.
                ["ip", "route", "add", "default", "via", HOST_B, "dev", _LINK_B],
            )
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._leave()

    def _leave(self) -> None:
        home, self._home = self._home, None
        if home is not None:
            try:
                _libc_call("setns", home, _CLONE_NEWNET)
            finally:
                os.close(home)

    @property
    def links(self) -> list[str]:
        return links()
