"""Against a real LiveKit server: the pinned `livekit-server` (scripts/setup.sh --dev builds it), started in a private
network namespace by this module's fixture; or the server LIVEKIT_URL, LIVEKIT_API_KEY and LIVEKIT_API_SECRET name
when all three are set (e.g. the dev server of docker/compose.yaml: LIVEKIT_URL=ws://localhost:7880
LIVEKIT_API_KEY=devkey LIVEKIT_API_SECRET=secret).

The service side is the real `LiveKitTransport` (RoomService API, service participant, video track); the browser
is a second `livekit.rtc` participant joining with the controller token: it receives video frames and status, and
sends control. Then the service participant's connection breaks three ways at its own SDK room's request (the
SDK's `simulate_scenario`: a resume, a resume refused after a node failure, a leave for SERVER_SHUTDOWN), and the
binding recovers from each (the room factory the transport is given keeps the real rooms it makes, so the scenario
can reach them). Each scenario runs in a process of its own, born inside the namespace: this process never loads
`livekit.rtc` (its tests fork), and the SDK's own threads must be born where the server can be reached.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
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
from transport.livekit.binding import BindingState
from transport.livekit.config import LiveKitConfig
from transport.livekit.room import LiveKitRoom, Room, RoomFactory
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
async def _transport(room_factory: RoomFactory | None = None) -> AsyncIterator[LiveKitTransport]:
    config = LiveKitConfig(
        url=os.environ["LIVEKIT_URL"],
        api_key=os.environ["LIVEKIT_API_KEY"],
        api_secret=os.environ["LIVEKIT_API_SECRET"],
        room_prefix="lingstream-live-test-",
    )
    live = LiveKitTransport(config, room_factory=room_factory)
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


async def service_scenario() -> None:
    """The service participant's breaks, run by the test in a process of its own (`python -c`), with LIVEKIT_* set."""
    rooms: list[LiveKitRoom] = []

    def room_factory() -> Room:
        room = LiveKitRoom()  # the real SDK room, kept so that the scenario can drill it
        rooms.append(room)
        return room

    async with _transport(room_factory) as transport:
        await _the_service_participant_recovers_every_way_the_server_breaks_it(transport, rooms)


async def _the_service_participant_recovers_every_way_the_server_breaks_it(
    transport: LiveKitTransport, rooms: list[LiveKitRoom]
) -> None:
    """The server breaks the service participant's connection three ways, at the participant's own request (the
    SDK's `simulate_scenario`, the only way a real server does this to one participant): its signal connection
    closed, the participant kept (the SDK resumes); the participant dropped without a word, as a failed node would
    (its resume is refused and the SDK joins afresh, republishing the track); a leave for SERVER_SHUTDOWN, a reason
    that is not final (the SDK gives up and the binding rejoins with a fresh token). After each, a subscriber gets
    the session's frames again."""
    from livekit import rtc

    port = FakeSessionPort(f"s{os.getpid()}", width=W, height=H, fps=FPS)
    details = await transport.attach(port)
    generator = asyncio.create_task(_generate(port))
    browser = rtc.Room()
    arrived = asyncio.Condition()
    frames = 0
    readers: list[asyncio.Task[None]] = []

    async def read(track: rtc.Track) -> None:
        nonlocal frames
        stream = rtc.VideoStream(track)
        try:
            async for _ in stream:
                async with arrived:
                    frames += 1
                    arrived.notify_all()
        finally:
            await stream.aclose()

    def on_track(
        track: rtc.Track, _publication: rtc.RemoteTrackPublication, participant: rtc.RemoteParticipant
    ) -> None:
        if participant.identity == details["service_identity"]:  # the first track, and each one republished
            readers.append(asyncio.create_task(read(track)))

    async def frames_flow() -> None:
        async with arrived:
            await arrived.wait_for(lambda: frames >= seen + 8)

    async def settled(step: str, check: Callable[[], bool]) -> None:
        while not check():
            stats = transport.session_statistics(port.session_id)
            assert stats.state in (BindingState.LIVE, BindingState.REJOINING), (step, stats)
            await asyncio.sleep(0.05)  # the SDK's events arrive on their own; nothing to wait on but its state

    def stats() -> tuple[int, int, bool]:
        current = transport.session_statistics(port.session_id)
        return current.sdk_reconnects, current.rejoins, current.state is BindingState.LIVE

    browser.on("track_subscribed", on_track)
    try:
        async with asyncio.timeout(3 * _WAIT):
            await browser.connect(str(details["url"]), str(details["token"]))
            seen = 0
            await frames_flow()

            # 1. The signal connection closes, the participant is kept: the SDK resumes, nothing is republished.
            seen = frames
            await rooms[-1].sdk_room.simulate_scenario(rtc.SimulateScenarioKind.SIMULATE_SIGNAL_RECONNECT)
            await settled("resume", lambda: stats() == (1, 0, True))
            await frames_flow()
            assert len(rooms) == 1

            # 2. The server drops the participant (a node failure): the resume is refused, the SDK joins afresh
            # and republishes; the subscriber subscribes to the new track.
            seen = frames
            await rooms[-1].sdk_room.simulate_scenario(rtc.SimulateScenarioKind.SIMULATE_NODE_FAILURE)
            await settled("full reconnect", lambda: stats() == (2, 0, True))
            await frames_flow()
            assert len(rooms) == 1

            # 3. A leave for a reason that is not final (SERVER_SHUTDOWN): the binding rejoins, a new room object.
            seen = frames
            await rooms[-1].sdk_room.simulate_scenario(rtc.SimulateScenarioKind.SIMULATE_SERVER_LEAVE)
            await settled("rejoin", lambda: stats()[1:] == (1, True))
            await frames_flow()
            assert len(rooms) == 2
            assert port.gone == []  # the session never ended
    finally:
        generator.cancel()
        for task in readers:
            task.cancel()
        await asyncio.gather(generator, *readers, return_exceptions=True)
        await browser.disconnect()
    await transport.detach(port.session_id, "test over")


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


def _run(server_env: dict[str, str], scenario: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_"))}
    env.update(server_env, PYTHONPATH=str(ROOT))
    # It ends through `exit_process`, not Python's finalization, which the FFI's threads can abort (SIGABRT, -6:
    # seen once in CI after a scenario that had passed; transport/livekit/ffi_exit.py).
    code = (
        f"import asyncio, traceback, {__name__} as live\n"
        "from transport.livekit.ffi_exit import exit_process\n"
        "try:\n"
        f"    asyncio.run(live.{scenario}())\n"
        "except BaseException:\n"
        "    traceback.print_exc()\n"
        "    exit_process(1)\n"
        "exit_process(0)\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=90, check=False
    )


def test_browser_participant_gets_video_and_status_and_sends_control(server_env: dict[str, str]) -> None:
    run = _run(server_env, "scenario")
    assert run.returncode == 0, f"the scenario exited {run.returncode}:\n{run.stderr[-6000:]}"


def test_the_service_participant_recovers_every_way_the_server_breaks_it(server_env: dict[str, str]) -> None:
    run = _run(server_env, "service_scenario")
    assert run.returncode == 0, f"the scenario exited {run.returncode}:\n{run.stderr[-6000:]}"
