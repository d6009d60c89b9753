"""`FakeWorld`: a hand-written `BidirectionalService` for the service's tests (no torch, no threads of its own).

It validates a tiny config schema (`fps`: int 1..60, `seed`: int, `prompt`: str; nothing else), creates and closes
sessions, records every control, and yields small numpy frame chunks when told to (`emit`) or at a fixed pace
(`pace_s`); each chunk reports the newest prompt, and a paused session (`Pause`) paces no chunks until `Resume`.
Tests can make it fail a session, fail creates, go unready, hold creates or drain-closes until released, and read
what happened (`created`, `close_calls`, `controls`, `live`, `max_live`).

`paced_fake_workers`, `noisy_fake_workers` and `idle_fake_workers` are worker factories for `lingstream serve
--worker-factory` (a test-only hook, see `service.cli`).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass

import numpy as np

from pipeline.bidirectional import (
    ChunkOutput,
    CloseMode,
    ControlMessage,
    ControlState,
    Pause,
    PreparedSession,
    Resume,
    ServiceStatistics,
    SessionSummary,
    SetPrompt,
)
from pipeline.errors import UnknownSessionError
from service.settings import Settings

__all__ = [
    "FakeCheckpoint",
    "FakeConfig",
    "FakeWorld",
    "idle_fake_workers",
    "noisy_fake_workers",
    "paced_fake_workers",
    "stepped_fake_workers",
]

_ALLOWED = ("fps", "seed", "prompt")
_END = object()
_QUEUE_LIMIT = 256


@dataclass(frozen=True, slots=True)
class FakeConfig:
    fps: int = 10
    seed: int = 0
    prompt: str = ""


@dataclass(frozen=True, slots=True)
class FakeCheckpoint:
    """A `PortableCheckpoint` of a fake session: its header is JSON of the fields, it has no image."""

    session_id: str
    next_chunk: int
    prompt: str
    applied_seq: int

    def header_bytes(self) -> bytes:
        fields = {"session_id": self.session_id, "next_chunk": self.next_chunk, "prompt": self.prompt}
        return json.dumps(fields | {"applied_seq": self.applied_seq}).encode()

    def image_data(self) -> bytes | None:
        return None

    def history_indices(self) -> tuple[int, ...]:
        return ()

    def history_part(self, chunk_index: int) -> bytes:
        raise KeyError(chunk_index)


class _FakeSession:
    def __init__(self, session_id: str, prepared: PreparedSession) -> None:
        self.id = session_id
        self.prepared = prepared
        self.items: asyncio.Queue[object] = asyncio.Queue(maxsize=_QUEUE_LIMIT)
        self.index = 0
        self.last_seq = -1
        self.keys: frozenset[str] = frozenset()
        config = prepared.config
        self.prompt = config.prompt if isinstance(config, FakeConfig) else ""
        self.prompt_seq = -1
        self.paused = False
        self.failure: str | None = None
        self.closing = False
        self.release_close = asyncio.Event()
        self.closed = asyncio.Event()
        self.pacer: asyncio.Task[None] | None = None
        self.handed_out = 0  # chunks the reader took: the checkpoint's next chunk


class FakeWorld:
    """A scripted model worker. Every method is called on the event loop except `prepare` (a worker thread)."""

    def __init__(
        self,
        *,
        pace_s: float | None = None,
        max_image_bytes: int = 1 << 20,
        frame_size: int = 8,
        noise: bool = False,
        level_step: int = 1,
        frames_per_chunk: int = 1,
        second_digit: bool = False,
    ) -> None:
        self.pace_s = pace_s
        self.noise = noise
        # Frame i of the session's video is flat grey level i * level_step (mod 256); chunk k holds frames
        # k * frames_per_chunk onwards (with one frame per chunk: chunk k is level k * level_step). With
        # `second_digit` the bottom half carries the next digit of i in base 256 / level_step (level_step times
        # i // (256 / level_step), mod 256), so a decoded frame tells i modulo (256 / level_step) ** 2.
        self.level_step = level_step
        self.second_digit = second_digit
        self.frames_per_chunk = frames_per_chunk
        self.max_image_bytes = max_image_bytes
        self.frame_size = frame_size
        self.fail_creates = False
        self.hold_drain_closes = False
        self.resumable_checkpoints = False  # `resumable`
        self.prepare_threads: list[str] = []
        self.created: list[str] = []
        self.close_calls: list[tuple[str, CloseMode]] = []
        self.controls: dict[str, list[ControlMessage]] = {}
        self.summaries: dict[str, SessionSummary] = {}
        self.live = 0
        self.max_live = 0
        self.started = False
        self.stopped = False
        self._ready = True
        self._create_gate: asyncio.Event | None = None
        self._sessions: dict[str, _FakeSession] = {}

    # -- test controls --------------------------------------------------------------------------------------

    def set_ready(self, ready: bool) -> None:
        self._ready = ready

    def hold_creates(self) -> None:
        """Creates wait until `release_creates()`."""
        self._create_gate = asyncio.Event()

    def release_creates(self) -> None:
        if self._create_gate is not None:
            self._create_gate.set()
            self._create_gate = None

    def release_closes(self) -> None:
        """Drain-closes held by `hold_drain_closes` finish now."""
        self.hold_drain_closes = False
        for session in self._sessions.values():
            session.release_close.set()

    def emit(self, session_id: str, count: int = 1) -> None:
        session = self._sessions[session_id]
        for _ in range(count):
            self._put(session, self._chunk(session))

    def fail(self, session_id: str, message: str = "fake generation failure") -> None:
        session = self._sessions[session_id]
        session.failure = message
        self._put(session, RuntimeError(message))

    def session_ids(self) -> list[str]:
        return list(self._sessions)

    # -- BidirectionalService -------------------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return self._ready and self.started and not self.stopped

    async def start(self) -> None:
        self.started = True

    async def aclose(self) -> None:
        self.stopped = True
        for session in list(self._sessions.values()):
            await self._stop_pacer(session)

    def prepare(self, config: Mapping[str, object], image: bytes | None) -> PreparedSession:
        self.prepare_threads.append(threading.current_thread().name)
        unknown = sorted(set(config) - set(_ALLOWED))
        if unknown:
            raise ValueError(f"unknown config field(s) {', '.join(unknown)}; allowed: {', '.join(_ALLOWED)}")
        fps = config.get("fps", 10)
        if isinstance(fps, bool) or not isinstance(fps, int) or not 1 <= fps <= 60:
            raise ValueError(f"fps must be an integer between 1 and 60, got {fps!r}")
        seed = config.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise ValueError(f"seed must be an integer between 0 and 2**31 - 1, got {seed!r}")
        prompt = config.get("prompt", "")
        if not isinstance(prompt, str):
            raise ValueError(f"prompt must be a string, got {type(prompt).__name__}")
        if image is not None and len(image) > self.max_image_bytes:
            raise ValueError(f"image is larger than the fake's {self.max_image_bytes} bytes")
        return PreparedSession(
            config=FakeConfig(fps=fps, seed=seed, prompt=prompt),
            width=self.frame_size,
            height=self.frame_size,
            fps=float(fps),
            frame_limit=None,
            image=image,
        )

    async def create_session(self, session_id: str, prepared: PreparedSession) -> None:
        if session_id in self._sessions:
            raise ValueError(f"session {session_id!r} exists")
        gate = self._create_gate
        if gate is not None:
            await gate.wait()
        if self.fail_creates:
            raise RuntimeError("fake create failure")
        session = _FakeSession(session_id, prepared)
        self._sessions[session_id] = session
        self.created.append(session_id)
        self.controls[session_id] = []
        self.live += 1
        self.max_live = max(self.max_live, self.live)
        if self.pace_s is not None:
            session.pacer = asyncio.get_running_loop().create_task(self._pace(session), name=f"fake-pace-{session_id}")

    @property
    def resumable(self) -> bool:
        """Its checkpoints are for the wiring's tests: no session goes on from one, so none is adopted (unless a test
        says they are, `resumable_checkpoints`, to see the service treat them as a real model's)."""
        return self.resumable_checkpoints

    def checkpoint(self, session_id: str) -> FakeCheckpoint | None:
        """`CheckpointingService`: the session at its last chunk handed to the reader (its prompt and control seq;
        no image)."""
        session = self._sessions.get(session_id)
        if session is None:
            return None
        return FakeCheckpoint(session_id, session.handed_out, session.prompt, session.last_seq)

    def _session(self, session_id: str) -> _FakeSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(session_id)
        return session

    def push_control(self, session_id: str, message: ControlMessage) -> None:
        session = self._session(session_id)
        self.controls[session_id].append(message)
        if isinstance(message, ControlState) and message.seq > session.last_seq:
            session.last_seq = message.seq
            session.keys = message.keys
        elif isinstance(message, SetPrompt) and message.seq > session.prompt_seq:
            session.prompt_seq = message.seq
            session.prompt = message.text
        elif isinstance(message, Pause | Resume):
            session.paused = isinstance(message, Pause)

    async def outputs(self, session_id: str, *, parts: bool = False) -> AsyncIterator[ChunkOutput]:
        session = self._session(session_id)
        while True:
            item = await session.items.get()
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            assert isinstance(item, ChunkOutput)
            session.handed_out = item.index + 1
            yield item

    async def close_session(self, session_id: str, mode: CloseMode = CloseMode.DRAIN) -> SessionSummary:
        self.close_calls.append((session_id, mode))
        session = self._sessions.get(session_id)
        if session is None:
            summary = self.summaries.get(session_id)
            if summary is None:
                raise UnknownSessionError(session_id)
            return summary
        if mode is CloseMode.CANCEL:
            session.release_close.set()
        if session.closing:
            await session.closed.wait()
            return self.summaries[session_id]
        session.closing = True
        if mode is CloseMode.DRAIN and self.hold_drain_closes:
            await session.release_close.wait()
        await self._stop_pacer(session)
        self._put(session, _END)
        del self._sessions[session_id]
        self.live -= 1
        summary = SessionSummary(
            session_id=session_id, chunks=session.index, failure=session.failure, cleanup_failures={}, slot_leaks=0
        )
        self.summaries[session_id] = summary
        session.closed.set()
        return summary

    def statistics(self) -> ServiceStatistics:
        return ServiceStatistics(
            ready=self.ready,
            sessions=len(self._sessions),
            chunks=sum(s.index for s in self._sessions.values()),
            stale_controls=0,
        )

    # -- internals ------------------------------------------------------------------------------------------

    def _chunk(self, session: _FakeSession) -> ChunkOutput:
        index = session.index
        session.index += 1
        size, count = self.frame_size, self.frames_per_chunk
        first = index * count
        if self.noise:  # incompressible frames (a recording grows fast), the same for the same chunk index
            frames = np.random.default_rng(index).integers(0, 256, (count, size, size, 3), dtype=np.uint8)
        else:
            ids = np.arange(first, first + count)
            levels = (ids * self.level_step) % 256
            frames = np.broadcast_to(levels.astype(np.uint8)[:, None, None, None], (count, size, size, 3)).copy()
            if self.second_digit:
                digits = (ids // (256 // self.level_step) * self.level_step) % 256
                frames[:, size // 2 :] = digits.astype(np.uint8)[:, None, None, None]
        return ChunkOutput(
            session_id=session.id,
            index=index,
            frames=frames,
            fps=session.prepared.fps,
            first_frame_index=first,
            applied_seq=session.last_seq,
            keys=session.keys,
            timings={"fake": 0.0},
            prompt=session.prompt,
            prompt_seq=session.prompt_seq,
        )

    @staticmethod
    def _put(session: _FakeSession, item: object) -> None:
        if session.items.full():  # overflow policy: drop the oldest (a fake never blocks its caller)
            session.items.get_nowait()
        session.items.put_nowait(item)

    async def _pace(self, session: _FakeSession) -> None:
        assert self.pace_s is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time()
        while True:
            deadline += self.pace_s
            await asyncio.sleep(max(0.0, deadline - loop.time()))
            if not session.paused:
                self._put(session, self._chunk(session))

    @staticmethod
    async def _stop_pacer(session: _FakeSession) -> None:
        pacer, session.pacer = session.pacer, None
        if pacer is not None:
            pacer.cancel()
            await asyncio.gather(pacer, return_exceptions=True)


def paced_fake_workers(settings: Settings) -> list[FakeWorld]:
    """Workers that generate a chunk every 50 ms per session (for `lingstream serve` in e2e tests)."""
    return [FakeWorld(pace_s=0.05) for _ in range(settings.num_workers)]


def noisy_fake_workers(settings: Settings) -> list[FakeWorld]:
    """Workers that generate a chunk of one 128x128 frame of noise every 50 ms per session (recordings grow fast)."""
    return [FakeWorld(pace_s=0.05, frame_size=128, noise=True) for _ in range(settings.num_workers)]


def stepped_fake_workers(settings: Settings) -> list[FakeWorld]:
    """Paced workers whose chunk k is grey level 16 k (mod 256): a decoded frame tells its chunk from the next one
    (VP8 moves a flat level by a few steps; adjacent levels 1 apart would be indistinguishable)."""
    return [FakeWorld(pace_s=0.05, level_step=16) for _ in range(settings.num_workers)]


def framed_fake_workers(settings: Settings) -> list[FakeWorld]:
    """Workers whose chunks are 4 frames of 64x64, paced for 16 fps (a chunk every 250 ms), frame i of the session's
    video two flat grey halves: the top at level 16 (i mod 16), the bottom at 16 (i // 16 mod 16). A decoded frame
    tells its frame index modulo 256, so a test checks each frame's id (LiveKit frame metadata) and chunk against the
    picture itself."""
    return [
        FakeWorld(pace_s=0.25, level_step=16, frames_per_chunk=4, frame_size=64, second_digit=True)
        for _ in range(settings.num_workers)
    ]


def idle_fake_workers(settings: Settings) -> list[FakeWorld]:
    """Workers whose sessions generate nothing (for the admission benchmark)."""
    return [FakeWorld() for _ in range(settings.num_workers)]
