"""Benchmark of what embedded viewers cost the service: its CPU per media second with 0, 1 and 4 viewers, in one run.

A real `lingstream serve` (the reference model, one torch thread, the embedded transport) runs one session at
416x240, 16 fps with a key held; its controller is the project's client (`transport.client`, as `lingstream play`
uses it). Viewers are receive-only aiortc peer connections of this process, each with its own credential from
`POST /v1/sessions/{id}/viewers`, offering to the watch URL. Each viewer gets its own video track from the service,
so its own H.264 encoder: that encoding is what a viewer costs.

Three windows of the same session, one after the other: the controller alone, then 1 viewer, then 4 (a short
warm-up after each change). In each window the service process's CPU time (user + system, from /proc; every thread
of the process: the model runs on threads of it) is divided by the media seconds the service sent in it (its
`lingstream_transport_frames_sent_total` / fps, read from /metrics).

Figures:
- cpu_s_per_media_s_0_viewers, cpu_s_per_media_s_1_viewers, cpu_s_per_media_s_4_viewers: the service's CPU seconds
  per second of video, with that many viewers watching (the generation itself is in all three);
- cpu_s_per_media_s_per_viewer: (4 viewers - 0 viewers) / 4, what one more viewer costs;
- viewer_fps_min_4: the frames per second the slowest of the 4 viewers decoded in the last window;
- viewers_watching_4: `lingstream_viewers{transport="embedded"}` in the last window (4 when all are connected);
- viewer_frames_dropped: frames the service dropped to slow viewers over the run
  (`lingstream_viewers_frames_dropped_total`).

`--quick` is a smoke run (2 s windows, 1 s warm-ups); its figures are not the ones to compare. The last line printed
is one JSON object with every figure. On a loaded machine the service's CPU seconds stay meaningful (they are CPU
time, not wall time) but the windows vary more: compare figures from one run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from bench._common import Server, metric_sum, report
from transport.client import ServiceClient, connect
from transport.embedded.rtc import ice_host_addresses

FPS = 16
WIDTH, HEIGHT = 416, 240
VIEWERS = (0, 1, 4)
_TICKS = os.sysconf("SC_CLK_TCK")
_CONNECT_S = 30.0


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (every thread), from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        fields = stat.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS  # utime and stime: fields 14 and 15 of stat(5)


class Viewer:
    """One receive-only peer connection on a session's watch URL; counts the frames it decodes."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.frames = 0
        self.first = asyncio.Event()
        self._reader: asyncio.Task[None] | None = None

    async def join(self, http: httpx.AsyncClient, base: str, session_id: str) -> None:
        minted = await http.post(f"{base}/v1/sessions/{session_id}/viewers")
        minted.raise_for_status()
        details = minted.json()
        self.pc.addTransceiver("video", direction="recvonly")
        self.pc.createDataChannel(str(details.get("data_channel") or "control"))
        self.pc.on("track", self._on_track)
        with ice_host_addresses(("127.0.0.1",)):
            await self.pc.setLocalDescription(await self.pc.createOffer())
        local = self.pc.localDescription
        answer = await http.post(
            f"{base}{details['offer_url']}",
            json={"sdp": local.sdp, "type": local.type},
            headers={"Authorization": f"Bearer {details['viewer_token']}"},
        )
        answer.raise_for_status()
        body = answer.json()
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type=body["type"]))
        async with asyncio.timeout(_CONNECT_S):
            await self.first.wait()

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video" and self._reader is None:
            self._reader = asyncio.get_running_loop().create_task(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                await track.recv()  # decoded by aiortc
                self.frames += 1
                self.first.set()

    async def close(self) -> None:
        await self.pc.close()
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)


@contextlib.asynccontextmanager
async def viewers() -> AsyncIterator[list[Viewer]]:
    """The viewers a run adds to this list, closed at the end."""
    joined: list[Viewer] = []
    try:
        yield joined
    finally:
        for viewer in joined:
            await viewer.close()


async def window(
    server: Server, http: httpx.AsyncClient, seconds: float, viewers: list[Viewer]
) -> tuple[float, float, str]:
    """CPU seconds per media second of the service over `seconds`, the slowest viewer's fps, the last /metrics."""
    frames_before = [viewer.frames for viewer in viewers]
    sent_before = metric_sum((await http.get(f"{server.url}/metrics")).text, "lingstream_transport_frames_sent_total")
    cpu_before, started = process_cpu_s(server.process.pid), time.monotonic()
    await asyncio.sleep(seconds)  # the measurement window itself
    cpu_after, elapsed = process_cpu_s(server.process.pid), time.monotonic() - started
    text = (await http.get(f"{server.url}/metrics")).text
    media_s = (metric_sum(text, "lingstream_transport_frames_sent_total") - sent_before) / FPS
    if media_s <= 0:
        raise RuntimeError("the service sent no frames in the window")
    fps = [(viewer.frames - before) / elapsed for viewer, before in zip(viewers, frames_before, strict=True)]
    return (cpu_after - cpu_before) / media_s, min(fps, default=0.0), text


async def main(quick: bool) -> dict[str, float]:
    seconds, warmup = (2.0, 1.0) if quick else (10.0, 3.0)
    settings = {"LINGSTREAM_TORCH_THREADS": "1", "LINGSTREAM_LOG_LEVEL": "WARNING"}
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as folder, Server(Path(folder) / "serve.log", settings) as server:
        async with httpx.AsyncClient(timeout=30.0) as http, ServiceClient(server.url, http=http) as service:
            await server.wait_ready(http)
            info = await service.create(config={"width": WIDTH, "height": HEIGHT, "fps": FPS})
            info = await service.wait_streaming(info.id)
            async with await connect(service, info) as stream:
                await stream.send_keys({"w"})  # a held key keeps the session generating

                async def drain() -> None:
                    async for _frame in stream.frames():
                        pass

                reader = asyncio.get_running_loop().create_task(drain())
                try:
                    async with viewers() as joined:
                        await asyncio.sleep(warmup)
                        text = ""
                        for count in VIEWERS:
                            while len(joined) < count:
                                viewer = Viewer()
                                joined.append(viewer)
                                await viewer.join(http, server.url, info.id)
                            await asyncio.sleep(warmup)
                            cpu, slowest, text = await window(server, http, seconds, joined)
                            results[f"cpu_s_per_media_s_{count}_viewers"] = cpu
                        results["viewer_fps_min_4"] = slowest
                        results["viewers_watching_4"] = metric_sum(text, "lingstream_viewers")
                        results["viewer_frames_dropped"] = metric_sum(text, "lingstream_viewers_frames_dropped_total")
                finally:
                    reader.cancel()
                    await asyncio.gather(reader, return_exceptions=True)
                await stream.stop()
        await asyncio.to_thread(server.stop, 30.0)
    results["cpu_s_per_media_s_per_viewer"] = (
        results["cpu_s_per_media_s_4_viewers"] - results["cpu_s_per_media_s_0_viewers"]
    ) / 4
    results["fps"] = float(FPS)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run (2 s windows, 1 s warm-ups)")
    args = parser.parse_args()
    started = time.perf_counter()
    report(asyncio.run(main(args.quick)), started)
