"""The REST API's request and response bodies (pydantic: the HTTP edge only) and their conversion from records.

Unknown request fields are rejected (`extra="forbid"`), so a typo is a 422 instead of a silently ignored option.
The session body is built from a `SessionSnapshot`; nothing else in the service uses these classes.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, WithJsonSchema
from typing_extensions import TypeAliasType

from admission import KeyQuota
from service.api_keys import key_id
from service.http.contract import JOIN_DETAILS_SCHEMA
from service.runtime.recording_catalog import RecordingEntry, cursor_of
from service.runtime.recordings import RecordingReport
from service.runtime.records import DrainStatus
from service.runtime.sessions import SessionSnapshot
from service.settings import MAX_SESSION_SECONDS_BOUND
from service.usage.ledger import UsageReport

__all__ = [
    "CreateSessionRequest",
    "DrainBody",
    "ErrorBody",
    "ErrorDetail",
    "HealthBody",
    "LiveKitRoomRequest",
    "RecordingItem",
    "RecordingList",
    "SessionBody",
    "SessionList",
    "UsageBody",
    "VideoBody",
    "WebhookAck",
    "WebrtcAnswer",
    "WebrtcOffer",
    "drain_body",
    "recording_list",
    "session_body",
    "usage_body",
]

StateName = Literal[
    "queued", "admitted", "running", "paused", "recovering", "draining", "closed", "expired", "failed", "cancelled"
]


class LiveKitRoomRequest(BaseModel):
    """`livekit` of a create: publish the session into the caller's LiveKit room (docs/livekit.md). Either `room`
    (a room of the service's own LiveKit project, joined with a token the service mints) or `url` and `token` (any
    LiveKit project: the service joins with the token the caller minted for it)."""

    model_config = ConfigDict(extra="forbid")

    room: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="An existing LiveKit room of the service's project; the service joins it, never deletes it. With "
        "`token`: optional, and must be the token's room.",
    )
    url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2048,
        description="The LiveKit server the caller's token is for (ws(s):// or http(s)://); it must be one "
        "LINGSTREAM_LIVEKIT_CALLER_URLS allows (422 livekit_token_invalid otherwise).",
    )
    token: str | None = Field(
        default=None,
        min_length=1,
        max_length=8192,
        description="A join token the caller minted for the service participant: one room, an identity, kind agent, "
        "canPublish (camera), canPublishData and canUpdateOwnMetadata; valid while the session may need to rejoin. "
        "Checked before the session takes a place (422 livekit_token_invalid); one the server refuses fails the "
        "session with livekit_token_refused. Never logged.",
    )
    controller_identity: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The participant whose control the session takes (the caller tokens it); null: the service "
        "mints a controller identity and token for the room (not with `token`, where it is required).",
    )
    agent_identity: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The agent the video is published for: the service participant's `lk.publish_on_behalf` "
        "attribute, so `useVoiceAssistant().videoTrack` shows it.",
    )


class CreateSessionRequest(BaseModel):
    """POST /v1/sessions. Every field is optional: `{}` creates a session with the model's defaults."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] = Field(
        default_factory=dict,
        description="Session configuration for the model worker (e.g. fps, seed); validated by the worker.",
    )
    image: str | None = Field(
        default=None, description="Reference image, base64 (PNG, JPEG or WebP); null for the model's default scene."
    )
    livekit: LiveKitRoomRequest | None = Field(
        default=None,
        description="LiveKit only: publish into the caller's existing room instead of a new one (by name, or "
        "with the caller's token).",
    )
    record: StrictBool = Field(
        default=False,
        description="Record the session (an MP4 and its control trace, served by GET .../recording once it ended); "
        "needs LINGSTREAM_RECORDINGS_DIR (else 422 recording_not_configured).",
    )
    prompt: StrictStr | None = Field(
        default=None,
        description="The text prompt the session starts from (at most 512 UTF-8 bytes; 422 prompt_too_large "
        "beyond); the `prompt` control message replaces it. Passed to the model worker as its config's `prompt`.",
    )
    max_seconds: StrictFloat | StrictInt | None = Field(
        default=None,
        gt=0,
        le=MAX_SESSION_SECONDS_BOUND,
        description="Longest the session may run, in seconds from its start (at most the server's "
        "LINGSTREAM_MAX_SESSION_SECONDS: 422 max_seconds_over_limit beyond); it gets a `warning` status 30 s "
        "before, then ends with reason time_limit. Default: the server's limit (none when unset).",
    )
    webhook_url: StrictStr | None = Field(
        default=None,
        max_length=2048,
        description="An endpoint of this session's own for its webhook events, besides the key's or the "
        "deployment's (docs/webhooks.md): it must start with one of LINGSTREAM_WEBHOOK_ALLOWED_PREFIXES and may "
        "not resolve to an internal address (else 422 webhook_url_not_allowed).",
    )


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable machine-readable code (see docs/api.md).")
    message: str = Field(description="A sentence for humans.")


