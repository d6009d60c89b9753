"""Against a real LiveKit server: the pinned `livekit-server` (scripts/setup.sh --dev builds it), started in a private
network namespace by this module's fixture; or the server LIVEKIT_URL, LIVEKIT_API_KEY and LIVEKIT_API_SECRET name
when all three are set (e.g. the dev server of docker/compose.yaml: LIVEKIT_URL=ws://localhost:7880
LIVEKIT_API_KEY=devkey LIVEKIT_API_SECRET=secret).

The service side is the real `LiveKitTransport` (RoomService API, service participant, video track); the browser
is a second `livekit.rtc` participant joining with the controller token: it receives video frames and status, and
sends control. The scenario runs in a process of its own, born inside the namespace: this process never loads
`livekit.rtc` (its tests fork), and the SDK's own threads must be born where the server can be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace

import numpy as np
import pytest

from pipeline.bidirectional import ControlState
from tests.support.fakes.transport_port import FakeSessionPort, make_chunk
from tests.support.livekit_server_real import LiveKitServerProcess, livekit_server_support
from tests.support.netns import HOST_A, PrivateNetwork, private_network_support
from tests.support.serving import ROOT, free_port
from transport.base import ChunkStatus, StatusMessage
from transport.config import CONTROL_TOPIC, STATUS_TOPIC
from transport.livekit.config import LiveKitConfig
from transport.livekit.rooms import RoomManager
from transport.livekit.transport import LiveKitTransport
from transport.protocol import ProtocolError, decode_status, encode_control

_ENV = ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET")
_EXTERNAL = all(os.environ.get(name) for name in _ENV)
_SKIP = None if _EXTERNAL else private_network_support() or livekit_server_support()
pytestmark = [pytest.mark.livekit_live, pytest.mark.slow, pytest.mark.skipif(_SKIP is not None, reason=str(_SKIP))]

W, H, FPS = 320, 192, 16.0
_WAIT = 30.0


async def _generate(port: FakeSessionPort) -> None:
    index = 0
    while True:
        port.emit_chunk(make_chunk(index, first_frame_index=index * 4, count=4, width=W, height=H, fps=FPS))
        index += 1
        await asyncio.sleep(4 / FPS)


@contextlib.asynccontextmanager
async def _transport() -> AsyncIterator[LiveKitTransport]:
    config = LiveKitConfig(
        url=os.environ["LIVEKIT_URL"],
        api_key=os.environ["LIVEKIT_API_KEY"],
        api_secret=os.environ["LIVEKIT_API_SECRET"],
        room_prefix="lingstream-live-test-",
    )
    live = LiveKitTransport(config)
    await live.start()
    yield live
    await live.aclose()


async def scenario() -> None:
    """The scenario, run by the test in a process of its own (`python -c`), with LIVEKIT_* set."""
    async with _transport() as transport:
        await _browser_participant_gets_video_and_status_and_sends_control(transport)


async def _browser_participant_gets_video_and_status_and_sends_control(transport: LiveKitTransport) -> None:
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

            # Resent until it arrives, as a page resends the keys it holds: a real server announces a participant
            # that publishes nothing in batches (every 3 s), and until then the SDK hands its packets over with no
            # sender, which the binding must ignore (the Rust SDK drops the identity the packet carried too).
            while not port.controls:
                await browser.local_participant.publish_data(
                    encode_control(ControlState(1, frozenset({"w"}))), reliable=True, topic=CONTROL_TOPIC
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await port.wait_controls(1)
            assert port.controls == [ControlState(1, frozenset({"w"}))]

            port.emit_status(ChunkStatus(3, 1, ("w",), {"control_to_output": 0.2}))
            status = await statuses.get()
            assert isinstance(status, ChunkStatus), status
            # The binding stamps the pts its pacer gave the chunk's first frame (None: chunk 3 was never paced).
            assert replace(status, first_frame_pts=None) == ChunkStatus(3, 1, ("w",), {"control_to_output": 0.2})
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


@pytest.fixture(scope="module")
def server_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """LIVEKIT_* for the scenario: the variables set around the tests, else the pinned server's, started in a private
    network namespace (this thread stays in it while the module runs, so the scenario's process is born there)."""
    if _EXTERNAL:
        yield {name: os.environ[name] for name in _ENV}
        return
    workdir = tmp_path_factory.mktemp("livekit-live")
    with PrivateNetwork(), LiveKitServerProcess(HOST_A, free_port(), free_port(), workdir / "server.log") as server:
        yield {"LIVEKIT_URL": server.url, "LIVEKIT_API_KEY": server.api_key, "LIVEKIT_API_SECRET": server.api_secret}
    assert "panic" not in server.output(), server.output()[-4000:]


def test_browser_participant_gets_video_and_status_and_sends_control(server_env: dict[str, str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_"))}
    env.update(server_env, PYTHONPATH=str(ROOT))
    code = f"import asyncio, {__name__} as live; asyncio.run(live.scenario())"
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90, check=False
    )
    assert run.returncode == 0, f"the scenario exited {run.returncode}:\n{run.stderr[-6000:]}"
