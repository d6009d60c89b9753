"""The Python client's pure parts: which chunk a received frame shows, the error classes of the stable codes, the
session body, where ICE candidates are gathered, and the stream's bookkeeping (through a recording link)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.bidirectional import Pause, Resume, SetPrompt
from service.errors import error_table, http_status_spec
from tests.support.fakes.clock import FakeClock
from tests.support.fakes.transport_port import make_frames
from transport.base import ChunkStatus, DoneStatus, ErrorStatus
from transport.client import (
    ApiError,
    ChunkTracker,
    ControlRefusedError,
    InvalidInputError,
    LiveKitTokenError,
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
from transport.client.links import LiveKitLink, is_source_placeholder
from transport.protocol import decode_control, encode_status
from transport.session.pacing import REPEAT_PTS_OFFSET, PacedFrame, PacingConfig, PacingCore, SendFrame, frame_pts

ROOT = Path(__file__).resolve().parents[4]
TICKS = 3600  # 90 kHz / 25 fps
FIRST = 2  # the first frame the client received was the session's frame 2: RTP timestamps count from there


def _chunk(index: int, stamped: bool = True) -> ChunkStatus:
    """Chunk `index` of a one-frame-per-chunk session: its frame is the session's frame `index`."""
    return ChunkStatus(index, -1, (), {}, index * TICKS if stamped else None)


def _rtp(frame: int) -> int:
    return (frame - FIRST) * TICKS


def _play(tracker: ChunkTracker, delays: list[float], period: float = 0.04, *, lost: int = 0) -> None:
    """Statuses of chunks FIRST.. leave every `period` s, each chunk's frame arrives `delays[i]` after its status;
    the statuses of the first `lost` chunks never arrive (sent before the data channel opened)."""
    events: list[tuple[float, int, str]] = []
    for i, delay in enumerate(delays):
        index = FIRST + i
        if i >= lost:
            events.append((i * period, index, "status"))
        events.append((i * period + delay, index, "frame"))
    for at, index, kind in sorted(events):
        if kind == "status":
            tracker.status(_chunk(index), at)
        else:
            tracker.frame(_rtp(index), at)


def test_frames_are_labelled_exactly_once_the_offset_is_fitted_over_many_statuses() -> None:
    tracker = ChunkTracker()
    # The first status is lost and the first frames lag their statuses by more than a frame interval: the first
    # status to arrive (chunk 3's) is followed by chunk 2's frame, a frame off. Then the video catches up: only the
    # true offset has no frame overtaking its status.
    _play(tracker, [0.045] * 6 + [0.015] * 20, lost=1)
    assert tracker.offset == FIRST * TICKS
    assert tracker.label(_rtp(FIRST)) == (None, False, FIRST * TICKS)  # its status never came
    for index in range(FIRST + 1, FIRST + 26):
        chunk, first, pts = tracker.label(_rtp(index))
        assert (chunk, first, pts) == (_chunk(index), True, index * TICKS)


def test_a_fit_refuses_an_offset_that_pairs_statuses_with_the_repeats_sent_before_their_frames() -> None:
    """One-frame chunks on every other slot of a 25 fps stream, each after an idle slot that keep-warm fills with a
    repeat (`REPEAT_PTS_OFFSET` after that slot). Each repeat arrives 2 ms after the next chunk's status and the
    chunk's frame 30 ms after: paired with the repeats, the statuses follow more closely than with their frames."""

    def play(tracker: ChunkTracker) -> None:
        for k in range(1, 20):
            at = k * 0.08
            tracker.status(ChunkStatus(k, -1, (), {}, 2 * k * TICKS), at)
            tracker.frame((2 * k - 1) * TICKS + REPEAT_PTS_OFFSET - base, at + 0.002)
            tracker.frame(2 * k * TICKS - base, at + 0.03)

    base = TICKS + REPEAT_PTS_OFFSET  # the first frame received (RTP timestamps count from it): the first repeat
    blind = ChunkTracker()  # no frame rate: the fit cannot tell a repeat, and pairs the statuses with them
    play(blind)
    assert blind.offset is not None
    assert blind.offset != base
    tracker = ChunkTracker(fps=25.0)
    play(tracker)
    assert tracker.offset == base
    for k in range(1, 20):
        assert tracker.label(2 * k * TICKS - base) == (ChunkStatus(k, -1, (), {}, 2 * k * TICKS), True, 2 * k * TICKS)
        assert tracker.label((2 * k - 1) * TICKS + REPEAT_PTS_OFFSET - base)[1] is False  # a repeat starts nothing


