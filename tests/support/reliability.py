"""Harnesses for the reliability tests: the app in-process around any model workers and transport, and a real
`lingstream serve` process on a free loopback port with an SSE reader.

In-process runs use the app's real lifespan and httpx's ASGI transport (the service's own code end to end, minus
uvicorn). Process runs start `lingstream serve` like production does (uvicorn, signals, its own event loop); their
model workers come from the test-only `--worker-factory` hook (`LINGSTREAM_TEST_HOOKS=1`), and polling them has a
deadline, since another process has no event the test could await.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from fastapi import FastAPI

from pipeline.bidirectional import BidirectionalService, ChunkOutput
from pipeline.lingbot.camera import CameraController
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.seam import WorldModel
from service.app import create_app, runtime_of
from service.runtime.runtime import ServiceRuntime
from service.settings import Settings, load_settings
from service.transports import livekit_config
from tests.support.fakes.livekit import FakeRoomFactory, FakeRoomService
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.fakes.world import FakeWorld
from tests.support.service_harness import FAST
from tests.support.waits import until
from transport.base import Transport
from transport.livekit.transport import LiveKitTransport

WAIT_S = 15.0


# -- in-process -----------------------------------------------------------------------------------------------------


@dataclass
class App:
    app: FastAPI
    runtime: ServiceRuntime
    workers: list[Any]
    client: httpx.AsyncClient
    transport: Transport | None
    headers: dict[str, str] = field(default_factory=dict)

    async def create(self, body: Any = None, **kwargs: Any) -> httpx.Response:
        kwargs.setdefault("headers", self.headers)
        return await self.client.post("/v1/sessions", json={} if body is None else body, **kwargs)

    async def get(self, session_id: str) -> dict[str, Any]:
        response = await self.client.get(f"/v1/sessions/{session_id}", headers=self.headers)
        body: dict[str, Any] = response.json()
        return body

    async def metrics(self) -> str:
        return (await self.client.get("/metrics")).text


@contextlib.asynccontextmanager
async def running_app(
    factory: Callable[[Settings], Sequence[BidirectionalService]],
    *,
    transport: Any = None,
    settings: Settings | None = None,
    **overrides: Any,
) -> AsyncIterator[App]:
    """The app on the workers `factory` builds, lifespan running and workers started; `overrides` are settings.
    `transport` is a `Transport` (or a test double of one)."""
    loaded = settings if settings is not None else load_settings(**overrides)
    workers: list[Any] = []

    def build(s: Settings) -> Sequence[BidirectionalService]:
        workers.extend(factory(s))
        return workers

    app = create_app(loaded, worker_factory=build, transport=transport, tuning=FAST)
    async with app.router.lifespan_context(app):
        runtime = runtime_of(app)
        await runtime.wait_ready()
        asgi = httpx.ASGITransport(app=app, client=("127.0.0.1", 50000))
        async with httpx.AsyncClient(transport=asgi, base_url="http://testserver", timeout=WAIT_S) as client:
            yield App(app, runtime, workers, client, transport)


LIVEKIT_KEY = "devkey"
LIVEKIT_SECRET = "secret-that-is-long-enough-for-hs256-0123456789"


def paced_fakes(settings: Settings) -> list[FakeWorld]:
    return [FakeWorld(pace_s=0.05, frame_size=32) for _ in range(settings.num_workers)]


@dataclass
class LiveKit:
    app: App
    transport: LiveKitTransport
    rooms: FakeRoomFactory
    server: FakeRoomService


@contextlib.asynccontextmanager
async def livekit_app(**overrides: Any) -> AsyncIterator[LiveKit]:
    """The app with the real LiveKit transport, built from the settings like `lingstream serve` builds it, over the
    in-process fake RoomService (real livekit-api over HTTP on loopback) and scripted rooms; paced fake workers.
    `overrides` are settings; LIVEKIT_API_KEY/SECRET default to the fakes' pair."""
    key = overrides.pop("livekit_api_key", LIVEKIT_KEY)
    secret = overrides.pop("livekit_api_secret", LIVEKIT_SECRET)
    server = FakeRoomService(key, secret)
    url = await server.start()
    settings = load_settings(livekit_url=url, livekit_api_key=key, livekit_api_secret=secret, **overrides)
    rooms = FakeRoomFactory(server.api_key, server.api_secret)
    transport = LiveKitTransport(livekit_config(settings), room_factory=rooms, timers=FakeTimers())
    try:
        async with running_app(paced_fakes, transport=transport, settings=settings) as app:
            yield LiveKit(app, transport, rooms, server)
    finally:
        await server.close()


