"""A recording made by a real `lingstream serve` (the reference LingBot model, the embedded transport, an aiortc peer
as the browser) is exactly what `lingstream generate` renders from the recording's own control trace with the same
seed and image: the service records the frames it generated, and the trace says what each chunk was generated from."""

from __future__ import annotations

import asyncio
import base64
import io
import subprocess
import time
from pathlib import Path

import av
import httpx
import numpy as np
import numpy.typing as npt
import pytest
from aiortc import RTCSessionDescription

from pipeline.bidirectional import ControlState, ResetPose, Stop
from tests.e2e.pages import reference_texture
from tests.fakes.webrtc_client import BrowserPeer
from tests.serving import ROOT, environment, lingstream, serve
from transport.base import ChunkStatus, DoneStatus

WIDTH, HEIGHT, FPS, SEED, CHUNK_SIZE = 96, 64, 16, 7, 1
_WAIT = 60.0


def _frames(data: bytes | Path) -> npt.NDArray[np.uint8]:
    source = data if isinstance(data, Path) else io.BytesIO(data)
    with av.open(source, mode="r") as container:
        stream = container.streams.video[0]
        assert stream.average_rate == FPS
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(stream)])


async def _until_applied(peer: BrowserPeer, seq: int) -> ChunkStatus:
    async with asyncio.timeout(_WAIT):
        while True:
            status = await peer.next_status()
            if isinstance(status, ChunkStatus) and status.applied_seq >= seq:
                return status


@pytest.mark.slow
async def test_a_recording_replays_with_lingstream_generate_to_the_same_frames(tmp_path: Path) -> None:
    recordings = tmp_path / "recordings"
    image = reference_texture(tmp_path / "reference.png", WIDTH, HEIGHT)
    body = {
        "config": {"width": WIDTH, "height": HEIGHT, "fps": FPS, "seed": SEED, "chunk_size": CHUNK_SIZE},
        "image": base64.b64encode(image.read_bytes()).decode(),
        "record": True,
    }
    with serve(
        tmp_path, factory=None, LINGSTREAM_RECORDINGS_DIR=str(recordings), LINGSTREAM_TORCH_THREADS="1"
    ) as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=30.0) as client:
            await service.wait_ready(client)
            created = await client.post("/v1/sessions", json=body)
            assert created.status_code == 201, created.text
            session = created.json()
            sid = session["id"]
            peer = BrowserPeer()
            try:
                answer = (
                    await client.post(
                        session["transport"]["offer_url"], json={"sdp": await peer.offer(), "type": "offer"}
                    )
                ).json()
                await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
                async with asyncio.timeout(_WAIT):
                    await peer.opened.wait()
                # Walk, turn while walking, go back to the start pose, look up; a few chunks of each.
                for seq, keys in enumerate((["w"], ["w", "l"], ["i"]), start=1):
                    if seq == 3:
                        peer.send(ResetPose())
                    peer.send(ControlState(seq, frozenset(keys)))
                    first = await _until_applied(peer, seq)
                    await _until_applied(peer, seq)  # at least two chunks of each, however fast the model is
                    assert set(first.keys) == set(keys)
                peer.send(ControlState(4, frozenset()))
                await _until_applied(peer, 4)
                running = await client.get(f"/v1/sessions/{sid}/recording")
                assert (running.status_code, running.json()["error"]["code"]) == (409, "recording_in_progress")
                peer.send(Stop())
                async with asyncio.timeout(_WAIT):
                    while not isinstance(await peer.next_status(), DoneStatus):
                        pass
            finally:
                await peer.close()

            deadline = time.monotonic() + _WAIT
            while (video := await client.get(f"/v1/sessions/{sid}/recording")).status_code == 409:
                assert time.monotonic() < deadline, "the recording was not finalised in time"
                await asyncio.sleep(0.1)  # polling another process against a deadline
            assert video.status_code == 200, video.text
            trace = await client.get(f"/v1/sessions/{sid}/recording/controls")
            assert trace.status_code == 200

    recorded = _frames(video.content)
    chunks = 1 + (len(recorded) - 1) // (4 * CHUNK_SIZE)
    assert len(recorded) == 4 * (CHUNK_SIZE - 1) + 1 + 4 * CHUNK_SIZE * (chunks - 1)
    assert chunks >= 8
    controls = tmp_path / "controls.jsonl"
    controls.write_text(trace.text)
    assert '"reset_pose": true' in trace.text
    assert "replay: lingstream generate" in trace.text

    replay = tmp_path / "replay.mp4"
    command = [
        *lingstream(), "generate", "--controls", str(controls), "--out", str(replay), "--image", str(image),
        "--frames", str(len(recorded)), "--fps", str(FPS), "--resolution", f"{WIDTH}x{HEIGHT}",
        "--seed", str(SEED), "--chunk-size", str(CHUNK_SIZE), "--threads", "1",
    ]  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run, command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-4000:]
    replayed = _frames(replay)
    assert replayed.shape == recorded.shape
    assert np.array_equal(replayed, recorded), f"{int((replayed != recorded).any(axis=(1, 2, 3)).sum())} frames differ"
    # The same bitstream: the same frames through the same deterministic encoder.
    assert replay.read_bytes() == video.content
