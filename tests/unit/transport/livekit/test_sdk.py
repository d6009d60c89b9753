"""The real livekit SDK, offline: frames through `VideoSource` come back from a local `VideoStream` on the track.

The native source converts what it is given (RGB24) to I420, the format WebRTC encodes. So the stream returns
exactly the SDK's own RGB24 → I420 conversion of each generated frame (checked byte for byte), which differs from
the generated RGB by chroma subsampling and rounding only (checked with a tolerance on these smooth frames).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace

import numpy as np
import numpy.typing as npt
import pytest

from tests.support.fakes.livekit import FakeRoomFactory
from tests.support.fakes.transport_port import FakeSessionPort, make_chunk, make_frames
from tests.support.fakes.transport_timers import FakeTimers
from transport.errors import RoomJoinError
from transport.livekit.binding import LiveKitSessionBinding
from transport.livekit.config import LiveKitConfig
from transport.livekit.room import LiveKitRoom, LiveKitVideo, RoomConnectionState, RoomJoinOptions
from transport.livekit.tokens import ParticipantRole, TokenIssuer
from transport.session.pacing import PacedFrame

KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"
W, H = 416, 240


def _as_encoded(image: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint8]:
    """What the source hands the encoder, seen as RGB: the SDK's RGB24 → I420 → RGB24."""
    from livekit import rtc

    height, width, _ = image.shape
    frame = rtc.VideoFrame(width, height, rtc.VideoBufferType.RGB24, image.tobytes())
    back = frame.convert(rtc.VideoBufferType.I420).convert(rtc.VideoBufferType.RGB24)
    return np.frombuffer(back.data, np.uint8).reshape(height, width, 3).copy()


def _paced(image: npt.NDArray[np.uint8], index: int) -> PacedFrame:
    return PacedFrame(image=image, frame_index=index, chunk_index=0, media_index=index, deadline=0.0)


@pytest.fixture
async def video() -> AsyncIterator[LiveKitVideo]:
    source = LiveKitVideo("test", W, H)
    yield source
    await source.aclose()


async def _read(stream: object, count: int, *, first: bool = False) -> list[npt.NDArray[np.uint8]]:
    """The next `count` frames of the stream. `first`: these are the first frames captured into the source, so the
    black placeholders before them are skipped — the native source sends an all-zero frame every 100 ms until it
    gets its first frame (measured: none after it), and a loaded machine lets one through before that first frame
    (the flake seen: an all-zero frame read back, and "native video stream queue overflow")."""
    from livekit import rtc

    assert isinstance(stream, rtc.VideoStream)
    images: list[npt.NDArray[np.uint8]] = []
    async with asyncio.timeout(10):
        while len(images) < count:
            event = await anext(stream)
            assert (event.frame.width, event.frame.height) == (W, H)
            assert event.frame.type == rtc.VideoBufferType.RGB24
            image = np.frombuffer(event.frame.data, np.uint8).reshape(H, W, 3).copy()
            if first and not images and not image.any():
                continue  # the source's placeholder, before the first frame it was given
            images.append(image)
    return images


async def test_captured_frames_read_back_as_encoded(video: LiveKitVideo) -> None:
    from livekit import rtc

    stream = rtc.VideoStream(video.track, format=rtc.VideoBufferType.RGB24)
    try:
        frames = make_frames(0, 3, W, H)
        noise = np.random.default_rng(7).integers(0, 256, (H, W, 3), dtype=np.uint8)
        received = []
        assert all(image.any() for image in [*frames, noise])  # none can pass for the source's black placeholder
        for index, image in enumerate([*frames, noise]):
            video.capture(_paced(image, index))
            # The native stream keeps one frame: read each before the next.
            received += await _read(stream, 1, first=index == 0)
    finally:
        await stream.aclose()
    for got, sent in zip(received, [*frames, noise], strict=True):
        assert np.array_equal(got, _as_encoded(sent))
    for got, sent in zip(received[:3], frames, strict=True):
        assert np.abs(got.astype(int) - sent.astype(int)).max() <= 3


async def test_capture_refuses_a_frame_of_the_wrong_size(video: LiveKitVideo) -> None:
    with pytest.raises(ValueError, match="source takes"):
        video.capture(_paced(np.zeros((H, W - 2, 3), np.uint8), 0))
    with pytest.raises(ValueError, match="source takes"):
        video.capture(_paced(np.zeros((H, W, 4), np.uint8), 0))


