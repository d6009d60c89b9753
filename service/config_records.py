"""The service's config records: what `Settings` becomes, once, at start (`ServiceConfig.from_settings`).

Frozen dataclasses, no pydantic: `ServiceConfig` (with the packages' own records inside it, `AdmissionConfig` and
`KeyQuota`), `RequestLimits`, `SharedAdmissionConfig`, `RecordingLimits`. Nothing downstream of the conversion reads
`Settings` again; a value only the conversion can check (a recordings directory this process cannot write, an
admission configuration the package refuses) raises `SettingsError` here.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from admission import AdmissionConfig, AdmissionConfigError, KeyQuota
from service.api_keys import ANONYMOUS, key_id
from service.errors import SettingsError
from service.settings import Settings, env_name, owners_of

__all__ = [
    "RecordingLimits",
    "RequestLimits",
    "ServiceConfig",
    "SharedAdmissionConfig",
    "default_replica_id",
    "key_quotas",
]


@dataclass(frozen=True, slots=True)
class RequestLimits:
    """Bounds on what clients may send: request body bytes, reference image bytes and pixels."""

    max_request_bytes: int
    max_image_bytes: int
    max_image_pixels: int


@dataclass(frozen=True, slots=True)
class SharedAdmissionConfig:
    """The redis backend's identity for this process: `replica_id` (unique per process), how long its slots
    outlive its silence (`replica_ttl_s`; it heartbeats every third of it) and its address for the other replicas
    (`replica_url`, None: none; they forward its sessions' transport routes there)."""

    replica_id: str
    replica_ttl_s: float
    replica_url: str | None = None


def default_replica_id() -> str:
    """The host name (the pod name on Kubernetes) plus a random suffix: a restarted container in the same pod is
    a new replica, so it never re-asserts the slots of the process that died before it."""
    host = re.sub(r"[^A-Za-z0-9._\-]", "-", socket.gethostname())[:180] or "lingstream"
    return f"{host}-{secrets.token_hex(3)}"


def _writable_directory(path: Path, variable: str) -> Path:
    """`path`, created if missing; a `SettingsError` naming `variable` when it cannot be created or written."""
    if path.exists() and not path.is_dir():
        raise SettingsError(f"invalid configuration: {variable}={path} is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(
            f"invalid configuration: {variable}={path} cannot be created: {exc.strerror or exc}"
        ) from None
    if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
        raise SettingsError(f"invalid configuration: {variable}={path} is not a directory this process can write to")
    return path


@dataclass(frozen=True, slots=True)
class RecordingLimits:
    """Where recordings go and how much of them is kept (`RECORDINGS_DIR`, `RECORDINGS_MAX_BYTES`, `_MAX_COUNT`)."""

    directory: Path
    max_bytes: int
    max_count: int


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """What the running service needs, converted once from `Settings` (no secrets beyond key digests).

    `api_key_digests` are SHA-256 digests of the bearer keys: authentication compares digests, so the keys
    themselves are not kept past start. `shared_admission` is set with the redis backend (its URL, a secret, is
    not part of it: `service.app` hands it to the runtime directly). `session_history` finished sessions stay
    readable by GET (the oldest are forgotten first; the admission tickets and worker records behind them too).
    `recordings` is set when `RECORDINGS_DIR` is (sessions may then be created with `"record": true`).
    `max_session_seconds` caps every session's running time (None: no cap); `max_pause` is the longest pause.
    `drain_mode` is what a drain does with running sessions: "wait" for them, or "hand_off" to other replicas.
    """

    admission: AdmissionConfig
    limits: RequestLimits
    api_key_digests: tuple[bytes, ...]
    cors_origins: tuple[str, ...]
    drain_timeout: float
    log_format: str
    log_level: str
    shared_admission: SharedAdmissionConfig | None = None
    session_history: int = 256
    recordings: RecordingLimits | None = None
    max_session_seconds: float | None = None
    max_pause: float = 300.0
    drain_mode: str = "wait"

    @classmethod
    def from_settings(cls, settings: Settings) -> ServiceConfig:
        default_quota, quotas = key_quotas(settings)
        try:
            admission = AdmissionConfig(
                num_workers=settings.num_workers,
                max_sessions_per_worker=settings.max_sessions_per_worker,
                queue_size=settings.queue_size,
                queue_timeout=settings.queue_timeout,
                queue_heartbeat_timeout=settings.queue_heartbeat_timeout,
                finished_history=settings.session_history,
                default_quota=default_quota,
                key_quotas=quotas,
            )
        except AdmissionConfigError as exc:
            raise SettingsError(f"invalid configuration: {exc}") from None
        return cls(
            admission=admission,
            limits=RequestLimits(
                max_request_bytes=settings.max_request_bytes,
                max_image_bytes=settings.max_image_bytes,
                max_image_pixels=settings.max_image_pixels,
            ),
            api_key_digests=tuple(hashlib.sha256(key.encode()).digest() for key in settings.api_key_list),
            cors_origins=settings.cors_origins,
            drain_timeout=settings.drain_timeout,
            log_format=settings.log_format,
            log_level=settings.log_level,
            shared_admission=None
            if settings.admission_backend != "redis"
            else SharedAdmissionConfig(
                replica_id=settings.replica_id or default_replica_id(),
                replica_ttl_s=settings.replica_ttl,
                replica_url=settings.replica_url,
            ),
            session_history=settings.session_history,
            recordings=None
            if settings.recordings_dir is None
            else RecordingLimits(
                directory=_writable_directory(settings.recordings_dir, env_name("recordings_dir")),
                max_bytes=settings.recordings_max_bytes,
                max_count=settings.recordings_max_count,
            ),
            max_session_seconds=settings.max_session_seconds,
            max_pause=settings.max_pause,
            drain_mode=settings.drain_mode,
        )


def key_quotas(settings: Settings) -> tuple[KeyQuota, tuple[tuple[str, KeyQuota], ...]]:
    """The default quota and each overridden owner's quota (by owner fingerprint), as admission takes them."""
    default = KeyQuota(max_running=settings.key_max_running, max_queued=settings.key_max_queued)
    owners = owners_of(settings.api_key_list) if settings.api_key_list else (ANONYMOUS,)
    overrides: list[tuple[str, KeyQuota]] = []
    for owner in dict.fromkeys(owners):
        entry = settings.key_quotas.get(key_id(owner))
        if entry is None:
            continue
        given = entry.model_fields_set
        overrides.append(
            (
                owner,
                KeyQuota(
                    max_running=entry.max_running if "max_running" in given else default.max_running,
                    max_queued=entry.max_queued if "max_queued" in given else default.max_queued,
                ),
            )
        )
    return default, tuple(overrides)
