"""LiveKit webhooks: verify them, and turn the ones a session cares about into room events.

LiveKit signs each webhook with a JWT (issued by the API key, signed with its secret) whose `sha256` claim is the
base64 SHA-256 of the body; it arrives in the `Authorization` header. `WebhookHandler.receive` checks both with
`livekit.api.WebhookReceiver` and raises `WebhookError` (answer 401) for anything that fails, then maps
`participant_joined`/`participant_left` of a controller or viewer identity (the binding counts viewers' places) and
`room_finished` to the `transport.livekit.events` the LiveKit binding handles. Other events (the service's own
participant,
tracks, egress) are verified and ignored.
"""

from __future__ import annotations

from livekit import api

from transport.errors import TransportConfigError, WebhookError
from transport.livekit.events import ParticipantJoined, ParticipantLeft, RoomEvent, RoomFinished
from transport.livekit.tokens import ParticipantRole

__all__ = ["MAX_WEBHOOK_BYTES", "WebhookHandler"]

MAX_WEBHOOK_BYTES = 256 * 1024
_PARTICIPANT_PREFIXES = (f"{ParticipantRole.CONTROLLER.value}-", f"{ParticipantRole.VIEWER.value}-")


class WebhookHandler:
    """Verifies LiveKit webhook requests with the project's API key and secret."""

    def __init__(self, api_key: str, api_secret: str, *, max_body_bytes: int = MAX_WEBHOOK_BYTES) -> None:
        if not api_key or not api_secret:
            raise TransportConfigError("LiveKit api_key and api_secret must both be set")
        self._receiver = api.WebhookReceiver(api.TokenVerifier(api_key, api_secret))
        self._max_body_bytes = max_body_bytes

    def verify(self, body: bytes | str, authorization: str | None) -> api.WebhookEvent:
        """The verified event; raises `WebhookError` when the signature, the body hash or the body is wrong."""
        if not authorization:
            raise WebhookError("the webhook has no Authorization header")
        token = authorization.strip()
        if token[:7].lower() == "bearer ":
            token = token[7:].strip()
        raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        if len(raw) > self._max_body_bytes:
            raise WebhookError(f"the webhook body is over {self._max_body_bytes} bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise WebhookError("the webhook body is not UTF-8") from exc
        try:
            return self._receiver.receive(text, token)
        except Exception as exc:  # jwt errors, "hash mismatch", protobuf ParseError: all mean "do not trust it"
            raise WebhookError(f"the webhook failed verification: {type(exc).__name__}: {exc}") from exc

    def receive(self, body: bytes | str, authorization: str | None) -> RoomEvent | None:
        """Verify, then map to a room event; None for verified events no session acts on."""
        event = self.verify(body, authorization)
        room = event.room.name
        match event.event:
            case "participant_joined" if event.participant.identity.startswith(_PARTICIPANT_PREFIXES):
                return ParticipantJoined(room=room, identity=event.participant.identity)
            case "participant_left" if event.participant.identity.startswith(_PARTICIPANT_PREFIXES):
                return ParticipantLeft(room=room, identity=event.participant.identity)
            case "room_finished" if room:
                return RoomFinished(room=room)
        return None
