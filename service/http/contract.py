"""The typed contract of the OpenAPI document beyond the request and response bodies: the join details a session
carries (`LiveKitJoin | EmbeddedJoin`, a union on `kind`), what the viewers route answers (`LiveKitViewer |
EmbeddedViewer | ShareLink`), and every message of control protocol v1 both ways (docs/control-protocol.md), so a
generated client types them.

The models describe what the transports and `transport.protocol` already send; they do not make or check it. The
bodies keep carrying the transports' mappings as they are (a model validated on the way out would turn a field a
transport adds into a 500 before the schema learns it), and `tests/unit/service/http/test_transport_routes.py` holds
the two together: what each real transport returns must validate against these models. The control protocol's messages
are not modelled here: their one source is the codec's table, `transport.protocol_schema`, whose schemas are copied
into the document as they are (the codec's test validates everything the encoder writes against them).
`add_components` puts them in the document's `components.schemas`; the session body and the viewers route point at
them with `$ref`s (`JOIN_DETAILS_SCHEMA`, `VIEWER_DETAILS_SCHEMA`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import models_json_schema

from transport.protocol_schema import CONTROL_MESSAGES, STATUS_MESSAGES

__all__ = [
    "CONTRACT_MODELS",
    "JOIN_DETAILS_SCHEMA",
    "VIEWER_DETAILS_SCHEMA",
    "EmbeddedJoin",
    "EmbeddedViewer",
    "LiveKitJoin",
    "LiveKitViewer",
    "ShareLink",
    "add_components",
    "request_body",
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


CONTRACT_MODELS: tuple[type[BaseModel], ...] = (
    LiveKitJoin,
    EmbeddedJoin,
    LiveKitViewer,
    EmbeddedViewer,
    ShareLink,
)


def _union(**models: type[BaseModel]) -> dict[str, Any]:
    refs = {kind: _REF.format(model=model.__name__) for kind, model in models.items()}
    return {
        "oneOf": [{"$ref": ref} for ref in refs.values()],
        "discriminator": {"propertyName": "kind", "mapping": refs},
    }


JOIN_DETAILS_SCHEMA = _union(livekit=LiveKitJoin, embedded=EmbeddedJoin)
VIEWER_DETAILS_SCHEMA = _union(livekit=LiveKitViewer, embedded=EmbeddedViewer, share=ShareLink)


_REQUEST_MODELS: dict[str, type[BaseModel]] = {}


def request_body(model: type[BaseModel], *, required: bool) -> dict[str, Any]:
    """A route's `openapi_extra` for a JSON body the handler reads itself (so FastAPI does not see it): a `$ref` to
    `model` in the components, which `add_components` fills, nested models included. A schema inlined with
    `model_json_schema()` would carry `#/$defs/...` references, which no generator resolves inside the document."""
    _REQUEST_MODELS[model.__name__] = model
    schema = {"$ref": _REF.format(model=model.__name__)}
    return {"requestBody": {"required": required, "content": {"application/json": {"schema": schema}}}}


def add_components(document: dict[str, Any]) -> dict[str, Any]:
    """`document` (an OpenAPI dict) with the contract's models and the request bodies of `request_body` in
    `components.schemas`, every message of the control
    protocol from its one table (`transport.protocol_schema`), and their unions on `type`: `ControlStatus` (service →
    client) and `ControlMessage` (client → service)."""
    _, top = models_json_schema([(model, "serialization") for model in CONTRACT_MODELS], ref_template=_REF)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas.update(top.get("$defs", {}))
    _, bodies = models_json_schema([(model, "validation") for model in _REQUEST_MODELS.values()], ref_template=_REF)
    schemas.update(bodies.get("$defs", {}))
    unions = {
        "ControlStatus": (STATUS_MESSAGES, "A status message of control protocol v1 (service → client), on `type`."),
        "ControlMessage": (CONTROL_MESSAGES, "A client message of control protocol v1 (client → service), on `type`."),
    }
    for union, (messages, description) in unions.items():
        mapping = {}
        for message in messages:
            schemas[message.name] = message.json_schema()
            mapping[message.type] = _REF.format(model=message.name)
        schemas[union] = {
            "title": union,
            "description": f"{description} See docs/control-protocol.md.",
            "oneOf": [{"$ref": ref} for ref in mapping.values()],
            "discriminator": {"propertyName": "type", "mapping": mapping},
        }
    return document