def test_a_frame_read_before_its_status_arrived_is_labelled_when_it_is_read_after() -> None:
    tracker = ChunkTracker()
    _play(tracker, [0.01] * 10)
    assert tracker.label(_rtp(FIRST + 12)) == (_chunk(FIRST + 9), False, (FIRST + 12) * TICKS)  # not announced yet
    tracker.status(_chunk(FIRST + 12), 1.0)
    assert tracker.label(_rtp(FIRST + 12)) == (_chunk(FIRST + 12), True, (FIRST + 12) * TICKS)


def test_nothing_is_labelled_before_a_stamped_status_and_unstamped_ones_label_nothing() -> None:
    tracker = ChunkTracker()
    tracker.frame(_rtp(FIRST), 0.0)
    assert tracker.label(_rtp(FIRST)) == (None, False, None)
    tracker.status(_chunk(FIRST, stamped=False), 0.01)
    tracker.frame(_rtp(FIRST + 1), 0.05)
    assert tracker.offset is None
    assert tracker.label(_rtp(FIRST + 1)) == (None, False, None)


def test_without_timestamps_each_status_goes_to_the_next_frame_that_arrives() -> None:
    tracker = ChunkTracker()
    assert tracker.frame(None, 0.0) == (None, False)
    tracker.status(_chunk(0), 0.01)
    assert tracker.frame(None, 0.02) == (_chunk(0), True)
    assert tracker.frame(None, 0.03) == (_chunk(0), False)
    tracker.status(_chunk(1), 0.04)
    tracker.status(_chunk(2), 0.05)
    assert tracker.frame(None, 0.06) == (_chunk(1), True)
    assert tracker.frame(None, 0.07) == (_chunk(2), True)


def _service_codes() -> set[str]:
    """Every stable code the service answers with: its exception table's and routing's own (statuses outside the
    routing table get a made-up `http_<status>`, which no client can be told about in advance)."""
    routing = {http_status_spec(status).code for status in range(400, 600)}
    return {spec.code for spec in error_table().values()} | {code for code in routing if not code.startswith("http_")}


def test_every_code_the_service_answers_has_a_client_class_or_is_a_plain_api_error() -> None:
    codes = _service_codes()
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
    assert isinstance(api_error(422, "livekit_token_refused", "401"), LiveKitTokenError)
    assert isinstance(api_error(503, "draining", "later"), UnavailableError)
    limited = api_error(429, "queue_full", "full", retry_after=12.0)
    assert isinstance(limited, RateLimitedError)
    assert (limited.status, limited.code, limited.message, limited.retry_after) == (429, "queue_full", "full", 12.0)
    future = api_error(418, "a_code_from_a_newer_service", "hm")
    assert type(future) is ApiError
    assert future.code == "a_code_from_a_newer_service"


def test_the_error_table_of_docs_client_md_lists_each_class_with_the_codes_it_maps() -> None:
    text = (ROOT / "docs" / "client.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+Error)` \| (.*) \|$", text, flags=re.MULTILINE)
    # The codes of a row are its backquoted words outside parentheses (those explain: "(see `retry_after`)").
    documented = {
        name: set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", codes))) for name, codes in rows if name != "ApiError"
    }
    mapped: dict[str, set[str]] = {}
    for code, cls in error_classes().items():
        mapped.setdefault(cls.__name__, set()).add(code)
    assert documented == mapped, "docs/client.md's table of error classes and codes is not transport/client/errors.py's"


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


class WedgedLink(RecordingLink):
    """A link whose close never finishes (a peer connection stuck in its DTLS teardown)."""

    def __init__(self) -> None:
        super().__init__()
        self.closing = asyncio.Event()

    async def aclose(self) -> None:
        self.closing.set()
        await asyncio.Event().wait()


