"""Test-only: records every attempt of this Python process to reach a non-local address (tests/e2e/test_airgap.py).

Python imports `sitecustomize` at start from the first directory on `sys.path` that has one; the air-gap test puts
this directory first on PYTHONPATH for `lingstream serve`, so the service and the model-worker processes it spawns
all carry the hook. With `LINGSTREAM_TEST_NET_AUDIT` naming a file, an audit hook (PEP 578) appends one JSON line per
`socket.connect`/`socket.sendto` to an address that is not loopback or one of `LINGSTREAM_TEST_LOCAL_ADDRESSES`,
and per name resolution of anything but such an address or `localhost`, with the innermost frames of the caller.
It observes only; the network namespace the test runs in is what makes the attempt fail. Sockets that Python does
not create (uvloop's, native libraries') are invisible here: the test's packet capture sees their packets.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import sys
import threading
import traceback

_PATH = os.environ.get("LINGSTREAM_TEST_NET_AUDIT")
_LOCAL = {a for a in os.environ.get("LINGSTREAM_TEST_LOCAL_ADDRESSES", "").split(",") if a}
_NAMES = {"", "localhost", "localhost.localdomain", "ip6-localhost"}
_LOOKUPS = {"socket.getaddrinfo", "socket.gethostbyname", "socket.gethostbyname_ex", "socket.gethostbyaddr"}


def _is_local_host(host: object) -> bool:
    if host is None:
        return True
    text = host.decode() if isinstance(host, bytes) else str(host)
    if text.lower() in _NAMES or text in _LOCAL:
        return True
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return False  # a name: resolving it is already an attempt to use the network
    return address.is_loopback or address.is_link_local or address.is_unspecified or str(address) in _LOCAL


def _install(path: str) -> None:
    sink = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the life of the process
    lock = threading.Lock()

    def record(event: str, target: object) -> None:
        frames = traceback.format_stack(limit=8)[:-2]
        line = json.dumps({"pid": os.getpid(), "event": event, "target": repr(target), "stack": frames})
        with lock:
            sink.write(line + "\n")

    def hook(event: str, args: tuple[object, ...]) -> None:
        if event in {"socket.connect", "socket.sendto"}:
            sock, address = args[0], args[-1]
            if getattr(sock, "family", None) not in {socket.AF_INET, socket.AF_INET6}:
                return
            if isinstance(address, tuple) and not _is_local_host(address[0]):
                record(event, address)
        elif event in _LOOKUPS and not _is_local_host(args[0]):
            record(event, args[0])

    sys.addaudithook(hook)


if _PATH:
    _install(_PATH)
