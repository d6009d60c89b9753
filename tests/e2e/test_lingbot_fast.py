"""The real model's plumbing end to end on a tiny random checkpoint: `lingstream tiny-checkpoint DIR` writes it,
`lingstream serve` with `LINGSTREAM_MODEL=lingbot-fast` streams its frames to the Python client over the embedded
WebRTC transport, `lingstream generate --model lingbot-fast` writes an MP4, and a broken directory stops the start
with the problem named. The picture is noise (random weights); sizes, counts and the chunk contract are real. One
service decodes with the tiny decoder (`LINGSTREAM_DECODER=tiny`, the checkpoint's random `tiny_decoder/`) on the
`processes` placement, where the decode runs in the DiT group's second call lane beside the next chunk's DiT."""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import numpy.typing as npt
import pytest

from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.errors import SessionConfigError
from tests.support.serving import STARTUP_DEADLINE_S, Served, run_lingstream, serve, wait_until_ready
from tests.support.tiny_model import write_tiny_checkpoint
from transport.base import ChunkStatus, StatusMessage
from transport.client import ServiceClient, SessionInfo, connect

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")

from pipeline.lingbot.models import LingBotFastOptions, session_limits  # after the skips: it needs the extra

pytestmark = pytest.mark.slow

WIDTH, HEIGHT = 64, 32
WAIT_S = 60.0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model")


def test_tiny_checkpoint_refuses_a_directory_that_is_not_empty(checkpoint: Path) -> None:
    done = run_lingstream("tiny-checkpoint", str(checkpoint), timeout=60)
    assert done.returncode == 2
    assert "is not an empty directory" in done.stderr


PLACEMENTS = {
    "threads": ("threads", "1", "wan"),
    "processes": ("processes", "1", "wan"),
    "processes-cp2": ("processes", "2", "wan"),
    "processes-tiny": ("processes", "1", "tiny"),
}
"""Stage placement, DiT ranks and decoder: `processes-cp2` runs the DiT over two gloo ranks (Ulysses context
parallelism); `processes-tiny` decodes with the tiny decoder (`LINGSTREAM_DECODER=tiny`)."""


def _decoder(request: pytest.FixtureRequest) -> str:
    return PLACEMENTS[request.node.callspec.params["service"]][2]


def _assert_not_constant(image: npt.NDArray[Any]) -> None:
    """A decoded frame of random weights is noise, never one flat colour (a NaN or an all-zero latent decodes to
    one: a float NaN cast to uint8 comes out as a constant)."""
    assert int(image.max()) > int(image.min()), "a constant frame"


@pytest.fixture(scope="module", params=sorted(PLACEMENTS))
def service(
    checkpoint: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Served]:
    """The service on the tiny model, its stages on threads or in worker processes (each loading its part), the
    DiT on one rank or two, decoding with the Wan VAE or the tiny decoder."""
    workdir = tmp_path_factory.mktemp("serve")
    placement, ranks, decoder = PLACEMENTS[request.param]
    with serve(
        workdir,
        factory=None,
        LINGSTREAM_HOST="127.0.0.1",
        LINGSTREAM_MODEL="lingbot-fast",
        LINGSTREAM_MODEL_PATH=str(checkpoint),
        LINGSTREAM_TORCH_THREADS="1",
        LINGSTREAM_STAGE_PLACEMENT=placement,
        LINGSTREAM_DENOISE_RANKS=ranks,
        LINGSTREAM_DECODER=decoder,
        LINGSTREAM_ATTENTION="math",
        LINGSTREAM_WARMUP_CHUNKS="1",  # one 832x480 chunk of the tiny model (~7 s on one thread) before ready
        LINGSTREAM_RECORDINGS_DIR=str(workdir / "recordings"),
    ) as served:
        # Each DiT rank imports the model stack and loads the DiT in its own process: allow more on a loaded machine.
        wait_until_ready(served.url, served.process, served.output, within_s=STARTUP_DEADLINE_S * int(ranks) * 2)
        yield served
    assert "Traceback" not in served.output(), served.output()[-4000:]