async def test_a_raising_status_listener_is_logged_once_and_the_stream_and_other_listeners_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = LiveStream(_info())
    stream.attach_link(RecordingLink())
    seen: list[object] = []

    def broken(message: object) -> None:
        dict(message)  # type: ignore[call-overload]  # what a new user tried on a WarningStatus

    stream.add_status_listener(broken)
    stream.add_status_listener(seen.append)
    for index in range(3):
        stream.on_status(encode_status(ChunkStatus(index=index, applied_seq=0, keys=(), timings={})))
    stream.on_status(encode_status(DoneStatus("closed")))
    assert [type(message).__name__ for message in seen] == ["ChunkStatus"] * 3 + ["DoneStatus"]
    assert stream.last_chunk is not None
    assert stream.last_chunk.index == 2
    assert stream.done == DoneStatus("closed")
    assert stream.statistics().listener_errors == 4
    logged = [record for record in caplog.records if "status listener" in record.getMessage()]
    assert len(logged) == 1
    assert logged[0].exc_info is not None


async def test_aclose_returns_within_its_bound_when_the_link_is_wedged() -> None:
    stream = LiveStream(_info(), close_timeout=0.2)
    link = WedgedLink()
    stream.attach_link(link)
    started = asyncio.get_running_loop().time()
    async with asyncio.timeout(5):
        await stream.aclose()
    assert link.closing.is_set()
    assert asyncio.get_running_loop().time() - started < 2
    assert stream.ended  # readers waiting on the stream stop waiting
    assert await stream.next_frame() is None
    async with asyncio.timeout(1):
        assert (await stream.wait_done()).reason == "connection closed by the client"
    await stream.aclose()  # idempotent
    with pytest.raises(ValueError, match="close_timeout"):
        LiveStream(_info(), close_timeout=0)


def test_the_services_stream_base_makes_the_offset_exact_whatever_the_arrival_times() -> None:
    tracker = ChunkTracker()
    _play(tracker, [0.045] * 20)  # every frame a frame interval late: a fit alone would be a frame off
    fitted = tracker.offset
    tracker.status(replace(_chunk(FIRST + 20), stream_base_pts=FIRST * TICKS), 2.0)
    assert tracker.offset == FIRST * TICKS != fitted
    for index in range(FIRST, FIRST + 20):
        assert tracker.label(_rtp(index)) == (_chunk(index), True, index * TICKS)
    last = replace(_chunk(FIRST + 20), stream_base_pts=FIRST * TICKS)
    assert tracker.label(_rtp(FIRST + 20)) == (last, True, (FIRST + 20) * TICKS)
    assert tracker.label(_rtp(FIRST + 5) + 1)[:2] == (_chunk(FIRST + 5), True)  # a tick of rounding is the same slot


def _paced_with_an_idle_gap() -> list[PacedFrame]:
    """What a pacer at 20 fps with keep-warm sends: chunk 0 (3 frames), 1.2 s of nothing (repeats), chunk 1 (2)."""
    clock = FakeClock()
    core = PacingCore(PacingConfig(fps=20.0, width=8, height=8, idle_frame_interval=0.25))
    sent: list[PacedFrame] = []

    def run_until(until: float) -> None:
        while True:
            decision = core.poll(clock.now())
            if isinstance(decision, SendFrame):
                sent.append(decision.frame)
                continue
            if decision.deadline is None or decision.deadline > until:
                clock.advance(max(0.0, until - clock.now()))
                return
            clock.advance(max(0.0, decision.deadline - clock.now()))

    core.push_chunk(make_frames(0, 3, 8, 8), first_frame_index=0, chunk_index=0, now=clock.now())
    run_until(0.1 + 1.2)
    core.push_chunk(make_frames(3, 2, 8, 8), first_frame_index=3, chunk_index=1, now=clock.now())
    run_until(clock.now() + 0.1)
    return sent