async def wait_status(app: App, session_id: str, *statuses: str, within: float = WAIT_S) -> dict[str, Any]:
    found: dict[str, Any] = {}

    async def reached() -> bool:
        found.update(await app.get(session_id))
        return found.get("status") in statuses

    await until(reached, f"session {session_id} to become {'/'.join(statuses)}", within=within)
    return found


def samples(text: str, name: str) -> dict[str, float]:
    """Every sample of metric `name` in a Prometheus exposition, keyed by its label string ('' without labels)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or not line.startswith(name):
            continue
        rest = line[len(name) :]
        if rest[:1] not in (" ", "{"):
            continue
        labels, _, value = rest.rpartition(" ")
        found[labels.strip()] = float(value)
    return found


def total(text: str, name: str) -> float:
    return sum(samples(text, name).values())


# -- a real process: tests/support/serving.py
# ----------------------------------------------------------------------------


class Events:
    """Reads one session's SSE stream (a real HTTP connection) into `snapshots`; `until` waits on a condition."""

    def __init__(self, client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None) -> None:
        self._client = client
        self._url = url
        self._headers = headers or {}
        self.snapshots: list[dict[str, Any]] = []
        self.status_code: int | None = None
        self.ended = False
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Events:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self) -> None:
        try:
            timeout = httpx.Timeout(WAIT_S, read=120.0)
            async with self._client.stream("GET", self._url, headers=self._headers, timeout=timeout) as response:
                self.status_code = response.status_code
                self._changed.set()
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        self.snapshots.append(json.loads(line[len("data: ") :]))
                        self._changed.set()
        finally:
            self.ended = True
            self._changed.set()

    @property
    def statuses(self) -> list[str]:
        return [snapshot["status"] for snapshot in self.snapshots]

    async def until(self, predicate: Callable[[list[dict[str, Any]]], bool], *, within: float = WAIT_S) -> None:
        async with asyncio.timeout(within):
            while not predicate(self.snapshots):
                if self.ended:
                    raise AssertionError(f"the event stream ended first: {self.statuses}")
                self._changed.clear()
                await self._changed.wait()

    async def closed(self, *, within: float = WAIT_S) -> None:
        """Wait for the stream to end (the server closes it after the terminal snapshot)."""
        async with asyncio.timeout(within):
            while not self.ended:
                self._changed.clear()
                await self._changed.wait()


def replay_uninterrupted(
    world: WorldModel, config: LingBotSessionConfig, chunks: Sequence[ChunkOutput]
) -> list[np.ndarray[Any, Any]]:
    """What `world` makes for these chunks' controls (keys, prompt, pose resets) as one uninterrupted session, stage by
    stage in this process: what a session that survived a fault must have streamed."""
    sid = "replay"
    world.encoder.create_cache(sid, config)
    base = world.encoder.encode_reference(sid, None)
    world.denoiser.create_cache(sid, config, base)
    world.decoder.create_cache(sid, config)
    camera = CameraController(config.pose_steps(), config.camera_intrinsics())
    frames = []
    for chunk in chunks:
        if chunk.reset_pose:
            camera.reset_pose()
        control = camera.chunk_control(ControlSnapshot.from_keys(0, chunk.keys), chunk.index, config.chunk_size)
        latent = world.denoiser.denoise_chunk(sid, chunk.index, config.chunk_size, control.camera, prompt=chunk.prompt)
        frames.append(world.decoder.decode_chunk(sid, chunk.index, latent).numpy())
    return frames
