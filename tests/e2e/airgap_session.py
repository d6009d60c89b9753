"""The inside of tests/e2e/test_airgap.py: run as root of a fresh network and mount namespace (`unshare`), it builds
a network with no way out, runs `lingstream serve` and a real Chromium session in it, and writes what tried to leave.

`python -m tests.e2e.airgap_session REPORT.json WORKDIR`, from the repository root, inside the namespaces.

Two network namespaces joined by a veth pair, neither with a way out:
- the service's (the one `unshare` made): loopback, `svc0` (10.213.1.1, where `lingstream serve` listens and its
  ICE candidates are) and `trap0`, a tun device this process holds open, with an address like a network card's
  and both default routes. Every packet the service or any process it starts sends to a non-local address is
  routed into the trap, read here (protocol, destination, port, the name a DNS query asks for) and dropped.
  `/etc/resolv.conf` is bind-mounted to name a server behind the trap, so a name lookup shows up as a packet too.
  Two probes at the start (a datagram to a documentation address, a lookup of an `.invalid` name) must be seen:
  they prove the trap watches what it should.
- the browser's (bound to a file in WORKDIR, entered with `nsenter`): loopback and `web0` (10.213.1.2), no route
  anywhere else. Chromium runs here, so its own background services (sign-in, autofill, updates: the harness's
  browser, not the product) fail without being mistaken for the service's traffic; what the page asks for is
  witnessed by Playwright instead (every request of the browser context, every WebSocket, and the peer
  connection's ICE servers).
The service's Python processes also carry an audit hook (`netaudit/sitecustomize.py`) that names the caller of any
connect, sendto or name lookup aimed outside the test network; sockets Python does not create (uvloop's, native
libraries') only the trap sees.

The session: the page creates a session on the reference model, receives video over the embedded WebRTC transport
(frames counted by the page) while `w` is held, and stops; then `/docs` renders the API reference from the
service's own Swagger UI files (a screenshot is saved). The report is written whatever happens (`error`).
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from playwright.sync_api import Page, sync_playwright

from tests.support.browser.chromium import CHROMIUM, CHROMIUM_ARGS
from tests.support.netns import links, run
from tests.support.serving import ROOT, free_port, lingstream

TRAP, TRAP_V4, TRAP_V6 = "trap0", "10.213.0.1", "fd00:213::1"
NAMESERVER = "10.213.0.53"  # behind the trap: a lookup is a packet there
SERVICE_LINK, SERVICE_ADDRESS = "svc0", "10.213.1.1"
BROWSER_NETNS, BROWSER_LINK, BROWSER_ADDRESS = "browser.netns", "web0", "10.213.1.2"
TEST_NETWORK = (TRAP_V4, TRAP_V6, SERVICE_ADDRESS, BROWSER_ADDRESS)
PROBE = ("192.0.2.1", 9)  # TEST-NET-1, the discard port
NETAUDIT = Path(__file__).resolve().parent / "netaudit"
WIDTH, HEIGHT = 128, 96
FRAMES = 24  # one and a half chunks at the page's default 16 fps
STARTUP_S = 60.0
WAIT_MS = 30_000
_TUNSETIFF, _IFF_TUN, _IFF_NO_PI = 0x400454CA, 0x0001, 0x1000
_HOUSEKEEPING = {2: "igmp", 58: "icmpv6"}  # the kernel's own multicast and neighbour chatter on a new link
_PROTOCOLS = {1: "icmp", 6: "tcp", 17: "udp"}


def main(report_path: Path, workdir: Path) -> int:
    report: dict[str, Any] = {"error": None}
    try:
        with _Trap(TRAP) as trap:
            report["interfaces"] = _build_network(workdir)
            report["probes"] = _probe(trap)
            report.update(_session(workdir))
            time.sleep(0.5)  # let the last packets of the shutdown reach the trap before it closes
            report["trap_tx_packets"] = _tx_packets(TRAP)
        report["packets"] = trap.packets
        report["housekeeping"] = trap.housekeeping
    except Exception:
        report["error"] = traceback.format_exc()
    report_path.write_text(json.dumps(report, indent=2))
    return 0 if report["error"] is None else 1


def _build_network(workdir: Path) -> dict[str, list[str]]:
    """The trap's routes, the browser's namespace (bound to a file in WORKDIR: nothing is left on the host) and the
    veth pair between the two; `/etc/resolv.conf` (in this private mount namespace only) naming the trap."""
    browser = _in_browser_netns(workdir)
    run(
        ["ip", "link", "set", "lo", "up"],
        ["ip", "link", "set", TRAP, "up"],
        ["ip", "addr", "add", f"{TRAP_V4}/24", "dev", TRAP],
        ["ip", "-6", "addr", "add", f"{TRAP_V6}/64", "dev", TRAP, "nodad"],
        ["ip", "route", "add", "default", "dev", TRAP],
        ["ip", "-6", "route", "add", "default", "dev", TRAP],
        ["touch", str(workdir / BROWSER_NETNS)],
        ["unshare", f"--net={workdir / BROWSER_NETNS}", "true"],
        [*browser, "ip", "link", "add", BROWSER_LINK, "type", "veth", "peer", SERVICE_LINK, "netns", str(os.getpid())],
        ["ip", "addr", "add", f"{SERVICE_ADDRESS}/24", "dev", SERVICE_LINK],
        ["ip", "link", "set", SERVICE_LINK, "up"],
        [*browser, "ip", "link", "set", "lo", "up"],
        [*browser, "ip", "addr", "add", f"{BROWSER_ADDRESS}/24", "dev", BROWSER_LINK],
        [*browser, "ip", "link", "set", BROWSER_LINK, "up"],
    )
    resolv = workdir / "resolv.conf"
    resolv.write_text(f"nameserver {NAMESERVER}\noptions timeout:1 attempts:1\n")
    run(["mount", "--bind", str(resolv), "/etc/resolv.conf"])
    return {"service": links(), "browser": links(browser)}


def _in_browser_netns(workdir: Path) -> list[str]:
    return ["nsenter", f"--net={workdir / BROWSER_NETNS}", "--"]


class _Trap:
    """A tun device that this process holds open: whatever the kernel routes to it arrives here as an IP packet (read
    on a thread and recorded) and goes no further. Opened before its addresses and routes are added."""

    def __init__(self, name: str) -> None:
        self.packets: list[dict[str, Any]] = []
        self.housekeeping: dict[str, int] = {}
        self._fd = os.open("/dev/net/tun", os.O_RDWR)
        fcntl.ioctl(self._fd, _TUNSETIFF, struct.pack("16sH", name.encode(), _IFF_TUN | _IFF_NO_PI))
        self._stop = threading.Event()
        self._seen = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="trap", daemon=True)

    def __enter__(self) -> _Trap:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        os.close(self._fd)

    def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float) -> bool:
        with self._seen:
            return self._seen.wait_for(lambda: predicate(self.packets), timeout=timeout)

    def forget(self) -> None:
        with self._seen:
            self.packets.clear()

    def _run(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self._fd], [], [], 0.1)
            if not ready:
                continue
            packet = _parse(os.read(self._fd, 65535))
            with self._seen:
                if packet["protocol"] in _HOUSEKEEPING.values():
                    self.housekeeping[packet["protocol"]] = self.housekeeping.get(packet["protocol"], 0) + 1
                else:
                    self.packets.append(packet)
                self._seen.notify_all()


def _parse(data: bytes) -> dict[str, Any]:
    """Protocol, destination and port of a raw IP packet (a tun device without packet information)."""
    version = data[0] >> 4 if data else 0
    if version == 4:
        header, number = (data[0] & 0x0F) * 4, data[9]
        destination, payload = ipaddress.ip_address(data[16:20]), data[header:]
    elif version == 6:
        number, destination, payload = data[6], ipaddress.ip_address(data[24:40]), data[40:]
    else:
        return {"protocol": f"not IP (version {version})", "bytes": len(data)}
    protocol = _HOUSEKEEPING.get(number) or _PROTOCOLS.get(number) or f"ip protocol {number}"
    packet: dict[str, Any] = {"protocol": protocol, "destination": str(destination)}
    if number in {6, 17} and len(payload) >= 4:
        packet["port"] = int.from_bytes(payload[2:4], "big")
    if number == 17 and packet.get("port") == 53:
        packet["query"] = _dns_name(payload[8 + 12 :])
    return packet


def _dns_name(question: bytes) -> str:
    """The name asked for in a DNS query's first question (for the report: who looked up what)."""
    labels: list[str] = []
    at = 0
    while at < len(question) and question[at] and len(labels) < 64:
        size = question[at]
        labels.append(question[at + 1 : at + 1 + size].decode("ascii", "replace"))
        at += 1 + size
    return ".".join(labels)


