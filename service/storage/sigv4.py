"""AWS Signature Version 4 for S3-compatible object stores: signed request headers and presigned URLs.

Pure functions over a request's parts (method, URL, headers, payload hash) and a `datetime`; no I/O, no clock of
their own, so a test pins them to the examples AWS publishes (the GET-object and list-bucket header examples and the
presigned-URL example of the S3 API reference, 2013-05-24, `AKIAIOSFODNN7EXAMPLE`). `service.storage.s3` builds
the requests around them.

The canonical request: the method, the URI path with each segment percent-encoded once (S3 does not normalise it),
the query sorted by encoded name then value, the signed headers lower-cased and trimmed, then the payload's SHA-256
(or `UNSIGNED-PAYLOAD` for a presigned GET). Everything outside RFC 3986's unreserved characters is encoded
(`~` included as unreserved, space as `%20`).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from urllib.parse import quote, unquote, urlsplit

__all__ = [
    "EMPTY_SHA256",
    "UNSIGNED_PAYLOAD",
    "Credentials",
    "canonical_query",
    "presign_url",
    "sign_headers",
]

EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
UNSIGNED_PAYLOAD = "UNSIGNED-PAYLOAD"
_ALGORITHM = "AWS4-HMAC-SHA256"
_SERVICE = "s3"


@dataclass(frozen=True, slots=True)
class Credentials:
    """An access key pair and the region it signs for (the secret never appears in a repr)."""

    access_key_id: str
    secret_access_key: str = field(repr=False)
    region: str = "us-east-1"


def _encode(text: str, *, keep_slash: bool = False) -> str:
    return quote(text, safe="-_.~/" if keep_slash else "-_.~")


def canonical_query(params: Sequence[tuple[str, str]]) -> str:
    """`name=value` pairs encoded and sorted as SigV4 wants them (also what the request sends)."""
    encoded = sorted((_encode(name), _encode(value)) for name, value in params)
    return "&".join(f"{name}={value}" for name, value in encoded)


def _stamp(now: datetime) -> tuple[str, str]:
    moment = now.astimezone(UTC)
    return moment.strftime("%Y%m%dT%H%M%SZ"), moment.strftime("%Y%m%d")


def _signature(credentials: Credentials, amz_date: str, day: str, canonical_request: str) -> tuple[str, str]:
    scope = f"{day}/{credentials.region}/{_SERVICE}/aws4_request"
    to_sign = "\n".join((_ALGORITHM, amz_date, scope, hashlib.sha256(canonical_request.encode()).hexdigest()))
    key = f"AWS4{credentials.secret_access_key}".encode()
    for part in (day, credentials.region, _SERVICE, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return scope, hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _canonical_request(
    method: str, path: str, query: str, headers: Mapping[str, str], payload_hash: str
) -> tuple[str, str]:
    lowered = {name.lower(): " ".join(value.strip().split()) for name, value in headers.items()}
    names = sorted(lowered)
    canonical_headers = "".join(f"{name}:{lowered[name]}\n" for name in names)
    signed = ";".join(names)
    uri = _encode(path or "/", keep_slash=True)
    return "\n".join((method.upper(), uri, query, canonical_headers, signed, payload_hash)), signed


def _host(url: str) -> tuple[str, str, list[tuple[str, str]]]:
    parts = urlsplit(url)
    host = parts.hostname or ""
    default = {"http": 80, "https": 443}.get(parts.scheme)
    if parts.port is not None and parts.port != default:
        host = f"{host}:{parts.port}"
    params: list[tuple[str, str]] = []
    for pair in parts.query.split("&") if parts.query else []:
        name, _, value = pair.partition("=")
        params.append((unquote(name), unquote(value)))
    return host, unquote(parts.path), params


def sign_headers(
    method: str,
    url: str,
    credentials: Credentials,
    now: datetime,
    *,
    payload_hash: str = EMPTY_SHA256,
    headers: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The headers to send with a request to `url` (its path unencoded or encoded, its query as sent): the given
    `headers` plus `host`, `x-amz-date`, `x-amz-content-sha256` and `Authorization`, every one of them signed."""
    host, path, params = _host(url)
    amz_date, day = _stamp(now)
    signed_headers = {**(headers or {}), "host": host, "x-amz-date": amz_date, "x-amz-content-sha256": payload_hash}
    request, signed = _canonical_request(method, path, canonical_query(params), signed_headers, payload_hash)
    scope, signature = _signature(credentials, amz_date, day, request)
    authorization = (
        f"{_ALGORITHM} Credential={credentials.access_key_id}/{scope}, SignedHeaders={signed}, Signature={signature}"
    )
    return {**signed_headers, "Authorization": authorization}


def presign_url(method: str, url: str, credentials: Credentials, now: datetime, expires_s: int) -> str:
    """`url` with the query that authenticates one `method` on it for `expires_s` seconds from `now` (1 s to 7
    days, the limit of SigV4), only the host signed."""
    if not 1 <= expires_s <= 7 * 24 * 3600:
        raise ValueError("a presigned URL expires within 1 s to 7 days")
    host, path, params = _host(url)
    amz_date, day = _stamp(now)
    scope = f"{day}/{credentials.region}/{_SERVICE}/aws4_request"
    params += [
        ("X-Amz-Algorithm", _ALGORITHM),
        ("X-Amz-Credential", f"{credentials.access_key_id}/{scope}"),
        ("X-Amz-Date", amz_date),
        ("X-Amz-Expires", str(expires_s)),
        ("X-Amz-SignedHeaders", "host"),
    ]
    query = canonical_query(params)
    request, _ = _canonical_request(method, path, query, {"host": host}, UNSIGNED_PAYLOAD)
    _, signature = _signature(credentials, amz_date, day, request)
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{_encode(path or '/', keep_slash=True)}?{query}&X-Amz-Signature={signature}"
