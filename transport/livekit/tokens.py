"""LiveKit access tokens for a session's participants: who may join which room and do what there.

Every identity is generated here, unique per session and per token holder (`ctl-<session>-<random>` for the
browser that controls the session, `view-...` for viewers, `svc-...` for the service's own participant), so a
client can never pick or guess another's identity. Grants are room-scoped and least-privilege:

| role       | join | subscribe | publish media        | publish data |
|------------|------|-----------|----------------------|--------------|
| controller | yes  | yes       | no                   | yes (control)|
| viewer     | yes  | yes       | no                   | no           |
| service    | yes  | no        | camera video only    | yes (status) |

The service participant's token has kind `agent` (LiveKit's kind for a non-human publisher: an Agents worker's
`wait_for_participant()` and RoomIO never take it for the user, and it does not keep an empty room alive) and may
update its own attributes (`transport.livekit.attributes`: the session's state, read by late joiners).

Tokens are for joining: their TTL is short (default 60 s; LiveKit refreshes a connected participant's token by
itself). The metadata ties the identity to its session and role.
"""

from __future__ import annotations

import datetime
import enum
import json
import re
import secrets
import time
from dataclasses import dataclass, field

from livekit import api

from transport.config import DEFAULT_JOIN_TTL
from transport.errors import TransportConfigError

__all__ = [
    "DEFAULT_JOIN_TTL",
    "IssuedToken",
    "ParticipantRole",
    "TokenIssuer",
    "room_name_for",
]

_SAFE_ID = re.compile(r"[^A-Za-z0-9_.-]")
_MAX_ID_PART = 48


class ParticipantRole(enum.Enum):
    CONTROLLER = "ctl"  # the browser that created the session: receives video, sends control
    VIEWER = "view"  # an extra watcher: receives video and status only
    SERVICE = "svc"  # the service's own participant: publishes the video track and status


def _id_part(session_id: str) -> str:
    cleaned = _SAFE_ID.sub("_", session_id)[:_MAX_ID_PART]
    if not cleaned:
        raise TransportConfigError("a session id must not be empty")
    return cleaned


def room_name_for(session_id: str, prefix: str = "lingstream-") -> str:
    """The LiveKit room of a session (one room per session)."""
    return f"{prefix}{_id_part(session_id)}"


@dataclass(frozen=True, slots=True)
class IssuedToken:
    """A signed join token. `expires_at` is in Unix seconds (when the token stops admitting a join)."""

    role: ParticipantRole
    identity: str
    room: str
    session_id: str
    token: str = field(repr=False)
    expires_at: float


class TokenIssuer:
    """Mints join tokens for one LiveKit project (API key and secret).

    `join_ttl` is in seconds. Identities get 12 random hex digits: unique per token, unguessable.
    """

    def __init__(self, api_key: str, api_secret: str, *, join_ttl: float = DEFAULT_JOIN_TTL) -> None:
        if not api_key or not api_secret:
            raise TransportConfigError("LiveKit api_key and api_secret must both be set")
        if not 1 <= join_ttl <= 24 * 3600:
            raise TransportConfigError(f"join_ttl must be between 1 s and 24 h, got {join_ttl}")
        self._api_key = api_key
        self._api_secret = api_secret
        self._join_ttl = join_ttl

    @property
    def join_ttl(self) -> float:
        return self._join_ttl

    @staticmethod
    def new_identity(role: ParticipantRole, session_id: str) -> str:
        return f"{role.value}-{_id_part(session_id)}-{secrets.token_hex(6)}"

    @staticmethod
    def has_role(identity: str, role: ParticipantRole) -> bool:
        """Whether `identity` is one `new_identity` makes for `role` (e.g. a service participant of any replica)."""
        return identity.startswith(f"{role.value}-")

    def issue(self, role: ParticipantRole, session_id: str, room: str, *, identity: str | None = None) -> IssuedToken:
        """A token for `role` in `room`. Pass `identity` to re-issue for a known participant (a rejoin)."""
        identity = identity if identity is not None else self.new_identity(role, session_id)
        if not identity.startswith(f"{role.value}-"):
            raise TransportConfigError(f"identity {identity!r} does not belong to role {role.name.lower()}")
        grants = _grants(role, room)
        metadata = json.dumps({"session_id": session_id, "role": role.name.lower()}, separators=(",", ":"))
        ttl = datetime.timedelta(seconds=self._join_ttl)
        token = (
            api.AccessToken(self._api_key, self._api_secret)
            .with_identity(identity)
            .with_name(role.name.lower())
            .with_metadata(metadata)
            .with_grants(grants)
            .with_ttl(ttl)
        )
        if role is ParticipantRole.SERVICE:
            token = token.with_kind("agent")
        issued_at = time.time()
        return IssuedToken(
            role=role,
            identity=identity,
            room=room,
            session_id=session_id,
            token=token.to_jwt(),
            expires_at=float(int(issued_at + self._join_ttl)),
        )

    def controller(self, session_id: str, room: str, *, identity: str | None = None) -> IssuedToken:
        return self.issue(ParticipantRole.CONTROLLER, session_id, room, identity=identity)

    def viewer(self, session_id: str, room: str) -> IssuedToken:
        return self.issue(ParticipantRole.VIEWER, session_id, room)

    def service(self, session_id: str, room: str, *, identity: str | None = None) -> IssuedToken:
        return self.issue(ParticipantRole.SERVICE, session_id, room, identity=identity)


def _grants(role: ParticipantRole, room: str) -> api.VideoGrants:
    # Every permission is spelled out: VideoGrants defaults to publish/subscribe/data all True.
    match role:
        case ParticipantRole.CONTROLLER:
            return api.VideoGrants(
                room_join=True,
                room=room,
                can_subscribe=True,
                can_publish=False,
                can_publish_data=True,
                can_update_own_metadata=False,
            )
        case ParticipantRole.VIEWER:
            return api.VideoGrants(
                room_join=True,
                room=room,
                can_subscribe=True,
                can_publish=False,
                can_publish_data=False,
                can_update_own_metadata=False,
            )
        case ParticipantRole.SERVICE:
            return api.VideoGrants(
                room_join=True,
                room=room,
                can_subscribe=False,
                can_publish=True,
                can_publish_sources=["camera"],
                can_publish_data=True,
                can_update_own_metadata=True,  # its attributes carry the session's state
            )