def _probe(trap: _Trap) -> dict[str, Any]:
    """Prove the trap sees what leaves: a datagram to a documentation address and a name lookup; then forget them."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.sendto(b"airgap probe", PROBE)
    datagram = trap.wait_for(lambda seen: any(p.get("destination") == PROBE[0] for p in seen), timeout=5)
    with contextlib.suppress(OSError):
        socket.getaddrinfo("airgap-probe.invalid", 80)
    lookup = trap.wait_for(lambda seen: any(p.get("query") == "airgap-probe.invalid" for p in seen), timeout=5)
    packets = len(trap.packets)
    trap.forget()
    return {"datagram": datagram, "lookup": lookup, "packets": packets}


def _tx_packets(interface: str) -> int:
    for line in Path("/proc/self/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == interface:
            return int(counters.split()[9])
    raise RuntimeError(f"{interface} is not in /proc/self/net/dev")


def _session(workdir: Path) -> dict[str, Any]:
    audit = workdir / "netaudit.jsonl"
    audit.touch()
    port = free_port()
    url = f"http://{SERVICE_ADDRESS}:{port}"
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_", "OTEL_"))}
    env.update(
        PYTHONPATH=f"{NETAUDIT}{os.pathsep}{ROOT}",
        LINGSTREAM_TEST_NET_AUDIT=str(audit),
        LINGSTREAM_TEST_LOCAL_ADDRESSES=",".join(TEST_NETWORK),
        LINGSTREAM_HOST=SERVICE_ADDRESS,
        LINGSTREAM_TORCH_THREADS="1",
        LINGSTREAM_NUM_WORKERS="1",
        LINGSTREAM_DRAIN_TIMEOUT="5",
    )
    log = workdir / "serve.log"
    with log.open("wb") as sink:
        service = subprocess.Popen(
            [*lingstream(), "serve", "--port", str(port)], cwd=ROOT, env=env, stdout=sink, stderr=sink
        )
    browser_wrapper = workdir / "chromium-in-netns"
    browser_wrapper.write_text(f'#!/bin/sh\nexec {" ".join(_in_browser_netns(workdir))} {CHROMIUM} "$@"\n')
    browser_wrapper.chmod(0o755)
    requests: list[str] = []
    result: dict[str, Any] = {"service_log": str(log), "url": url}
    try:
        _wait_ready(url, service, log)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(browser_wrapper), args=CHROMIUM_ARGS)
            try:
                context = browser.new_context()
                context.on("request", lambda request: requests.append(request.url))
                page = context.new_page()
                page.on("websocket", lambda socket: requests.append(socket.url))
                page.set_default_timeout(WAIT_MS)
                result.update(_stream(page, url))
                result.update(_docs(page, url, workdir))
                context.close()
            finally:
                browser.close()
    finally:
        if service.poll() is None:
            service.send_signal(signal.SIGTERM)
            try:
                service.wait(timeout=20)
            except subprocess.TimeoutExpired:
                service.kill()
                service.wait(timeout=10)
    result["service_exit"] = service.returncode
    result["requests"] = requests
    result["foreign_requests"] = [r for r in requests if not _same_origin(r, url)]
    result["python_attempts"] = [json.loads(line) for line in audit.read_text().splitlines() if line.strip()]
    result["service_traceback"] = "Traceback" in log.read_text(errors="replace")
    return result


def _wait_ready(url: str, service: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            if service.poll() is not None:
                raise RuntimeError(f"lingstream serve exited with {service.returncode}:\n{log.read_text()}")
            with contextlib.suppress(httpx.TransportError):
                if client.get(f"{url}/readyz").status_code == 200:
                    return
            time.sleep(0.05)  # polling another process against a deadline
    raise RuntimeError(f"lingstream serve was not ready in {STARTUP_S} s:\n{log.read_text()}")


def _stream(page: Page, url: str) -> dict[str, Any]:
    page.goto(f"{url}/")
    page.wait_for_function("window.lingstream !== undefined")
    page.fill("#width", str(WIDTH))
    page.fill("#height", str(HEIGHT))
    page.click("#start")
    page.wait_for_function("window.lingstream.frames >= 1")
    page.focus("#stage")
    page.keyboard.down("w")  # an idle session renders only its first chunk; a held key keeps it generating
    page.wait_for_function("(n) => window.lingstream.frames >= n", arg=FRAMES)
    page.keyboard.up("w")
    streamed = {
        "transport": page.evaluate("window.lingstream.transport"),
        "connection": page.evaluate("window.lingstream.pc.connectionState"),
        "ice_servers": page.evaluate("window.lingstream.pc.getConfiguration().iceServers"),
        "video_size": page.evaluate("window.lingstream.videoSize"),
        "frames": page.evaluate("window.lingstream.frames"),
    }
    page.click("#stop")
    page.wait_for_function("window.lingstream.state === 'closed'")
    return streamed


def _docs(page: Page, url: str, workdir: Path) -> dict[str, Any]:
    page.goto(f"{url}/docs")
    page.locator(".opblock-summary-path", has_text="/v1/sessions").first.wait_for()
    screenshot = workdir / "docs.png"
    page.screenshot(path=str(screenshot), full_page=True)
    return {"docs_operations": page.locator(".opblock").count(), "docs_screenshot": str(screenshot)}


def _same_origin(request_url: str, origin: str) -> bool:
    parts, home = urlsplit(request_url), urlsplit(origin)
    if parts.scheme in {"data", "blob", "about"}:
        return True
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return (scheme, parts.netloc) == (home.scheme, home.netloc)


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
