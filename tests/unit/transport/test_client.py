"""The Python client's pure parts: which chunk a received frame shows, the error classes of the stable codes, the
session body, where ICE candidates are gathered, and the stream's bookkeeping (through a recording link)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from pipeline.bidirectional import SetPrompt
from service.errors import error_table, http_status_spec
from transport.base import ChunkStatus, DoneStatus, ErrorStatus
from transport.client import (
    ApiError,
    ChunkTracker,
    InvalidInputError,
    LiveStream,
    RateLimitedError,
    RoomInUseError,
    RoomNotFoundError,
    SessionInfo,
    UnauthorizedError,
    UnavailableError,
    api_error,
    default_ice_addresses,
    error_classes,
)
from transport.protocol import decode_control, encode_status

ORIGIN = 4_000_000_000  # an RTP offset near the 32-bit wrap
TICKS = 4500  # 90 kHz / 20 fps


def _chunk(index: int, first_frame: int | None, applied_seq: int = -1) -> ChunkStatus:
    pts = None if first_frame is None else first_frame * TICKS
    return ChunkStatus(index, applied_seq, (), {}, pts)


def _rtp(frame: int) -> int:
    return (ORIGIN + frame * TICKS) % (1 << 32)


def test_frames_are_matched_to_chunks_by_their_rtp_timestamp_across_the_wrap() -> None:
    tracker = ChunkTracker()
    assert tracker.frame(_rtp(0)) == (None, False, None)  # no stamped status yet: nothing is known
    for index in range(3):
        tracker.status(_chunk(index, first_frame=10 + 4 * index))  # four frames per chunk
    seen = []
    for frame in range(10, 22):
        chunk, first, pts = tracker.frame(_rtp(frame))
        assert pts == frame * TICKS
        assert chunk is not None
        seen.append((chunk.index, first))
    assert seen == [(i // 4, i % 4 == 0) for i in range(12)]


def test_a_status_that_comes_late_is_taken_when_its_frame_is_reached() -> None:
    tracker = ChunkTracker()
    tracker.status(_chunk(0, first_frame=0))
    assert tracker.frame(_rtp(0))[:2] == (_chunk(0, 0), True)
    assert tracker.frame(_rtp(1))[:2] == (_chunk(0, 0), False)
    # chunk 1's frames (from frame 2 on) are not announced yet: they stay with the chunk before
    assert tracker.frame(_rtp(2))[0] == _chunk(0, 0)
    tracker.status(_chunk(1, first_frame=2))
    tracker.status(_chunk(2, first_frame=5))
    assert tracker.frame(_rtp(3))[:2] == (_chunk(1, 2), True)
    assert tracker.frame(_rtp(6))[:2] == (_chunk(2, 5), True)  # frames lost in between: still the right chunk


def test_unstamped_statuses_never_claim_a_frame() -> None:
    tracker = ChunkTracker()
    tracker.status(_chunk(0, first_frame=None))
    assert tracker.frame(_rtp(0)) == (None, False, None)


def test_without_timestamps_each_status_goes_to_the_next_frame_that_arrives() -> None:
    tracker = ChunkTracker()
    assert tracker.frame(None) == (None, False, None)
    tracker.status(_chunk(0, first_frame=0))
    assert tracker.frame(None) == (_chunk(0, 0), True, None)
    assert tracker.frame(None) == (_chunk(0, 0), False, None)
    tracker.status(_chunk(1, first_frame=4))
    tracker.status(_chunk(2, first_frame=8))
    assert tracker.frame(None)[:2] == (_chunk(1, 4), True)
    assert tracker.frame(None)[:2] == (_chunk(2, 8), True)


def test_every_code_the_service_answers_has_a_client_class_or_is_a_plain_api_error() -> None:
    codes = {spec.code for spec in error_table().values()} | {http_status_spec(s).code for s in (400, 404, 405, 413)}
    classes = error_classes()
    unmapped = sorted(codes - set(classes))
    # The codes without a class of their own are the ones a client cannot act on differently.
    expected = {"bad_request", "forbidden", "internal", "method_not_allowed", "model_context_exhausted", "not_found"}
    assert unmapped == sorted(expected), (
        f"codes the client does not classify: {sorted(set(unmapped) - expected)}; a new code of the service goes into "
        "transport/client/errors.py (_BY_CODE, the class tree) and the table of docs/client.md"
    )
    for code in unmapped:
        assert type(api_error(500, code, "x")) is ApiError
    assert isinstance(api_error(401, "unauthorized", "no"), UnauthorizedError)
    assert isinstance(api_error(422, "invalid_config", "fps"), InvalidInputError)
    assert isinstance(api_error(422, "room_not_found", "lobby"), RoomNotFoundError)
    assert isinstance(api_error(409, "room_in_use", "lobby"), RoomInUseError)
    assert isinstance(api_error(503, "draining", "later"), UnavailableError)
    limited = api_error(429, "queue_full", "full", retry_after=12.0)
    assert isinstance(limited, RateLimitedError)
    assert (limited.status, limited.code, limited.message, limited.retry_after) == (429, "queue_full", "full", 12.0)
    future = api_error(418, "a_code_from_a_newer_service", "hm")
    assert type(future) is ApiError
    assert future.code == "a_code_from_a_newer_service"


def test_a_session_body_is_read_and_a_broken_one_is_an_api_error() -> None:
    body = {
        "id": "s1",
        "status": "failed",
        "reason": "model_failure",
        "queue_position": None,
        "transport": None,
        "config": {"fps": 16},
        "video": {"width": 64, "height": 48, "fps": 16.0},
        "error": {"code": "model_failure", "message": "boom"},
    }
    info = SessionInfo.from_body(body)
    assert (info.id, info.width, info.height, info.fps, info.terminal, info.streaming) == (
        "s1",
        64,
        48,
        16.0,
        True,
        False,
    )
    ended = info.ended_error()
    assert (ended.status, ended.reason, ended.code, ended.message) == (
        "failed",
        "model_failure",
        "model_failure",
        "boom",
    )
    with pytest.raises(ApiError, match="not a session body"):
        SessionInfo.from_body({"id": "s1"})


@pytest.mark.parametrize(
    ("url", "addresses"),
    [
        ("http://127.0.0.1:8080", ("127.0.0.1",)),
        ("http://localhost:8080", ("127.0.0.1",)),
        ("http://[::1]:8080", ("::1",)),
        ("http://10.0.0.5:8080", None),
        ("https://worlds.example", None),
    ],
)
def test_a_loopback_service_gets_loopback_candidates_and_others_the_default(
    url: str, addresses: tuple[str, ...] | None
) -> None:
    assert default_ice_addresses(url) == addresses


class RecordingLink:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bool]] = []
        self.closed = False

    async def send(self, payload: bytes, *, reliable: bool) -> None:
        self.sent.append((payload, reliable))

    async def aclose(self) -> None:
        self.closed = True


def _info() -> SessionInfo:
    return SessionInfo.from_body(
        {
            "id": "s1",
            "status": "running",
            "transport": {"kind": "embedded"},
            "video": {"width": 8, "height": 8, "fps": 20},
        }
    )


async def test_a_stream_numbers_its_snapshots_and_keeps_the_newest_frames_when_its_buffer_is_full() -> None:
    stream = LiveStream(_info(), frame_buffer=2)
    link = RecordingLink()
    stream.attach_link(link)
    first = await stream.send_keys(["w", "ArrowLeft"])
    prompt = await stream.send_prompt("dusk")
    second = await stream.send_keys([])
    assert second == first + 1  # prompts count on their own
    assert stream.sent_at(first) is not None
    decoded = [decode_control(payload) for payload, _ in link.sent]
    assert decoded[1] == SetPrompt(prompt, "dusk")
    snapshots = [decoded[0], decoded[2]]
    assert [(m.seq, sorted(m.keys)) for m in snapshots] == [(first, ["j", "w"]), (second, [])]  # type: ignore[union-attr]
    for level in range(3):
        stream.on_frame(np.full((8, 8, 3), level, np.uint8), None)
    stream.on_status(encode_status(ErrorStatus("invalid_keys", "no")))
    stream.on_status(encode_status(DoneStatus("closed")))
    levels = [int(frame.image[0, 0, 0]) async for frame in stream.frames()]
    assert levels == [1, 2]  # drop oldest
    stats = stream.statistics()
    assert (stats.frames_received, stats.frames_dropped, stats.errors, stats.controls_sent) == (3, 1, 1, 3)
    async with asyncio.timeout(1):
        assert await stream.stop() == DoneStatus("closed")  # already done: no stop is sent
    assert len(link.sent) == 3
    await stream.aclose()
    assert link.closed
