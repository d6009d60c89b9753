"""`transport.livekit.agents.WorldSession` without a server: the token it mints for the service, the create it sends,
how its tools hold keys (snapshots repeated while held, then released) and report what the world did, how it ends;
and, in the Agents environment, that importing it loads nothing of livekit-agents until the tools are asked for."""

from __future__ import annotations

import asyncio
import json
import subprocess
import textwrap
from dataclasses import dataclass, field
from typing import Any

import pytest
from livekit import api

from tests.support.serving import ROOT
from transport.client.api import SessionInfo
from transport.livekit.agents import WorldSession
from transport.protocol import decode_control

KEY, SECRET = "APIagent", "agent-secret-long-enough-for-hs256-0123456789"
AGENTS_PYTHON = ROOT / ".venv-agents" / "bin" / "python"


@dataclass
class Sent:
    payload: bytes
    reliable: bool
    topic: str


@dataclass
class FakeParticipant:
    identity: str
    sent: list[Sent] = field(default_factory=list)

    async def publish_data(self, payload: bytes, *, reliable: bool, topic: str) -> None:
        self.sent.append(Sent(payload, reliable, topic))


@dataclass
class FakePacket:
    data: bytes
    topic: str
    participant: FakeParticipant | None


class FakeRoom:
    """The little of `rtc.Room` the world session uses."""

    def __init__(self) -> None:
        self.name = "agent-room"
        self.local_participant = FakeParticipant("agent-7")
        self.handlers: dict[str, Any] = {}

    def on(self, event: str, handler: Any) -> None:
        self.handlers[event] = handler

    def off(self, event: str, handler: Any) -> None:
        assert self.handlers.pop(event) == handler


class FakeService:
    """The REST calls the world session makes, recorded; the session queues once, then runs."""

    def __init__(self) -> None:
        self.created: dict[str, Any] = {}
        self.updates: list[str] = []
        self.deleted: list[tuple[str, str]] = []
        self.paused: list[str] = []

    @staticmethod
    def _info(status: str, position: int | None = None) -> SessionInfo:
        body = {"id": "s1", "status": status, "queue_position": position, "video": {"width": 8, "height": 8, "fps": 8}}
        return SessionInfo.from_body(body)

    async def create(self, **fields: Any) -> SessionInfo:
        self.created = fields
        return self._info("queued", 1)

    async def wait_streaming(self, session_id: str, *, on_update: Any = None) -> SessionInfo:
        if on_update is not None:
            on_update(self._info("queued", 1))
        return self._info("running")

    async def pause(self, session_id: str) -> SessionInfo:
        self.paused.append(session_id)
        return self._info("paused")

    async def delete(self, session_id: str, mode: str = "drain") -> SessionInfo:
        self.deleted.append((session_id, mode))
        return self._info("closed")


def _world(service: FakeService, **kwargs: Any) -> WorldSession:
    return WorldSession(
        "http://lingstream",
        livekit_url="wss://agents.example",
        livekit_api_key=KEY,
        livekit_api_secret=SECRET,
        client=service,  # type: ignore[arg-type]
        **kwargs,
    )


async def test_start_creates_the_session_with_a_token_for_the_service_and_the_agent_as_controller() -> None:
    service, room = FakeService(), FakeRoom()
    queued: list[int | None] = []
    world = _world(service, prompt="a misty forest", on_update=lambda info: queued.append(info.queue_position))
    info = await world.start(None, room)  # type: ignore[arg-type]
    assert info.status == "running"
    assert queued == [1]  # it waited through the queue
    livekit = service.created["livekit"]
    assert (livekit["url"], livekit["controller_identity"], livekit["agent_identity"]) == (
        "wss://agents.example",
        "agent-7",
        "agent-7",
    )
    assert service.created["prompt"] == "a misty forest"
    claims = api.TokenVerifier(KEY, SECRET).verify(livekit["token"])
    assert (claims.identity, claims.kind) == ("lingstream-world", "agent")
    assert claims.attributes == {"lk.publish_on_behalf": "agent-7"}
    video = claims.video
    assert video is not None
    assert (video.room, video.room_join, video.can_subscribe, video.can_publish_data) == (
        "agent-room",
        True,
        False,
        True,
    )
    assert (video.can_publish_sources, video.can_update_own_metadata) == (["camera"], True)


