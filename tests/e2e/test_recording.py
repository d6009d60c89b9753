"""A recording made by a real `lingstream serve` (the reference LingBot model, the embedded transport, an aiortc peer
as the browser) is exactly what `lingstream generate` renders from the recording's own control trace with the same
seed and image: the service records the frames it generated, and the trace says what each chunk was generated from
(its keys, a pose reset, and its text prompt: the create's and a live `prompt` message's)."""

from __future__ import annotations

import asyncio
import base64
import io
import resource
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import numpy.typing as npt
import pytest
from aiortc import RTCSessionDescription

from pipeline.bidirectional import ControlState, ResetPose, SetPrompt, Stop
from tests.support.browser.pages import reference_texture
from tests.support.fakes.webrtc_client import BrowserPeer
from tests.support.serving import ROOT, environment, free_port, lingstream, serve, wait_until_ready
from transport.base import ChunkStatus, DoneStatus, ErrorStatus

WIDTH, HEIGHT, FPS, SEED, CHUNK_SIZE = 96, 64, 16, 7, 1
FIRST_PROMPT, LIVE_PROMPT = "a foggy dawn", "golden dusk over snow"
_WAIT = 60.0


def _frames(data: bytes | Path) -> npt.NDArray[np.uint8]:
    source = data if isinstance(data, Path) else io.BytesIO(data)
    with av.open(source, mode="r") as container:
        stream = container.streams.video[0]
        assert stream.average_rate == FPS
        return np.stack([frame.to_ndarray(format="rgb24") for frame in container.decode(stream)])


async def _join(client: httpx.AsyncClient, session: dict[str, Any], peer: BrowserPeer) -> None:
    """Offer `peer` to the session's embedded transport and wait for its control channel to open."""
    offer = {"sdp": await peer.offer(), "type": "offer"}
    answer = (await client.post(session["transport"]["offer_url"], json=offer)).json()
    await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
    async with asyncio.timeout(_WAIT):
        await peer.opened.wait()


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
        "prompt": FIRST_PROMPT,
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
                await _join(client, session, peer)
                # Walk, turn while walking under a new prompt, go back to the start pose, look up; a few chunks of
                # each. The created prompt holds until the live one.
                for seq, keys in enumerate((["w"], ["w", "l"], ["i"]), start=1):
                    if seq == 2:
                        peer.send(SetPrompt(1, LIVE_PROMPT))
                    if seq == 3:
                        peer.send(ResetPose())
                    peer.send(ControlState(seq, frozenset(keys)))
                    first = await _until_applied(peer, seq)
                    second = await _until_applied(peer, seq)  # at least two chunks of each, however fast the model is
                    assert set(first.keys) == set(keys)
                    if seq == 1:
                        assert (first.prompt, first.prompt_seq) == (FIRST_PROMPT, -1)
                    if seq == 3:  # the prompt came before the keys of seq 2, so it holds by now
                        assert (second.prompt, second.prompt_seq) == (LIVE_PROMPT, 1)
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
    assert f'{{"chunk": 0, "prompt": "{FIRST_PROMPT}"}}' in trace.text
    assert f'"prompt": "{LIVE_PROMPT}"' in trace.text
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


def _limit_file_size(limit: int) -> Callable[[], None]:
    def apply() -> None:  # in the child, before exec: every file it writes stops at `limit` bytes (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


@pytest.mark.slow
async def test_a_full_disk_stops_the_recording_with_a_status_and_the_session_goes_on(tmp_path: Path) -> None:
    """A real `lingstream serve` whose files may not grow past 64 KiB (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a
    write past it fails with EFBIG, as on a full disk): the recording stops, the client is told, the session goes
    on, and nothing is served or left behind."""
    recordings = tmp_path / "recordings"
    port = free_port()
    command = [
        *lingstream(), "serve", "--port", str(port), "--worker-factory", "tests.support.fakes.world:noisy_fake_workers",
    ]  # fmt: skip
    env = environment(LINGSTREAM_RECORDINGS_DIR=str(recordings))
    # The log goes to a pipe (not a file, which the limit would cut short), read by a thread.
    process = subprocess.Popen(  # noqa: ASYNC220 - started once; the test then waits on it over HTTP
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=_limit_file_size(64 * 1024),
    )
    lines: list[str] = []
    assert process.stdout is not None
    output = process.stdout
    reader = threading.Thread(
        target=lambda: lines.extend(line.decode(errors="replace") for line in output), daemon=True
    )
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=30.0) as client:
            await asyncio.to_thread(wait_until_ready, url, process, lambda: "".join(lines), within_s=_WAIT)
            session = (await client.post("/v1/sessions", json={"record": True})).json()
            sid = session["id"]
            peer = BrowserPeer()
            try:
                await _join(client, session, peer)
                async with asyncio.timeout(_WAIT):
                    status = await peer.next_status()
                    while not isinstance(status, ErrorStatus):
                        status = await peer.next_status()
                assert status.code == "recording_failed"
                assert "the session goes on" in status.message
                # The session goes on: it keeps streaming and is running.
                await peer.next_frame()
                assert (await client.get(f"/v1/sessions/{sid}")).json()["status"] == "running"
                peer.send(Stop())
                async with asyncio.timeout(_WAIT):
                    while not isinstance(await peer.next_status(), DoneStatus):
                        pass
            finally:
                await peer.close()
            failed = await client.get(f"/v1/sessions/{sid}/recording")
            assert (failed.status_code, failed.json()["error"]["code"]) == (404, "recording_failed")
            # The partial file goes too (right after the failure, off the event loop).
            deadline = time.monotonic() + _WAIT
            while list(recordings.iterdir()):
                assert time.monotonic() < deadline, "".join(line for line in lines if "record" in line)
                await asyncio.sleep(0.05)  # polling another process's cleanup against a deadline
    finally:
        process.terminate()
        process.wait(timeout=20)
        reader.join(timeout=10)
        output.close()
    assert "Traceback" not in "".join(lines), "".join(lines)[-4000:]
