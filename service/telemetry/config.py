"""The telemetry's configuration, read from the standard OTEL_* variables: `TelemetryConfig.from_environ` (checked
at start: a value that cannot work is a `SettingsError` naming the variable) and one `OtlpTarget` per exported signal.
Only OTLP over http/protobuf ships; asking for another protocol is a configuration error, not a silent fallback."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.util.re import parse_env_headers

from service.errors import SettingsError

__all__ = ["COMPRESSIONS", "OTLP_PROTOCOL", "OtlpTarget", "TelemetryConfig", "display_endpoint"]

logger = logging.getLogger(__name__)

OTLP_PROTOCOL = "http/protobuf"
_SIGNAL_PATHS = {"metrics": "v1/metrics", "traces": "v1/traces"}
COMPRESSIONS = {"none": Compression.NoCompression, "gzip": Compression.Gzip, "deflate": Compression.Deflate}


@dataclass(frozen=True, slots=True)
class OtlpTarget:
    """Where and how one signal is exported over OTLP/HTTP. `headers` may hold credentials: never logged."""

    endpoint: str
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    timeout_s: float = 10.0
    compression: str = "none"


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """What `Telemetry` is built from. `otlp_metrics`/`otlp_traces` None: that signal is not exported over OTLP
    (metrics are always served at `/metrics`)."""

    service_name: str = "lingstream"
    service_version: str = "0.0.0"
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    otlp_metrics: OtlpTarget | None = None
    otlp_traces: OtlpTarget | None = None
    metric_export_interval_s: float = 60.0
    metric_export_timeout_s: float = 30.0

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], *, service_version: str = "0.0.0") -> TelemetryConfig:
        """Read the standard variables: `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_{METRICS,TRACES}_
        EXPORTER` (otlp or none), `OTEL_EXPORTER_OTLP_[{METRICS,TRACES}_]{ENDPOINT,PROTOCOL,HEADERS,TIMEOUT,
        COMPRESSION}` (timeouts in seconds, as the Python SDK reads them) and `OTEL_METRIC_EXPORT_{INTERVAL,TIMEOUT}`
        (milliseconds). Raises `SettingsError` naming the variable for a value that cannot work."""
        resource = _resource_attributes(_get(environ, "OTEL_RESOURCE_ATTRIBUTES") or "")
        service_name = _get(environ, "OTEL_SERVICE_NAME") or resource.pop("service.name", "") or "lingstream"
        resource.pop("service.name", None)
        return cls(
            service_name=service_name,
            service_version=service_version,
            resource_attributes=resource,
            otlp_metrics=_otlp_target(environ, "metrics"),
            otlp_traces=_otlp_target(environ, "traces"),
            metric_export_interval_s=_number(environ, "OTEL_METRIC_EXPORT_INTERVAL", 60_000.0) / 1000.0,
            metric_export_timeout_s=_number(environ, "OTEL_METRIC_EXPORT_TIMEOUT", 30_000.0) / 1000.0,
        )


def _get(environ: Mapping[str, str], name: str) -> str | None:
    value = environ.get(name, "").strip()
    return value or None


def _number(environ: Mapping[str, str], name: str, default: float) -> float:
    raw = _get(environ, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(f"invalid configuration: {name} must be a positive number, got {raw!r}")
    return value


def _resource_attributes(raw: str) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for item in raw.split(","):
        key, separator, value = item.partition("=")
        if not item.strip():
            continue
        if not separator or not key.strip():
            logger.warning("OTEL_RESOURCE_ATTRIBUTES: ignoring %r (expected key=value)", item.strip())
            continue
        attributes[unquote(key.strip())] = unquote(value.strip())
    return attributes


def _otlp_target(environ: Mapping[str, str], signal: str) -> OtlpTarget | None:
    upper = signal.upper()
    selector = f"OTEL_{upper}_EXPORTER"
    names = {name.strip().lower() for name in (_get(environ, selector) or "otlp").split(",") if name.strip()}
    allowed = {"otlp", "none"} | ({"prometheus"} if signal == "metrics" else set())
    if names - allowed:
        raise SettingsError(
            f"invalid configuration: {selector}={_get(environ, selector)!r}: this service supports "
            f"{', '.join(sorted(allowed))}"
        )
    if "none" in names or "otlp" not in names:
        return None
    specific = _get(environ, f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT")
    generic = _get(environ, "OTEL_EXPORTER_OTLP_ENDPOINT")
    if specific is not None:
        endpoint, source = specific, f"OTEL_EXPORTER_OTLP_{upper}_ENDPOINT"
    elif generic is not None:
        endpoint, source = f"{generic.rstrip('/')}/{_SIGNAL_PATHS[signal]}", "OTEL_EXPORTER_OTLP_ENDPOINT"
    else:
        return None
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise SettingsError(f"invalid configuration: {source} must be an http:// or https:// URL, got {endpoint!r}")

    def pick(suffix: str) -> tuple[str, str | None]:
        name = f"OTEL_EXPORTER_OTLP_{upper}_{suffix}"
        value = _get(environ, name)
        if value is None:
            name = f"OTEL_EXPORTER_OTLP_{suffix}"
            value = _get(environ, name)
        return name, value

    name, protocol = pick("PROTOCOL")
    if protocol is not None and protocol.lower() != OTLP_PROTOCOL:
        raise SettingsError(
            f"invalid configuration: {name}={protocol!r}: this service exports OTLP over {OTLP_PROTOCOL} only "
            f"(a collector's OTLP/HTTP port, usually 4318); set {name}={OTLP_PROTOCOL}"
        )
    _, headers = pick("HEADERS")
    name, _ = pick("TIMEOUT")
    timeout_s = _number(environ, name, 10.0)
    name, compression = pick("COMPRESSION")
    compression = (compression or "none").lower()
    if compression not in COMPRESSIONS:
        raise SettingsError(f"invalid configuration: {name} must be none, gzip or deflate, got {compression!r}")
    return OtlpTarget(
        endpoint=endpoint,
        headers=dict(parse_env_headers(headers or "", liberal=True)),
        timeout_s=timeout_s,
        compression=compression,
    )


def display_endpoint(url: str) -> str:
    """An endpoint for the logs: without user info (it could hold a password) or query."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"