@pytest.mark.parametrize("joined_at", [0, 3], ids=["from-the-start", "during-the-idle-gap"])
async def test_frames_around_an_idle_gap_keep_their_labels_and_repeats_are_flagged(joined_at: int) -> None:
    """The client's labels around keep-warm repeats, on the timestamps a real pacer gives: generated frames keep
    their chunk and first-of-chunk exactly, repeats are flagged, labelled like the frame they repeat, never first."""
    paced = _paced_with_an_idle_gap()
    assert [frame.repeat for frame in paced].count(True) >= 3
    seen = paced[joined_at:]  # a client that joined late receives from there (its first frame may be a repeat)
    base = frame_pts(seen[0], 20.0)  # the service's `stream_base_pts`: the first frame the connection got
    stream = LiveStream(_info())
    firsts = {frame.chunk_index: frame for frame in reversed(paced) if not frame.repeat}
    statuses = {
        index: ChunkStatus(index, -1, (), {}, first_frame_pts=frame_pts(frame, 20.0), stream_base_pts=base)
        for index, frame in firsts.items()
    }
    told: set[int] = set()
    for frame in seen:
        if not frame.repeat and firsts[frame.chunk_index] is frame:
            stream.on_status(encode_status(statuses[frame.chunk_index]))  # it leaves the service with this frame
            told.add(frame.chunk_index)
        stream.on_frame(frame.image, frame_pts(frame, 20.0) - base)
    stream.on_status(encode_status(DoneStatus("closed")))
    received = [frame async for frame in stream.frames()]
    assert [frame.repeat for frame in received] == [frame.repeat for frame in seen]
    for got, sent in zip(received, seen, strict=True):
        assert got.pts == frame_pts(sent, 20.0)
        known = sent.chunk_index in told  # a chunk whose status left before the client joined labels nothing
        assert got.chunk == (statuses[sent.chunk_index] if known else None)
        assert got.first_of_chunk == (not sent.repeat and firsts[sent.chunk_index] is sent)
        np.testing.assert_array_equal(got.image, sent.image)


def _id_status(index: int, first_frame_id: int) -> ChunkStatus:
    return ChunkStatus(index, index, (), first_frame_pts=first_frame_id * TICKS, first_frame_id=first_frame_id)


def test_frame_ids_label_every_frame_exactly_and_a_seen_id_is_a_repeat() -> None:
    tracker = ChunkTracker(fps=25.0)
    # Chunks of 4 frames from frame 8 on; frame 11 is sent again twice (keep-warm) before chunk 3 starts.
    arrivals = [8, 9, 10, 11, 11, 11, 12, 13, 14, 15]
    repeats = [tracker.frame_id(frame_id) for frame_id in arrivals]
    assert repeats == [False, False, False, False, True, True, False, False, False, False]
    for index, first in ((2, 8), (3, 12)):  # the statuses may come after their frames: labels are read later
        tracker.status(_id_status(index, first), 0.0)
    labels = [tracker.label_id(frame_id) for frame_id in arrivals]
    assert [chunk.index if chunk is not None else None for chunk, _ in labels] == [2, 2, 2, 2, 2, 2, 3, 3, 3, 3]
    assert [first for _, first in labels] == [True, False, False, False, False, False, True, False, False, False]
    assert tracker.label_id(7) == (None, False)  # before the first status received


def test_a_frame_id_behind_a_lost_status_is_labelled_none_not_guessed() -> None:
    tracker = ChunkTracker()
    tracker.status(_id_status(0, 0), 0.0)
    tracker.status(_id_status(2, 8), 0.0)  # chunk 1's (lossy) status was lost
    assert tracker.label_id(3)[0] is None  # chunk 0's last frame or chunk 1's: unknown
    chunk, first = tracker.label_id(9)
    assert chunk is not None
    assert (chunk.index, first) == (2, False)


async def test_a_livekit_stream_labels_frames_by_their_ids_and_flags_repeats() -> None:
    stream = LiveStream(_info())
    stream.attach_link(RecordingLink())
    for frame_id in (0, 1, 1, 2, 3):
        stream.on_frame(np.full((8, 8, 3), frame_id, np.uint8), None, frame_id)
    stream.on_status(encode_status(_id_status(0, 0)))
    stream.on_status(encode_status(_id_status(1, 2)))
    stream.on_status(encode_status(DoneStatus("closed")))
    frames = [frame async for frame in stream.frames()]
    assert [(f.frame_id, f.chunk.index if f.chunk else None, f.first_of_chunk, f.repeat) for f in frames] == [
        (0, 0, True, False),
        (1, 0, False, False),
        (1, 0, False, True),
        (2, 1, True, False),
        (3, 1, False, False),
    ]
    await stream.aclose()