async def test_move_holds_the_key_repeatedly_then_releases_it_and_says_whether_a_frame_showed_it() -> None:
    service, room = FakeService(), FakeRoom()
    world = _world(service)
    await world.start(None, room)  # type: ignore[arg-type]
    service_participant = FakeParticipant("lingstream-world")

    async def report_chunk() -> None:
        await asyncio.sleep(0.3)
        chunk = {"v": 1, "type": "chunk", "index": 3, "applied_seq": 1, "keys": ["w"], "timings": {}}
        room.handlers["data_received"](FakePacket(json.dumps(chunk).encode(), "lingstream.status", service_participant))

    reporter = asyncio.create_task(report_chunk())
    answer = await world.move("forward", 0.6)
    await reporter
    assert answer == "moved forward for 0.6 s"
    messages = [(decode_control(s.payload), s.reliable, s.topic) for s in room.local_participant.sent]
    held = [m for m, reliable, _ in messages if not reliable]
    assert len(held) >= 3  # sent, then again every 250 ms while held
    assert all(getattr(m, "keys", None) == frozenset({"w"}) for m in held)
    assert len({getattr(m, "seq", None) for m in held}) == 1  # the same snapshot, repeated
    release, reliable, topic = messages[-1]
    assert (getattr(release, "keys", None), reliable, topic) == (frozenset(), True, "lingstream.control")
    assert world.chunk_keys == [frozenset({"w"})]


async def test_a_hold_no_frame_showed_says_so_and_foreign_statuses_are_ignored() -> None:
    service, room = FakeService(), FakeRoom()
    world = _world(service, chunk_wait=0.1)
    await world.start(None, room)  # type: ignore[arg-type]
    chunk = {"v": 1, "type": "chunk", "index": 3, "applied_seq": 1, "keys": ["j"], "timings": {}}
    room.handlers["data_received"](FakePacket(json.dumps(chunk).encode(), "lingstream.status", FakeParticipant("x")))
    assert await world.turn("left", 0.3) == "turned left for 0.3 s (no frame showed it yet)"
    assert world.chunk_keys == []
    assert await world.move("up", 1) == "cannot move 'up': say forward, back, left or right"  # type: ignore[arg-type]


async def test_prompt_pause_and_the_end() -> None:
    service, room = FakeService(), FakeRoom()
    world = _world(service)
    await world.start(None, room)  # type: ignore[arg-type]
    assert await world.set_prompt("a snowy night") == "the world now follows: a snowy night"
    prompt = decode_control(room.local_participant.sent[-1].payload)
    assert getattr(prompt, "text", None) == "a snowy night"
    assert await world.pause() == "the world is paused"
    assert service.paused == ["s1"]
    await world.aclose()
    await world.aclose()  # idempotent
    assert service.deleted == [("s1", "cancel")]
    assert "data_received" not in room.handlers


@pytest.mark.skipif(not AGENTS_PYTHON.exists(), reason=f"no {AGENTS_PYTHON} (scripts/setup.sh --dev makes it)")
def test_importing_it_loads_no_livekit_agents_until_the_tools_are_asked_for() -> None:
    script = textwrap.dedent(
        """
        import sys
        from transport.livekit.agents import WorldSession
        assert "livekit.agents" not in sys.modules, "importing the module loaded livekit.agents"
        world = WorldSession("http://x", livekit_url="ws://x", livekit_api_key="k", livekit_api_secret="s" * 32)
        tools = world.tools()
        assert "livekit.agents" in sys.modules
        print(sorted(tool.info.name for tool in tools))
        """
    )
    done = subprocess.run(
        [str(AGENTS_PYTHON), "-c", script],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "['move', 'pause', 'set_prompt', 'turn']"