def test_readyz_shows_the_memory_estimate_attention_and_warm_up_it_started_with(
    service: Served, request: pytest.FixtureRequest
) -> None:
    body = httpx.get(f"{service.url}/readyz", timeout=5.0).json()
    assert body["status"] == "ready"
    memory = body["model_memory"]
    assert (memory["device"], memory["dtype"], memory["resolution"]) == ("cpu", "float32", "832x480")
    assert memory["fits_sessions"] >= 1
    assert memory["model_bytes"] + memory["once_bytes"] + memory["session_bytes"] <= memory["usable_bytes"]
    assert memory["usable_bytes"] < memory["device_bytes"]
    parts = memory["parts"]
    assert parts["decoder_cache_bytes"] > 0  # the tiny VAE's or the tiny decoder's, measured on meta at 832x480
    assert memory["session_bytes"] == parts["attention_cache_bytes"] + parts["decoder_cache_bytes"]
    assert parts["context_bytes"] == 0  # the CPU
    assert memory["once_bytes"] == sum(
        parts[name]
        for name in (
            "camera_modulation_bytes",
            "dit_transient_bytes",
            "decode_transient_bytes",
            "encode_transient_bytes",
        )
    )
    assert memory["denoise_ranks"] == int(PLACEMENTS[request.node.callspec.params["service"]][1])
    start = body["model_start"]
    assert start["compile"] == "off"
    assert start["decoder"] == _decoder(request)
    assert start["attention"] == {"backend": "math", "kernel": "sdpa", "sdpa_order": ["math"]}
    warmup = start["warmup"]  # threads: measured while the worker was built; processes: rank 0's ready report
    assert (warmup["chunks"], warmup["resolution"]) == (1, "832x480")
    assert warmup["seconds"] > 0


# Sessions the tiny model's default cache (window 18, sink 6) and memory plan (832x480) cannot hold, each with the
# `lingstream generate` options that ask for the same.
TOO_LARGE = {"width": 1280, "height": 720}
TOO_CHUNKY = {"chunk_size": 13, "frame_num": 4 * 26 - 3}
OPTIONS = {
    "width x height": (TOO_LARGE, ["--resolution", "1280x720"]),
    "chunk_size": (TOO_CHUNKY, ["--chunk-size", "13", "--frames", "101"]),
}


def _refusal(config: dict[str, int]) -> str:
    """The message of the model's own check (`session_limits`, what create runs) for `config`."""
    with pytest.raises(SessionConfigError) as refused:
        session_limits(LingBotFastOptions("unused"))(LingBotSessionConfig.from_mapping(config))
    return str(refused.value)


def test_a_session_the_model_cannot_hold_is_refused_at_create(service: Served) -> None:
    for field, (config, _) in OPTIONS.items():
        with httpx.Client(base_url=service.url, timeout=5.0) as client:
            refused = client.post("/v1/sessions", json={"config": config})
        assert refused.status_code == 422, refused.text
        assert refused.json()["error"]["code"] == "invalid_config"
        assert refused.json()["error"]["message"] == _refusal(config)
        assert refused.json()["error"]["message"].startswith(field)


def test_generate_refuses_what_create_refuses_with_the_same_message(checkpoint: Path, tmp_path: Path) -> None:
    never = ["--out", str(tmp_path / "never.mp4"), "--threads", "1"]
    for config, options in OPTIONS.values():
        done = run_lingstream(
            "generate", "--model", "lingbot-fast", "--model-path", str(checkpoint), *options, *never, timeout=120
        )
        assert done.returncode == 2, done.stderr  # generate's exit code for every bad option
        assert f"{options[0]}: {_refusal(config)}" in done.stderr
    assert list(tmp_path.iterdir()) == []


