"""The typed contract of the OpenAPI document beyond the request and response bodies: the join details a session
carries (`LiveKitJoin | EmbeddedJoin`, a union on `kind`), what the viewers route answers (`LiveKitViewer |
EmbeddedViewer | ShareLink`), and every status message of control protocol v1 (docs/control-protocol.md), so a
generated client types them.

The models describe what the transports and `transport.protocol` already send; they do not make or check it. The
bodies keep carrying the transports' mappings as they are (a model validated on the way out would turn a field a
transport adds into a 500 before the schema learns it), and `tests/unit/service/http/test_contract.py` holds the
two together: what each real transport returns and what the encoder writes must validate against these models.
`add_components` puts them in the document's `components.schemas`; the session body and the viewers route point at
them with `$ref`s (`JOIN_DETAILS_SCHEMA`, `VIEWER_DETAILS_SCHEMA`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

__all__ = [
    "CONTRACT_MODELS",
    "JOIN_DETAILS_SCHEMA",
    "VIEWER_DETAILS_SCHEMA",
    "ChunkMessage",
    "DoneMessage",
    "EmbeddedJoin",
    "EmbeddedViewer",
    "ErrorMessage",
    "LiveKitJoin",
    "LiveKitViewer",
    "ShareLink",
    "StateMessage",
    "WarningMessage",
    "add_components",
]

_REF = "#/components/schemas/{model}"


class _Exact(BaseModel):
    model_config = ConfigDict(extra="forbid")


class LiveKitJoin(_Exact):
    """The controller's join details on the LiveKit transport (docs/livekit.md)."""

    kind: Literal["livekit"]
    url: str = Field(description="The LiveKit server URL clients join (LINGSTREAM_LIVEKIT_CLIENT_URL or LIVEKIT_URL).")
    room: str
    token: str | None = Field(description="A join token for `identity`; null when the caller tokens its controller.")
    identity: str = Field(description="The controller identity: the only participant whose control is taken.")
    expires_at: float | None = Field(description="When `token` stops admitting a join (Unix seconds).")
    service_identity: str = Field(description="The service's participant: it publishes the video and the statuses.")
    control_topic: str
    status_topic: str
    room_owner: Literal["service", "caller"]


class EmbeddedJoin(_Exact):
    """The controller's join details on the embedded WebRTC transport (docs/webrtc.md)."""

    kind: Literal["embedded"]
    offer_url: str = Field(description="POST the SDP offer here (`answer_webrtc_offer`); every offer rebinds.")
    data_channel: str = Field(description="The label of the control data channel to create.")


class LiveKitViewer(_Exact):
    """A viewer's details on LiveKit: a subscribe-only token."""

    kind: Literal["livekit"]
    url: str
    room: str
    token: str
    identity: str
    expires_at: float
    service_identity: str
    status_topic: str


class EmbeddedViewer(_Exact):
    """A viewer's details on the embedded transport: its credential and where to offer (`answer_watch_offer`)."""

    kind: Literal["embedded"]
    role: Literal["viewer"]
    offer_url: str
    data_channel: str
    viewer_token: str = Field(description="Send it as `Authorization: Bearer <viewer_token>` with the offer.")
    expires_at: float = Field(description="Unused by then, the credential lapses and the place frees (Unix seconds).")


class ShareLink(_Exact):
    """A share link (`"share": true`): a watch page URL carrying a watch-only token (docs/integrate.md)."""

    kind: Literal["share"]
    share_id: str = Field(description="DELETE /v1/sessions/{id}/viewers/{share_id} revokes it, on every replica.")
    watch_url: str = Field(description="The page watching the session, relative to the service's URL.")
    watch_token: str = Field(
        description="Watch-only: GET the session, its events, and POST .../viewers for one viewer's credential."
    )
    expires_at: float = Field(description="The latest it works (Unix seconds); the session's end ends it sooner.")


class StateMessage(_Exact):
    """`state`: the session's state changed (and once on joining)."""

    v: Literal[1]
    type: Literal["state"]
    state: str
    detail: str | None


class ChunkMessage(_Exact):
    """`chunk`: a chunk was generated; sent with its first frame."""

    v: Literal[1]
    type: Literal["chunk"]
    index: int
    applied_seq: int = Field(description="The `control_state` snapshot the chunk was generated from.")
    keys: list[str]
    prompt: str
    prompt_seq: int = Field(description="The `prompt` message that set the prompt (-1: the create's).")
    timings: dict[str, float]
    first_frame_pts: int | None = Field(default=None, description="The chunk's first frame's 90 kHz timestamp.")
    stream_base_pts: int | None = Field(default=None, description="Embedded: the connection's RTP timestamp offset.")
    first_frame_id: int | None = Field(
        default=None, description="The chunk's first frame's index in the session's video (LiveKit frame_id)."
    )
    truncated: bool | None = Field(default=None, description="True when `timings` was trimmed to fit.")


class WarningMessage(_Exact):
    """`warning`: a deadline will end the session (`time_limit`, `paused_too_long`)."""

    v: Literal[1]
    type: Literal["warning"]
    code: str
    message: str
    ends_in_s: float


class ErrorMessage(_Exact):
    """`error`: something the client sent was rejected, or the session's own failure (a stable code)."""

    v: Literal[1]
    type: Literal["error"]
    code: str
    message: str


class DoneMessage(_Exact):
    """`done`: the session ended; the last message."""

    v: Literal[1]
    type: Literal["done"]
    reason: str


CONTRACT_MODELS: tuple[type[BaseModel], ...] = (
    LiveKitJoin,
    EmbeddedJoin,
    LiveKitViewer,
    EmbeddedViewer,
    ShareLink,
    StateMessage,
    ChunkMessage,
    WarningMessage,
    ErrorMessage,
    DoneMessage,
)


def _union(**models: type[BaseModel]) -> dict[str, Any]:
    refs = {kind: _REF.format(model=model.__name__) for kind, model in models.items()}
    return {
        "oneOf": [{"$ref": ref} for ref in refs.values()],
        "discriminator": {"propertyName": "kind", "mapping": refs},
    }


JOIN_DETAILS_SCHEMA = _union(livekit=LiveKitJoin, embedded=EmbeddedJoin)
VIEWER_DETAILS_SCHEMA = _union(livekit=LiveKitViewer, embedded=EmbeddedViewer, share=ShareLink)


def add_components(document: dict[str, Any]) -> dict[str, Any]:
    """`document` (an OpenAPI dict) with the contract's models in `components.schemas`, plus `ControlStatus`: the
    union of the status messages on `type`."""
    _, top = models_json_schema([(model, "serialization") for model in CONTRACT_MODELS], ref_template=_REF)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(top.get("$defs", {}))
    statuses = {
        "state": StateMessage,
        "chunk": ChunkMessage,
        "warning": WarningMessage,
        "error": ErrorMessage,
        "done": DoneMessage,
    }
    mapping = {kind: _REF.format(model=model.__name__) for kind, model in statuses.items()}
    schemas["ControlStatus"] = {
        "title": "ControlStatus",
        "description": "A status message of control protocol v1 (docs/control-protocol.md), on `type`.",
        "oneOf": [{"$ref": ref} for ref in mapping.values()],
        "discriminator": {"propertyName": "type", "mapping": mapping},
    }
    return document
