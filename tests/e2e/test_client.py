"""The Python client (`transport.client`) and `lingstream play` against a real `lingstream serve` (fake model workers
through the test-only hook, embedded WebRTC on loopback, API keys on, one session slot).

The fake world's chunk k is one flat grey frame of level 16 k (mod 256), so a received frame proves which chunk it
shows, and the client's chunk metadata is checked against the picture itself (one chunk off is 16 levels off).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest

from tests.support.serving import ROOT, Served, environment, lingstream, serve
from transport.client import (
    InvalidInputError,
    ServiceClient,
    SessionInfo,
    SessionNotFoundError,
    UnauthorizedError,
    UnreachableError,
    connect,
)

pytestmark = pytest.mark.slow

KEY = "client-test-key-0123456789abcdef"
OTHER_KEY = "client-test-key-other-0123456789"
WAIT_S = 20.0


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    workdir = tmp_path_factory.mktemp("client")
    with serve(
        workdir,
        factory="tests.support.fakes.world:stepped_fake_workers",
        LINGSTREAM_API_KEYS=f"{KEY},{OTHER_KEY}",
        LINGSTREAM_HOST="127.0.0.1",
        LINGSTREAM_RECORDINGS_DIR=str(workdir / "recordings"),
    ) as served:
        served.wait_until_ready()
        yield served
    assert "Traceback" not in served.output(), served.output()[-4000:]


def _level(frame: np.ndarray) -> float:
    return float(frame.mean())


async def test_a_client_follows_the_queue_joins_steers_and_reads_frames_with_their_chunks(service: Served) -> None:
    async with ServiceClient(service.url, api_key=KEY) as client:
        first = await client.create(config={"fps": 25})
        assert first.status == "running"
        queued = await client.create(config={"fps": 25})
        assert (queued.status, queued.queue_position) == ("queued", 1)
        seen: list[SessionInfo] = []
        follower = asyncio.create_task(client.wait_streaming(queued.id, on_update=seen.append))

        async with asyncio.timeout(WAIT_S):
            stream = await connect(client, first)
            async with stream:
                assert (await stream.next_frame()) is not None  # video flows before any control
                seq = await stream.send_keys({"w", "ArrowRight"})
                steered = None
                while steered is None:
                    frame = await stream.next_frame()
                    assert frame is not None
                    if frame.chunk is not None and frame.chunk.applied_seq == seq:
                        steered = frame
                assert steered.chunk is not None
                assert sorted(steered.chunk.keys) == ["l", "w"]  # the alias arrives canonical
                assert steered.image.shape == (8, 8, 3)
                assert steered.image.dtype == np.uint8
                # Every frame is the chunk its metadata names: the fake paints chunk k at grey level 16 k.
                matched = 0
                for _ in range(15):
                    frame = await stream.next_frame()
                    assert frame is not None
                    assert frame.chunk is not None
                    painted = frame.chunk.index * 16 % 256
                    assert abs(_level(frame.image) - painted) < 6, (frame.chunk, _level(frame.image))
                    assert frame.pts is not None
                    matched += 1
                assert matched == 15
                prompt_seq = await stream.send_prompt("a foggy harbour at dawn")
                prompted = None
                while prompted is None:
                    frame = await stream.next_frame()
                    assert frame is not None
                    if frame.chunk is not None and frame.chunk.prompt_seq == prompt_seq:
                        prompted = frame.chunk
                assert prompted.prompt == "a foggy harbour at dawn"
                assert prompted.applied_seq == seq  # the keys' own sequence is untouched by prompts
                done = await stream.stop()
                assert done.reason == "client_stop"
                assert stream.statistics().frames_received > 15
                assert stream.errors == []

            # The queued session moves up as the first ends, and the follower saw its place in line.
            admitted = await follower
        assert admitted.status == "running"
        assert admitted.transport is not None
        assert admitted.transport["kind"] == "embedded"
        assert ("queued", 1) in [(info.status, info.queue_position) for info in seen]
        final = await client.get(first.id)
        assert (final.status, final.reason) == ("closed", "client_stop")
        await client.delete(admitted.id, "cancel")


async def test_a_raising_status_listener_leaves_a_live_session_streaming_and_aclose_bounded(service: Served) -> None:
    # Measured before listeners were isolated: the exception escaped into aiortc's DTLS task, the data channel
    # died, `done` read "connection lost" and aclose() hung for over 15 s.
    raised: list[str] = []

    def broken(message: object) -> None:
        raised.append(type(message).__name__)
        dict(message)  # type: ignore[call-overload]  # what a new user tried on a WarningStatus

    async with ServiceClient(service.url, api_key=KEY) as client:
        created = await client.create(config={"fps": 25})
        async with asyncio.timeout(WAIT_S):
            info = await client.wait_streaming(created.id)
            stream = await connect(client, info, close_timeout=3.0)
            stream.add_status_listener(broken)
            seq = await stream.send_keys({"w"})
            chunks_then = stream.statistics().chunks
            steered = None
            while steered is None:
                frame = await stream.next_frame()
                assert frame is not None, stream.done
                if frame.chunk is not None and frame.chunk.applied_seq == seq:
                    steered = frame
            # Statuses keep coming over the same data channel after the listener raised on them.
            while stream.statistics().chunks < chunks_then + 5:
                assert await stream.next_frame() is not None, stream.done
            assert stream.statistics().listener_errors >= 5
            assert "ChunkStatus" in raised
            assert not stream.ended
            done = await stream.stop()
            assert done.reason == "client_stop"  # the service's done, not a lost connection
        loop = asyncio.get_running_loop()
        started = loop.time()
        await stream.aclose()
        assert loop.time() - started < 3.5
        assert (await client.get(created.id)).reason == "client_stop"


async def test_the_services_error_codes_become_typed_exceptions(service: Served) -> None:
    async with ServiceClient(service.url, api_key="not-a-key") as stranger:
        with pytest.raises(UnauthorizedError) as refused:
            await stranger.create()
    assert (refused.value.status, refused.value.code) == (401, "unauthorized")

    async with (
        ServiceClient(service.url, api_key=KEY) as client,
        ServiceClient(service.url, api_key=OTHER_KEY) as other,
    ):
        with pytest.raises(InvalidInputError) as invalid:
            await client.create(config={"fps": 1000})
        assert (invalid.value.status, invalid.value.code) == (422, "invalid_config")
        assert "fps" in invalid.value.message
        with pytest.raises(InvalidInputError) as long_prompt:
            await client.create(prompt="x" * 600)
        assert (long_prompt.value.status, long_prompt.value.code) == (422, "prompt_too_large")
        created = await client.create(config={"fps": 25}, prompt="a quiet harbour")
        try:
            with pytest.raises(SessionNotFoundError) as hidden:  # another key's session does not exist for it
                await other.get(created.id)
            assert hidden.value.code == "session_not_found"
            with pytest.raises(SessionNotFoundError):
                await other.pause(created.id)
            await client.wait_streaming(created.id)
            paused = await client.pause(created.id)
            assert (paused.status, paused.streaming) == ("paused", True)
            assert (await client.resume(created.id)).status == "running"
        finally:
            ended = await client.delete(created.id, "cancel")
        assert ended.status in ("closed", "draining")
    async with ServiceClient("http://127.0.0.1:9", api_key=KEY) as nowhere:
        with pytest.raises(UnreachableError):
            await nowhere.get("x")


def _play(service: Served, tmp_path: Path, trace: str, *extra: str) -> subprocess.CompletedProcess[str]:
    controls = tmp_path / "trace.jsonl"
    controls.write_text(trace, encoding="utf-8")
    return subprocess.run(
        [
            *lingstream(),
            "play",
            "--url",
            service.url,
            "--api-key",
            KEY,
            "--controls",
            str(controls),
            "--out",
            str(tmp_path / "out.mp4"),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=environment(),
        cwd=ROOT,
        check=False,
    )


TRACE = """\
# w at once, turn right after half a second, a new prompt, let go once chunk 25 came, then a reset
{"chunk": 0, "keys": ["w"]}
{"t": 0.5, "keys": ["w", "l"]}
{"t": 0.6, "prompt": "snow falls on the quay"}
{"chunk": 25, "keys": []}
{"chunk": 25, "reset_pose": true}
"""


def test_play_drives_a_live_session_from_a_trace_and_records_it(service: Served, tmp_path: Path) -> None:
    run = _play(
        service, tmp_path, TRACE, "--config", '{"fps": 25}', "--tail", "1", "--report", str(tmp_path / "r.json")
    )
    assert run.returncode == 0, run.stderr
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    assert report == json.loads((tmp_path / "r.json").read_text())
    assert report["transport"] == "embedded"
    assert report["done_reason"] == "client_stop"
    assert report["errors"] == []
    # Three key changes, each seen in a frame generated from it; the fake paces 20 chunks (frames) per second.
    assert report["controls_sent"] == 6  # three snapshots, the prompt, the reset and the final stop
    assert report["control_to_photon_count"] == 3, report
    assert report["controls_unseen"] == 0
    assert 0 < report["control_to_photon_p50_ms"] <= report["control_to_photon_max_ms"] < 2000
    assert 10 < report["fps"] < 30
    assert report["chunks"] >= 26
    with av.open(report["out"]) as clip:
        decoded = [frame.to_ndarray(format="rgb24") for frame in clip.decode(video=0)]
    assert len(decoded) == report["frames_written"] == report["frames"]
    assert decoded[0].shape == (8, 8, 3)
    assert "control-to-photon" in run.stderr
    with _rest(service.url) as client:
        session = client.get(f"/v1/sessions/{report['session_id']}").json()
    assert (session["status"], session["reason"]) == ("closed", "client_stop")


def test_play_record_saves_the_services_recording_beside_what_it_received(service: Served, tmp_path: Path) -> None:
    run = _play(
        service, tmp_path, '{"chunk": 0, "keys": ["w"]}\n{"chunk": 5, "keys": []}\n', "--tail", "0.5", "--record"
    )
    assert run.returncode == 0, run.stderr
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["recording"] == str(tmp_path / "out.service.mp4")
    assert report["recording_controls"] == str(tmp_path / "out.service.controls.jsonl")
    with av.open(report["recording"]) as clip:
        generated = [frame.to_ndarray(format="rgb24") for frame in clip.decode(video=0)]
    assert len(generated) >= 6  # every chunk the service generated, one frame each here
    assert generated[0].shape == (8, 8, 3)
    entries = [
        json.loads(line) for line in Path(report["recording_controls"]).read_text().splitlines() if line[:1] == "{"
    ]
    assert entries[0]["chunk"] == 0
    assert any(entry.get("keys") == ["w"] for entry in entries)
    assert sorted(path.name for path in tmp_path.iterdir() if "service" in path.name) == [
        "out.service.controls.jsonl",
        "out.service.mp4",
    ]


def test_play_refuses_a_bad_trace_before_creating_anything(service: Served, tmp_path: Path) -> None:
    with _rest(service.url) as client:
        before = len(client.get("/v1/sessions").json()["sessions"])
    run = _play(service, tmp_path, '{"chunk": 0, "keys": ["q"]}\n')
    assert run.returncode == 2
    assert "trace.jsonl:1: unknown key 'q'" in run.stderr
    with _rest(service.url) as client:
        assert len(client.get("/v1/sessions").json()["sessions"]) == before


def test_play_reports_the_stable_code_of_a_refused_session(service: Served, tmp_path: Path) -> None:
    run = _play(service, tmp_path, '{"chunk": 0, "keys": ["w"]}\n', "--config", '{"colour": "red"}')
    assert run.returncode == 1
    assert "invalid_config" in run.stderr
    assert not (tmp_path / "out.mp4").exists()


@contextlib.contextmanager
def _rest(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=10.0, headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client


def test_the_example_of_docs_client_md_runs_as_written(service: Served, tmp_path: Path) -> None:
    text = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    example = text.split("```python\n", 1)[1].split("```", 1)[0]
    assert 'ServiceClient("http://127.0.0.1:8080", api_key=None)' in example
    script = tmp_path / "example.py"
    script.write_text(
        example.replace("http://127.0.0.1:8080", service.url)
        .replace("api_key=None", f"api_key={KEY!r}")
        # The fake world makes 20 one-frame chunks a second whatever the fps: played at 16 fps a backlog would grow
        # and chunk statuses would go out before their frames, unstamped (as the service does when generation
        # outruns playback); played at 25 fps the pacer keeps up.
        .replace('"fps": 16', '"fps": 25'),
        encoding="utf-8",
    )
    run = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=environment(), cwd=ROOT
    )
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert "running" in lines[0]
    assert any(line.startswith("turn to photon: ") for line in lines), run.stdout
    assert "16 frames of the turn (keys ('l', 'w'))" in run.stdout
    assert lines[-1] == "client_stop"
