"""One participant's signalling over a websocket: protobuf `SignalRequest`s in, `SignalResponse`s out (v0).

`SignalOutbox` holds what the stand-in has to say to a participant, in order, across websockets: a message leaves
it only once a websocket took it, so a resume on a new websocket carries on where the old one stopped (the bound
drops the newest, logged). `serve_signal` runs one websocket: a writer draining the outbox, and a reader handling
the client's requests one at a time in arrival order (an offer is answered before the trickle that follows it is
applied). It returns when the websocket closes, saying whether the client said goodbye (`leave`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from aiohttp import WSMsgType, web
from livekit.protocol import models, rtc

if TYPE_CHECKING:
    from tests.support.livekit_server.rooms import Participant

__all__ = ["SignalOutbox", "serve_signal"]

logger = logging.getLogger(__name__)

_OUTBOX_BOUND = 512


class SignalOutbox:
    """Messages waiting for a websocket, oldest first; `None` asks the writer to close the websocket.

    `put` never blocks (beyond the bound the message is dropped and logged). `peek` waits for the oldest without
    taking it; `pop` takes it once it went out.
    """

    def __init__(self, label: str) -> None:
        self._label = label
        self._items: collections.deque[rtc.SignalResponse | None] = collections.deque()
        self._ready = asyncio.Event()

    def put(self, message: rtc.SignalResponse | None) -> None:
        if message is not None and len(self._items) >= _OUTBOX_BOUND:
            logger.warning("%s: signal outbox full; dropping %s", self._label, message.WhichOneof("message"))
            return
        self._items.append(message)
        self._ready.set()

    async def peek(self) -> rtc.SignalResponse | None:
        while not self._items:
            self._ready.clear()
            await self._ready.wait()
        return self._items[0]

    def pop(self) -> None:
        if self._items:
            self._items.popleft()


async def _write(ws: web.WebSocketResponse, outbox: SignalOutbox, label: str) -> None:
    while True:
        message = await outbox.peek()
        if message is None:
            outbox.pop()
            await ws.close()
            return
        logger.debug("%s ← %s", label, message.WhichOneof("message"))
        await ws.send_bytes(message.SerializeToString())
        outbox.pop()


async def serve_signal(ws: web.WebSocketResponse, participant: Participant) -> bool:
    """Serve `participant` on `ws` until it closes. True when the client sent `leave`."""
    writer = asyncio.get_running_loop().create_task(
        _write(ws, participant.outbox, participant.identity), name=f"signal {participant.sid}"
    )
    left = False
    try:
        async for frame in ws:
            if frame.type != WSMsgType.BINARY:
                continue
            try:
                request = rtc.SignalRequest.FromString(frame.data)
            except Exception:
                logger.warning("%s: unreadable signal request", participant.identity)
                continue
            logger.debug("%s → %s", participant.identity, request.WhichOneof("message"))
            if request.WhichOneof("message") == "leave":
                left = True
                break
            try:
                await _handle(participant, request)
            except Exception:
                logger.exception("%s: handling %s failed", participant.identity, request.WhichOneof("message"))
    finally:
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await writer
    return left


async def _handle(participant: Participant, request: rtc.SignalRequest) -> None:
    kind = request.WhichOneof("message")
    match kind:
        case "offer":
            sdp = await participant.media.answer_offer(request.offer.sdp)
            answer = rtc.SessionDescription(type="answer", sdp=sdp, id=request.offer.id)
            participant.send(rtc.SignalResponse(answer=answer))
        case "answer":
            await participant.media.apply_answer(request.answer.sdp)
        case "trickle":
            await participant.media.add_candidate(request.trickle)
        case "add_track":
            participant.add_track(request.add_track)
        case "ping":
            participant.send(rtc.SignalResponse(pong=int(time.time() * 1000)))
        case "ping_req":
            pong = rtc.Pong(last_ping_timestamp=request.ping_req.timestamp, timestamp=int(time.time() * 1000))
            participant.send(rtc.SignalResponse(pong_resp=pong))
        case "mute":
            info = participant.tracks.get(request.mute.sid)
            if info is not None:
                info.muted = request.mute.muted
                participant.changed()
                participant.room.broadcast(participant)
        case _:
            # subscription, track_setting, update_layers, sync_state, simulate, update_metadata: adaptive stream,
            # dynacast and selective subscription are what a real server does and this stand-in does not.
            participant.room.counters[f"signal_ignored_{kind}"] += 1


def leave_response(reason: models.DisconnectReason, action: rtc.LeaveRequest.Action) -> rtc.SignalResponse:
    """A `LeaveRequest`, as the server sends it."""
    return rtc.SignalResponse(
        leave=rtc.LeaveRequest(reason=reason, action=action, can_reconnect=action != rtc.LeaveRequest.Action.DISCONNECT)
    )


def reconnect_response() -> rtc.SignalResponse:
    return rtc.SignalResponse(reconnect=rtc.ReconnectResponse(client_configuration=models.ClientConfiguration()))