class ErrorBody(BaseModel):
    """The one error shape of every non-2xx answer."""

    error: ErrorDetail


class VideoBody(BaseModel):
    width: int
    height: int
    fps: float


RecordingStateName = Literal["recording", "finishing", "uploading", "ready", "failed", "removed"]


class RecordingBody(BaseModel):
    """A session's recording as of the answer."""

    state: RecordingStateName = Field(
        description="recording (the session runs), finishing (it ended; the files are being finalised), uploading "
        "(to the object store, when one is configured), ready (GET .../recording serves it), failed (stopped: see "
        "code; nothing kept), removed (by retention)."
    )
    code: str | None = Field(
        description="What stopped a failed recording: recording_failed (a write error, or the object store refused "
        "the upload) or recording_overrun (it fell behind the stream); null otherwise."
    )
    frames: int = Field(description="Frames written so far.")
    bytes: int = Field(
        description="Bytes on disk: the MP4 so far while recording, the MP4 and its control trace once ready "
        "(a failed recording's were written, then removed)."
    )


class RecordingItem(BaseModel):
    """One of the caller's recordings (`GET /v1/recordings`)."""

    session_id: str
    state: RecordingStateName = Field(description="As a session's recording state (removed ones are not listed).")
    code: str | None = Field(description="What stopped a failed recording (recording_failed, recording_overrun).")
    frames: int = Field(description="Frames recorded.")
    bytes: int = Field(description="Bytes of the MP4 and its control trace (once ready).")
    started_at: datetime.datetime = Field(description="When recording started.")
    updated_at: datetime.datetime = Field(description="Its last change.")
    video_url: str = Field(description="Where the MP4 is served: GET it (a 302 to the object store when one is set).")
    controls_url: str = Field(description="Where its control trace is served.")


class RecordingList(BaseModel):
    """A page of the caller's recordings, oldest first."""

    recordings: list[RecordingItem]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null on the last page (a page shorter than `limit`)."
    )


ConfigValue = TypeAliasType(
    "ConfigValue",
    "bool | int | float | str | list[ConfigValue] | dict[str, ConfigValue] | None",
)
"""A field of a resolved session configuration: JSON data as `service.runtime.config_view` makes it (scalars, lists
and mappings of them; today's models are flat, `LingBotSessionConfig`)."""


class SessionBody(BaseModel):
    """A session as of the moment of the answer."""

    id: str
    status: StateName
    reason: str | None = Field(description="Why it is in this state, e.g. queue_timeout, client_deleted.")
    queue_position: int | None = Field(description="1 = next in line; null unless queued.")
    created_at: datetime.datetime
    updated_at: datetime.datetime
    transport: Annotated[dict[str, Any] | None, WithJsonSchema({"anyOf": [JOIN_DETAILS_SCHEMA, {"type": "null"}]})] = (
        Field(
            description="Join details once attached (`LiveKitJoin` or `EmbeddedJoin`, on `kind`); null without a "
            "transport."
        )
    )
    config: dict[str, ConfigValue] = Field(
        description="The resolved session configuration: the model worker's fields (fps, seed, prompt, ...), as JSON "
        "data."
    )
    video: VideoBody
    error: ErrorDetail | None = Field(description="Set when status is failed.")
    max_seconds: float | None = Field(default=None, description="The session's time limit in seconds; null: none.")
    ends_at: datetime.datetime | None = Field(
        default=None, description="When the time limit ends the session (set once it runs with a limit)."
    )
    record: bool = Field(default=False, description='Created with "record": true: the session is recorded.')
    recording: RecordingBody | None = Field(
        default=None, description="Its recording once the session started (null without one, or on another replica)."
    )


