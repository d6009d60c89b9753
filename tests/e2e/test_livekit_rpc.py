"""RPC methods and frame metadata on a real `livekit-server`: the Python client (`transport.client`, the real SDK,
in a process of its own: `tests/support/livekit_client.py labels`) steers a session of `lingstream serve` by RPC and
labels every frame it receives by its LiveKit frame metadata.

The workers are `framed_fake_workers`: chunks of 4 frames, frame i of the session's video two flat grey halves, the
top at level 16 (i mod 16) and the bottom at 16 (i // 16 mod 16). So each received frame's picture says its frame
index modulo 256, more than a run's frames span, and the test checks every frame's labels against the picture
itself: its `frame_id` (the service's stamp: every frame of the run, those before the client's first chunk status
too), its chunk (`frame_id // 4`, the status whose `first_frame_id` is `4 × index`), whether it starts its chunk,
and whether it is a keep-warm repeat (sent while paused: the id of the frame it repeats). A label off by any number
of frames fails: by fewer than 256 the picture disagrees, by 256 or more the chunk it names has no status in the
run. Skipped, with the reason, where the namespace cannot be made or livekit-server is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.livekit_stack import LiveKitStack, livekit_stack
from tests.support.serving import ROOT

CLIENT_S = 90.0
FRAMES_PER_CHUNK = 4
LEVEL_STEP = 16
LEVEL_TOLERANCE = 8  # VP8 moves a flat level by a few steps; the next frame's is 16 away

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LiveKitStack.skip_reason() is not None, reason=str(LiveKitStack.skip_reason())),
]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveKitStack]:
    workdir = tmp_path_factory.mktemp("livekit-rpc")
    with livekit_stack(workdir, factory="tests.support.fakes.world:framed_fake_workers") as running:
        yield running
    assert "Traceback" not in running.output(), running.output()[-4000:]


def _level_distance(level: float, painted: int) -> float:
    distance = abs(level - painted)
    return min(distance, 256 - distance)


def _shows(frame: dict[str, Any], frame_id: int) -> bool:
    """Whether the frame's picture is the one frame `frame_id` of the session's video was painted with (both digits
    of the id modulo 256: see the module docstring)."""
    low = frame_id * LEVEL_STEP % 256
    high = frame_id // (256 // LEVEL_STEP) * LEVEL_STEP % 256
    return (
        _level_distance(frame["level"], low) <= LEVEL_TOLERANCE
        and _level_distance(frame["level_high"], high) <= LEVEL_TOLERANCE
    )


def test_the_python_client_steers_by_rpc_and_labels_every_frame_by_its_frame_id(stack: LiveKitStack) -> None:
    with stack.client() as client:
        created = client.post("/v1/sessions", json={"config": {"fps": 16}})
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.support.livekit_client",
            "labels",
            stack.url,
            "--",
            session_id,
        ],  # an id may start "-"
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=CLIENT_S,
        check=False,
    )
    assert run.returncode == 0, f"the client exited {run.returncode}:\n{run.stderr[-4000:]}"
    report: dict[str, Any] = json.loads(run.stdout.strip().splitlines()[-1])

    # RPC round trips: each answer is the state the command left the session in; refusals carry their codes.
    assert report["pause"] == ["paused", "paused"], report
    assert report["resume"] == "running", report
    bad = report["bad"]
    assert (bad["malformed"]["code"], bad["malformed"]["data"]) == (2002, "malformed_json"), bad
    assert (bad["other_type"]["code"], bad["other_type"]["data"]) == (2003, "invalid_message"), bad
    assert (bad["prompt_without_seq"]["code"], bad["prompt_without_seq"]["data"]) == (2003, "invalid_message"), bad
    assert report["prompts_refused"] == ["rate_limited", "rate_limited"], report  # a burst of 5, then refused
    assert report["done"] == "client_stop"

    # Every frame of the run carries the service's frame id, the one its picture was painted with.
    frames: list[dict[str, Any]] = report["frames"]
    assert len(frames) > 40, len(frames)
    for frame in frames:
        assert frame["frame_id"] is not None, frame
        assert _shows(frame, frame["frame_id"]), frame
    ids = [frame["frame_id"] for frame in frames]
    assert max(ids) - min(ids) < 256, (min(ids), max(ids))  # the picture tells every frame of the run apart
    # Every frame is labelled with its chunk, and every label is what the picture says; only the frames of the chunk
    # in flight when the client joined cannot be (its status went out before the client was in the room).
    joined_mid_chunk = 0
    while frames[joined_mid_chunk]["chunk"] is None:
        joined_mid_chunk += 1
    in_flight = {frame["frame_id"] // FRAMES_PER_CHUNK for frame in frames[:joined_mid_chunk]}
    assert len(in_flight) <= 1, frames[:joined_mid_chunk]
    newest = -1
    repeats = 0
    for frame in frames[joined_mid_chunk:]:
        frame_id = frame["frame_id"]
        assert frame["repeat"] == (frame_id <= newest), frame
        if frame["repeat"]:
            repeats += 1
        newest = max(newest, frame_id)
        assert frame["chunk"] == frame_id // FRAMES_PER_CHUNK, frame
        assert frame["first_frame_id"] == frame["chunk"] * FRAMES_PER_CHUNK, frame
        assert frame["first"] == (frame_id % FRAMES_PER_CHUNK == 0 and not frame["repeat"]), frame
    assert repeats >= 3, "the second paused showed no keep-warm repeats"  # 100 ms apart on LiveKit
    generated = [frame["frame_id"] for frame in frames if not frame["repeat"]]
    assert generated == sorted(set(generated))  # each generated frame once, in order
    with stack.client() as client:
        assert client.get(f"/v1/sessions/{session_id}").json()["reason"] == "client_stop"