class AnsweringLink(RecordingLink):
    """A `CommandLink` (as LiveKit's): commands are calls; `refuse` makes the next one refused."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[object] = []
        self.refuse: ControlRefusedError | None = None

    async def command(self, message: object) -> str | None:
        if self.refuse is not None:
            raise self.refuse
        self.commands.append(message)
        return {Pause(): "paused", Resume(): "running"}.get(message, "running")


async def test_commands_over_a_command_link_answer_the_state_and_refusals_raise_and_are_recorded() -> None:
    stream = LiveStream(_info())
    link = AnsweringLink()
    stream.attach_link(link)
    seen: list[object] = []
    stream.add_status_listener(seen.append)
    assert await stream.pause() == "paused"
    assert stream.state == "paused"
    assert await stream.resume() == "running"
    link.refuse = ControlRefusedError("rate_limited", "too many prompts", 2010)
    with pytest.raises(ControlRefusedError) as refused:
        await stream.send_prompt("dusk")
    assert refused.value.code == "rate_limited"
    assert stream.errors == [ErrorStatus("rate_limited", "too many prompts")]
    assert seen == [ErrorStatus("rate_limited", "too many prompts")]
    assert link.commands == [Pause(), Resume()]
    assert link.sent == []  # no packet went: the calls were the commands
    plain = LiveStream(_info())
    plain.attach_link(RecordingLink())
    assert await plain.pause() is None  # a packet (embedded): no answer


def test_a_frame_past_the_newest_known_chunk_awaits_its_status_instead_of_taking_the_previous_label() -> None:
    tracker = ChunkTracker()
    tracker.status(_id_status(0, 0), 0.0)
    assert not tracker.awaits_status(0)  # one status: its first frame is its own for sure
    assert tracker.awaits_status(1)  # the length is not known: frame 1 may be chunk 1's
    assert tracker.awaits_status(9)
    assert tracker.label_id(4) == (None, False)  # never the previous chunk's label (a full run saw 20 as chunk 4)
    tracker.status(_id_status(1, 4), 0.0)  # chunks of 4 frames: chunk 1 is frames 4..7
    assert [tracker.awaits_status(i) for i in (4, 7, 8, 11)] == [False, False, True, True]
    assert tracker.label_id(7)[0] == _id_status(1, 4)
    assert tracker.label_id(8) == (None, False)  # chunk 2's first frame overtook chunk 2's status
    tracker.status(_id_status(2, 8), 0.0)
    assert not tracker.awaits_status(8)
    assert tracker.label_id(8) == (_id_status(2, 8), True)


async def test_a_livekit_reader_waits_a_moment_for_the_status_its_frame_overtook() -> None:
    stream = LiveStream(_info())
    stream.attach_link(RecordingLink())
    stream.on_status(encode_status(_id_status(0, 0)))
    stream.on_status(encode_status(_id_status(1, 2)))
    for frame_id in (2, 3, 4):
        stream.on_frame(np.full((8, 8, 3), frame_id, np.uint8), None, frame_id)
    read = [await stream.next_frame(), await stream.next_frame()]
    waiting = asyncio.create_task(stream.next_frame())  # frame 4: chunk 2's, whose status is still on its way
    await asyncio.sleep(0.05)
    assert not waiting.done()
    stream.on_status(encode_status(_id_status(2, 4)))
    frame = await waiting
    assert frame is not None
    assert frame.chunk is not None
    assert [(f.frame_id, f.chunk.index if f.chunk else None) for f in read if f] == [(2, 1), (3, 1)]
    assert (frame.frame_id, frame.chunk.index, frame.first_of_chunk) == (4, 2, True)
    stream.on_frame(np.zeros((8, 8, 3), np.uint8), None, 6)  # chunk 3's first frame; its status was lost
    started = asyncio.get_running_loop().time()
    lost = await stream.next_frame()
    assert lost is not None
    assert lost.chunk is None  # labelled None after the bounded wait, not chunk 2
    assert asyncio.get_running_loop().time() - started < 2.0
    await stream.aclose()


def test_the_sdks_placeholders_are_skipped_on_livekit_black_before_the_first_stamped_frame_and_any_after() -> None:
    black = np.zeros((4, 6, 3), np.uint8)
    picture = black.copy()
    picture[1, 2, 0] = 1
    # before any frame with the service's id: a black frame without one is the native source's placeholder
    assert is_source_placeholder(black, None, stamped=False)
    # a stamped frame is the session's, and so is a picture without an id from a service that stamps nothing
    assert not is_source_placeholder(black, 0, stamped=False)
    assert not is_source_placeholder(picture, None, stamped=False)
    # once stamped frames came, any frame without an id is a source's placeholder (an adopter's new source, #33)
    assert is_source_placeholder(black, None, stamped=True)
    assert is_source_placeholder(picture, None, stamped=True)
    assert not is_source_placeholder(black, 7, stamped=True)


def test_a_frame_without_an_id_on_a_stream_of_stamped_frames_takes_no_waiting_status() -> None:
    """The interleaving of a SIGKILLed replica's last frames and its adopter's new track (issue #33, a full run's
    follower read `sequence [2, 1, 2, 5]`): the adopter's source sent placeholders (no frame id) before its first
    capture; labelled by arrival, they took the oldest statuses queued for that mode, chunks 1 and 2 again."""
    tracker = ChunkTracker(fps=25.0)
    tracker.status(_id_status(1, 1), 0.0)  # chunks of 4 frames from frame 1 (chunk 0 was frame 0 alone)
    tracker.status(_id_status(2, 5), 0.0)
    labels: list[int | None] = []
    for frame_id in (1, 2, 3, 4, 5, 6):  # the old replica's frames, the last two after the kill
        tracker.frame_id(frame_id)
        chunk, _ = tracker.label_id(frame_id)
        labels.append(None if chunk is None else chunk.index)
    for _ in range(3):  # the adopter's placeholders
        chunk, first = tracker.frame(None, 1.0)
        assert (chunk, first) == (None, False)
        labels.append(None)
    tracker.status(_id_status(5, 17), 2.0)  # the adopter goes on from chunk 5 (the old one had generated 3 and 4)
    for frame_id in (17, 18):
        assert not tracker.frame_id(frame_id)
        chunk, _ = tracker.label_id(frame_id)
        labels.append(None if chunk is None else chunk.index)
    assert labels == [1, 1, 1, 1, 2, 2, None, None, None, 5, 5]
    known = [label for label in labels if label is not None]
    assert known == sorted(known)  # never back


def test_without_frame_ids_statuses_still_label_frames_by_arrival() -> None:
    tracker = ChunkTracker()
    tracker.status(_id_status(1, 1), 0.0)
    tracker.status(_id_status(2, 5), 0.0)
    assert tracker.frame(None, 0.1)[0] == _id_status(1, 1)  # a service that stamps no frames: arrival order
    assert tracker.frame(None, 0.2)[0] == _id_status(2, 5)


class _Metadata:
    def __init__(self, frame_id: int | None) -> None:
        self.frame_id = frame_id

    def HasField(self, name: str) -> bool:  # the protobuf message's method
        return name == "frame_id" and self.frame_id is not None


class _Event:
    """What `rtc.VideoStream` yields: `frame` (RGB24 bytes, width, height) and `metadata` (the frame id)."""

    def __init__(self, level: int, frame_id: int | None) -> None:
        self.frame = SimpleNamespace(data=bytes([level]) * (4 * 6 * 3), width=6, height=4)
        self.metadata = _Metadata(frame_id)


async def _video(events: list[_Event]) -> AsyncIterator[_Event]:
    for event in events:
        yield event


async def test_a_new_tracks_placeholders_are_skipped_after_the_old_tracks_stamped_frames() -> None:
    """An adopter's new track comes from a new `VideoSource`, which sends placeholders before its first capture, and
    the subscriber may read them on the old track's stream (the server can carry the new track on the same
    transceiver): the link skips every frame without an id once stamped frames came (issue #33). Read through
    `LiveKitLink._read` with the SDK's stream stood in for (`livekit.rtc` never loads in pytest)."""
    stream = LiveStream(_info())
    stream.attach_link(RecordingLink())
    link = LiveKitLink.__new__(LiveKitLink)  # only the reader: no room, no SDK
    link._stream, link._stamped = stream, False
    placeholder = _Event(0, None)
    await link._read(_video([placeholder, _Event(9, 4), _Event(0, 5), placeholder, _Event(3, None)]))  # old track
    await link._read(_video([placeholder, placeholder, _Event(7, 17)]))  # the new track
    stream.on_status(encode_status(DoneStatus("closed")))
    frames = [frame async for frame in stream.frames()]
    assert [frame.frame_id for frame in frames] == [4, 5, 17]
