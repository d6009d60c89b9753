"""The wire shape of control protocol v1, both ways, as one table: each message's fields with their JSON Schema.

It is the one source of what a message may carry. The codec (`transport.protocol`) reads from it which fields each
client message has and which a status message may carry, and the OpenAPI document (`service.http.contract`) puts
`json_schema()` of every message in its components, so generated clients (the TypeScript types in
`web/openapi/`) type them. A field added to a message is added here; the codec's tests and the document follow.

Every message carries `"v": 1` and its `"type"`; `WireMessage.fields` lists the rest. `required` says what the
service always sends (a status) or what a client must send (a control message); `decode_status` is kinder to an
older service than the schema (a chunk without `prompt`/`prompt_seq` still decodes: see `transport.protocol`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CONTROL_MESSAGES",
    "PROTOCOL_VERSION",
    "STATUS_MESSAGES",
    "WireField",
    "WireMessage",
]

PROTOCOL_VERSION = 1

_INT: Mapping[str, object] = {"type": "integer"}
_NUMBER: Mapping[str, object] = {"type": "number"}
_STRING: Mapping[str, object] = {"type": "string"}
_SEQ: Mapping[str, object] = {"type": "integer", "minimum": 0, "maximum": 2**53 - 1}


def _nullable(schema: Mapping[str, object]) -> Mapping[str, object]:
    return {"anyOf": [dict(schema), {"type": "null"}]}


@dataclass(frozen=True, slots=True)
class WireField:
    """One field of a message: its JSON Schema, whether it is always there, and a sentence for the document."""

    schema: Mapping[str, object]
    description: str = ""
    required: bool = True


@dataclass(frozen=True, slots=True)
class WireMessage:
    """One message of the protocol: its `type`, the component name the OpenAPI document gives it, its fields."""

    type: str
    name: str
    description: str
    fields: Mapping[str, WireField] = field(default_factory=dict)

    @property
    def names(self) -> frozenset[str]:
        """Every field it may carry, `v` and `type` included."""
        return frozenset({"v", "type", *self.fields})

    @property
    def required(self) -> frozenset[str]:
        """The fields it always carries, `v` and `type` included."""
        return frozenset({"v", "type", *(name for name, spec in self.fields.items() if spec.required)})

    def json_schema(self) -> dict[str, Any]:
        """Its JSON Schema (an exact object: no field beyond `names`)."""
        properties: dict[str, Any] = {
            "v": {"type": "integer", "const": PROTOCOL_VERSION, "description": "The protocol version."},
            "type": {"type": "string", "const": self.type},
        }
        for name, spec in self.fields.items():
            properties[name] = (
                {**spec.schema, "description": spec.description} if spec.description else dict(spec.schema)
            )
        return {
            "title": self.name,
            "description": self.description,
            "type": "object",
            "properties": properties,
            "required": [name for name in properties if name in self.required],
            "additionalProperties": False,
        }


_KEY_NAMES = "held keys: w a s d i j k l (ArrowUp/Down/Left/Right and upper case as aliases), at most 16"

CONTROL_MESSAGES: tuple[WireMessage, ...] = (
    WireMessage(
        "control_state",
        "ControlStateMessage",
        "`control_state`: the keys held now (a snapshot; newest `seq` wins).",
        {
            "seq": WireField(_SEQ, "Increasing with every snapshot, per session (not per connection)."),
            "keys": WireField({"type": "array", "items": _STRING, "maxItems": 16}, f"The {_KEY_NAMES}."),
        },
    ),
    WireMessage(
        "prompt",
        "PromptMessage",
        "`prompt`: the text prompt from the next chunk on (newest `seq` wins, counted apart from snapshots).",
        {
            "seq": WireField(_SEQ, "Increasing with every prompt, per session."),
            "text": WireField(_STRING, "At most 512 UTF-8 bytes; empty clears it."),
        },
    ),
    WireMessage("reset_pose", "ResetPoseMessage", "`reset_pose`: the camera back at its start pose."),
    WireMessage("pause", "PauseMessage", "`pause`: stop generating after the chunk in progress; keep the slot."),
    WireMessage("resume", "ResumeMessage", "`resume`: go on after `pause`."),
    WireMessage("stop", "StopMessage", "`stop`: end the session after the chunk in progress (then `done`)."),
)
"""Client → service, in the order docs/control-protocol.md gives them."""

STATUS_MESSAGES: tuple[WireMessage, ...] = (
    WireMessage(
        "state",
        "StateMessage",
        "`state`: the session's state changed (and once on joining).",
        {
            "state": WireField(_STRING, "The session's state (running, paused, recovering, draining, ...)."),
            "detail": WireField(_nullable(_STRING), "A note for humans, or null."),
        },
    ),
    WireMessage(
        "chunk",
        "ChunkMessage",
        "`chunk`: a chunk was generated; sent with its first frame.",
        {
            "index": WireField(_INT, "The chunk's index in the session."),
            "applied_seq": WireField(_INT, "The `control_state` snapshot the chunk was generated from."),
            "keys": WireField({"type": "array", "items": _STRING}, "The keys it was generated with."),
            "prompt": WireField(_STRING, "The prompt it was generated from."),
            "prompt_seq": WireField(_INT, "The `prompt` message that set the prompt (-1: the create's)."),
            "timings": WireField(
                {"type": "object", "additionalProperties": _NUMBER}, "Stage timings (seconds or counts, by name)."
            ),
            "first_frame_pts": WireField(_INT, "The chunk's first frame's 90 kHz timestamp.", required=False),
            "stream_base_pts": WireField(_INT, "Embedded: the connection's RTP timestamp offset.", required=False),
            "first_frame_id": WireField(
                _INT, "The chunk's first frame's index in the session's video (LiveKit frame_id).", required=False
            ),
            "truncated": WireField(
                {"type": "boolean", "const": True}, "Present when `timings` was trimmed to fit.", required=False
            ),
        },
    ),
    WireMessage(
        "warning",
        "WarningMessage",
        "`warning`: a deadline will end the session (`time_limit`, `paused_too_long`).",
        {
            "code": WireField(_STRING, "What will end it."),
            "message": WireField(_STRING),
            "ends_in_s": WireField(_NUMBER, "Seconds until it ends."),
        },
    ),
    WireMessage(
        "error",
        "ErrorMessage",
        "`error`: something the client sent was rejected, or the session's own failure (a stable code).",
        {"code": WireField(_STRING, "A stable code (docs/control-protocol.md)."), "message": WireField(_STRING)},
    ),
    WireMessage(
        "done",
        "DoneMessage",
        "`done`: the session ended; the last message.",
        {"reason": WireField(_STRING, "Why it ended: the session's reason (e.g. time_limit, model_failure).")},
    ),
)
"""Service → client."""
