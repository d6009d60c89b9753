"""`S3Client`'s bounded retries, through a scripted HTTP transport (httpx's `MockTransport`): a real store does not
answer 503 or drop a connection on cue, so these faults are faked at the HTTP seam; everything else the client does
is tested against a real server (tests/e2e/test_recordings_s3.py)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from service.storage import Credentials, ObjectStoreConfig, ObjectStoreError, S3Client

_DENIED = b"<?xml version='1.0'?><Error><Code>AccessDenied</Code><Message>Access Denied.</Message></Error>"


def _client(answers: list[httpx.Response | Exception], seen: list[httpx.Request]) -> S3Client:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        reply = answers.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    config = ObjectStoreConfig(
        "http://store.test:9000", "bucket", Credentials("id", "secret"), attempts=3, backoff_s=0.001
    )
    return S3Client(config, transport=httpx.MockTransport(answer))


async def test_a_5xx_or_a_dropped_connection_is_retried_within_the_bound(tmp_path: Path) -> None:
    source = tmp_path / "x.bin"
    source.write_bytes(b"abc")
    seen: list[httpx.Request] = []
    client = _client([httpx.Response(503), httpx.ConnectError("refused"), httpx.Response(200)], seen)
    assert await client.put_file("k/x.bin", source, "application/octet-stream") == 3
    assert [request.content for request in seen] == [b"abc"] * 3
    assert all(request.headers["authorization"].startswith("AWS4-HMAC-SHA256 ") for request in seen)
    assert seen[0].url.path == "/bucket/k/x.bin"
    await client.aclose()


async def test_retries_stop_at_the_bound_with_the_last_error(tmp_path: Path) -> None:
    seen: list[httpx.Request] = []
    client = _client([httpx.Response(500), httpx.Response(502), httpx.Response(503)], seen)
    with pytest.raises(ObjectStoreError) as failed:
        await client.delete("k/x.bin")
    assert (failed.value.status, len(seen)) == (503, 3)
    await client.aclose()


async def test_a_refusal_is_not_retried_and_names_the_stores_code(tmp_path: Path) -> None:
    source = tmp_path / "x.bin"
    source.write_bytes(b"abc")
    seen: list[httpx.Request] = []
    client = _client([httpx.Response(403, content=_DENIED)], seen)
    with pytest.raises(ObjectStoreError) as refused:
        await client.put_file("k/x.bin", source, "application/octet-stream")
    assert (refused.value.status, refused.value.code, len(seen)) == (403, "AccessDenied", 1)
    assert "Access Denied." in str(refused.value)
    await client.aclose()