async def test_binding_feeds_generated_frames_through_the_real_video_source() -> None:
    from livekit import rtc

    port = FakeSessionPort(width=W, height=H, fps=16.0)
    factory = FakeRoomFactory(KEY, SECRET, video_factory=LiveKitVideo)
    binding = LiveKitSessionBinding(
        port,
        config=LiveKitConfig(url="ws://livekit.test", api_key=KEY, api_secret=SECRET),
        room_name="lingstream-s1",
        controller_identity=TokenIssuer.new_identity(ParticipantRole.CONTROLLER, "s1"),
        service_identity=TokenIssuer.new_identity(ParticipantRole.SERVICE, "s1"),
        tokens=TokenIssuer(KEY, SECRET),
        room_factory=factory,
        timers=FakeTimers(),
    )
    await binding.start()
    (video,) = factory.current.videos
    assert isinstance(video, LiveKitVideo)
    stream = rtc.VideoStream(video.track, format=rtc.VideoBufferType.RGB24)
    sent = 16  # one second of video at 16 fps
    try:
        chunk = make_chunk(0, first_frame_index=0, count=sent, width=W, height=H)
        port.emit_chunk(chunk)
        async with asyncio.timeout(10):  # the pacer releases the chunk at 16 fps
            while (stats := binding.statistics()).frames_captured + stats.pacer.dropped_late < sent:  # noqa: ASYNC110 - the pacer has no event to await
                await asyncio.sleep(0.01)
        received = await _read(stream, stats.frames_captured, first=True)
    finally:
        await stream.aclose()
        await binding.aclose()
    # Every frame sent is accounted for exactly once: captured, or dropped late by the pacer.
    assert stats.frames_captured + stats.pacer.dropped_late == sent
    assert stats.pacer.dropped_overflow == 0
    # The tolerance: the pacer drops a frame whose slot passed while the event loop was stalled (by design: the
    # stream catches up instead of lagging), and a loaded CI machine can stall the loop for a frame period (62 ms)
    # now and then. Two drops in a second allow for that; more means the binding, not the machine, loses frames.
    assert stats.frames_captured >= sent - 2
    expected = [_as_encoded(image) for image in chunk.frames]
    assert _in_order(received, expected)
    assert video.source is not None


def _in_order(received: list[npt.NDArray[np.uint8]], expected: list[npt.NDArray[np.uint8]]) -> bool:
    """Whether every received frame equals an expected one, each later than the one before (an ordered subsequence)."""
    remaining = iter(expected)
    return all(any(np.array_equal(got, want) for want in remaining) for got in received)


async def test_real_room_translates_a_refused_connection() -> None:
    room = LiveKitRoom()
    token = TokenIssuer(KEY, SECRET).service("s1", "lingstream-s1").token
    with pytest.raises(RoomJoinError, match=r"server ws://127\.0\.0\.1:9"):
        await room.connect("ws://127.0.0.1:9", token, RoomJoinOptions(connect_timeout=1.0))
    assert room.connection_state is RoomConnectionState.DISCONNECTED
    await room.disconnect()


async def test_real_room_translates_sdk_events_to_plain_values() -> None:
    from livekit import rtc

    room = LiveKitRoom()
    seen: list[tuple[str, tuple[object, ...]]] = []
    for event in ("participant_connected", "participant_disconnected", "data_received", "disconnected"):
        room.on(event, lambda *args, name=event: seen.append((name, args)))
    with pytest.raises(ValueError, match="async"):
        room.sdk_room.on("reconnecting", _coroutine_callback)  # the SDK refuses coroutines: ours are plain

    participant = SimpleNamespace(identity="ctl-s1-abc")
    room.sdk_room.emit("participant_connected", participant)
    room.sdk_room.emit("participant_disconnected", participant)
    packet = rtc.DataPacket(data=b"{}", kind=rtc.DataPacketKind.KIND_LOSSY, participant=participant, topic="t")  # type: ignore[arg-type]
    room.sdk_room.emit("data_received", packet)
    room.sdk_room.emit("disconnected", rtc.DisconnectReason.ROOM_DELETED)
    assert seen == [
        ("participant_connected", ("ctl-s1-abc",)),
        ("participant_disconnected", ("ctl-s1-abc",)),
        ("data_received", (b"{}", "ctl-s1-abc", "t")),
        ("disconnected", ("ROOM_DELETED",)),
    ]


async def _coroutine_callback() -> None:
    return None
