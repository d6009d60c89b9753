"""Running the app under uvicorn in one process, with SIGTERM turned into a drain.

uvicorn's own handling of SIGTERM stops listening at once and re-raises the signal after shutdown (so the process
would die by the signal, not exit 0). `DrainingServer` replaces it: the first SIGTERM or SIGINT starts the
runtime's drain while the server keeps serving (readiness answers 503, running sessions keep their streams and
their final status reaches the clients); once the drain is complete the server shuts down normally and the
process exits 0. A second signal skips the rest of the drain (a second SIGINT also skips the graceful close of
connections). One process only: never fork after `livekit.rtc` is imported, so no uvicorn workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Iterator
from types import FrameType

import uvicorn

from service.runtime.runtime import ServiceRuntime

__all__ = ["DrainingServer"]

logger = logging.getLogger(__name__)

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DrainingServer(uvicorn.Server):
    """A `uvicorn.Server` whose first SIGTERM/SIGINT drains the runtime before the server stops.

    `handle_signals=False` leaves the process's signal handlers alone (tests that run a server inside pytest);
    `request_drain()` is then the way to trigger the same path.
    """

    def __init__(self, config: uvicorn.Config, runtime: ServiceRuntime, *, handle_signals: bool = True) -> None:
        super().__init__(config)
        self._runtime = runtime
        self._handle_signals = handle_signals
        self._drain_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if not self._handle_signals:
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._drain_requested:
            logger.warning("second %s: stopping without waiting for the drain", signal.Signals(sig).name)
            if sig == signal.SIGINT and self.should_exit:
                self.force_exit = True
            self.should_exit = True
            return
        logger.warning("%s received: draining", signal.Signals(sig).name)
        self.request_drain()

    def request_drain(self) -> None:
        """Start the drain on the server's loop (thread-safe); the server stops once it is complete."""
        self._drain_requested = True
        loop = self._loop
        if loop is None:
            self.should_exit = True
            return
        loop.call_soon_threadsafe(self._runtime.start_drain, "signal")

    async def on_tick(self, counter: int) -> bool:
        if self._drain_requested and self._runtime.drain_complete:
            self.should_exit = True
        return await super().on_tick(counter)