async def test_serve_streams_the_tiny_models_frames_to_a_client(service: Served) -> None:
    async with ServiceClient(service.url) as client:
        info = await client.create(config={"width": WIDTH, "height": HEIGHT, "fps": 16, "prompt": "a stone bridge"})
        assert info.status == "running"
        async with asyncio.timeout(WAIT_S):
            stream = await connect(client, info)
            told: dict[int, int | None] = {}  # chunk index -> its first frame's index in the session's video

            def on_status(message: StatusMessage) -> None:
                if isinstance(message, ChunkStatus):
                    told.setdefault(message.index, message.first_frame_id)

            stream.add_status_listener(on_status)
            async with stream:
                first = await stream.next_frame()  # the first chunk streams before any control
                assert first is not None
                assert first.image.shape == (HEIGHT, WIDTH, 3)
                _assert_not_constant(first.image)
                await stream.send_keys({"w"})  # a held key keeps chunks coming (idle sessions hold the picture)
                chunks: dict[int, int] = {}
                # Four chunks: the second last is complete and comes after the first `stream_base_pts`, from which
                # the client labels frames exactly (before it, an offset fitted under load may misplace a few).
                while len(chunks) < 4:
                    frame = await stream.next_frame()
                    assert frame is not None
                    assert frame.image.shape == (HEIGHT, WIDTH, 3)
                    _assert_not_constant(frame.image)
                    if frame.chunk is not None:
                        chunks[frame.chunk.index] = chunks.get(frame.chunk.index, 0) + 1
                done = await stream.stop()
        assert done.reason == "client_stop"
        assert stream.errors == []
        # The chunks' sizes as the service sent them (1 + 4 * 2 frames, then 4 * 3), from the statuses' first frame
        # ids: counting received frames cannot tell, loopback WebRTC drops some under load (3 of a chunk's 12, once).
        assert sorted(told) == list(range(len(told))), told
        assert len(told) >= 4, told
        ids = [told[index] for index in sorted(told)]
        assert ids[0] == 0, told
        sizes = [int(b or 0) - int(a or 0) for a, b in itertools.pairwise(ids)]
        assert sizes == [9] + [12] * (len(sizes) - 1), told


