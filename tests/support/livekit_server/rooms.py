"""Rooms and their participants: who is in which room, what each publishes, and what the room tells everyone.

A `Room` is created by the RoomService API only (auto-create is off, as in a production config: a token for a room
that does not exist is refused). A `Participant` is one signalling client with its two peer connections
(`media.ParticipantMedia`) and a queue of signal messages its websocket sends in order. The room does what the real
server does at each change, in this order: the change itself, a `ParticipantUpdate` to the others, the webhook.

Permissions are the token's grants, checked where the real server checks them: publishing a track
(`RequestResponse NOT_ALLOWED` without `canPublish` or the source), publishing data (dropped and counted without
`canPublishData`), being subscribed to tracks (`canSubscribe`).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiortc.contrib.media import MediaRelay
from aiortc.mediastreams import MediaStreamTrack
from livekit import api
from livekit.api.access_token import Claims
from livekit.protocol import models, rtc

from tests.support.livekit_server.media import DATA_LABELS, ParticipantMedia, PublishedTrack
from tests.support.livekit_server.signal import SignalOutbox, leave_response

__all__ = ["Participant", "Room", "WebhookSink"]

logger = logging.getLogger(__name__)

WebhookSink = Callable[[str, "Room", "Participant | None"], None]
"""Queues a webhook: event name, room, participant (for participant events)."""


def _sid(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(6)}"


@dataclass(slots=True)
class _Pending:
    cid: str
    info: models.TrackInfo


class Participant:
    """One client in one room. Signal messages go out through `send` (never blocks; the websocket's writer drains
    them in order); `websocket` is None while its signal connection is down (a resume may bring a new one)."""

    def __init__(self, room: Room, claims: Claims, *, auto_subscribe: bool) -> None:
        grants = claims.video or api.VideoGrants()
        self.room = room
        self.identity = claims.identity
        self.name = claims.name
        self.metadata = claims.metadata
        self.grants = grants
        self.sid = _sid("PA")
        self.auto_subscribe = auto_subscribe
        self.joined_at = time.time()
        self.state = models.ParticipantInfo.State.JOINED
        self.version = 1
        self.disconnect_reason = models.DisconnectReason.UNKNOWN_REASON
        self.tracks: dict[str, models.TrackInfo] = {}
        self._pending: list[_Pending] = []
        self.outbox = SignalOutbox(f"{room.name}/{self.identity}")
        self.websocket: web.WebSocketResponse | None = None  # None while the signal connection is down
        self.closed = False
        self.data_refused = 0
        self.media = ParticipantMedia(f"{room.name}/{self.identity}", self.send, self._on_track, self._on_data)

    # -- what others see ------------------------------------------------------------------------------------------

    def permission(self) -> models.ParticipantPermission:
        g = self.grants
        return models.ParticipantPermission(
            can_subscribe=bool(g.can_subscribe),
            can_publish=bool(g.can_publish),
            can_publish_data=bool(g.can_publish_data),
            can_publish_sources=[s.upper() for s in (g.can_publish_sources or [])],
            hidden=bool(g.hidden),
        )

    def info(self) -> models.ParticipantInfo:
        return models.ParticipantInfo(
            sid=self.sid,
            identity=self.identity,
            name=self.name,
            metadata=self.metadata,
            state=self.state,
            tracks=list(self.tracks.values()),
            joined_at=int(self.joined_at),
            joined_at_ms=int(self.joined_at * 1000),
            version=self.version,
            permission=self.permission(),
            is_publisher=bool(self.tracks),
            disconnect_reason=self.disconnect_reason,
        )

    def changed(self) -> None:
        self.version += 1

    # -- signalling -----------------------------------------------------------------------------------------------

    def send(self, message: rtc.SignalResponse) -> None:
        """Queue a signal message (nothing once the participant has left)."""
        if not self.closed:
            self.outbox.put(message)

    def request_response(self, reason: rtc.RequestResponse.Reason, request: rtc.AddTrackRequest) -> None:
        self.send(rtc.SignalResponse(request_response=rtc.RequestResponse(reason=reason, add_track=request)))

    def add_track(self, request: rtc.AddTrackRequest) -> None:
        """`add_track`: refused without the grant (as the real server does), else a pending TrackInfo is answered
        with `track_published`."""
        sources = [s.upper() for s in (self.grants.can_publish_sources or [])]
        source_name = models.TrackSource.Name(request.source)
        if not self.grants.can_publish or (sources and source_name not in sources):
            logger.info("%s: no permission to publish a %s track", self.identity, source_name.lower())
            self.room.counters["tracks_refused"] += 1
            self.request_response(rtc.RequestResponse.Reason.NOT_ALLOWED, request)
            return
        info = models.TrackInfo(
            sid=_sid("TR"),
            type=request.type,
            name=request.name,
            width=request.width,
            height=request.height,
            muted=request.muted,
            simulcast=False,
            source=request.source,
            mime_type="video/VP8" if request.type == models.TrackType.VIDEO else "audio/opus",
            # Frame metadata (a trailer on each encoded frame) is announced to subscribers as the real server does,
            # so that theirs strip it before decoding.
            packet_trailer_features=request.packet_trailer_features,
        )
        self._pending.append(_Pending(request.cid, info))
        self.send(rtc.SignalResponse(track_published=rtc.TrackPublishedResponse(cid=request.cid, track=info)))

    def _on_track(self, track: MediaStreamTrack, mid: str | None) -> None:
        # The Rust SDK's cid does not match its SDP's msid: take the first pending track of the same kind, as the
        # real server does.
        kind = models.TrackType.VIDEO if track.kind == "video" else models.TrackType.AUDIO
        pending = next((p for p in self._pending if p.info.type == kind), None)
        if pending is None:
            logger.warning("%s: a %s track arrived that was never announced", self.identity, track.kind)
            return
        self._pending.remove(pending)
        pending.info.mid = mid or ""
        self.tracks[pending.info.sid] = pending.info
        self.changed()
        self.room.publish(self, PublishedTrack(self.sid, pending.info.sid, track, MediaRelay()))

    def _on_data(self, label: str, payload: bytes) -> None:
        if label not in DATA_LABELS:
            return  # e.g. the newer clients' `_data_track`
        if not self.grants.can_publish_data:
            self.data_refused += 1
            self.room.counters["data_refused"] += 1
            return
        self.room.forward_data(self, label, payload)


class Room:
    """One room: its participants by identity, the tracks published in it, its empty and departure timeouts."""

    def __init__(self, request: api.CreateRoomRequest, webhook: WebhookSink, counters: Counter[str]) -> None:
        self.name = request.name
        self.sid = _sid("RM")
        self.empty_timeout = request.empty_timeout or 300
        self.departure_timeout = request.departure_timeout or 20
        self.max_participants = request.max_participants
        self.metadata = request.metadata
        self.created_at = time.time()
        self.participants: dict[str, Participant] = {}
        self.published: dict[str, PublishedTrack] = {}
        self.counters = counters
        self.closed = False
        self._webhook = webhook
        self._timeout: asyncio.TimerHandle | None = None
        self.on_finished: Callable[[Room], None] = lambda _room: None
        self._arm_timeout(self.empty_timeout)

    def info(self) -> models.Room:
        return models.Room(
            sid=self.sid,
            name=self.name,
            empty_timeout=self.empty_timeout,
            departure_timeout=self.departure_timeout,
            max_participants=self.max_participants,
            creation_time=int(self.created_at),
            creation_time_ms=int(self.created_at * 1000),
            metadata=self.metadata,
            num_participants=len(self.participants),
            num_publishers=sum(1 for p in self.participants.values() if p.tracks),
        )

    def _arm_timeout(self, seconds: int) -> None:
        if self._timeout is not None:
            self._timeout.cancel()
        self._timeout = asyncio.get_running_loop().call_later(seconds, self._timed_out)

    def _timed_out(self) -> None:
        self._timeout = None
        if not self.participants and not self.closed:
            logger.info("room %s: closing after its timeout", self.name)
            asyncio.get_running_loop().create_task(self.close(models.DisconnectReason.ROOM_CLOSED))

    # -- membership -----------------------------------------------------------------------------------------------

    @property
    def full(self) -> bool:
        return self.max_participants > 0 and len(self.participants) >= self.max_participants

    def infos(self) -> list[models.ParticipantInfo]:
        return [p.info() for p in self.participants.values()]

    def others(self, participant: Participant) -> list[Participant]:
        return [p for p in self.participants.values() if p is not participant]

    def join_response(self, participant: Participant) -> rtc.SignalResponse:
        subscriber_primary = bool(participant.grants.can_subscribe)
        return rtc.SignalResponse(
            join=rtc.JoinResponse(
                room=self.info(),
                participant=participant.info(),
                other_participants=[p.info() for p in self.others(participant)],
                server_version="1.9.0",
                subscriber_primary=subscriber_primary,
                ping_interval=5,
                ping_timeout=15,
                server_info=models.ServerInfo(
                    edition=models.ServerInfo.Edition.Standard,
                    version="1.9.0",
                    protocol=16,
                    node_id="ND_standin",
                    region="test",
                ),
                enabled_publish_codecs=[models.Codec(mime="video/VP8"), models.Codec(mime="video/H264")],
            )
        )

    async def join(self, participant: Participant) -> None:
        """Admit `participant` (its signal is attached): a duplicate identity is removed first, the join response
        goes out, the others hear of it, the webhook follows, and the subscriber connection starts with every track
        it may receive."""
        if self._timeout is not None:
            self._timeout.cancel()
            self._timeout = None
        existing = self.participants.get(participant.identity)
        if existing is not None:
            await self.remove(existing, models.DisconnectReason.DUPLICATE_IDENTITY, tell=True)
        self.participants[participant.identity] = participant
        self.counters["joins"] += 1
        participant.send(self.join_response(participant))
        participant.state = models.ParticipantInfo.State.ACTIVE
        self.broadcast(participant)
        self._webhook("participant_joined", self, participant)
        participant.media.start()
        if participant.grants.can_subscribe and participant.auto_subscribe:
            for track in self.published.values():
                participant.media.subscribe(track)

    def broadcast(self, participant: Participant) -> None:
        """Tell everyone else in the room what `participant` looks like now."""
        update = rtc.SignalResponse(update=rtc.ParticipantUpdate(participants=[participant.info()]))
        for other in self.others(participant):
            other.send(update)

    async def remove(
        self,
        participant: Participant,
        reason: models.DisconnectReason,
        *,
        tell: bool,
        action: rtc.LeaveRequest.Action | None = None,
    ) -> None:
        """`participant` leaves: told why first when `tell` (a `LeaveRequest`), then its connections close, the
        others see it go, the webhook follows. Idempotent."""
        if participant.closed:
            return
        if tell:
            participant.send(leave_response(reason, rtc.LeaveRequest.Action.DISCONNECT if action is None else action))
        participant.closed = True
        participant.outbox.put(None)  # the writer closes the websocket after what is queued
        if self.participants.get(participant.identity) is participant:
            del self.participants[participant.identity]
        participant.state = models.ParticipantInfo.State.DISCONNECTED
        participant.disconnect_reason = reason
        participant.changed()
        for sid in list(participant.tracks):
            track = self.published.pop(sid, None)
            for other in self.others(participant):
                other.media.unsubscribe(sid)
            if track is not None:
                track.source.stop()
        self.broadcast(participant)
        self.counters["leaves"] += 1
        self._webhook("participant_left", self, participant)
        await participant.media.close()
        if not self.participants and not self.closed:
            self._arm_timeout(self.departure_timeout)

    async def close(self, reason: models.DisconnectReason) -> None:
        """The room ends (deleted, or its timeout): everyone is told `reason` and removed; `room_finished` last."""
        if self.closed:
            return
        self.closed = True
        if self._timeout is not None:
            self._timeout.cancel()
            self._timeout = None
        for participant in list(self.participants.values()):
            await self.remove(participant, reason, tell=True)
        self._webhook("room_finished", self, None)
        self.on_finished(self)

    # -- media and data -------------------------------------------------------------------------------------------

    def publish(self, participant: Participant, track: PublishedTrack) -> None:
        """A track arrived on `participant`'s publisher connection: the others hear of it, subscribers get it."""
        self.published[track.track_sid] = track
        self.broadcast(participant)
        for other in self.others(participant):
            if other.grants.can_subscribe and other.auto_subscribe:
                other.media.subscribe(track)

    def forward_data(self, sender: Participant, label: str, payload: bytes) -> None:
        """A data packet from `sender`: stamped with who sent it, `sequence` kept, delivered on the channel of the
        same label to its destinations (everyone else when it names none)."""
        try:
            packet = models.DataPacket.FromString(payload)
        except Exception:
            self.counters["data_malformed"] += 1
            return
        packet.participant_identity = sender.identity
        packet.participant_sid = sender.sid
        destinations = set(packet.destination_identities)
        if packet.HasField("user"):
            packet.user.participant_identity = sender.identity
            packet.user.participant_sid = sender.sid
            destinations |= set(packet.user.destination_identities)
        data = packet.SerializeToString()
        for other in self.others(sender):
            if destinations and other.identity not in destinations:
                continue
            if other.media.send_data(label, data):
                self.counters["data_forwarded"] += 1
            else:
                self.counters["data_unsent"] += 1
