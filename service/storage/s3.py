"""`S3Client`: the few S3 calls recordings need, over httpx, signed with SigV4 (`service.storage.sigv4`).

Why our own client: recordings need six calls (put an object, or a multipart upload for a large one; list a prefix;
delete; presign a GET), all plain HTTP with an XML answer. httpx is already a dependency; an SDK would add tens of
megabytes to every install and image for that. Any S3-compatible store that accepts path-style requests
(`ENDPOINT/BUCKET/KEY`) works: AWS S3, SeaweedFS (the tests' server), MinIO, Ceph RGW, R2, GCS's XML API.

Off the event loop: the network calls are async; reading a file's part and hashing it (SHA-256, signed with the
request, so the store checks what it received) run on a worker thread. A file over `part_bytes` goes up as a
multipart upload, part after part (one part in memory at a time); a failed one is aborted.

Retries: each request is tried `attempts` times at most, after a transport error or a 5xx/429 answer, with an
exponential backoff from `backoff_s`; any other 4xx (access denied, no such bucket) fails at once. A failure raises
`ObjectStoreError` with the store's code (`AccessDenied`, `NoSuchBucket`, ...) or `transport`.

Cancellation: cancelling a call cancels its request in flight (a multipart upload cancelled midway is left to the
bucket's lifecycle rules, as with every S3 client). `aclose()` closes the HTTP client.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote

import httpx

from service.storage.sigv4 import Credentials, canonical_query, presign_url, sign_headers

__all__ = ["ObjectStoreConfig", "ObjectStoreError", "S3Client", "StoredObject"]

logger = logging.getLogger(__name__)

_MIB = 1024 * 1024
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_CONNECT_S = 5.0  # a store that does not accept a connection in this long is down (retried like any transport error)


class ObjectStoreError(Exception):
    """An S3 call failed: `code` is the store's error code (`AccessDenied`, `NoSuchBucket`, ...), `transport` when
    no answer came, `status` the HTTP status (0: none)."""

    def __init__(self, operation: str, status: int, code: str, message: str) -> None:
        super().__init__(f"{operation}: {status or 'no answer'} {code}: {message}")
        self.operation = operation
        self.status = status
        self.code = code


@dataclass(frozen=True, slots=True)
class ObjectStoreConfig:
    """Where objects go: `endpoint` (`http(s)://host[:port]`, what this service dials), `bucket`, `prefix` (before
    every key), the signing `credentials` and region; `public_endpoint`: what presigned URLs name when clients reach
    the store at another address (None: `endpoint`); `url_ttl_s`: how long a presigned URL works; `part_bytes`:
    files above it go up in parts of that size (S3's minimum part is 5 MiB); `attempts`, `backoff_s`,
    `timeout_s`: the retry bound and each request's timeout."""

    endpoint: str
    bucket: str
    credentials: Credentials = field(repr=False)
    prefix: str = ""
    public_endpoint: str | None = None
    url_ttl_s: int = 300
    part_bytes: int = 16 * _MIB
    attempts: int = 4
    backoff_s: float = 0.5
    timeout_s: float = 60.0

    def __post_init__(self) -> None:
        if self.part_bytes < 5 * _MIB:
            raise ValueError("part_bytes: S3's smallest multipart part is 5 MiB")
        if self.attempts < 1:
            raise ValueError("attempts: at least 1")


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object of a listing: its key, its size in bytes, when it was last written (Unix seconds)."""

    key: str
    size: int
    modified: float


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _find(root: ET.Element, name: str) -> str:
    node = root.find(f".//{{*}}{name}")  # `{*}`: in any namespace, or none
    return (node.text or "") if node is not None else ""


def _error_of(operation: str, response: httpx.Response) -> ObjectStoreError:
    code, message = f"http_{response.status_code}", response.reason_phrase
    try:
        root = ET.fromstring(response.content)
        code, message = _find(root, "Code") or code, _find(root, "Message") or message
    except ET.ParseError:
        pass
    return ObjectStoreError(operation, response.status_code, code, message)


def _read_part(path: Path, offset: int, size: int) -> tuple[bytes, str]:
    with path.open("rb") as handle:
        handle.seek(offset)
        data = handle.read(size)
    return data, hashlib.sha256(data).hexdigest()


class S3Client:
    """The object store of `config`; see the module docstring. `clock` gives the signing time (tests pin it);
    `transport` replaces httpx's (tests only)."""

    def __init__(
        self,
        config: ObjectStoreConfig,
        *,
        clock: Callable[[], datetime] = _utc_now,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self._clock = clock
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(config.timeout_s, connect=_CONNECT_S), transport=transport)

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------------------------------------ URLs

    def _url(self, key: str | None, params: Sequence[tuple[str, str]] = (), *, public: bool = False) -> str:
        base = self.config.public_endpoint if public and self.config.public_endpoint else self.config.endpoint
        path = f"/{quote(self.config.bucket, safe='')}" + ("" if key is None else f"/{quote(key, safe='/-_.~')}")
        query = canonical_query(params)
        return f"{base.rstrip('/')}{path}" + (f"?{query}" if query else "")

    def presign_get(self, key: str, *, filename: str | None = None, content_type: str | None = None) -> str:
        """A URL that GETs `key` without credentials for `url_ttl_s` seconds (`filename`: the download's name)."""
        params: list[tuple[str, str]] = []
        if filename is not None:
            params.append(("response-content-disposition", f'attachment; filename="{filename}"'))
        if content_type is not None:
            params.append(("response-content-type", content_type))
        url = self._url(key, params, public=True)
        return presign_url("GET", url, self.config.credentials, self._clock(), self.config.url_ttl_s)

    # ------------------------------------------------------------------------------------------------ calls

    async def _request(
        self,
        operation: str,
        method: str,
        key: str | None,
        params: Sequence[tuple[str, str]] = (),
        *,
        body: bytes = b"",
        payload_hash: str | None = None,
        headers: dict[str, str] | None = None,
        ok: frozenset[int] = frozenset({200}),
    ) -> httpx.Response:
        url = self._url(key, params)
        digest = payload_hash if payload_hash is not None else hashlib.sha256(body).hexdigest()
        delay = self.config.backoff_s
        for attempt in range(1, self.config.attempts + 1):
            signed = sign_headers(
                method, url, self.config.credentials, self._clock(), payload_hash=digest, headers=headers
            )
            signed.pop("host")  # httpx sends it from the URL
            try:
                response = await self._http.request(method, url, content=body or None, headers=signed)
            except httpx.TransportError as exc:
                error = ObjectStoreError(operation, 0, "transport", f"{type(exc).__name__}: {exc}")
            else:
                if response.status_code in ok:
                    return response
                error = _error_of(operation, response)
                if response.status_code not in _RETRY_STATUSES:
                    raise error
            if attempt == self.config.attempts:
                raise error
            logger.info("object store: %s (attempt %d of %d); retrying", error, attempt, self.config.attempts)
            await asyncio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # pragma: no cover

    async def put_file(self, key: str, path: Path, content_type: str) -> int:
        """Upload the file at `path` as `key` (in parts above `part_bytes`); returns its size in bytes."""
        size = (await asyncio.to_thread(path.stat)).st_size
        if size <= self.config.part_bytes:
            data, digest = await asyncio.to_thread(_read_part, path, 0, size)
            await self._request(
                "PutObject", "PUT", key, body=data, payload_hash=digest, headers={"content-type": content_type}
            )
            return size
        created = await self._request(
            "CreateMultipartUpload", "POST", key, [("uploads", "")], headers={"content-type": content_type}
        )
        upload_id = _find(ET.fromstring(created.content), "UploadId")
        if not upload_id:
            raise ObjectStoreError("CreateMultipartUpload", created.status_code, "malformed", "no UploadId")
        try:
            etags: list[str] = []
            for number, offset in enumerate(range(0, size, self.config.part_bytes), start=1):
                data, digest = await asyncio.to_thread(_read_part, path, offset, self.config.part_bytes)
                params = [("partNumber", str(number)), ("uploadId", upload_id)]
                answer = await self._request("UploadPart", "PUT", key, params, body=data, payload_hash=digest)
                etags.append(answer.headers.get("etag", ""))
            parts = "".join(
                f"<Part><PartNumber>{number}</PartNumber><ETag>{etag}</ETag></Part>"
                for number, etag in enumerate(etags, start=1)
            )
            body = f"<CompleteMultipartUpload>{parts}</CompleteMultipartUpload>".encode()
            done = await self._request("CompleteMultipartUpload", "POST", key, [("uploadId", upload_id)], body=body)
            if b"<Error>" in done.content:  # S3 may answer 200 and report the failure in the body
                raise _error_of("CompleteMultipartUpload", done)
        except BaseException:
            await self._abort(key, upload_id)
            raise
        return size

    async def _abort(self, key: str, upload_id: str) -> None:
        try:
            async with asyncio.timeout(self.config.timeout_s):
                await self._request(
                    "AbortMultipartUpload", "DELETE", key, [("uploadId", upload_id)], ok=frozenset({200, 204})
                )
        except (ObjectStoreError, TimeoutError) as exc:
            logger.warning("object store: aborting the multipart upload of %s failed: %s", key, exc)

    async def delete(self, key: str) -> None:
        """Delete `key` (deleting a missing key succeeds, as in S3)."""
        await self._request("DeleteObject", "DELETE", key, ok=frozenset({200, 204, 404}))

    async def list(self, prefix: str) -> list[StoredObject]:
        """Every object whose key starts with `prefix`, page after page (ListObjectsV2)."""
        found: list[StoredObject] = []
        token: str | None = None
        while True:
            params = [("list-type", "2"), ("prefix", prefix)]
            if token is not None:
                params.append(("continuation-token", token))
            answer = await self._request("ListObjectsV2", "GET", None, params)
            root = ET.fromstring(answer.content)
            for item in root.findall("{*}Contents"):  # `{*}`: in any namespace, or none
                modified = _find(item, "LastModified")
                found.append(
                    StoredObject(
                        key=_find(item, "Key"),
                        size=int(_find(item, "Size") or 0),
                        modified=datetime.fromisoformat(modified).timestamp() if modified else 0.0,
                    )
                )
            token = _find(root, "NextContinuationToken") or None
            if _find(root, "IsTruncated") != "true" or token is None:
                return found
