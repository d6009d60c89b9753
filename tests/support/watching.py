"""`SessionWatch`: one session's Python client as a player runs it, for the tests and benches that take replicas
away under it (issue #33): it joins once through a front door, reads every frame and the states it is told, and
leaves every reconnect to the client itself (`connect(..., reconnect=...)`); on `stop` it stops the session and keeps
its `done`. What it records is what the continuity figures read: the gap at the client from the last frame over the
first connection to the first over the next (`gap`), and how often the stream joined again.

    watch = SessionWatch(sid, door)
    task = asyncio.create_task(watch_session(watch, api_key, policy))
    ...
    watch.stop.set(); await task
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.support.front_door import FrontDoor
from transport.base import DoneStatus, StateStatus
from transport.client import LiveStream, ReconnectPolicy, ServiceClient, connect

__all__ = ["SessionWatch", "rejoined_at", "watch_session"]


def rejoined_at(states: list[tuple[float, StateStatus]], after: float = float("-inf")) -> float:
    """When a stream joined its session again after `after` (its own `running`/`reconnected` status), or infinity."""
    return next((at for at, state in states if at > after and state.detail == "reconnected"), float("inf"))


@dataclass
class SessionWatch:
    """One session's client behind `door`: each frame's arrival and chunk index (-1 before the first chunk status),
    the states it was told, its stream, and its `done` once `stop` was set and the session stopped."""

    sid: str
    door: FrontDoor
    frames: list[tuple[float, int]] = field(default_factory=list)
    states: list[tuple[float, StateStatus]] = field(default_factory=list)
    done: DoneStatus | None = None
    stream: LiveStream | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    def frames_after(self, at: float) -> int:
        return sum(1 for t, _ in self.frames if t > at)

    def rejoined_at(self, after: float = float("-inf")) -> float:
        return rejoined_at(self.states, after)

    def gap(self, after: float = float("-inf")) -> float:
        """The hiccup at the client around its first rejoin after `after`: the last frame over the connection it
        lost to the first over the one it joined."""
        at = self.rejoined_at(after)
        return min(t for t, _ in self.frames if t > at) - max(t for t, _ in self.frames if t <= at)

    def streaming_again(self, after: float, count: int = 3) -> Callable[[], bool]:
        """A condition for `until`: `count` frames arrived over a connection joined after `after`."""
        return lambda: self.frames_after(self.rejoined_at(after)) >= count


async def watch_session(watch: SessionWatch, api_key: str, policy: ReconnectPolicy) -> None:
    """The client: join once through the door, read every frame until `stop`, then stop the session and keep its
    `done`. A stream that ends by itself (its reconnect gave up) raises `AssertionError` with its reason."""
    async with ServiceClient(watch.door.url, api_key=api_key) as service:
        stream = watch.stream = await connect(service, await service.wait_streaming(watch.sid), reconnect=policy)
        stream.add_status_listener(
            lambda m: watch.states.append((time.monotonic(), m)) if isinstance(m, StateStatus) else None
        )
        try:
            await stream.send_keys(["w", "l"])
            while not watch.stop.is_set():
                frame = await stream.next_frame()
                assert frame is not None, f"{watch.sid}: the stream ended: {stream.done} {stream.errors}"
                watch.frames.append((frame.received_at, frame.chunk.index if frame.chunk else -1))
            watch.done = await asyncio.wait_for(stream.stop(), 30)
        finally:
            await stream.aclose()
