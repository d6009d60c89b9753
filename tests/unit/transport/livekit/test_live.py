"""Against a real LiveKit server (opt-in): set LIVEKIT_URL, LIVEKIT_API_KEY and LIVEKIT_API_SECRET, e.g. for the dev
server of docker/compose.yaml: LIVEKIT_URL=ws://localhost:7880 LIVEKIT_API_KEY=devkey LIVEKIT_API_SECRET=secret.

The service side is the real `LiveKitTransport` (RoomService API, service participant, video track); the browser
is a second `livekit.rtc` participant joining with the controller token: it receives video frames and status, and
sends control.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import numpy as np
import pytest

from pipeline.bidirectional import ControlState
from tests.support.fakes.transport_port import FakeSessionPort, make_chunk
from transport.base import ChunkStatus, StatusMessage
from transport.config import CONTROL_TOPIC, STATUS_TOPIC
from transport.livekit.config import LiveKitConfig
from transport.livekit.rooms import RoomManager
from transport.livekit.transport import LiveKitTransport
from transport.protocol import ProtocolError, decode_status, encode_control

_ENV = ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET")
pytestmark = [
    pytest.mark.livekit_live,
    pytest.mark.skipif(
        not all(os.environ.get(name) for name in _ENV),
        reason="needs a LiveKit server: set LIVEKIT_URL, LIVEKIT_API_KEY and LIVEKIT_API_SECRET",
    ),
]

W, H, FPS = 320, 192, 16.0
_WAIT = 30.0


async def _generate(port: FakeSessionPort) -> None:
    index = 0
    while True:
        port.emit_chunk(make_chunk(index, first_frame_index=index * 4, count=4, width=W, height=H, fps=FPS))
        index += 1
        await asyncio.sleep(4 / FPS)


@pytest.fixture
async def transport() -> AsyncIterator[LiveKitTransport]:
    config = LiveKitConfig(
        url=os.environ["LIVEKIT_URL"],
        api_key=os.environ["LIVEKIT_API_KEY"],
        api_secret=os.environ["LIVEKIT_API_SECRET"],
        room_prefix="lingstream-live-test-",
    )
    live = LiveKitTransport(config)
    await live.start()
    yield live
    await live.stop()


async def test_browser_participant_gets_video_and_status_and_sends_control(transport: LiveKitTransport) -> None:
    from livekit import rtc

    port = FakeSessionPort(f"s{os.getpid()}", width=W, height=H, fps=FPS)
    details = await transport.attach(port)
    generator = asyncio.create_task(_generate(port))
    browser = rtc.Room()
    subscribed: asyncio.Future[rtc.Track] = asyncio.get_running_loop().create_future()
    statuses: asyncio.Queue[StatusMessage | ProtocolError] = asyncio.Queue()

    def on_track(
        track: rtc.Track, _publication: rtc.RemoteTrackPublication, participant: rtc.RemoteParticipant
    ) -> None:
        if participant.identity == details["service_identity"] and not subscribed.done():
            subscribed.set_result(track)

    def on_data(packet: rtc.DataPacket) -> None:
        if packet.topic == STATUS_TOPIC:
            statuses.put_nowait(decode_status(packet.data))

    browser.on("track_subscribed", on_track)
    browser.on("data_received", on_data)
    stream: rtc.VideoStream | None = None
    try:
        async with asyncio.timeout(_WAIT):
            await browser.connect(str(details["url"]), str(details["token"]))
            assert browser.local_participant.identity == details["identity"]
            track = await subscribed
            stream = rtc.VideoStream(track, format=rtc.VideoBufferType.RGB24)
            for _ in range(5):
                event = await anext(stream)
                assert (event.frame.width, event.frame.height) == (W, H)
                image = np.frombuffer(event.frame.data, np.uint8).reshape(H, W, 3)
                assert 20 < float(image.mean()) < 240  # a real picture, not a black placeholder

            await browser.local_participant.publish_data(
                encode_control(ControlState(1, frozenset({"w"}))), reliable=True, topic=CONTROL_TOPIC
            )
            assert await port.wait_controls(1) == [ControlState(1, frozenset({"w"}))]

            port.emit_status(ChunkStatus(3, 1, ("w",), {"control_to_output": 0.2}))
            assert await statuses.get() == ChunkStatus(3, 1, ("w",), {"control_to_output": 0.2})
    finally:
        generator.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await generator
        if stream is not None:
            await stream.aclose()
        await browser.disconnect()
    room = str(details["room"])
    await transport.detach(port.session_id, "test over")
    rooms = RoomManager(os.environ["LIVEKIT_URL"], os.environ["LIVEKIT_API_KEY"], os.environ["LIVEKIT_API_SECRET"])
    await rooms.start()
    try:
        assert room not in {info.name for info in await rooms.list_rooms([room])}
    finally:
        await rooms.aclose()