class SessionList(BaseModel):
    sessions: list[SessionBody]


class QuotaBody(BaseModel):
    max_running: int | None = Field(description="Sessions the key may run or wait to run at once (null: no bound).")
    max_queued: int | None = Field(description="Of those, how many may wait in the queue (null: no bound).")


class UsageBody(BaseModel):
    """GET /v1/usage: the caller's key's usage from `since` (the start of the hour bucket that holds the asked
    time) to `until` (now); with the redis backend, over every replica."""

    key: str = Field(description="The key id (never the key): what /metrics labels and KEY_QUOTAS names.")
    since: datetime.datetime = Field(description="Counted from here (an hour bucket's start, UTC).")
    until: datetime.datetime = Field(description="Counted up to here (when it was read, UTC).")
    running_seconds: float = Field(description="Session-seconds holding a slot (admitted until released).")
    queued_seconds: float = Field(description="Session-seconds waiting in the queue (counted when the wait ends).")
    sessions: int = Field(description="Creates accepted (admitted or queued); refusals are not counted.")
    chunks: int = Field(description="Chunks generated.")
    frames: int = Field(description="Frames generated.")
    quota: QuotaBody


def usage_body(report: UsageReport, quota: KeyQuota) -> UsageBody:
    totals = report.totals
    return UsageBody(
        key=key_id(report.owner),
        since=_time(report.since),
        until=_time(report.until),
        running_seconds=round(totals.running_s, 3),
        queued_seconds=round(totals.queued_s, 3),
        sessions=totals.sessions,
        chunks=totals.chunks,
        frames=totals.frames,
        quota=QuotaBody(max_running=quota.max_running, max_queued=quota.max_queued),
    )


class WebrtcOffer(BaseModel):
    """POST /v1/sessions/{id}/webrtc: the browser's SDP offer, candidates included (no trickle)."""

    model_config = ConfigDict(extra="forbid")

    sdp: str = Field(description="The offer SDP: a recvonly video transceiver and a data channel labelled `control`.")
    type: Literal["offer"] = Field(description="Always `offer`.")


class WebrtcAnswer(BaseModel):
    """The service's SDP answer, candidates included."""

    sdp: str
    type: Literal["answer"]


class WebhookAck(BaseModel):
    """A LiveKit webhook was verified and applied."""

    received: Literal[True] = True


class ModelMemoryParts(BaseModel):
    """The estimate's parts in bytes, measured from the modules' shapes on the meta device (docs/lingbot-fast.md)."""

    attention_cache_bytes: int = Field(description="Per session: the DiT's K/V window and the prompt's K/V.")
    decoder_cache_bytes: int = Field(description="Per session: the VAE decoder's feature cache.")
    camera_modulation_bytes: int = Field(description="Once: one chunk's camera modulation.")
    dit_transient_bytes: int = Field(description="Once: the peak of a steady-state DiT forward.")
    decode_transient_bytes: int = Field(description="Once: the peak of a VAE decoder step.")
    encode_transient_bytes: int = Field(description="Once: the peak of the reference prefix encode.")
    context_bytes: int = Field(description="Once: the CUDA context and workspaces (a stated estimate; 0 on CPU).")


class ModelMemoryBody(BaseModel):
    """LINGSTREAM_MODEL=lingbot-fast's memory estimate on the first worker's device (docs/lingbot-fast.md)."""

    device: str
    dtype: str
    model_bytes: int = Field(description="Weights: DiT, VAE and text encoder, in the run dtype.")
    session_bytes: int = Field(description="One session's attention cache at the planning resolution.")
    device_bytes: int
    usable_bytes: int = Field(description="The share of the device the estimate plans with (90%).")
    fits_sessions: int = Field(description="Sessions that fit beside the weights and what the worker needs once.")
    resolution: str = Field(description="The planning resolution, WIDTHxHEIGHT.")
    denoise_ranks: int = Field(default=1, description="P: the figures are one DiT rank's.")
    once_bytes: int = Field(
        default=0, description="What the worker needs once: camera modulation, transients, CUDA context."
    )
    parts: ModelMemoryParts | None = None


