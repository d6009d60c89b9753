"""The bodies of the token routes (issue #35): minting a client token, a create's session token, share links."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt

from service.http.schemas import SessionBody
from service.settings import MAX_SESSION_SECONDS_BOUND
from service.tokens import CLIENT_TTL_DEFAULT_S, CLIENT_TTL_MAX_S, MAX_CREATES_BOUND

__all__ = ["AddViewerRequest", "ClientTokenBody", "ClientTokenRequest", "CreatedSessionBody", "ShareRevokedBody"]

_MAX_ORIGINS = 16


class ClientTokenRequest(BaseModel):
    """POST /v1/client_tokens (API key only). Every field is optional: `{}` is a token for one create, 5 minutes."""

    model_config = ConfigDict(extra="forbid")

    ttl_seconds: StrictInt = Field(
        default=CLIENT_TTL_DEFAULT_S, ge=1, le=CLIENT_TTL_MAX_S, description="How long the token may create (s)."
    )
    max_creates: StrictInt = Field(
        default=1, ge=1, le=MAX_CREATES_BOUND, description="Sessions it may create, counted on every replica."
    )
    max_seconds: StrictFloat | StrictInt | None = Field(
        default=None,
        gt=0,
        le=MAX_SESSION_SECONDS_BOUND,
        description="The longest time limit its creates may ask for; a create that asks for none gets it. "
        "Null: the server's limit.",
    )
    record: StrictBool = Field(default=False, description='Its creates may ask for "record": true.')
    origins: list[str] = Field(
        default_factory=list,
        max_length=_MAX_ORIGINS,
        description="Browser origins (scheme://host[:port]) allowed to use it and its session tokens, checked "
        "against the Origin header; empty: any.",
    )


class ClientTokenBody(BaseModel):
    """A client token: hand `token` to the browser; it creates with `Authorization: Bearer <token>`."""

    token: str
    token_id: str = Field(description="Its id (creates are counted by it); not a secret.")
    expires_at: float = Field(description="When it stops creating (Unix seconds).")
    max_creates: int
    max_seconds: float | None
    record: bool
    origins: list[str]


class CreatedSessionBody(SessionBody):
    """A create's answer: the session, and with a client token, the session token for it."""

    session_token: str | None = Field(
        default=None,
        description="Made with a client token: the token for this one session (GET, events, pause/resume, DELETE, "
        "the offer, viewers and share links, its recording), good for its lifetime plus the reconnect grace; "
        "null with an API key.",
    )
    session_token_expires_at: float | None = Field(
        default=None, description="The latest the session token can work (Unix seconds); the session's end ends it."
    )


class AddViewerRequest(BaseModel):
    """POST /v1/sessions/{id}/viewers (optional body): `share: true` answers a share link instead of one viewer."""

    model_config = ConfigDict(extra="forbid")

    share: StrictBool = Field(
        default=False,
        description="A share link (`ShareLink`): a watch URL whose watch-only token mints a viewer's credential on "
        "each use, within MAX_VIEWERS, until the session ends or DELETE .../viewers/{share_id} revokes it.",
    )


class ShareRevokedBody(BaseModel):
    share_id: str
    revoked: bool = True
