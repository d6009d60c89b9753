"""`lingstream play`'s own logic: control-to-photon from sent snapshots and received frames, and option checks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from service.play import PhotonMeter, main, wait_for_chunk
from transport.base import ChunkStatus
from transport.client import LiveStream, ReceivedFrame, SessionInfo
from transport.protocol import encode_status


def _frame(at: float, applied_seq: int | None) -> ReceivedFrame:
    chunk = None if applied_seq is None else ChunkStatus(0, applied_seq, (), {}, 0)
    return ReceivedFrame(np.zeros((2, 2, 3), np.uint8), at, None, chunk, True)


def test_a_change_is_seen_by_the_first_frame_of_a_chunk_that_applied_it_or_a_newer_one() -> None:
    meter = PhotonMeter()
    meter.sent(10, at=1.0)
    meter.sent(11, at=1.5)
    meter.frame(_frame(1.2, None))  # no chunk known yet
    meter.frame(_frame(1.3, 9))  # generated from an older control
    meter.frame(_frame(1.6, 10))
    assert meter.latencies_s == [pytest.approx(0.6)]
    meter.sent(12, at=2.0)
    meter.frame(_frame(2.4, 12))  # 11 was overtaken by 12: both are shown now
    assert meter.latencies_s == [pytest.approx(0.6), pytest.approx(0.9), pytest.approx(0.4)]
    assert meter.pending == []


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", "clip.webm"], "--out must end in .mp4"),
        (["--tail", "-1"], "--tail must be"),
        (["--livekit-identity", "user-1"], "together"),
        (["--livekit-identity", "u", "--livekit-token", "t"], "--livekit-identity needs --livekit-room"),
        (["--config", "[1]"], "--config must be a JSON object"),
    ],
)
def test_bad_options_exit_two_before_anything_is_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"chunk": 0, "keys": ["w"]}\n')
    argv = ["--url", "http://127.0.0.1:9", "--controls", str(trace), "--out", str(tmp_path / "o.mp4"), *extra]
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def _stream() -> LiveStream:
    info = SessionInfo.from_body(
        {
            "id": "s1",
            "status": "running",
            "transport": {"kind": "embedded"},
            "video": {"width": 8, "height": 8, "fps": 20},
        }
    )
    return LiveStream(info)


async def test_a_chunk_entry_waits_for_the_chunk_before_it_or_the_end_and_not_forever() -> None:
    stream = _stream()
    waiting = asyncio.create_task(wait_for_chunk(stream, 3, within=30.0))
    stream.on_status(encode_status(ChunkStatus(2, -1, (), {})))
    await asyncio.sleep(0)  # the waiter runs: chunk 2 is not the one it waits for
    assert not waiting.done()
    stream.on_status(encode_status(ChunkStatus(4, -1, (), {})))  # chunk 3's status was lost: a later one will do
    assert await waiting is True
    assert await wait_for_chunk(stream, 1, within=30.0) is True  # seen already

    ended = asyncio.create_task(wait_for_chunk(stream, 9, within=30.0))
    await asyncio.sleep(0)
    stream.on_link_lost("the room closed")
    assert await ended is True
    assert await wait_for_chunk(_stream(), 0, within=0.01) is False  # nothing ever comes: bounded