class ModelWarmUpBody(BaseModel):
    """The warm-up chunks a lingbot-fast worker ran before it reported ready (LINGSTREAM_WARMUP_CHUNKS)."""

    chunks: int
    seconds: float | None = Field(description="How long they took (null while a processes worker is not ready).")
    resolution: str | None = Field(description="The throwaway session's WIDTHxHEIGHT.")


class ModelAttentionBody(BaseModel):
    """The attention kernel the DiT runs (LINGSTREAM_ATTENTION)."""

    backend: str = Field(description="sdpa (PyTorch's own choice), cudnn, flash, efficient, math, fa3 or sage.")
    kernel: Literal["sdpa", "fa3", "sage"]
    sdpa_order: list[str] = Field(description="SDPA's backends in priority order (empty: PyTorch's default).")


class ModelStartBody(BaseModel):
    """How the first lingbot-fast worker started: compile mode, attention, decoder and warm-up."""

    compile: Literal["off", "default", "max"]
    decoder: Literal["wan", "tiny"] = Field(
        default="wan", description="The decode stage's decoder (LINGSTREAM_DECODER): the Wan VAE or the tiny one."
    )
    attention: ModelAttentionBody
    warmup: ModelWarmUpBody


class HealthBody(BaseModel):
    status: Literal["ok", "ready"]
    model_memory: ModelMemoryBody | None = Field(
        default=None, description="/readyz with LINGSTREAM_MODEL=lingbot-fast: the memory estimate it started with."
    )
    model_start: ModelStartBody | None = Field(
        default=None, description="/readyz with LINGSTREAM_MODEL=lingbot-fast: its attention and warm-up."
    )


class DrainBody(BaseModel):
    draining: bool
    complete: bool = Field(description="Every session has ended.")
    running: int = Field(description="Admitted sessions still open.")
    queued: int
    deadline_in_s: float | None


def _time(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)


def _config(config: Mapping[str, object]) -> dict[str, ConfigValue]:
    """The resolved configuration as the document types it (`config_view` made it JSON data already)."""
    return {str(name): _config_value(value) for name, value in config.items()}


def _config_value(value: object) -> ConfigValue:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_config_value(item) for item in value]
    if isinstance(value, Mapping):
        return _config(value)
    raise TypeError(f"a session config value of type {type(value).__name__} is not JSON data (see config_view)")


def session_body(snapshot: SessionSnapshot) -> SessionBody:
    error = None if snapshot.error is None else ErrorDetail(code=snapshot.error[0], message=snapshot.error[1])
    status: StateName = snapshot.state.value
    return SessionBody(
        id=snapshot.id,
        status=status,
        reason=snapshot.reason,
        queue_position=snapshot.queue_position,
        created_at=_time(snapshot.created_at),
        updated_at=_time(snapshot.updated_at),
        transport=None if snapshot.transport is None else dict(snapshot.transport),
        config=_config(snapshot.config),
        video=VideoBody(width=snapshot.width, height=snapshot.height, fps=snapshot.fps),
        error=error,
        max_seconds=snapshot.max_seconds,
        ends_at=None if snapshot.ends_at is None else _time(snapshot.ends_at),
        record=snapshot.record,
        recording=None if snapshot.recording is None else _recording_body(snapshot.recording),
    )


def _recording_body(report: RecordingReport) -> RecordingBody:
    state: RecordingStateName = report.state.value
    return RecordingBody(state=state, code=report.code, frames=report.frames, bytes=report.bytes)


def recording_list(entries: list[RecordingEntry], limit: int) -> RecordingList:
    items = []
    for entry in entries:
        state: RecordingStateName = entry.state.value
        items.append(
            RecordingItem(
                session_id=entry.session_id,
                state=state,
                code=entry.code,
                frames=entry.frames,
                bytes=entry.bytes,
                started_at=_time(entry.started_at),
                updated_at=_time(entry.updated_at),
                video_url=f"/v1/sessions/{entry.session_id}/recording",
                controls_url=f"/v1/sessions/{entry.session_id}/recording/controls",
            )
        )
    cursor = cursor_of(entries[-1]) if entries and len(entries) >= limit else None
    return RecordingList(recordings=items, next_cursor=cursor)


def drain_body(status: DrainStatus) -> DrainBody:
    return DrainBody(
        draining=status.draining,
        complete=status.complete,
        running=status.running,
        queued=status.queued,
        deadline_in_s=status.deadline_in_s,
    )
