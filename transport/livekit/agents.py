"""A lingstream world for a LiveKit Agents voice agent: the avatar-provider pattern, with tools to steer it.

`WorldSession` is what an agent's entrypoint starts next to its `AgentSession`, as an avatar plugin's session is:

    world = WorldSession(LINGSTREAM_URL, api_key=KEY, livekit_url=os.environ["LIVEKIT_URL"],
                         livekit_api_key=os.environ["LIVEKIT_API_KEY"],
                         livekit_api_secret=os.environ["LIVEKIT_API_SECRET"], prompt="a misty forest")
    await world.start(session, ctx.room)                   # waits through the service's queue
    agent = Agent(instructions="...", tools=world.tools())  # move, turn, set_prompt, pause

`start` mints a join token for the service's participant in the agent's room (kind `agent`, the grants the service
needs, the agent named in `lk.publish_on_behalf`, so `useVoiceAssistant().videoTrack` shows the world as the agent's
video), creates the session over the REST API with `{"livekit": {"url", "token", "controller_identity",
"agent_identity"}}` (the agent is the controller: it steers with its tools), and follows the session through the
queue until it streams. The session ends when the agent session closes (its `close` event) or on `aclose()`.

The tools hold keys the way a page does (control protocol v1, docs/control-protocol.md): a `control_state`
snapshot on `lingstream.control` as a lossy packet, repeated every 250 ms while held, then an empty one; `move` and
`turn` return once the keys were released, saying whether a generated chunk was seen carrying them (the service's
`chunk` statuses arrive on `lingstream.status`). One hold at a time: a second call waits for the first.

Nothing of `livekit-agents` is imported unless a tool list is asked for (`tools()`), so the module can be imported
(and the `WorldSession` driven from plain `livekit.rtc` code) without the package; the `agents` extra installs it.
Cancellation: `start` cancelled while queued deletes the session it created; `aclose()` is idempotent.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from livekit import api

from pipeline.bidirectional import ControlMessage, ControlState, SetPrompt
from transport.client.api import ServiceClient, SessionInfo
from transport.config import CONTROL_TOPIC, STATUS_TOPIC
from transport.protocol import encode_control

if TYPE_CHECKING:
    from livekit import rtc

__all__ = ["HOLD_REPEAT_S", "MOVES", "TURNS", "WorldSession"]

logger = logging.getLogger(__name__)

HOLD_REPEAT_S = 0.25
"""How often a held snapshot is sent again (lossy packets; the service keeps the newest `seq`)."""

MOVES: Mapping[str, str] = {"forward": "w", "back": "s", "left": "a", "right": "d"}
TURNS: Mapping[str, str] = {"left": "j", "right": "l", "up": "i", "down": "k"}
_MAX_HOLD_S = 10.0
_CHUNK_WAIT_S = 5.0  # after a release, how long a hold's chunk may still take to be reported


class WorldSession:
    """One lingstream session in an agent's room, steered by the agent. See the module docstring.

    `service_url`/`api_key`: the lingstream service. `livekit_url`/`livekit_api_key`/`livekit_api_secret`: the agent's
    LiveKit project (an Agents worker has them in `LIVEKIT_URL`, ...); the secret only mints the service's token here
    and never leaves this process. `identity`: the service participant's identity in the room. `config`, `prompt`,
    `image`, `max_seconds`: the session's create fields. `token_ttl`: how long the service's token stays valid (it
    rejoins with it after a lost connection: as long as the session may run). `on_update`: sees every snapshot while
    the session waits (e.g. `info.queue_position`, for the agent to say so). `client`: a `ServiceClient` to use
    (closed by its owner), else one is made. `chunk_wait`: seconds a released hold waits for the chunk made from
    it to be reported.
    """

    def __init__(
        self,
        service_url: str,
        *,
        livekit_url: str,
        livekit_api_key: str,
        livekit_api_secret: str,
        api_key: str | None = None,
        identity: str = "lingstream-world",
        config: Mapping[str, Any] | None = None,
        prompt: str | None = None,
        image: bytes | None = None,
        max_seconds: float | None = None,
        token_ttl: datetime.timedelta = datetime.timedelta(hours=2),
        on_update: Callable[[SessionInfo], None] | None = None,
        client: ServiceClient | None = None,
        chunk_wait: float = _CHUNK_WAIT_S,
    ) -> None:
        self._livekit_url = livekit_url
        self._livekit_key = livekit_api_key
        self._livekit_secret = livekit_api_secret
        self._identity = identity
        self._create = {"config": dict(config or {}), "prompt": prompt, "image": image, "max_seconds": max_seconds}
        self._token_ttl = token_ttl
        self._on_update = on_update
        self._chunk_wait = chunk_wait
        self._owns_client = client is None
        self._client = client if client is not None else ServiceClient(service_url, api_key=api_key)
        self._room: rtc.Room | None = None
        self._info: SessionInfo | None = None
        self._seq = int(time.time() * 1000)
        self._hold_lock = asyncio.Lock()
        self._chunk_keys: list[frozenset[str]] = []  # keys of every chunk status seen, in order
        self._chunk_seen = asyncio.Event()
        self._closing: asyncio.Task[None] | None = None

    @property
    def identity(self) -> str:
        """The service participant's identity in the room."""
        return self._identity

    @property
    def info(self) -> SessionInfo:
        """The session as it was when it started streaming (`start` first)."""
        if self._info is None:
            raise RuntimeError("the world session has not started")
        return self._info

    @property
    def chunk_keys(self) -> list[frozenset[str]]:
        """The keys each generated chunk was made from, as the service reported them, oldest first."""
        return list(self._chunk_keys)

    def service_token(self, room: str, agent_identity: str) -> str:
        """The join token for the service's participant: kind agent, this room only, publish a camera track and
        data, update its own attributes, subscribe to nothing."""
        grants = api.VideoGrants(
            room_join=True,
            room=room,
            can_subscribe=False,
            can_publish=True,
            can_publish_sources=["camera"],
            can_publish_data=True,
            can_update_own_metadata=True,
        )
        return (
            api.AccessToken(self._livekit_key, self._livekit_secret)
            .with_identity(self._identity)
            .with_kind("agent")
            .with_grants(grants)
            .with_attributes({"lk.publish_on_behalf": agent_identity})
            .with_ttl(self._token_ttl)
            .to_jwt()
        )

    async def start(self, agent_session: Any, room: rtc.Room) -> SessionInfo:
        """Create the session in `room` with the agent as its controller, wait until it streams (through the
        queue), and end it when `agent_session` (a `livekit.agents.AgentSession`, or None) closes. Raises the
        client's typed errors (`RateLimitedError` when the queue is full, `SessionEndedError` when it ended first)."""
        if self._info is not None:
            raise RuntimeError("the world session was started already")
        self._room = room
        agent = room.local_participant.identity
        room.on("data_received", self._on_data)
        livekit = {
            "url": self._livekit_url,
            "token": self.service_token(room.name, agent),
            "controller_identity": agent,
            "agent_identity": agent,
        }
        created = await self._client.create(livekit=livekit, **self._create)  # type: ignore[arg-type]
        try:
            self._info = await self._client.wait_streaming(created.id, on_update=self._on_update)
        except BaseException:
            await self._delete(created.id)
            raise
        if agent_session is not None:
            agent_session.on("close", lambda *_: self._close_soon())
        logger.info("world session %s streams in room %s", created.id, room.name)
        return self._info

    # -- steering -------------------------------------------------------------------------------------------------

    async def move(self, direction: Literal["forward", "back", "left", "right"], seconds: float = 1.0) -> str:
        """Walk in `direction` for `seconds` (at most 10)."""
        key = MOVES.get(direction)
        if key is None:
            return f"cannot move {direction!r}: say forward, back, left or right"
        return await self._hold(frozenset({key}), seconds, f"moved {direction}")

    async def turn(self, direction: Literal["left", "right", "up", "down"], seconds: float = 0.5) -> str:
        """Turn (look) `direction` for `seconds` (at most 10)."""
        key = TURNS.get(direction)
        if key is None:
            return f"cannot turn {direction!r}: say left, right, up or down"
        return await self._hold(frozenset({key}), seconds, f"turned {direction}")

    async def set_prompt(self, text: str) -> str:
        """Describe the world anew: the next chunks follow `text` (at most 512 UTF-8 bytes)."""
        await self._send(SetPrompt(self._next_seq(), text), reliable=True)
        return f"the world now follows: {text}"

    async def pause(self, paused: bool = True) -> str:
        """Pause the world (`paused`) or let it go on."""
        info = self.info
        after = await (self._client.pause(info.id) if paused else self._client.resume(info.id))
        return f"the world is {after.status}"

    def tools(self) -> list[Any]:
        """The steering methods as `livekit.agents` function tools (`move`, `turn`, `set_prompt`, `pause`), for an
        `Agent(tools=...)`. Imports `livekit.agents` (the `agents` extra)."""
        from livekit.agents import function_tool

        return [
            function_tool(self.move, name="move", description="Walk through the world: forward, back, left or right."),
            function_tool(self.turn, name="turn", description="Turn the view: left, right, up or down."),
            function_tool(self.set_prompt, name="set_prompt", description="Describe what the world should become."),
            function_tool(self.pause, name="pause", description="Pause the world (paused=false: let it go on)."),
        ]

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    async def _send(self, message: ControlMessage, *, reliable: bool) -> None:
        room = self._room
        if room is None or self._info is None:
            raise RuntimeError("the world session has not started")
        await room.local_participant.publish_data(encode_control(message), reliable=reliable, topic=CONTROL_TOPIC)

    async def _hold(self, keys: frozenset[str], seconds: float, done: str) -> str:
        seconds = min(max(seconds, HOLD_REPEAT_S), _MAX_HOLD_S)
        async with self._hold_lock:
            seen_before = len(self._chunk_keys)
            deadline = asyncio.get_running_loop().time() + seconds
            seq = self._next_seq()
            while True:
                await self._send(ControlState(seq, keys), reliable=False)
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                await asyncio.sleep(min(HOLD_REPEAT_S, left))  # the repeat interval of a held snapshot
            await self._send(ControlState(self._next_seq(), frozenset()), reliable=True)
            reached = await self._chunk_with(keys, seen_before)
        return f"{done} for {seconds:.1f} s" + ("" if reached else " (no frame showed it yet)")

    async def _chunk_with(self, keys: frozenset[str], start: int) -> bool:
        """Whether a chunk made from `keys` was reported after chunk `start` (waiting a little for it)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._chunk_wait
        while not any(keys <= seen for seen in self._chunk_keys[start:]):
            left = deadline - loop.time()
            if left <= 0:
                return False
            self._chunk_seen.clear()
            try:
                async with asyncio.timeout(left):
                    await self._chunk_seen.wait()
            except TimeoutError:
                return False
        return True

    def _on_data(self, packet: rtc.DataPacket) -> None:
        if packet.topic != STATUS_TOPIC or self._info is None:
            return
        participant = packet.participant
        if participant is None or participant.identity != self._identity:
            return
        try:
            message = json.loads(packet.data)
        except ValueError:
            return
        if isinstance(message, dict) and message.get("type") == "chunk" and isinstance(message.get("keys"), list):
            self._chunk_keys.append(frozenset(str(key) for key in message["keys"]))
            self._chunk_seen.set()

    # -- ending ---------------------------------------------------------------------------------------------------

    def _close_soon(self) -> None:
        # From the agent session's `close` event (a plain callback): the task is ours, awaited by `aclose()`.
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close(), name="lingstream-world-close")

    async def _delete(self, session_id: str) -> None:
        try:
            await self._client.delete(session_id, mode="cancel")
        except Exception:
            logger.warning("world session %s: deleting it failed", session_id, exc_info=True)

    async def aclose(self) -> None:
        """End the session (the service leaves the room; the room stays) and close the client. Idempotent; waits for
        a close the agent session's end started."""
        self._close_soon()
        assert self._closing is not None
        await self._closing

    async def _close(self) -> None:
        if self._room is not None:
            self._room.off("data_received", self._on_data)
        if self._info is not None:
            await self._delete(self._info.id)
        if self._owns_client:
            await self._client.aclose()
