"""`ServiceClient` covers the REST API: every `/v1` operation of the OpenAPI document has a client method (by
operation id), and the newer ones (recorded sessions, their downloads, usage, viewers) work against the real service
in-process (fake model workers)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiortc import RTCSessionDescription

from service.runtime.recordings import RecordingState
from tests.support.fakes.webrtc_client import BrowserPeer
from tests.support.service_harness import running_service, wait_status
from tests.support.waits import until
from transport.client import InvalidInputError, ServiceClient, SessionNotFoundError
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport


def _names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


PACED = {"pace_s": 0.05, "frame_size": 32}
_WAIT = 10.0

# Operation id → the `ServiceClient` method that calls it (docs/client.md's table says the same).
CLIENT_METHODS = {
    "create_session": "create",
    "list_sessions": "sessions",
    "get_session": "get",
    "delete_session": "delete",
    "pause_session": "pause",
    "resume_session": "resume",
    "session_events": "follow",
    "get_recording": "recording",
    "get_recording_controls": "recording_controls",
    "answer_webrtc_offer": "answer_offer",
    "add_viewer": "add_viewer",
    "answer_watch_offer": "answer_watch_offer",
    "get_usage": "usage",
    "create_client_token": "client_token",
    "revoke_share": "revoke_share",
    "list_recordings": "recordings",
}
# `/v1` operations no client calls, with the reason.
NOT_FOR_CLIENTS = {"livekit_webhook": "LiveKit's server calls it, signed with the LiveKit API secret"}


async def test_every_v1_operation_has_a_client_method() -> None:
    async with running_service() as svc:
        schema = (await svc.client.get("/openapi.json")).json()
    operations = {
        operation["operationId"]
        for path, methods in schema["paths"].items()
        if path.startswith("/v1/")
        for operation in methods.values()
    }
    missing = sorted(operations - CLIENT_METHODS.keys() - NOT_FOR_CLIENTS.keys())
    assert not missing, f"these /v1 operations have no ServiceClient method: {missing} (add one, then CLIENT_METHODS)"
    assert not (CLIENT_METHODS.keys() | NOT_FOR_CLIENTS.keys()) - operations, "an operation listed here is gone"
    absent = sorted(name for name in CLIENT_METHODS.values() if not callable(getattr(ServiceClient, name, None)))
    assert not absent, f"ServiceClient lacks {absent}"


async def test_a_recorded_session_downloads_as_bytes_or_to_a_path_and_counts_in_usage(tmp_path: Path) -> None:
    recordings = tmp_path / "recordings"
    recordings.mkdir()
    async with (
        running_service(world=PACED, recordings_dir=recordings) as svc,
        ServiceClient("http://testserver", http=svc.client) as client,
    ):
        before = await client.usage()
        info = await client.create(record=True)
        assert info.body["record"] is True
        await until(lambda: svc.world.live == 1 and svc.world._sessions[info.id].index >= 3, "three chunks", every=0)
        await client.delete(info.id)
        store = svc.runtime._recordings
        assert store is not None
        await until(
            lambda: (outcome := store.outcome(info.id)) is not None and outcome.state is RecordingState.READY,
            "the recording to be ready",
            within=_WAIT,
            every=0,
        )

        video = await client.recording(info.id)
        assert video == (await svc.client.get(f"/v1/sessions/{info.id}/recording")).content
        assert video[4:8] == b"ftyp"
        saved = await client.recording(info.id, tmp_path / "session.mp4")
        assert saved == tmp_path / "session.mp4"
        assert saved.read_bytes() == video
        trace = await client.recording_controls(info.id)
        assert b'"chunk": 0' in trace or b'"chunk":0' in trace
        saved_trace = await client.recording_controls(info.id, tmp_path / "session.jsonl")
        assert saved_trace.read_bytes() == trace
        assert _names(tmp_path) == ["recordings", "session.jsonl", "session.mp4"]

        with pytest.raises(SessionNotFoundError):
            await client.recording("nope", tmp_path / "nope.mp4")
        assert _names(tmp_path) == ["recordings", "session.jsonl", "session.mp4"]  # no half-written nope.mp4

        after = await client.usage(since=0)
        assert after.sessions == before.sessions + 1
        assert after.chunks >= 3
        assert (after.max_running, after.max_queued) == (None, None)
        with pytest.raises(InvalidInputError):
            await client.usage(since="yesterday")


async def test_a_viewer_added_through_the_client_watches_with_its_credential() -> None:
    transport = EmbeddedTransport(EmbeddedConfig(max_viewers=2))
    async with (
        running_service(transport=transport, world=PACED) as svc,  # type: ignore[arg-type]
        ServiceClient("http://testserver", http=svc.client) as client,
    ):
        created = await client.create()
        await wait_status(svc, created.id, "running")
        info = await client.get(created.id)
        controller = BrowserPeer()
        viewer = BrowserPeer()
        try:
            offer = info.transport["offer_url"] if info.transport is not None else ""
            answer = await client.answer_offer(offer, await controller.offer())
            await controller.pc.setRemoteDescription(RTCSessionDescription(sdp=answer, type="answer"))
            async with asyncio.timeout(_WAIT):
                await controller.opened.wait()
            details = await client.add_viewer(info.id)
            assert (details["kind"], details["role"]) == ("embedded", "viewer")
            sdp = await client.answer_watch_offer(details["offer_url"], details["viewer_token"], await viewer.offer())
            assert sdp.startswith("v=0")
            with pytest.raises(SessionNotFoundError):
                await client.add_viewer("nope")
        finally:
            await viewer.close()
            await controller.close()


async def test_a_client_token_creates_and_the_session_token_drives_and_shares_the_session() -> None:
    secret = "token-secret-for-tests-0123456789abcdef"
    async with running_service(api_keys="key-alice-0123456789abcdef", token_secret=secret) as svc:
        http = svc.client  # the app in-process; ServiceClient speaks to it through the same ASGI transport
        async with ServiceClient("http://testserver", api_key="key-alice-0123456789abcdef", http=http) as owner:
            minted = await owner.client_token(max_creates=1, max_seconds=60)
            assert (minted.max_creates, minted.max_seconds) == (1, 60.0)
            assert minted.token not in repr(minted)
            browser = ServiceClient("http://testserver", token=minted.token, http=http)
            created = await browser.create()
            assert created.session_token
            assert created.body["max_seconds"] == 60
            session = browser.with_token(created.session_token)
            assert (await session.get(created.id)).id == created.id
            with pytest.raises(InvalidInputError):  # 422: a share id that is not one
                await session.revoke_share(created.id, "not-a-share-id!")
            deleted = await session.delete(created.id, mode="cancel")
            assert deleted.id == created.id
