"""`StandIn`: the HTTP side of the stand-in on one port — signalling, validation, the RoomService, test controls.

Routes, as the real server's (livekit/livekit `pkg/service/rtcservice.go`) where they exist:

| route | what |
|---|---|
| `GET /rtc` (websocket) | v0 signalling; the token in `access_token` or `Authorization: Bearer` |
| `GET /rtc/validate` | the same checks without joining: 200, or the status and text a join would get (CORS open) |
| `GET /rtc/v1`, `/rtc/v1/validate` | 404, so both SDKs fall back to v0 |
| `POST /twirp/livekit.RoomService/{method}` | CreateRoom, DeleteRoom, ListRooms, ListParticipants, RemoveParticipant |
| `GET /_standin/state`, `POST /_standin/{drop,leave,block}` | test controls (no real server has them) |

A join is refused as the real server refuses it: no or a bad token (expired, forged) 401; a token without
`roomJoin` 401 "permissions denied"; a room that was never created (or was deleted) 404. A resume
(`reconnect=1`) of a participant the room no longer has is answered with `LeaveRequest{STATE_MISMATCH, RECONNECT}`
(the client then joins afresh), as `pkg/service/roommanager.go` does.

Test controls: `drop` closes a participant's signal websocket, either keeping the participant for a resume
(`resume: true`; the real server keeps a participant whose websocket broke while its peer connections live) or
removing it (`resume: false`, as after a lost connection: its resume is then refused); `leave` sends a
`LeaveRequest` with a given reason and action and removes the participant (a server shutdown, say); `block`
refuses an identity's joins and resumes with 503 for some seconds (a client that cannot reach the server).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections import Counter
from typing import Any, cast

import jwt
from aiohttp import web
from livekit import api
from livekit.api.access_token import Claims
from livekit.protocol import models, rtc

from tests.support.livekit_server.rooms import Participant, Room
from tests.support.livekit_server.signal import leave_response, reconnect_response, serve_signal
from tests.support.livekit_server.twirp import twirp_handler
from tests.support.livekit_server.webhooks import WebhookSender

__all__ = ["StandIn"]

logger = logging.getLogger(__name__)

_CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Headers": "Authorization, Content-Type"}
_HISTORY = 2000


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class StandIn:
    """The rooms, the counters every test reads, and the aiohttp application serving them.

    `resume_window`: seconds a participant whose websocket broke (without `leave`) stays in its room waiting for
    a resume before it is removed.
    """

    def __init__(
        self, api_key: str, api_secret: str, *, webhook_url: str | None = None, resume_window: float = 10.0
    ) -> None:
        self._verifier = api.TokenVerifier(api_key, api_secret)
        self.rooms: dict[str, Room] = {}
        self.counters: Counter[str] = Counter()
        self.history: collections.deque[dict[str, Any]] = collections.deque(maxlen=_HISTORY)
        self.webhooks = WebhookSender(webhook_url, api_key, api_secret, self.counters)
        self._resume_window = resume_window
        self._blocked: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/rtc", self._rtc)
        app.router.add_get("/rtc/validate", self._validate)
        app.router.add_route("*", "/rtc/v1", self._not_found)
        app.router.add_route("*", "/rtc/v1/validate", self._not_found)
        app.router.add_post("/twirp/livekit.RoomService/{method}", twirp_handler(self))
        app.router.add_get("/_standin/state", self._state)
        app.router.add_post("/_standin/drop", self._drop)
        app.router.add_post("/_standin/leave", self._leave)
        app.router.add_post("/_standin/block", self._block)
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        self.webhooks.start()

    async def _on_shutdown(self, _app: web.Application) -> None:
        for room in list(self.rooms.values()):
            await room.close(models.DisconnectReason.SERVER_SHUTDOWN)
        await self.webhooks.close()

    def _note(self, event: str, **fields: Any) -> None:
        self.history.append({"t": round(time.time(), 3), "event": event, **fields})

    # -- rooms ----------------------------------------------------------------------------------------------------

    def verify(self, token: str) -> Claims:
        """The token's claims; raises when the signature, the key or the expiry is wrong."""
        return self._verifier.verify(token)

    def create_room(self, request: api.CreateRoomRequest) -> Room:
        """The room of that name, created (with `room_started`) if there is none."""
        room = self.rooms.get(request.name)
        if room is None:
            room = Room(request, self._webhook, self.counters)
            room.on_finished = self._finished
            self.rooms[request.name] = room
            self._note("room_created", room=room.name)
            self._webhook("room_started", room, None)
        return room

    async def delete_room(self, name: str) -> bool:
        room = self.rooms.get(name)
        if room is None:
            return False
        self._note("room_deleted", room=name)
        await room.close(models.DisconnectReason.ROOM_DELETED)
        return True

    def _finished(self, room: Room) -> None:
        if self.rooms.get(room.name) is room:
            del self.rooms[room.name]

    def _webhook(self, event: str, room: Room, participant: Participant | None) -> None:
        self.webhooks.queue(event, room.info(), None if participant is None else participant.info())

    def _find(self, identity: str) -> Participant | None:
        for room in self.rooms.values():
            participant = room.participants.get(identity)
            if participant is not None:
                return participant
        return None

    # -- joining --------------------------------------------------------------------------------------------------

    def _admit(self, request: web.Request) -> tuple[Claims, Room, int]:
        """The token's claims, its room and its expiry (Unix seconds), or `_Refused` as the real server refuses."""
        header = request.headers.get("Authorization", "")
        token = header[7:] if header.startswith("Bearer ") else request.query.get("access_token", "")
        if not token:
            raise _Refused(401, "invalid authorization header. Must start with Bearer ")
        try:
            claims = self.verify(token)
        except Exception as exc:
            raise _Refused(401, f"invalid authorization token: {exc}") from exc
        grants = claims.video
        if grants is None or not grants.room_join:
            raise _Refused(401, "permissions denied")
        if not claims.identity:
            raise _Refused(400, "participant identity cannot be empty")
        if not grants.room:
            raise _Refused(400, "room name cannot be empty")
        blocked_until = self._blocked.get(claims.identity, 0.0)
        if time.monotonic() < blocked_until:
            raise _Refused(503, "unavailable (the test blocks this identity)")
        room = self.rooms.get(grants.room)
        if room is None or room.closed:
            raise _Refused(404, "requested room does not exist")
        expires = int(jwt.decode(token, options={"verify_signature": False}).get("exp", 0))
        return claims, room, expires

    async def _validate(self, request: web.Request) -> web.Response:
        try:
            self._admit(request)
        except _Refused as refused:
            return web.Response(status=refused.status, text=refused.text, headers=_CORS)
        return web.Response(text="success", headers=_CORS)

    async def _not_found(self, _request: web.Request) -> web.Response:
        return web.Response(status=404, text="404 page not found", headers=_CORS)

    async def _rtc(self, request: web.Request) -> web.StreamResponse:
        resume = request.query.get("reconnect") in ("1", "true")
        try:
            claims, room, expires = self._admit(request)
        except _Refused as refused:
            self.counters[f"joins_refused_{refused.status}"] += 1
            self._note("refused", status=refused.status, text=refused.text, resume=resume)
            return web.Response(status=refused.status, text=refused.text)
        ws = web.WebSocketResponse(max_msg_size=4 * 1024 * 1024)
        await ws.prepare(request)
        if resume:
            participant = room.participants.get(claims.identity)
            if participant is None or participant.closed:
                self.counters["resumes_refused"] += 1
                self._note("resume_refused", identity=claims.identity, room=room.name)
                await ws.send_bytes(
                    leave_response(
                        models.DisconnectReason.STATE_MISMATCH, rtc.LeaveRequest.Action.RECONNECT
                    ).SerializeToString()
                )
                await ws.close()
                return ws
            self.counters["resumes"] += 1
            self._note("resume", identity=claims.identity, room=room.name, expires=expires)
            stale, participant.websocket = participant.websocket, ws
            if stale is not None:  # the client saw the break before we did: swap the sink, as the real server does
                await stale.close()
            # As the real server resumes (pkg/rtc/room.go ResumeParticipant): who is in the room now (the client
            # takes anyone it does not hear of as gone) and the room. Its subscriber ICE restart is left out: aiortc
            # cannot restart ICE, and a signal-only break leaves the peer connections up.
            participant.send(reconnect_response())
            participant.send(rtc.SignalResponse(update=rtc.ParticipantUpdate(participants=room.infos())))
            participant.send(rtc.SignalResponse(room_update=rtc.RoomUpdate(room=room.info())))
        else:
            auto_subscribe = request.query.get("auto_subscribe", "1") not in ("0", "false")
            participant = Participant(room, claims, auto_subscribe=auto_subscribe)
            participant.websocket = ws
            self._note("join", identity=claims.identity, room=room.name, sid=participant.sid, expires=expires)
            await room.join(participant)
        left = await serve_signal(ws, participant)
        if participant.websocket is ws:
            participant.websocket = None
        if left:
            self._note("leave", identity=participant.identity, room=room.name)
            await room.remove(participant, models.DisconnectReason.CLIENT_INITIATED, tell=False)
        elif not participant.closed:
            self.counters["signal_closed"] += 1
            self._spawn(self._await_resume(room, participant))
        return ws

    async def _await_resume(self, room: Room, participant: Participant) -> None:
        await asyncio.sleep(self._resume_window)
        if participant.websocket is None and not participant.closed:
            self._note("resume_window_over", identity=participant.identity, room=room.name)
            await room.remove(participant, models.DisconnectReason.SIGNAL_CLOSE, tell=False)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- test controls --------------------------------------------------------------------------------------------

    async def _state(self, _request: web.Request) -> web.Response:
        rooms = {
            name: {
                "sid": room.sid,
                "participants": {
                    identity: {
                        "sid": p.sid,
                        "signal": p.websocket is not None,
                        "tracks": list(p.tracks),
                        "subscribed": list(p.media.subscribed),
                        "connections": p.media.connection_states,
                        "data_refused": p.data_refused,
                    }
                    for identity, p in room.participants.items()
                },
            }
            for name, room in self.rooms.items()
        }
        return web.json_response(
            {
                "rooms": rooms,
                "counters": dict(self.counters),
                "webhooks": list(self.webhooks.sent),
                "history": list(self.history),
            }
        )

    async def _participant(self, request: web.Request) -> tuple[Participant, dict[str, Any]]:
        body = await request.json()
        participant = self._find(str(body.get("identity", "")))
        if participant is None:
            raise web.HTTPNotFound(text=f"no participant {body.get('identity')!r}")
        return participant, body

    async def _drop(self, request: web.Request) -> web.Response:
        participant, body = await self._participant(request)
        resume = bool(body.get("resume", True))
        self._note("drop", identity=participant.identity, resume=resume)
        self.counters["drops"] += 1
        ws = participant.websocket
        if resume:
            if ws is not None:
                await ws.close()
        else:
            await participant.room.remove(participant, models.DisconnectReason.SIGNAL_CLOSE, tell=False)
            if ws is not None:
                with contextlib.suppress(Exception):
                    await ws.close()
        return web.json_response({"dropped": participant.identity, "resume": resume})

    async def _leave(self, request: web.Request) -> web.Response:
        participant, body = await self._participant(request)
        # The stubs give Value() an int; the field takes the enum's name as well, which is what the body holds.
        reason = cast(
            models.DisconnectReason, models.DisconnectReason.Value(str(body.get("reason", "SERVER_SHUTDOWN")))
        )
        action = cast(rtc.LeaveRequest.Action, rtc.LeaveRequest.Action.Value(str(body.get("action", "DISCONNECT"))))
        self._note("leave_sent", identity=participant.identity, reason=body.get("reason"), action=body.get("action"))
        await participant.room.remove(participant, reason, tell=True, action=action)
        return web.json_response({"left": participant.identity})

    async def _block(self, request: web.Request) -> web.Response:
        body = await request.json()
        identity, seconds = str(body["identity"]), float(body.get("seconds", 0))
        self._blocked[identity] = time.monotonic() + seconds
        self._note("block", identity=identity, seconds=seconds)
        return web.json_response({"blocked": identity, "seconds": seconds})
