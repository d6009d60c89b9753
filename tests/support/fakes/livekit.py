"""Fakes of LiveKit at our seams: a scripted `Room`, and an in-process Twirp RoomService for the real livekit-api.

`FakeRoom` implements `transport.livekit.room.Room`; the test drives it like the SDK would (participants joining and
leaving, data arriving, the SDK resuming, the connection dropping with a reason) and reads what the binding did
(connects, published tracks, data sent). `FakeRoomService` is an aiohttp server on 127.0.0.1 speaking the
RoomService Twirp protocol the way livekit-api calls it (protobuf bodies, JSON errors, a bearer JWT checked with
the project secret and the grants each method needs), and it records every call.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from google.protobuf.json_format import MessageToJson
from google.protobuf.message import Message
from livekit import api

from transport.errors import LinkLostError, RoomJoinError
from transport.livekit.room import (
    LocalVideo,
    RoomConnectionState,
    RoomEventName,
    RoomJoinOptions,
    RpcFailure,
    RpcHandler,
    VideoPublishOptions,
)
from transport.session.pacing import PacedFrame

_WAIT = 10.0  # seconds a test waits for something that should happen at once

# -- the Room seam ------------------------------------------------------------------------------------------------


class FakeVideo:
    """Records captured frames; `wait_frames(n)` waits until n have arrived."""

    def __init__(self, name: str, width: int, height: int) -> None:
        self.name = name
        self.width = width
        self.height = height
        self.frames: list[PacedFrame] = []
        self.captured_at: list[float] = []  # time.monotonic() of each capture
        self.closed = False
        self._arrived = asyncio.Event()

    def capture(self, frame: PacedFrame) -> None:
        assert not self.closed, "capture after aclose"
        self.frames.append(frame)
        self.captured_at.append(time.monotonic())
        self._arrived.set()

    async def wait_frames(self, count: int) -> list[PacedFrame]:
        while len(self.frames) < count:
            self._arrived.clear()
            await self._arrived.wait()
        return self.frames

    async def aclose(self) -> None:
        self.closed = True


@dataclass(frozen=True, slots=True)
class SentData:
    payload: bytes
    reliable: bool
    topic: str
    destinations: tuple[str, ...]


class FakeLocalParticipant:
    def __init__(self, room: FakeRoom) -> None:
        self._room = room

    @property
    def identity(self) -> str:
        return self._room.identity

    async def publish_track(self, video: LocalVideo, options: VideoPublishOptions) -> None:
        if self._room.fail_publish:
            raise RuntimeError("publish refused (scripted)")
        self._room.published.append((video, options))
        self._room.subscribe_if_watched()
        if self._room.factory.drop_during_publish > 0:
            self._room.factory.drop_during_publish -= 1
            self._room.drop("SIGNAL_CLOSE")
        self._room.factory.note_publish()

    async def publish_data(
        self, payload: bytes, *, reliable: bool, topic: str, destination_identities: Sequence[str] = ()
    ) -> None:
        if self._room.fail_data > 0:
            self._room.fail_data -= 1
            raise RuntimeError("data channel broken (scripted)")
        self._room.data.put_nowait(SentData(payload, reliable, topic, tuple(destination_identities)))

    def register_rpc_method(self, method: str, handler: RpcHandler) -> None:
        assert self._room.state is RoomConnectionState.CONNECTED, "register_rpc_method before connect"  # as the SDK
        assert not inspect.iscoroutinefunction(handler), "an RPC handler of ours is a plain function"
        self._room.rpc_methods[method] = handler

    async def set_attributes(self, attributes: Mapping[str, str]) -> None:
        if self._room.fail_attributes > 0:
            self._room.fail_attributes -= 1
            raise LinkLostError("attributes not set (scripted)")
        self._room.attribute_updates.append(dict(attributes))
        self._room.attributes.update(attributes)
        self._room.factory.remote_attributes.setdefault(self._room.identity, {}).update(attributes)


class FakeRoom:
    """One scripted room connection (see module docstring)."""

    def __init__(self, factory: FakeRoomFactory) -> None:
        self.factory = factory
        self._factory = factory
        self._callbacks: dict[str, list[Callable[..., None]]] = {}
        self.state = RoomConnectionState.DISCONNECTED
        self.remote: set[str] = set()
        self.connects: list[tuple[str, str, RoomJoinOptions]] = []
        self.disconnects = 0
        self.disconnected_at: float | None = None  # time.monotonic() of the last disconnect
        self.published: list[tuple[LocalVideo, VideoPublishOptions]] = []
        self.data: asyncio.Queue[SentData] = asyncio.Queue()
        self.videos: list[LocalVideo] = []
        self.identity = ""
        self.fail_publish = False
        self.fail_data = 0  # how many of the next publish_data calls fail
        self.rpc_methods: dict[str, RpcHandler] = {}
        self.fail_attributes = 0  # how many of the next set_attributes calls fail
        self.attributes: dict[str, str] = {}  # the local participant's, as the server has them
        self.attribute_updates: list[dict[str, str]] = []  # every set_attributes call, in order
        self.kind = ""  # the joining token's participant kind
        self.subscribed_tracks = 0  # how many of `published` someone subscribed to (`subscribe_if_watched`)

    # Room protocol
    @property
    def connection_state(self) -> RoomConnectionState:
        return self.state

    @property
    def local_participant(self) -> FakeLocalParticipant:
        return FakeLocalParticipant(self)

    @property
    def remote_identities(self) -> frozenset[str]:
        return frozenset(self.remote)

    def remote_attributes(self) -> Mapping[str, Mapping[str, str]]:
        return {identity: dict(self._factory.remote_attributes.get(identity, {})) for identity in self.remote}

    def on(self, event: RoomEventName, callback: Callable[..., None]) -> None:
        if inspect.iscoroutinefunction(callback):
            raise ValueError("Cannot register an async callback with `.on()`")  # as livekit.rtc does
        self._callbacks.setdefault(event, []).append(callback)

    async def connect(self, url: str, token: str, options: RoomJoinOptions) -> None:
        self.connects.append((url, token, options))
        try:
            claims = api.TokenVerifier(self._factory.api_key, self._factory.api_secret).verify(token)
        except Exception as exc:
            # As the real SDK reports a token the server refused: an HTTP 401 quoting the whole token.
            raise RoomJoinError(
                f"engine: signal failure: client error: 401 Unauthorized - invalid token: {token}, error: {exc}"
            ) from None
        self.identity = claims.identity
        self.kind = claims.kind
        self.attributes = dict(claims.attributes or {})
        if self._factory.fail_connects > 0:
            self._factory.fail_connects -= 1
            raise RoomJoinError("connection refused (scripted)")
        self.remote = set(self._factory.present)
        self.state = RoomConnectionState.CONNECTED

    async def disconnect(self) -> None:
        self.disconnects += 1
        self.disconnected_at = time.monotonic()
        if self.state is not RoomConnectionState.DISCONNECTED:
            self.state = RoomConnectionState.DISCONNECTED
            self.emit("disconnected", "CLIENT_INITIATED")  # the SDK reports our own leave too

    def create_video(self, name: str, width: int, height: int) -> LocalVideo:
        video = self._factory.video_factory(name, width, height)
        self.videos.append(video)
        return video

    # scripting
    def emit(self, event: RoomEventName, *args: object) -> None:
        for callback in tuple(self._callbacks.get(event, ())):
            callback(*args)

    def participant_joins(self, identity: str) -> None:
        self.remote.add(identity)
        self._factory.present.add(identity)
        self.emit("participant_connected", identity)
        self.subscribe_if_watched()

    def subscribe_if_watched(self) -> None:
        """As the server with auto-subscribing participants: the first subscription to our published track, once
        a track is published and someone else is in the room (`local_track_subscribed`, once per track)."""
        if self.published and self.remote and len(self.published) > self.subscribed_tracks:
            self.subscribed_tracks = len(self.published)
            self.emit("local_track_subscribed", f"TR_fake{len(self.published)}")

    def participant_leaves(self, identity: str) -> None:
        self.remote.discard(identity)
        self._factory.present.discard(identity)
        self.emit("participant_disconnected", identity)

    def receive_data(self, payload: bytes | str, identity: str | None, topic: str = "lingstream.control") -> None:
        data = payload.encode() if isinstance(payload, str) else payload
        self.emit("data_received", data, identity, topic)

    def call_rpc(self, method: str, caller: str, payload: str = "") -> str | RpcFailure:
        """A participant calls `method` on us: the handler's answer, or the SDK's `UNSUPPORTED_METHOD` (1400) as a
        failure when nothing is registered under that name."""
        handler = self.rpc_methods.get(method)
        if handler is None:
            return RpcFailure(1400, "Method not supported at destination")
        return handler(caller, payload)

    def sdk_reconnecting(self) -> None:
        self.state = RoomConnectionState.RECONNECTING
        self.emit("reconnecting")

    def sdk_reconnected(self) -> None:
        self.state = RoomConnectionState.CONNECTED
        self.emit("reconnected")

    def drop(self, reason: str) -> None:
        """The connection ends from the far side with a DisconnectReason name."""
        self.state = RoomConnectionState.DISCONNECTED
        self.emit("disconnected", reason)

    async def next_data(self) -> SentData:
        async with asyncio.timeout(_WAIT):
            return await self.data.get()


class FakeRoomFactory:
    """`RoomFactory`: every call makes a new `FakeRoom` (kept in `rooms`). `present` is who the server has in the
    room (a joining room sees them at once); `fail_connects` makes the next n connects fail."""

    def __init__(
        self,
        api_key: str,
        api_secret: str,
        *,
        video_factory: Callable[[str, int, int], LocalVideo] = FakeVideo,
    ) -> None:
        self.api_key = api_key
        self.api_secret = api_secret
        self.video_factory = video_factory
        self.rooms: list[FakeRoom] = []
        self.present: set[str] = set()
        self.remote_attributes: dict[str, dict[str, str]] = {}  # attributes of who is in the room, by identity
        self.fail_connects = 0
        self.drop_during_publish = 0  # how many of the next publishes lose the connection right away
        self.publishes = 0
        self._published = asyncio.Event()

    def note_publish(self) -> None:
        self.publishes += 1
        self._published.set()

    async def wait_publishes(self, count: int) -> None:
        """Wait until `count` tracks were published over all rooms (a join or rejoin completed)."""
        while self.publishes < count:
            self._published.clear()
            await self._published.wait()

    def __call__(self) -> FakeRoom:
        room = FakeRoom(self)
        self.rooms.append(room)
        return room

    @property
    def current(self) -> FakeRoom:
        return self.rooms[-1]


# -- webhooks ------------------------------------------------------------------------------------------------------


def sign_webhook(body: str, api_key: str, api_secret: str) -> str:
    """The Authorization value LiveKit sends with a webhook body: a JWT whose sha256 claim hashes the body."""
    digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
    return api.AccessToken(api_key, api_secret).with_sha256(digest).to_jwt()


def webhook_body(event: str, room: str, identity: str | None = None) -> str:
    message = api.WebhookEvent(event=event, room=api.Room(name=room, sid="RM_x"), id="EV_" + secrets.token_hex(4))
    if identity is not None:
        message.participant.CopyFrom(api.ParticipantInfo(identity=identity, sid="PA_x"))
    return MessageToJson(message)


# -- the RoomService over Twirp ------------------------------------------------------------------------------------

_HTTP_STATUS = {
    "invalid_argument": 400,
    "malformed": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "already_exists": 409,
    "internal": 500,
    "unavailable": 503,
}


@dataclass(frozen=True, slots=True)
class TwirpCall:
    method: str
    request: Message
    identity: str
    grants: api.VideoGrants


class _TwirpError(Exception):
    def __init__(self, code: str, msg: str) -> None:
        super().__init__(msg)
        self.code = code
        self.msg = msg


@dataclass(slots=True)
class _Method:
    request: type[Message]
    handler: Callable[[Any, api.VideoGrants], Message]
    authorize: Callable[[Any, api.VideoGrants], bool]


@dataclass(slots=True)
class FakeRoomService:
    """The RoomService endpoints livekit-api calls: CreateRoom, DeleteRoom, ListRooms, ListParticipants,
    RemoveParticipant. `fail_next[method] = (code, message)` makes the next call of that method fail;
    `participants[room]` are the identities listed (joined at `joined_at_ms[identity]`, 0 when not given, or only in
    whole seconds at `joined_at_s[identity]`, as a server that gives no milliseconds); `before`,
    when set, is called with each call (after it is recorded, before it is answered) to change what it finds."""

    api_key: str
    api_secret: str
    rooms: dict[str, api.Room] = field(default_factory=dict)
    participants: dict[str, list[str]] = field(default_factory=dict)
    joined_at_ms: dict[str, int] = field(default_factory=dict)
    joined_at_s: dict[str, int] = field(default_factory=dict)
    calls: list[TwirpCall] = field(default_factory=list)
    fail_next: dict[str, tuple[str, str]] = field(default_factory=dict)
    before: Callable[[TwirpCall], None] | None = None
    _runner: web.AppRunner | None = None
    url: str = ""

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/twirp/livekit.RoomService/{method}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self.url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def calls_of(self, method: str) -> list[TwirpCall]:
        return [call for call in self.calls if call.method == method]

    def _methods(self) -> dict[str, _Method]:
        return {
            "CreateRoom": _Method(api.CreateRoomRequest, self._create_room, lambda _r, g: bool(g.room_create)),
            "DeleteRoom": _Method(api.DeleteRoomRequest, self._delete_room, lambda _r, g: bool(g.room_create)),
            "ListRooms": _Method(api.ListRoomsRequest, self._list_rooms, lambda _r, g: bool(g.room_list)),
            "ListParticipants": _Method(
                api.ListParticipantsRequest,
                self._list_participants,
                lambda r, g: bool(g.room_admin) and g.room == r.room,
            ),
            "RemoveParticipant": _Method(
                api.RoomParticipantIdentity,
                self._remove_participant,
                lambda r, g: bool(g.room_admin) and g.room == r.room,
            ),
        }

    async def _handle(self, request: web.Request) -> web.Response:
        name = request.match_info["method"]
        method = self._methods().get(name)
        try:
            if method is None:
                raise _TwirpError("bad_route", f"no method {name}")
            if request.content_type != "application/protobuf":
                raise _TwirpError("malformed", f"unexpected content type {request.content_type}")
            header = request.headers.get("Authorization", "")
            if not header.startswith("Bearer "):
                raise _TwirpError("unauthenticated", "no bearer token")
            try:
                claims = api.TokenVerifier(self.api_key, self.api_secret).verify(header[7:])
            except Exception as exc:
                raise _TwirpError("unauthenticated", f"invalid token: {exc}") from exc
            grants = claims.video or api.VideoGrants()
            message = method.request.FromString(await request.read())
            self.calls.append(TwirpCall(name, message, claims.identity, grants))
            if self.before is not None:
                self.before(self.calls[-1])
            if not method.authorize(message, grants):
                raise _TwirpError("permission_denied", f"{name} needs other grants")
            if name in self.fail_next:
                code, text = self.fail_next.pop(name)
                raise _TwirpError(code, text)
            response = method.handler(message, grants)
        except _TwirpError as exc:
            return web.json_response({"code": exc.code, "msg": exc.msg}, status=_HTTP_STATUS.get(exc.code, 500))
        return web.Response(body=response.SerializeToString(), content_type="application/protobuf")

    def _create_room(self, request: api.CreateRoomRequest, _grants: api.VideoGrants) -> Message:
        if not request.name:
            raise _TwirpError("invalid_argument", "room name is required")
        existing = self.rooms.get(request.name)
        if existing is not None:
            return existing
        room = api.Room(
            name=request.name,
            sid="RM_" + secrets.token_hex(6),
            empty_timeout=request.empty_timeout,
            departure_timeout=request.departure_timeout,
            max_participants=request.max_participants,
            metadata=request.metadata,
            creation_time=int(time.time()),
        )
        self.rooms[request.name] = room
        self.participants[request.name] = []
        return room

    def _delete_room(self, request: api.DeleteRoomRequest, _grants: api.VideoGrants) -> Message:
        if request.room not in self.rooms:
            raise _TwirpError("not_found", "requested room does not exist")
        del self.rooms[request.room]
        self.participants.pop(request.room, None)
        return api.DeleteRoomResponse()

    def _list_rooms(self, request: api.ListRoomsRequest, _grants: api.VideoGrants) -> Message:
        names = set(request.names)
        rooms = [room for name, room in self.rooms.items() if not names or name in names]
        return api.ListRoomsResponse(rooms=rooms)

    def _list_participants(self, request: api.ListParticipantsRequest, _grants: api.VideoGrants) -> Message:
        if request.room not in self.rooms:
            raise _TwirpError("not_found", "requested room does not exist")
        infos = [
            api.ParticipantInfo(
                identity=identity,
                joined_at_ms=self.joined_at_ms.get(identity, 0),
                joined_at=self.joined_at_s.get(identity, 0),
            )
            for identity in self.participants.get(request.room, [])
        ]
        return api.ListParticipantsResponse(participants=infos)

    def _remove_participant(self, request: api.RoomParticipantIdentity, _grants: api.VideoGrants) -> Message:
        members = self.participants.get(request.room)
        if members is None or request.identity not in members:
            raise _TwirpError("not_found", "participant not found")
        members.remove(request.identity)
        return api.RemoveParticipantResponse()
