"""Session rooms on the LiveKit server: created with sensible timeouts, deleted on close, via the RoomService API.

`RoomManager` wraps the real `livekit.api.LiveKitAPI` RoomService client (Twirp over HTTP). It is the one seam
where livekit-api and aiohttp exceptions become transport errors: authentication problems
(`RoomServiceAuthError`), an unreachable or failing server (`RoomServiceUnavailableError`), anything else the
server refuses (`RoomServiceError`). Deleting a room that does not exist (any more) is not an error.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import aiohttp
from livekit import api

from transport.errors import (
    RoomServiceAuthError,
    RoomServiceError,
    RoomServiceUnavailableError,
    TransportClosedError,
    TransportConfigError,
)
from transport.session.viewers import DEFAULT_MAX_VIEWERS

__all__ = ["ParticipantEntry", "RoomAdmin", "RoomConfig", "RoomInfo", "RoomManager", "room_capacity"]

logger = logging.getLogger(__name__)

_T = TypeVar("_T")
_AUTH_CODES = frozenset({"unauthenticated", "permission_denied"})
_UNAVAILABLE_CODES = frozenset({"unavailable", "deadline_exceeded", "internal", "dataloss"})


@dataclass(frozen=True, slots=True)
class RoomConfig:
    """How session rooms are created.

    `empty_timeout`: seconds a room waits for its first participant before the server closes it.
    `departure_timeout`: seconds a room stays open after its last participant left (the service deletes rooms
    itself; both timeouts are the safety net when the service dies without cleaning up).
    `max_participants`: controller + viewers (0 means no limit; `room_capacity`): the server does not count the
    service participant, whose token is of kind `agent`.
    `request_timeout`: seconds for one RoomService call.
    """

    empty_timeout: int = 30
    departure_timeout: int = 20
    max_participants: int = 1 + DEFAULT_MAX_VIEWERS
    request_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.empty_timeout < 1:
            raise TransportConfigError(f"room empty_timeout must be at least 1 s, got {self.empty_timeout}")
        if self.departure_timeout < 1:
            raise TransportConfigError(f"room departure_timeout must be at least 1 s, got {self.departure_timeout}")
        if self.max_participants != 0 and self.max_participants < 1:
            raise TransportConfigError(
                f"room max_participants must be 0 (no limit) or at least 1 (the controller), "
                f"got {self.max_participants}"
            )
        if not self.request_timeout > 0:
            raise TransportConfigError(f"room request_timeout must be positive, got {self.request_timeout}")


def room_capacity(max_viewers: int | None) -> int:
    """A session room's `max_participants`: the controller and `max_viewers` viewers (None: viewers unbounded, so the
    room is too: 0). The service participant is not counted: a real server leaves participants of kind `agent` (the
    service's token, `tokens.py`) out of the count, as it does egress. A real server refuses the join past it, so a
    smaller room would refuse viewers the service granted a place, and a larger one would let in more than the
    service granted."""
    return 0 if max_viewers is None else 1 + max_viewers


@dataclass(frozen=True, slots=True)
class RoomInfo:
    name: str
    sid: str
    empty_timeout: int
    departure_timeout: int
    max_participants: int
    num_participants: int
    metadata: str


@dataclass(frozen=True, slots=True)
class ParticipantEntry:
    """One participant of a room as the server lists it: who, and when it joined (the server's clock, ms)."""

    identity: str
    joined_at_ms: int


class RoomAdmin(Protocol):
    """What the LiveKit transport needs from room management (`RoomManager`, or a fake in tests)."""

    async def create_room(self, name: str, *, metadata: str = "") -> RoomInfo: ...

    async def delete_room(self, name: str) -> bool: ...

    async def room_exists(self, name: str) -> bool: ...

    async def list_participants(self, room: str) -> tuple[ParticipantEntry, ...]: ...


def _info(room: api.Room) -> RoomInfo:
    return RoomInfo(
        name=room.name,
        sid=room.sid,
        empty_timeout=room.empty_timeout,
        departure_timeout=room.departure_timeout,
        max_participants=room.max_participants,
        num_participants=room.num_participants,
        metadata=room.metadata,
    )


class RoomManager:
    """Room management through LiveKit's RoomService. `start()` before use (it opens the HTTP session on the
    running loop), `aclose()` at shutdown. Safe to share between sessions; calls run concurrently."""

    def __init__(self, url: str, api_key: str, api_secret: str, config: RoomConfig | None = None) -> None:
        if not url:
            raise TransportConfigError("the LiveKit url must be set")
        if not api_key or not api_secret:
            raise TransportConfigError("LiveKit api_key and api_secret must both be set")
        self._url = url
        self._api_key = api_key
        self._api_secret = api_secret
        self._config = config if config is not None else RoomConfig()
        self._api: api.LiveKitAPI | None = None

    @property
    def config(self) -> RoomConfig:
        return self._config

    async def start(self) -> None:
        if self._api is None:
            self._api = api.LiveKitAPI(
                self._url,
                self._api_key,
                self._api_secret,
                timeout=aiohttp.ClientTimeout(total=self._config.request_timeout),
            )

    async def aclose(self) -> None:
        client, self._api = self._api, None
        if client is not None:
            await client.aclose()

    def _room_service(self) -> api.room_service.RoomService:
        if self._api is None:
            raise TransportClosedError("the room manager is not started")
        return self._api.room

    async def _call(self, operation: str, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except api.ServerError as exc:
            cls: type[RoomServiceError] = RoomServiceError
            if exc.status in (401, 403) or exc.code in _AUTH_CODES:
                cls = RoomServiceAuthError
            elif exc.status >= 500 or exc.code in _UNAVAILABLE_CODES:
                cls = RoomServiceUnavailableError
            raise cls(operation, exc.code, exc.message, exc.status) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise RoomServiceUnavailableError(operation, "unavailable", str(exc) or type(exc).__name__) from exc

    async def create_room(self, name: str, *, metadata: str = "") -> RoomInfo:
        """Create the room (LiveKit returns the existing room when the name is taken)."""
        config = self._config
        request = api.CreateRoomRequest(
            name=name,
            empty_timeout=config.empty_timeout,
            departure_timeout=config.departure_timeout,
            max_participants=config.max_participants,
            metadata=metadata,
        )
        room = await self._call("CreateRoom", self._room_service().create_room(request))
        logger.info("created LiveKit room %s (sid %s)", room.name, room.sid)
        return _info(room)

    async def delete_room(self, name: str) -> bool:
        """Delete the room; False when it did not exist (deleting twice is fine)."""
        try:
            await self._call("DeleteRoom", self._room_service().delete_room(api.DeleteRoomRequest(room=name)))
        except RoomServiceError as exc:
            if exc.code == "not_found" or exc.status == 404:
                return False
            raise
        logger.info("deleted LiveKit room %s", name)
        return True

    async def room_exists(self, name: str) -> bool:
        """Whether the server has a room of that name now (a caller's room must exist before a session joins it)."""
        return any(info.name == name for info in await self.list_rooms([name]))

    async def list_rooms(self, names: Sequence[str] = ()) -> tuple[RoomInfo, ...]:
        response = await self._call("ListRooms", self._room_service().list_rooms(api.ListRoomsRequest(names=names)))
        return tuple(_info(room) for room in response.rooms)

    async def list_participants(self, room: str) -> tuple[ParticipantEntry, ...]:
        """Who is in the room and since when (`joined_at_ms`, or the seconds of a server that gives only those)."""
        response = await self._call(
            "ListParticipants", self._room_service().list_participants(api.ListParticipantsRequest(room=room))
        )
        return tuple(ParticipantEntry(p.identity, p.joined_at_ms or p.joined_at * 1000) for p in response.participants)

    async def remove_participant(self, room: str, identity: str) -> bool:
        """Remove a participant (it is disconnected with reason PARTICIPANT_REMOVED); False if it was not there."""
        request = api.RoomParticipantIdentity(room=room, identity=identity)
        try:
            await self._call("RemoveParticipant", self._room_service().remove_participant(request))
        except RoomServiceError as exc:
            if exc.code == "not_found" or exc.status == 404:
                return False
            raise
        return True
