"""The service's settings: environment variables (`LINGSTREAM_*`), an optional config file, and their validation.

This module is the flat environment contract: `Settings`, one field per variable, with its checks. `load_settings()`
reads the service's settings: it merges, highest priority first, explicit overrides (the CLI's `--host`/`--port`),
the environment, and the file named by `LINGSTREAM_CONFIG_FILE` (or `--config`; YAML or JSON, keys are the setting
names without the prefix, in any case; read by `service.config_file`). An invalid value raises `SettingsError` with
one paragraph naming the variable; the CLI prints it and exits 2. `service.config_records` converts the validated
settings, once, into the frozen records the rest of the service and the packages use (`ServiceConfig`,
`AdmissionConfig` and friends); nothing downstream reads `Settings` again. (A few process-level knobs are read
where they act, not here: the CLI's test hooks, telemetry's `OTEL_*`, the allocator's `MALLOC_ARENA_MAX`, and
`lingstream generate`'s model defaults.)

The three LiveKit variables keep their standard names without the prefix (`LIVEKIT_URL`, `LIVEKIT_API_KEY`,
`LIVEKIT_API_SECRET`). Secrets (`API_KEYS`, `REDIS_URL`, `LIVEKIT_API_SECRET`, `TOKEN_SECRET`,
`TOKEN_SECRET_PREVIOUS`, `WEBHOOK_SECRET`) are `SecretStr`: they never appear in a repr, a log line or an error
message.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import re
from pathlib import Path
from typing import Annotated, Literal, Self
from urllib.parse import urlsplit

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from service.api_keys import ANONYMOUS, key_id, owner_fingerprint
from service.config_file import CONFIG_FILE_VARIABLE, FileSource, file_values, read_config_file
from service.errors import SettingsError

__all__ = [
    "CONFIG_FILE_VARIABLE",
    "ENV_PREFIX",
    "MAX_SESSION_SECONDS_BOUND",
    "QuotaOverride",
    "Settings",
    "env_name",
    "load_settings",
    "owners_of",
    "webhook_url_problem",
]

logger = logging.getLogger(__name__)

ENV_PREFIX = "LINGSTREAM_"

_MIB = 1024 * 1024
_LOOPBACK = "127.0.0.1"
_ALL_INTERFACES = "0.0.0.0"
_SECRET_FIELDS = frozenset(
    {
        "api_keys",
        "redis_url",
        "livekit_api_secret",
        "token_secret",
        "token_secret_previous",
        "webhook_secret",
        "recordings_s3_secret_access_key",
    }
)
_MIN_TOKEN_SECRET_BYTES = 32
# Values an error message does not repeat: endpoints may carry credentials or tokens in their paths.
_URL_FIELDS = frozenset({"webhook_urls", "webhook_allowed_prefixes", "key_quotas"})
_LIVEKIT_ALIASES = {
    "livekit_url": "LIVEKIT_URL",
    "livekit_api_key": "LIVEKIT_API_KEY",
    "livekit_api_secret": "LIVEKIT_API_SECRET",
}
_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+$")
_REPLICA_ID = re.compile(r"[A-Za-z0-9._:\-]{1,200}")
_DEVICE = re.compile(r"cpu|cuda:\d{1,3}")


class QuotaOverride(BaseModel):
    """One key's entry in `key_quotas`: a field left out keeps the default (`KEY_MAX_RUNNING` / `KEY_MAX_QUEUED`),
    an explicit null lifts the bound for this key."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_running: int | None = Field(default=None, ge=1, le=100_000)
    max_queued: int | None = Field(default=None, ge=0, le=100_000)
    webhook_urls: tuple[str, ...] | None = Field(default=None, max_length=16)

    @field_validator("webhook_urls")
    @classmethod
    def _check_webhook_urls(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        return None if value is None else _checked_webhook_urls(value)


def webhook_url_problem(url: str) -> str | None:
    """Why `url` cannot be a webhook endpoint (None: it can): http(s), a host, no user:password part."""
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a bad port
    except ValueError:
        return "it is not a valid URL"
    if parts.scheme not in ("http", "https"):
        return "it must be an http or https URL"
    if not parts.hostname:
        return "it has no host"
    if parts.username is not None or parts.password is not None:
        return "it must not carry credentials"
    return None


def _checked_webhook_urls(urls: tuple[str, ...]) -> tuple[str, ...]:
    for url in urls:
        problem = webhook_url_problem(url)
        if problem is not None:
            raise ValueError(f"a webhook URL is refused: {problem}")
    return urls


MAX_SESSION_SECONDS_BOUND = 365 * 86_400
"""The largest time limit a session may have (`MAX_SESSION_SECONDS`, a create's `max_seconds`): a year."""


class Settings(BaseSettings):
    """Every setting of `lingstream serve`, validated. Field `x` is read from `LINGSTREAM_X` (LiveKit: unprefixed).

    Lists (`API_KEYS`, `CORS_ORIGINS`) are plain comma-separated strings, not JSON.
    """

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        case_sensitive=False,
        env_ignore_empty=True,
        extra="ignore",
        populate_by_name=True,
        validate_default=True,
    )

    host: str | None = Field(
        default=None, description="Bind address; default 127.0.0.1 without API keys, 0.0.0.0 with them."
    )
    port: int = Field(default=8080, ge=1, le=65535, description="TCP port.")
    num_workers: int = Field(default=1, ge=1, le=64, description="Model workers (one per GPU group).")
    max_sessions_per_worker: int = Field(default=1, ge=1, le=64, description="Retained sessions per model worker.")
    queue_size: int = Field(default=16, ge=0, le=100_000, description="Bounded admission FIFO; 0 rejects when full.")
    queue_timeout: float = Field(default=300.0, gt=0, le=86_400, description="Seconds a session may wait queued.")
    queue_heartbeat_timeout: float = Field(
        default=30.0, gt=0, le=86_400, description="Seconds a queued client may stay silent before losing its place."
    )
    drain_timeout: float = Field(default=60.0, gt=0, le=86_400, description="Seconds running sessions get on drain.")
    drain_mode: Literal["wait", "hand_off"] = Field(
        default="wait",
        description="On drain (SIGTERM): wait for running sessions to end, or hand them off to other replicas with "
        "room (the redis backend; sessions with nowhere to go wait as with 'wait').",
    )
    max_session_seconds: float | None = Field(
        default=None,
        gt=0,
        le=MAX_SESSION_SECONDS_BOUND,
        description="Longest a session may run (seconds, from its start; a create may ask for less with "
        "max_seconds); unset: no limit.",
    )
    max_pause: float = Field(
        default=300.0, gt=0, le=86_400, description="Seconds a session may stay paused before it is closed."
    )
    api_keys: SecretStr = Field(default=SecretStr(""), description="Comma-separated bearer keys; empty: no auth.")
    key_max_running: int | None = Field(
        default=None,
        ge=1,
        le=100_000,
        description="Quota of every API key: sessions it may run or wait to run at once (unset: no bound).",
    )
    key_max_queued: int | None = Field(
        default=None,
        ge=0,
        le=100_000,
        description="Quota of every API key: how many of its sessions may wait in the queue (unset: no bound).",
    )
    key_quotas: Annotated[dict[str, QuotaOverride], NoDecode] = Field(
        default_factory=dict,
        description="Per-key quota overrides by key id (see GET /v1/usage): "
        '{"key-1a2b3c4d5e6f": {"max_running": 4, "max_queued": 0}}; JSON in the environment.',
    )
    cors_origins: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(), description="Comma-separated browser origins allowed by CORS; empty: CORS off."
    )
    log_format: Literal["text", "json"] = "text"
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "INFO"
    torch_threads: int | None = Field(
        default=None, ge=1, le=1024, description="torch intra-op threads (per rank with the processes placement)."
    )
    device: Literal["cpu", "cuda"] = "cpu"
    stage_placement: Literal["threads", "processes"] = Field(
        default="threads",
        description="Where a model worker's stages run: threads of the service process, or worker processes "
        "(the DiT on LINGSTREAM_DENOISE_RANKS ranks, latents between groups through shared memory / CUDA IPC).",
    )
    denoise_ranks: int = Field(
        default=1, ge=1, le=64, description="Ranks of each model worker's DiT group (processes placement)."
    )
    devices: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Comma-separated devices of all model workers: cpu, or cuda:N,... split evenly across "
        "LINGSTREAM_NUM_WORKERS; empty: from LINGSTREAM_DEVICE.",
    )
    progressive_decode: bool = Field(
        default=True,
        description="Hand a chunk's frames to the transport one latent frame at a time as they are decoded, so its "
        "first frames play before the whole chunk is decoded (threads and processes placement; false: whole chunks).",
    )
    stage_call_timeout: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description="Seconds one call may run in a stage's worker processes before the group counts as stuck "
        "and is restarted (processes placement).",
    )
    worker_start_timeout: float = Field(
        default=120.0,
        gt=0,
        le=7200,
        description="Seconds a stage's worker processes have to load their weights and report ready, at start and "
        "after each restart, before the start counts as failed (processes placement). Full-size weights (~48 GB a "
        "DiT rank) from a slow disk can need more than the default.",
    )
    recovery_attempts: int = Field(
        default=3,
        ge=0,
        le=20,
        description="Re-seeds in a row a session gets when its model worker fails under it (processes placement, "
        "either model; docs/continuity.md); 0: a failed worker fails its sessions (model_failure).",
    )
    recovery_timeout: float = Field(
        default=30.0,
        gt=0,
        le=600,
        description="Seconds from a model worker's failure under a session to its first chunk after the re-seed; "
        "past it the session fails (model_failure).",
    )
    model: Literal["reference", "lingbot-fast"] = Field(
        default="reference",
        description="The world model: reference (built in, no weights) or lingbot-fast (LingBot-World-Fast from "
        "LINGSTREAM_MODEL_PATH; needs the lingbot extra).",
    )
    model_path: Path | None = Field(
        default=None,
        description="The lingbot-fast model directory: dit/, vae/, text_encoder/, tokenizer/ (docs/lingbot-fast.md).",
    )
    model_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto", description="lingbot-fast weights and compute dtype; auto: bfloat16 on CUDA, float32 on CPU."
    )
    model_window_frames: int = Field(
        default=18, ge=4, le=1024, description="lingbot-fast attention window in latent frames (sink included)."
    )
    model_sink_frames: int = Field(
        default=6, ge=0, le=1020, description="lingbot-fast latent frames at a session's start that are never evicted."
    )
    compile: Literal["off", "default", "max"] = Field(
        default="off",
        description="lingbot-fast: torch.compile of the DiT's blocks. off: eager; default: inductor (fused "
        "element-wise kernels); max: inductor's max-autotune (GEMM autotuning, CUDA graphs where it can). Compiles "
        "at a worker's first chunks (minutes on a CPU): give LINGSTREAM_WORKER_START_TIMEOUT room.",
    )
    attention: Literal["auto", "cudnn", "flash", "efficient", "math", "fa3", "sage"] = Field(
        default="auto",
        description="lingbot-fast: the DiT's attention kernel. auto: on SM90+ FA3 when installed, else PyTorch SDPA "
        "with the priority cuDNN > FlashAttention > memory-efficient > math; older GPUs: SDPA's own order; CPU: SDPA. "
        "cudnn|flash|efficient|math: that SDPA backend only; fa3|sage: FlashAttention-3 / SageAttention (installed).",
    )
    warmup_chunks: int | None = Field(
        default=None,
        ge=0,
        le=1000,
        description="lingbot-fast: chunks of a throwaway 832x480 session each DiT rank runs before it reports ready. "
        "Unset: with LINGSTREAM_COMPILE on, enough to fill the attention window and one chunk more (7 at "
        "window 18 / chunk 3), else 0. Counts against LINGSTREAM_WORKER_START_TIMEOUT.",
    )
    decoder: Literal["wan", "tiny"] = Field(
        default="wan",
        description="lingbot-fast: the decode stage's decoder. wan: the Wan VAE (quality); tiny: the TAEHV-style "
        "streaming decoder from the model directory's tiny_decoder/ (much cheaper; same frame contract).",
    )
    reconnect_grace: float = Field(default=20.0, gt=0, le=3600, description="Seconds a departed browser may return.")
    video_codec: Literal["vp8", "h264"] = "vp8"
    video_bitrate: int = Field(default=2_000_000, ge=50_000, le=100_000_000, description="Video bits per second.")
    web_vendor_dir: Path | None = Field(default=None, description="Directory of the vendored livekit-client build.")
    docs_vendor_dir: Path | None = Field(
        default=None, description="Directory of Swagger UI's files (swagger-ui-dist) for the /docs page."
    )
    admission_backend: str = Field(
        default="memory", description="Admission backend: memory (one replica) or redis (shared by every replica)."
    )
    redis_url: SecretStr | None = Field(default=None, description="Redis URL of the redis backend (secret).")
    replica_id: str | None = Field(
        default=None, description="This process's id in the redis backend; default the host name + a random suffix."
    )
    replica_ttl: float = Field(
        default=10.0, ge=0.3, le=3600, description="Seconds a silent replica keeps its slots (redis backend)."
    )
    replica_url: str | None = Field(
        default=None,
        description="This replica's base URL that the other replicas reach (redis backend), e.g. "
        "http://10.0.3.7:8000: they forward the transport routes of the sessions it runs to it; unset: they answer "
        "409 session_on_other_replica.",
    )
    max_request_bytes: int = Field(default=16 * _MIB, ge=1024, le=1024 * _MIB, description="Largest request body.")
    max_image_bytes: int = Field(default=10 * _MIB, ge=1, le=512 * _MIB, description="Largest reference image.")
    max_image_pixels: int = Field(default=16 * _MIB, ge=1, le=1 << 30, description="Most pixels of a reference image.")
    session_history: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="Finished sessions kept readable by GET, and the per-session close records behind them.",
    )
    malloc_arenas: int = Field(
        default=2,
        ge=0,
        le=1024,
        description="glibc malloc arenas `serve` allows (0: glibc's 8 per core); MALLOC_ARENA_MAX wins if set.",
    )
    max_connections: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="Most concurrent HTTP connections and requests (uvicorn limit_concurrency); beyond it 503.",
    )
    max_viewers: int = Field(
        default=8, ge=0, le=1000, description="Viewers a session may have at once (both transports); 0: none."
    )
    idle_frame_interval_ms: int | None = Field(
        default=None,
        ge=0,
        le=60_000,
        description="Milliseconds a session's stream may go without a frame before the last one is sent again, and "
        "how often while it stays idle (keep-warm); 0: off; unset: 100 on LiveKit, off on the embedded transport.",
    )
    token_secret: SecretStr | None = Field(
        default=None,
        description="The secret client, session and watch tokens are signed with (at least 32 bytes; the same on "
        "every replica); unset: no tokens (POST /v1/client_tokens and share links answer 404 tokens_not_configured).",
    )
    token_secret_previous: SecretStr | None = Field(
        default=None,
        description="Comma-separated earlier token secrets still accepted (not used to sign): rotate by moving "
        "TOKEN_SECRET here and setting a new one; drop it once the longest token's lifetime has passed.",
    )
    page_token_url: str | None = Field(
        default=None,
        description="A URL of the app's backend that the page asks for a client token (POST, the page's cookies "
        "sent); set: the page never asks for an API key.",
    )
    recordings_dir: Path | None = Field(
        default=None, description="Where sessions created with record=true are written; unset: recording is off."
    )
    recordings_max_bytes: int = Field(
        default=10 * 1024 * _MIB,
        ge=_MIB,
        le=1 << 50,
        description="Most bytes the finished recordings may take; the oldest are removed first.",
    )
    recordings_max_count: int = Field(
        default=100, ge=1, le=1_000_000, description="Most finished recordings kept; the oldest are removed first."
    )
    webhook_urls: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Comma-separated endpoints every session's webhook events are posted to (a key's "
        "KEY_QUOTAS webhook_urls replace them for its sessions); empty: none.",
    )
    webhook_secret: SecretStr | None = Field(
        default=None, description="The HMAC-SHA256 key webhook deliveries are signed with (secret; needed by webhooks)."
    )
    webhook_allowed_prefixes: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Comma-separated URL prefixes a create's own webhook_url must start with; empty: a create may "
        "not name one.",
    )
    webhook_allow_private: bool = Field(
        default=False,
        description="Let a create's webhook_url resolve to loopback, private or link-local addresses (off: refused, "
        "no SSRF into the cluster).",
    )
    webhook_timeout: float = Field(default=10.0, gt=0, le=300, description="Seconds one delivery attempt may take.")
    webhook_max_attempts: int = Field(
        default=8, ge=1, le=50, description="Attempts per delivery (exponential backoff from 1 s, at most 300 s)."
    )
    webhook_queue_size: int = Field(
        default=10_000, ge=1, le=10_000_000, description="Most deliveries waiting; past it the newest are dropped."
    )
    recordings_s3_endpoint: str | None = Field(
        default=None,
        description="An S3-compatible endpoint (http(s)://host[:port], path-style requests) finished recordings are "
        "uploaded to; GET .../recording on any replica then redirects to a presigned URL; unset: they stay on disk.",
    )
    recordings_s3_bucket: str | None = Field(default=None, description="The bucket of recordings (needs the endpoint).")
    recordings_s3_prefix: str = Field(
        default="recordings/", max_length=512, description="Before every recording's object key in the bucket."
    )
    recordings_s3_region: str = Field(
        default="us-east-1", min_length=1, description="The region requests are signed for."
    )
    recordings_s3_access_key_id: str | None = Field(default=None, description="The object store's access key id.")
    recordings_s3_secret_access_key: SecretStr | None = Field(
        default=None, description="The object store's secret access key (secret)."
    )
    recordings_s3_public_endpoint: str | None = Field(
        default=None,
        description="The endpoint presigned URLs name, when clients reach the store at another address than the "
        "service does; unset: RECORDINGS_S3_ENDPOINT.",
    )
    recordings_s3_url_ttl: int = Field(
        default=300, ge=1, le=7 * 24 * 3600, description="Seconds a presigned recording URL stays valid."
    )
    livekit_url: str | None = Field(default=None, validation_alias=AliasChoices("LIVEKIT_URL", "livekit_url"))
    livekit_client_url: str | None = Field(
        default=None,
        description="The LiveKit URL browsers and clients are told to join, when it differs from LIVEKIT_URL (what "
        "the service dials: e.g. an address only the cluster or the compose network resolves); unset: LIVEKIT_URL.",
    )
    livekit_api_key: str | None = Field(
        default=None, validation_alias=AliasChoices("LIVEKIT_API_KEY", "livekit_api_key")
    )
    livekit_caller_urls: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="Comma-separated LiveKit servers a create's caller-minted token (`livekit.url`/`livekit.token`) "
        "may send the service to: `*`, or scheme://host[:port] with an optional leading `*.` on the host "
        "(wss://*.livekit.cloud); LIVEKIT_URL is always allowed. Set without LIVEKIT_URL: the service runs LiveKit "
        "for callers' tokens only (docs/livekit.md).",
    )
    livekit_api_secret: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("LIVEKIT_API_SECRET", "livekit_api_secret")
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Overrides beat the environment, the environment beats the file; no dotenv, no secrets directory.
        return init_settings, env_settings, FileSource(settings_cls)

    @field_validator(
        "log_format",
        "video_codec",
        "device",
        "admission_backend",
        "stage_placement",
        "model",
        "model_dtype",
        mode="before",
    )
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("cors_origins")
    @classmethod
    def _check_origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for origin in value:
            if origin != "*" and not _ORIGIN.match(origin.rstrip("/")):
                raise ValueError(f"{origin!r} is not an origin: use scheme://host[:port] (http or https) or *")
        return tuple(origin.rstrip("/") for origin in value)

    @field_validator("webhook_urls", "webhook_allowed_prefixes", "livekit_caller_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("webhook_urls", "webhook_allowed_prefixes")
    @classmethod
    def _check_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _checked_webhook_urls(value)

    @field_validator("livekit_caller_urls")
    @classmethod
    def _check_caller_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            parts = urlsplit(pattern)
            if pattern != "*" and (parts.scheme not in ("ws", "wss", "http", "https") or not parts.hostname):
                raise ValueError(f"{pattern!r} is not a LiveKit server pattern: use * or scheme://host[:port]")
        return value

    @field_validator("devices", mode="before")
    @classmethod
    def _split_devices(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(part.strip().lower() for part in value.split(",") if part.strip())
        return value

    @field_validator("devices")
    @classmethod
    def _check_devices(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for device in value:
            if not _DEVICE.fullmatch(device):
                raise ValueError(f"{device!r} is not a device: use cpu or cuda:N (e.g. cuda:0,cuda:1)")
        cuda = [device for device in value if device != "cpu"]
        if cuda and len(cuda) != len(value):
            raise ValueError("cpu and cuda devices cannot be mixed")
        if not cuda and len(value) > 1:
            raise ValueError("list cpu once: every CPU rank runs on it")
        if len(set(cuda)) != len(cuda):
            raise ValueError("a CUDA device is listed twice: one rank per GPU")
        return value

    @field_validator("api_keys")
    @classmethod
    def _check_keys(cls, value: SecretStr) -> SecretStr:
        for key in _split_keys(value):
            if any(char.isspace() for char in key) or not key.isprintable():
                raise ValueError("an API key contains whitespace or unprintable characters (keys are comma-separated)")
        return value

    @field_validator("key_quotas", mode="before")
    @classmethod
    def _normalise_key_ids(cls, value: object) -> object:
        if isinstance(value, str):  # the environment: a JSON object
            try:
                value = json.loads(value) if value.strip() else {}
            except ValueError:
                raise ValueError('must be a JSON object of key id -> {"max_running": N, "max_queued": M}') from None
        if isinstance(value, dict):
            return {str(name).strip().lower(): entry for name, entry in value.items()}
        return value

    @field_validator("token_secret", "token_secret_previous")
    @classmethod
    def _check_token_secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        for secret in _split_keys(value):
            if len(secret.encode()) < _MIN_TOKEN_SECRET_BYTES:
                raise ValueError(
                    f"a token secret must have at least {_MIN_TOKEN_SECRET_BYTES} bytes (e.g. `openssl rand -hex 32`)"
                )
        return value if _split_keys(value) else None

    @field_validator("page_token_url")
    @classmethod
    def _check_page_token_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        value = value.strip()
        parts = urlsplit(value)
        if value.startswith("/") and not value.startswith("//"):
            return value
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"must be a path on this host (/token) or an http(s):// URL, got {value!r}")
        return value

    @field_validator("host")
    @classmethod
    def _check_host(cls, value: str | None) -> str | None:
        if value is None:
            return None
        value = value.strip()
        if not value:
            raise ValueError("must be an IP address or a host name, got an empty string")
        try:
            ipaddress.ip_address(value)
        except ValueError:
            if not re.fullmatch(r"[A-Za-z0-9.\-]{1,253}", value):
                raise ValueError(f"{value!r} is neither an IP address nor a host name") from None
        return value

    @field_validator("admission_backend")
    @classmethod
    def _check_backend(cls, value: str) -> str:
        if value not in ("memory", "redis"):
            raise ValueError(f"must be memory (one replica) or redis (several replicas), got {value!r}")
        return value

    @field_validator("replica_id")
    @classmethod
    def _check_replica_id(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        if not _REPLICA_ID.fullmatch(value.strip()):
            raise ValueError("must be 1-200 letters, digits or . _ : - (unique per process, e.g. the pod name)")
        return value.strip()

    @field_validator("replica_url")
    @classmethod
    def _check_replica_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        from service.scaleout.forwarding import check_replica_url  # one rule, where the addresses are read

        return check_replica_url(value.strip())

    @field_validator("livekit_url", "livekit_client_url")
    @classmethod
    def _check_livekit_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("ws", "wss", "http", "https") or not parts.netloc:
            raise ValueError(f"must be a ws://, wss://, http:// or https:// URL with a host, got {value!r}")
        return value.strip()

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        if self.host is None:
            self.host = _ALL_INTERFACES if self.api_key_list else _LOOPBACK
        livekit = {
            "LIVEKIT_URL": bool(self.livekit_url),
            "LIVEKIT_API_KEY": bool(self.livekit_api_key),
            "LIVEKIT_API_SECRET": self.livekit_api_secret is not None
            and bool(self.livekit_api_secret.get_secret_value()),
        }
        if any(livekit.values()) and not all(livekit.values()):
            missing = ", ".join(name for name, present in livekit.items() if not present)
            present = ", ".join(name for name, present in livekit.items() if present)
            raise ValueError(f"LiveKit needs all three variables: {present} set but {missing} missing")
        if self.admission_backend == "redis":
            url = self.redis_url.get_secret_value().strip() if self.redis_url is not None else ""
            if not url:
                raise ValueError(
                    "LINGSTREAM_ADMISSION_BACKEND=redis needs LINGSTREAM_REDIS_URL (e.g. redis://redis:6379/0)"
                )
            if urlsplit(url).scheme not in ("redis", "rediss", "unix"):
                raise ValueError("LINGSTREAM_REDIS_URL must be a redis://, rediss:// or unix:// URL")
        elif self.replica_url is not None:
            raise ValueError(
                "LINGSTREAM_REPLICA_URL needs LINGSTREAM_ADMISSION_BACKEND=redis (one replica forwards nothing)"
            )
        if self.token_secret is None and self.token_secret_previous is not None:
            raise ValueError("LINGSTREAM_TOKEN_SECRET_PREVIOUS needs LINGSTREAM_TOKEN_SECRET (the secret that signs)")
        self._check_recordings_s3()
        self._check_placement()
        self._check_quotas()
        self._check_webhooks()
        self._check_model()
        needed = _base64_size(self.max_image_bytes) + 4096
        if self.max_request_bytes < needed:
            raise ValueError(
                f"LINGSTREAM_MAX_REQUEST_BYTES ({self.max_request_bytes}) is too small for a base64 image of "
                f"LINGSTREAM_MAX_IMAGE_BYTES ({self.max_image_bytes}): it must be at least {needed}"
            )
        return self

    def _check_recordings_s3(self) -> None:
        """The object store of recordings: all of endpoint, bucket and credentials, or none; http(s) URLs."""
        wanted = {
            "LINGSTREAM_RECORDINGS_S3_ENDPOINT": bool(self.recordings_s3_endpoint),
            "LINGSTREAM_RECORDINGS_S3_BUCKET": bool(self.recordings_s3_bucket),
            "LINGSTREAM_RECORDINGS_S3_ACCESS_KEY_ID": bool(self.recordings_s3_access_key_id),
            "LINGSTREAM_RECORDINGS_S3_SECRET_ACCESS_KEY": self.recordings_s3_secret_access_key is not None
            and bool(self.recordings_s3_secret_access_key.get_secret_value()),
        }
        if not any(wanted.values()):
            return
        if not all(wanted.values()):
            missing = ", ".join(name for name, present in wanted.items() if not present)
            raise ValueError(f"recordings in an object store need all of {', '.join(wanted)}: {missing} missing")
        if self.recordings_dir is None:
            raise ValueError(
                "LINGSTREAM_RECORDINGS_S3_ENDPOINT needs LINGSTREAM_RECORDINGS_DIR (recordings are written there, "
                "then uploaded)"
            )
        for name, url in (
            ("LINGSTREAM_RECORDINGS_S3_ENDPOINT", self.recordings_s3_endpoint),
            ("LINGSTREAM_RECORDINGS_S3_PUBLIC_ENDPOINT", self.recordings_s3_public_endpoint),
        ):
            if url is not None and (urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname):
                raise ValueError(f"{name} must be an http:// or https:// URL with a host, got {url!r}")

    def _check_quotas(self) -> None:
        """Every override names a configured key (by key id), each key once."""
        known = self.key_ids
        unknown = sorted(name for name in self.key_quotas if name not in known)
        if unknown:
            hint = (
                f"the configured keys' ids are {', '.join(sorted(known))}"
                if self.api_key_list
                else "without LINGSTREAM_API_KEYS the only key id is anonymous"
            )
            raise ValueError(f"LINGSTREAM_KEY_QUOTAS names unknown key id(s) {', '.join(unknown)}: {hint}")

    def _check_webhooks(self) -> None:
        """Webhooks are signed: any endpoint, per-key list or allowed prefix needs the secret."""
        secret = self.webhook_secret.get_secret_value() if self.webhook_secret is not None else ""
        if self.webhooks_configured and len(secret) < 16:
            raise ValueError(
                "webhooks need LINGSTREAM_WEBHOOK_SECRET (at least 16 characters) to sign their deliveries"
            )

    @property
    def webhooks_configured(self) -> bool:
        """Whether any session can have a webhook endpoint (deployment, per key, or a create's own)."""
        return bool(
            self.webhook_urls
            or self.webhook_allowed_prefixes
            or any(entry.webhook_urls for entry in self.key_quotas.values())
        )

    @property
    def key_ids(self) -> frozenset[str]:
        """The key id of every configured key (`anonymous` without keys); ids are not secret."""
        if not self.api_key_list:
            return frozenset({ANONYMOUS})
        return frozenset(key_id(owner) for owner in owners_of(self.api_key_list))

    def _check_model(self) -> None:
        if self.model != "lingbot-fast":
            if self.compile != "off":
                raise ValueError(
                    f"LINGSTREAM_COMPILE={self.compile} compiles the lingbot-fast DiT; the reference model has none "
                    "(set LINGSTREAM_MODEL=lingbot-fast or LINGSTREAM_COMPILE=off)"
                )
            if self.attention != "auto" or self.warmup_chunks is not None:
                raise ValueError(
                    "LINGSTREAM_ATTENTION and LINGSTREAM_WARMUP_CHUNKS are for the lingbot-fast DiT; the reference "
                    "model has none (set LINGSTREAM_MODEL=lingbot-fast, or leave them unset)"
                )
            if self.decoder != "wan":
                raise ValueError(
                    f"LINGSTREAM_DECODER={self.decoder} chooses lingbot-fast's decoder; the reference model has its "
                    "own (set LINGSTREAM_MODEL=lingbot-fast or LINGSTREAM_DECODER=wan)"
                )
            return
        if self.model_path is None:
            raise ValueError(
                "LINGSTREAM_MODEL=lingbot-fast needs LINGSTREAM_MODEL_PATH, the model directory (dit/, vae/, "
                "text_encoder/, tokenizer/; `lingstream tiny-checkpoint DIR` writes a random one to try)"
            )
        if self.model_sink_frames + 3 > self.model_window_frames:
            raise ValueError(
                f"LINGSTREAM_MODEL_SINK_FRAMES ({self.model_sink_frames}) + a chunk of 3 latent frames must fit in "
                f"LINGSTREAM_MODEL_WINDOW_FRAMES ({self.model_window_frames})"
            )

    def _check_placement(self) -> None:
        """The rules between LINGSTREAM_STAGE_PLACEMENT, _DENOISE_RANKS, _DEVICES, _DEVICE and _NUM_WORKERS."""
        if self.devices:
            on_cuda = self.devices[0] != "cpu"
            if "device" in self.model_fields_set and (self.device == "cuda") != on_cuda:
                raise ValueError(
                    f"LINGSTREAM_DEVICE={self.device} contradicts LINGSTREAM_DEVICES={','.join(self.devices)}; "
                    "set only LINGSTREAM_DEVICES"
                )
            self.device = "cuda" if on_cuda else "cpu"
        if self.stage_placement == "threads" and self.denoise_ranks > 1:
            raise ValueError(
                f"LINGSTREAM_DENOISE_RANKS={self.denoise_ranks} needs LINGSTREAM_STAGE_PLACEMENT=processes "
                "(the threads placement runs one rank in the service process)"
            )
        if self.device != "cuda" or not self.devices:
            return
        count, workers = len(self.devices), self.num_workers
        if count % workers:
            raise ValueError(
                f"LINGSTREAM_DEVICES lists {count} CUDA devices for LINGSTREAM_NUM_WORKERS={workers}: "
                "every model worker needs the same number"
            )
        per_worker = count // workers
        if self.stage_placement == "threads" and per_worker != 1:
            raise ValueError(
                f"LINGSTREAM_DEVICES gives each model worker {per_worker} CUDA devices, but the threads placement "
                "runs a worker on one: list LINGSTREAM_NUM_WORKERS devices or set LINGSTREAM_STAGE_PLACEMENT=processes"
            )
        ranks = self.denoise_ranks
        if self.stage_placement == "processes" and per_worker < ranks:
            raise ValueError(
                f"LINGSTREAM_DENOISE_RANKS={ranks} is more than the {per_worker} CUDA device(s) each model worker "
                "gets from LINGSTREAM_DEVICES (ranks > devices: one rank per GPU)"
            )
        if self.stage_placement == "processes" and per_worker > ranks + 1:
            raise ValueError(
                f"LINGSTREAM_DEVICES gives each model worker {per_worker} CUDA devices, but it uses "
                f"LINGSTREAM_DENOISE_RANKS={ranks} for the DiT and at most one more for the VAE: "
                f"{per_worker - ranks - 1} would stay unused"
            )

    def worker_devices(self) -> list[tuple[str, ...]]:
        """Each model worker's devices: its share of LINGSTREAM_DEVICES, or the default from LINGSTREAM_DEVICE
        (CPU: "cpu"; CUDA: one GPU per worker with threads, LINGSTREAM_DENOISE_RANKS GPUs with processes)."""
        if self.device != "cuda":
            return [("cpu",)] * self.num_workers
        devices = self.devices
        if not devices:
            per_worker = self.denoise_ranks if self.stage_placement == "processes" else 1
            devices = tuple(f"cuda:{index}" for index in range(per_worker * self.num_workers))
        per_worker = len(devices) // self.num_workers
        return [devices[index * per_worker : (index + 1) * per_worker] for index in range(self.num_workers)]

    @property
    def api_key_list(self) -> tuple[str, ...]:
        """The configured API keys (secret: never log them)."""
        return _split_keys(self.api_keys)

    @property
    def token_secrets(self) -> tuple[str, ...]:
        """The token secrets, the signing one first, then the earlier ones still accepted (secret: never log them);
        empty without LINGSTREAM_TOKEN_SECRET."""
        if self.token_secret is None:
            return ()
        previous = _split_keys(self.token_secret_previous) if self.token_secret_previous is not None else ()
        return (self.token_secret.get_secret_value().strip(), *previous)

    @property
    def livekit_enabled(self) -> bool:
        return bool(self.livekit_url)


def owners_of(keys: tuple[str, ...]) -> tuple[str, ...]:
    """The owner fingerprint of each API key (what admission and usage count by)."""
    return tuple(owner_fingerprint(hashlib.sha256(key.encode()).digest()) for key in keys)


def _split_keys(value: SecretStr) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.get_secret_value().split(",") if part.strip())


def _base64_size(raw_bytes: int) -> int:
    return 4 * ((raw_bytes + 2) // 3)


def env_name(field: str) -> str:
    """The environment variable that sets `field`."""
    return _LIVEKIT_ALIASES.get(field, ENV_PREFIX + field.upper())


def load_settings(*, config_file: Path | None = None, **overrides: object) -> Settings:
    """Read and validate the settings; raise `SettingsError` (one paragraph naming the variable) if invalid.

    `config_file` wins over `LINGSTREAM_CONFIG_FILE`. `overrides` are setting names (e.g. `port=9000`) that beat
    both the environment and the file; None values are ignored.
    """
    path = config_file
    named = os.environ.get(CONFIG_FILE_VARIABLE, "").strip()
    if path is None and named:
        path = Path(named)
    known = Settings.model_fields
    read = read_config_file(path, known, prefix=ENV_PREFIX, aliases=_LIVEKIT_ALIASES) if path is not None else {}
    given = {name: value for name, value in overrides.items() if value is not None}
    try:
        with file_values(read):
            return Settings(**given)  # type: ignore[arg-type]
    except ValidationError as exc:
        raise SettingsError(_explain(exc, path)) from None


def _explain(exc: ValidationError, path: Path | None) -> str:
    problems: list[str] = []
    for error in exc.errors():
        location = error.get("loc", ())
        field = str(location[0]) if location else ""
        name = _field_of(field)
        message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
        if len(location) > 1:  # inside a structured setting (key_quotas): say where
            message = ".".join(str(part) for part in location[1:]) + ": " + message
        if name is None:
            problems.append(message)
            continue
        label = env_name(name)
        if path is not None:
            label += f" (or {name!r} in {path})"
        if name in _SECRET_FIELDS or name in _URL_FIELDS or "input" not in error:
            problems.append(f"{label}: {message}")
        else:
            problems.append(f"{label}: {message} (got {error['input']!r})")
    return "invalid configuration: " + "; ".join(problems) + ". Fix the value and start again."


def _field_of(location: str) -> str | None:
    if location in Settings.model_fields:
        return location
    for field, alias in _LIVEKIT_ALIASES.items():
        if location == alias:
            return field
    return None
