"""Benchmark of the transport package (runs in about a minute on 2 cores; its LiveKit part starts its own server).

Measures, in one run:
- pacing_jitter_p95_ms: p95 of |send time - deadline| of frames leaving `FramePacer` at 16 fps for ~5 s on the real
  monotonic clock, fed chunk by chunk in real time. For reference, the drift after the same number of frames of a
  naive loop that sleeps 1/fps after each frame (`naive_sleep_drift_ms`), run at the same time on the same loop.
- capture_frame_ms_720p: mean time of livekit `VideoSource.capture_frame` for a 1280x720 RGB24 frame (offline),
  and of our whole sink (`LiveKitVideo.capture`: size checks, buffer copy, capture) as capture_sink_ms_720p.
- webrtc_fps_received_aiortc: frames per second an in-process aiortc receiver decodes from `EmbeddedTransport` at
  416x240, 16 fps, fed by synthetic chunks (loopback ICE), over ~5 s after the first frame.
- webrtc_fps_received: frames per second a real headless Chromium presents (requestVideoFrameCallback's
  `presentedFrames`) from one embedded-WebRTC session of a real `lingstream serve` running the reference model at
  416x240, 16 fps with a key held (target >= 15), over ~5 s after 2 s of warm-up; `webrtc_chromium_frames_dropped`
  is what Chromium's decoder dropped meanwhile (getStats). Skipped, with a note, without /usr/bin/chromium or
  playwright.
- livekit_fps_received and livekit_join_s: the same page and session over LiveKit — the service's participant (the
  real `livekit` SDK) and the page's livekit-client meet through a real `livekit-server` (the release scripts/setup.sh
  --dev builds; an SFU: it forwards the service's packets) in a private network namespace
  (`tests/support/livekit_stack.py`): frames per second Chromium presents (target >= 15 of 16), and the seconds from
  pressing Start (the create request) to the first frame presented (at LiveKit's default keep-warm, a repeat of the
  last frame may be that first one). Skipped, with a note, where the namespace cannot be made (it needs root),
  livekit-server is not installed, or without Chromium.

`--quick` is a smoke run of a few seconds over the same paths (1 s windows, 1 s of Chromium warm-up, 30 captures);
its figures are not the ones to compare. The last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import numpy.typing as npt
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from bench._common import CHROMIUM, CHROMIUM_ARGS, Server, report
from pipeline.bidirectional import ChunkOutput, ControlMessage
from pipeline.metrics import percentile
from transport.base import CallerRoom, ResumedRoom, StatusMessage
from transport.embedded.config import EmbeddedConfig
from transport.embedded.rtc import ice_host_addresses
from transport.embedded.transport import EmbeddedTransport
from transport.livekit.ffi_exit import exit_process
from transport.livekit.room import LiveKitVideo
from transport.session.pacing import FramePacer, PacedFrame, PacingConfig

FPS = 16.0
CHUNK = 4
_CHROMIUM_PRESENT = Path(CHROMIUM).exists()
# Presented frames over a window of `ms` milliseconds, from requestVideoFrameCallback's metadata.
_PRESENTED_JS = """
(ms) => new Promise((resolve) => {
  const video = document.getElementById("video");
  let first = null;
  const onFrame = (now, meta) => {
    if (first === null) first = { now, frames: meta.presentedFrames };
    if (now - first.now < ms) { video.requestVideoFrameCallback(onFrame); return; }
    resolve({ frames: meta.presentedFrames - first.frames, seconds: (now - first.now) / 1000 });
  };
  video.requestVideoFrameCallback(onFrame);
})
"""
_DROPPED_JS = """
async () => {
  let dropped = 0;
  (await window.lingstream.pc.getStats()).forEach((report) => {
    if (report.type === "inbound-rtp" && report.kind === "video") dropped += report.framesDropped || 0;
  });
  return dropped;
}
"""


def _chunks(width: int, height: int, count: int) -> list[npt.NDArray[np.uint8]]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, (count, height, width, 3), dtype=np.uint8) for _ in range(4)]


def _chunk(index: int, frames: npt.NDArray[np.uint8], fps: float) -> ChunkOutput:
    return ChunkOutput(
        session_id="bench",
        index=index,
        frames=frames,
        fps=fps,
        first_frame_index=index * len(frames),
        applied_seq=-1,
        keys=frozenset(),
    )


async def bench_pacing(seconds: float) -> dict[str, float]:
    width, height = 416, 240
    pacer = FramePacer(PacingConfig(fps=FPS, width=width, height=height))
    deviations: list[float] = []
    done = asyncio.Event()
    total = int(seconds * FPS)

    def sink(frame: PacedFrame) -> None:
        deviations.append(time.monotonic() - frame.deadline)
        if len(deviations) >= total:
            done.set()

    async def produce() -> None:
        pool = _chunks(width, height, CHUNK)
        start = time.monotonic()
        index = 0
        while True:
            pacer.push_chunk(_chunk(index, pool[index % len(pool)], FPS))
            index += 1
            # The producer runs a little ahead of real time (as a generator with RTF < 1 would).
            await asyncio.sleep(max(0.0, start + index * CHUNK / FPS - 0.05 - time.monotonic()))

    async def naive() -> float:
        start = time.monotonic()
        for _ in range(total):
            await asyncio.sleep(1 / FPS)
        return (time.monotonic() - start - total / FPS) * 1000

    async with asyncio.TaskGroup() as group:
        runner = group.create_task(pacer.run(sink))
        producer = group.create_task(produce())
        naive_task = group.create_task(naive())
        await done.wait()
        await naive_task
        runner.cancel()
        producer.cancel()
    stats = pacer.statistics()
    absolute = [abs(d) * 1000 for d in deviations]
    return {
        "pacing_frames": float(len(deviations)),
        "pacing_jitter_p50_ms": percentile(absolute, 50) or 0.0,
        "pacing_jitter_p95_ms": percentile(absolute, 95) or 0.0,
        "pacing_jitter_max_ms": max(absolute),
        "pacing_dropped": float(stats.dropped_late + stats.dropped_overflow),
        "naive_sleep_drift_ms": await naive_task,
    }


async def bench_capture(iterations: int) -> dict[str, float]:
    from livekit import rtc

    width, height = 1280, 720
    image = np.random.default_rng(1).integers(0, 256, (height, width, 3), dtype=np.uint8)
    video = LiveKitVideo("bench", width, height)
    try:
        data = image.tobytes()
        for _ in range(5):  # warm-up
            video.source.capture_frame(rtc.VideoFrame(width, height, rtc.VideoBufferType.RGB24, data))
        start = time.perf_counter()
        for _ in range(iterations):
            video.source.capture_frame(rtc.VideoFrame(width, height, rtc.VideoBufferType.RGB24, data))
        capture = (time.perf_counter() - start) / iterations * 1000
        frame = PacedFrame(image=image, frame_index=0, chunk_index=0, media_index=0, deadline=0.0)
        start = time.perf_counter()
        for _ in range(iterations):
            video.capture(frame)
        sink = (time.perf_counter() - start) / iterations * 1000
    finally:
        await video.aclose()
    return {"capture_frame_ms_720p": capture, "capture_sink_ms_720p": sink}


class _Port:
    """A session that generates synthetic chunks in real time."""

    def __init__(self, width: int, height: int) -> None:
        self.session_id = "bench"
        self.caller_room: CallerRoom | None = None
        self.resumed_room: ResumedRoom | None = None
        self.handed_off = False
        self.ends_at: float | None = None
        self.width = width
        self.height = height
        self.fps = FPS
        self.state = "running"

    def push_control(self, message: ControlMessage) -> None:
        return None

    def client_gone(self, reason: str) -> None:
        return None

    def delivered(self, chunk_index: int) -> None:
        return None

    async def chunks(self) -> AsyncIterator[ChunkOutput]:
        pool = _chunks(self.width, self.height, CHUNK)
        start = time.monotonic()
        index = 0
        while True:
            yield _chunk(index, pool[index % len(pool)], FPS)
            index += 1
            await asyncio.sleep(max(0.0, start + index * CHUNK / FPS - 0.05 - time.monotonic()))

    async def status(self) -> AsyncIterator[StatusMessage]:
        await asyncio.Event().wait()
        yield  # type: ignore[misc]


async def bench_webrtc(seconds: float) -> dict[str, float]:
    width, height = 416, 240
    transport = EmbeddedTransport(EmbeddedConfig())
    await transport.start()
    client = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    arrivals: list[float] = []
    enough = asyncio.Event()
    reader: asyncio.Task[None] | None = None

    async def read(track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                await track.recv()
                arrivals.append(time.monotonic())
                if arrivals[-1] - arrivals[0] >= seconds:
                    enough.set()

    def on_track(track: MediaStreamTrack) -> None:
        nonlocal reader
        reader = asyncio.get_running_loop().create_task(read(track))

    client.on("track", on_track)
    try:
        await transport.attach(_Port(width, height))
        client.addTransceiver("video", direction="recvonly")
        client.createDataChannel("control")
        with ice_host_addresses(("127.0.0.1",)):
            await client.setLocalDescription(await client.createOffer())
        assert client.localDescription is not None
        sdp, kind = await transport.answer("bench", client.localDescription.sdp, "offer")
        await client.setRemoteDescription(RTCSessionDescription(sdp=sdp, type=kind))
        async with asyncio.timeout(seconds + 20):
            await enough.wait()
        stats = transport.session_statistics("bench")
    finally:
        await client.close()
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
        await transport.aclose()
    span = arrivals[-1] - arrivals[0]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return {
        "webrtc_fps_received_aiortc": (len(arrivals) - 1) / span,
        "webrtc_interarrival_p95_ms": (percentile(gaps, 95) or 0.0) * 1000,
        "webrtc_frames_dropped": float(stats.pacer.dropped_late + stats.pacer.dropped_overflow + stats.track_dropped),
    }


async def bench_chromium(seconds: float, warmup: float = 2.0) -> dict[str, float]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        print("webrtc_fps_received: skipped (playwright is not installed)", file=sys.stderr)
        return {}
    if not _CHROMIUM_PRESENT:
        print(f"webrtc_fps_received: skipped (no Chromium at {CHROMIUM})", file=sys.stderr)
        return {}
    # A real `lingstream serve`: the reference model, the embedded transport, one torch thread.
    settings = {"LINGSTREAM_TORCH_THREADS": "1", "LINGSTREAM_LOG_LEVEL": "WARNING"}
    with tempfile.TemporaryDirectory() as folder, Server(Path(folder) / "serve.log", settings) as server:
        async with async_playwright() as playwright:
            # Chromium starts while the service loads the model.
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                async with httpx.AsyncClient(timeout=5.0) as client:
                    await server.wait_ready(client)
                page = await browser.new_page()
                page.set_default_timeout(30_000)
                await page.goto(f"{server.url}/")
                await page.fill("#width", "416")
                await page.fill("#height", "240")
                await page.fill("#fps", str(int(FPS)))
                await page.click("#start")
                await page.wait_for_function("window.lingstream.frames > 0")
                await page.focus("#stage")
                await page.keyboard.down("w")  # a held key keeps the session generating
                await page.wait_for_function("window.lingstream.lastChunk && window.lingstream.lastChunk.keys.length")
                await page.evaluate(_PRESENTED_JS, warmup * 1000)
                dropped_before = await page.evaluate(_DROPPED_JS)
                window = await page.evaluate(_PRESENTED_JS, seconds * 1000)
                dropped = await page.evaluate(_DROPPED_JS) - dropped_before
                size = await page.evaluate("window.lingstream.videoSize")
                await page.keyboard.up("w")
                await page.click("#stop")
                await page.wait_for_function("window.lingstream.state === 'closed'")
            finally:
                await browser.close()
        await asyncio.to_thread(server.stop, 30.0)
    assert (size["width"], size["height"]) == (416, 240), size
    return {
        "webrtc_fps_received": window["frames"] / window["seconds"],
        "webrtc_chromium_frames_dropped": float(dropped),
    }


async def bench_livekit(seconds: float, warmup: float = 2.0) -> dict[str, float]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        print("livekit_fps_received: skipped (playwright is not installed)", file=sys.stderr)
        return {}
    from tests.support.livekit_stack import LiveKitStack, livekit_stack

    reason = LiveKitStack.skip_reason()
    if reason is not None or not _CHROMIUM_PRESENT:
        print(f"livekit_fps_received: skipped ({reason or f'no Chromium at {CHROMIUM}'})", file=sys.stderr)
        return {}
    # The loop's thread enters the namespace: livekit-server, the service and Chromium are all started from it.
    settings = {"LINGSTREAM_LOG_LEVEL": "WARNING", "LINGSTREAM_MAX_SESSIONS_PER_WORKER": "1"}
    with tempfile.TemporaryDirectory() as folder, livekit_stack(Path(folder), **settings) as stack:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = await browser.new_page()
                page.set_default_timeout(30_000)
                await page.goto(f"{stack.url}/")
                await page.wait_for_function("window.lingstream !== undefined")
                await page.fill("#width", "416")
                await page.fill("#height", "240")
                await page.fill("#fps", str(int(FPS)))
                started = time.monotonic()
                await page.click("#start")
                # The first frame may be a keep-warm repeat (LiveKit's default, 100 ms): through a real server the
                # page may subscribe after the first chunk went out. Polled on a timer, not on animation frames.
                await page.wait_for_function("window.lingstream.frames > 0", polling=100)
                join = time.monotonic() - started
                await page.focus("#stage")
                await page.keyboard.down("w")  # a held key keeps the session generating
                await page.wait_for_function("window.lingstream.lastChunk && window.lingstream.lastChunk.keys.length")
                await page.evaluate(_PRESENTED_JS, warmup * 1000)
                window = await page.evaluate(_PRESENTED_JS, seconds * 1000)
                size = await page.evaluate("window.lingstream.videoSize")
                await page.keyboard.up("w")
                await page.click("#stop")
                await page.wait_for_function("window.lingstream.ended")
            finally:
                await browser.close()
    assert (size["width"], size["height"]) == (416, 240), size
    return {"livekit_fps_received": window["frames"] / window["seconds"], "livekit_join_s": join}


async def main(quick: bool) -> dict[str, float]:
    seconds = 1.0 if quick else 5.0
    results: dict[str, float] = {}
    results |= await bench_pacing(seconds)
    # Before anything loads livekit.rtc in this process (bench_capture): the stack starts processes.
    results |= await bench_livekit(seconds, warmup=1.0 if quick else 2.0)
    results |= await bench_capture(30 if quick else 100)
    results |= await bench_webrtc(seconds)
    results |= await bench_chromium(seconds, warmup=1.0 if quick else 2.0)
    results["fps"] = FPS
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds (1 s windows, 1 s of Chromium warm-up)"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    report(asyncio.run(main(args.quick)), started)
    exit_process(0)  # not Python's finalization, which the LiveKit FFI's threads can abort (ffi_exit.py)