@pytest.mark.timeout(300)
async def test_what_the_client_was_sent_is_what_one_rank_on_threads_renders(
    service: Served, checkpoint: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The frames a session streams to the Python client on this placement (recorded before the WebRTC encoder, so
    bit-exact) equal `lingstream generate` on threads, one DiT rank, with the same decoder, from the recording's own
    control trace: the 2-rank (Ulysses) service sends the 1-rank frames, and so do the other placements; the tiny
    decoder's session on processes sends what the tiny decoder renders offline. Its chunks keep the 1 + 4n contract:
    9 frames, then 12 a chunk."""
    body = {
        "config": {"width": WIDTH, "height": HEIGHT, "fps": 16, "seed": 9},
        "prompt": "a stone bridge",
        "record": True,
    }
    async with ServiceClient(service.url) as client:
        info = SessionInfo.from_body((await client.request("POST", "/v1/sessions", json=body)).json())
        async with asyncio.timeout(WAIT_S):
            stream = await connect(client, info)
            async with stream:
                assert await stream.next_frame() is not None
                await stream.send_keys({"w", "l"})
                chunks: set[int] = set()
                while len(chunks) < 3:
                    frame = await stream.next_frame()
                    assert frame is not None
                    if frame.chunk is not None:
                        chunks.add(frame.chunk.index)
                await stream.stop()
    async with httpx.AsyncClient(base_url=service.url, timeout=10.0) as http:
        deadline = time.monotonic() + WAIT_S
        while (video := await http.get(f"/v1/sessions/{info.id}/recording")).status_code == 409:
            assert time.monotonic() < deadline, "the recording was not finalised in time"
            await asyncio.sleep(0.1)  # polling another process while it finalises the file
        assert video.status_code == 200, video.text
        trace = await http.get(f"/v1/sessions/{info.id}/recording/controls")
        assert trace.status_code == 200, trace.text
    controls = tmp_path / "controls.jsonl"
    controls.write_text(trace.text)
    recorded = tmp_path / "recorded.mp4"
    recorded.write_bytes(video.content)
    with av.open(str(recorded)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    recorded_chunks = [line for line in trace.text.splitlines() if line.startswith("{") and "keys" in json.loads(line)]
    assert len(recorded_chunks) >= 3
    assert len(frames) == 9 + 12 * (len(recorded_chunks) - 1)  # chunk 0: 1 + 4 * 2 frames, later ones 4 * 3
    for image in frames:
        _assert_not_constant(image)
    replay = tmp_path / "replay.mp4"
    done = await asyncio.to_thread(
        run_lingstream,
        "generate", "--model", "lingbot-fast", "--model-path", str(checkpoint), "--controls",
        str(controls), "--out", str(replay), "--frames", str(len(frames)), "--fps", "16", "--resolution",
        f"{WIDTH}x{HEIGHT}", "--seed", "9", "--threads", "1", "--placement", "threads",
        "--denoise-ranks", "1", "--decoder", _decoder(request), "--attention", "math", timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    if replay.read_bytes() != video.content:
        pytest.fail(_where_they_differ(frames, replay, trace.text))


def _where_they_differ(recorded: list[npt.NDArray[Any]], replay: Path, trace: str) -> str:
    """What to look at when a recording and its replay differ (seen once in a full run, docs/testing.md): the frames
    that differ, by index and chunk, how much, and the control trace."""
    with av.open(str(replay)) as container:
        replayed = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    differ = [
        (index, 0 if index < 9 else 1 + (index - 9) // 12, int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()))
        for index, (a, b) in enumerate(zip(recorded, replayed, strict=False))
        if not np.array_equal(a, b)
    ]
    return (
        f"the recording ({len(recorded)} frames) and its replay ({len(replayed)}) differ; frames that differ as"
        f" (index, chunk, max abs difference): {differ[:40]}; the trace:\n{trace}"
    )


def test_generate_writes_the_tiny_models_clip(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "clip.mp4"
    done = run_lingstream(
        "generate",
        "--model",
        "lingbot-fast",
        "--model-path",
        str(checkpoint),
        "--out",
        str(out),
        "--frames",
        "21",
        "--resolution",
        f"{WIDTH}x{HEIGHT}",
        "--threads",
        "1",
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    with av.open(str(out)) as container:
        frames = [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]
    assert len(frames) == 21  # chunk 0: 9 frames, chunk 1: 12
    assert frames[0].shape == (HEIGHT, WIDTH, 3)


def _generate_frames(checkpoint: Path, out: Path, *placement: str) -> list[object]:
    done = run_lingstream(
        "generate", "--model", "lingbot-fast", "--model-path", str(checkpoint), "--out", str(out), "--frames", "21",
        "--resolution", f"{WIDTH}x{HEIGHT}", "--threads", "1", "--prompt", "a stone bridge", "--seed", "5",
        *placement, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    with av.open(str(out)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


@pytest.mark.timeout(420)  # two renders that each start three worker process groups, on a loaded machine
def test_generate_renders_the_same_clip_on_one_and_two_dit_ranks_in_worker_processes(
    checkpoint: Path, tmp_path: Path
) -> None:
    """`--placement processes` (LINGSTREAM_STAGE_PLACEMENT) runs the clip as `lingstream serve` places it: the DiT
    over `--denoise-ranks` gloo ranks (Ulysses), whose chunks equal one rank's bit for bit, so the files are equal."""
    one = tmp_path / "one.mp4"
    two = tmp_path / "two.mp4"
    first = _generate_frames(checkpoint, one, "--placement", "processes", "--denoise-ranks", "1")
    second = _generate_frames(checkpoint, two, "--placement", "processes", "--denoise-ranks", "2")
    assert len(first) == len(second) == 21  # chunk 0: 9 frames, chunk 1 (evaluated over chunk 0's cache): 12
    assert one.read_bytes() == two.read_bytes()
    refused = run_lingstream(
        "generate", "--model", "lingbot-fast", "--model-path", str(checkpoint), "--out", str(tmp_path / "x.mp4"),
        "--placement", "processes", "--denoise-ranks", "3", timeout=120,
    )  # fmt: skip
    assert refused.returncode == 2
    assert "--denoise-ranks 3: LINGSTREAM_DENOISE_RANKS=3 does not divide the DiT's 2 attention heads" in refused.stderr


def test_serve_refuses_a_dit_group_that_does_not_divide_the_heads(checkpoint: Path, tmp_path: Path) -> None:
    with serve(
        tmp_path,
        factory=None,
        LINGSTREAM_MODEL="lingbot-fast",
        LINGSTREAM_MODEL_PATH=str(checkpoint),
        LINGSTREAM_STAGE_PLACEMENT="processes",
        LINGSTREAM_DENOISE_RANKS="3",
    ) as served:
        served.process.wait(timeout=STARTUP_DEADLINE_S)
        assert served.process.returncode == 2, served.output()
        assert "LINGSTREAM_DENOISE_RANKS=3 does not divide the DiT's 2 attention heads" in served.output()


def test_serve_refuses_to_start_on_a_broken_model_directory(checkpoint: Path, tmp_path: Path) -> None:
    broken = Path(shutil.copytree(checkpoint, tmp_path / "broken"))
    (broken / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    with serve(tmp_path, factory=None, LINGSTREAM_MODEL="lingbot-fast", LINGSTREAM_MODEL_PATH=str(broken)) as served:
        served.process.wait(timeout=STARTUP_DEADLINE_S)
        assert served.process.returncode == 2, served.output()
        assert "neither diffusion_pytorch_model.safetensors nor" in served.output()
        assert "LINGSTREAM_MODEL_PATH" in served.output()
