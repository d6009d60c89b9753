"""The RoomService calls the service makes (`transport/livekit/rooms.py`), over Twirp as livekit-api speaks it: `POST
/twirp/livekit.RoomService/<Method>` with a protobuf body and a bearer JWT; errors are JSON `{code, msg}` with the
matching HTTP status. Each method needs the grant the real server asks for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web
from google.protobuf.message import Message
from livekit import api
from livekit.protocol import models

if TYPE_CHECKING:
    from tests.support.livekit_server.server import StandIn

__all__ = ["TwirpError", "twirp_handler"]

_STATUS = {
    "bad_route": 404,
    "malformed": 400,
    "invalid_argument": 400,
    "unauthenticated": 401,
    "permission_denied": 403,
    "not_found": 404,
    "internal": 500,
}


class TwirpError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class _Method:
    request: type[Message]
    allowed: Callable[[Any, api.VideoGrants], bool]
    call: Callable[[Any], Awaitable[Message]]


def _methods(standin: StandIn) -> dict[str, _Method]:
    async def create(request: api.CreateRoomRequest) -> Message:
        if not request.name:
            raise TwirpError("invalid_argument", "room name is required")
        return standin.create_room(request).info()

    async def delete(request: api.DeleteRoomRequest) -> Message:
        if not await standin.delete_room(request.room):
            raise TwirpError("not_found", "requested room does not exist")
        return api.DeleteRoomResponse()

    async def list_rooms(request: api.ListRoomsRequest) -> Message:
        names = set(request.names)
        rooms = [room.info() for name, room in standin.rooms.items() if not names or name in names]
        return api.ListRoomsResponse(rooms=rooms)

    async def list_participants(request: api.ListParticipantsRequest) -> Message:
        room = standin.rooms.get(request.room)
        if room is None:
            raise TwirpError("not_found", "requested room does not exist")
        return api.ListParticipantsResponse(participants=[p.info() for p in room.participants.values()])

    async def remove(request: api.RoomParticipantIdentity) -> Message:
        room = standin.rooms.get(request.room)
        participant = room.participants.get(request.identity) if room is not None else None
        if room is None or participant is None:
            raise TwirpError("not_found", "participant not found")
        await room.remove(participant, models.DisconnectReason.PARTICIPANT_REMOVED, tell=True)
        return api.RemoveParticipantResponse()

    def admin(request: Any, grants: api.VideoGrants) -> bool:
        return bool(grants.room_admin) and grants.room == request.room

    return {
        "CreateRoom": _Method(api.CreateRoomRequest, lambda _r, g: bool(g.room_create), create),
        "DeleteRoom": _Method(api.DeleteRoomRequest, lambda _r, g: bool(g.room_create), delete),
        "ListRooms": _Method(api.ListRoomsRequest, lambda _r, g: bool(g.room_list), list_rooms),
        "ListParticipants": _Method(api.ListParticipantsRequest, admin, list_participants),
        "RemoveParticipant": _Method(api.RoomParticipantIdentity, admin, remove),
    }


def twirp_handler(standin: StandIn) -> Callable[[web.Request], Awaitable[web.Response]]:
    methods = _methods(standin)

    async def handle(request: web.Request) -> web.Response:
        name = request.match_info["method"]
        try:
            method = methods.get(name)
            if method is None:
                raise TwirpError("bad_route", f"no such method: {name}")
            if request.content_type != "application/protobuf":
                raise TwirpError("malformed", f"unexpected content type {request.content_type}")
            header = request.headers.get("Authorization", "")
            if not header.startswith("Bearer "):
                raise TwirpError("unauthenticated", "invalid authorization header. Must start with Bearer ")
            try:
                claims = standin.verify(header[7:])
            except Exception as exc:
                raise TwirpError("unauthenticated", f"invalid authorization token: {exc}") from exc
            message = method.request.FromString(await request.read())
            if not method.allowed(message, claims.video or api.VideoGrants()):
                raise TwirpError("permission_denied", "permissions denied")
            standin.counters[f"twirp_{name}"] += 1
            response = await method.call(message)
        except TwirpError as exc:
            standin.counters[f"twirp_error_{exc.code}"] += 1
            return web.json_response({"code": exc.code, "msg": exc.message}, status=_STATUS.get(exc.code, 500))
        return web.Response(body=response.SerializeToString(), content_type="application/protobuf")

    return handle
