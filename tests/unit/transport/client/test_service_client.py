"""`ServiceClient` covers the REST API: every `/v1` operation of the OpenAPI document has a client method (by
operation id), and the newer ones (recorded sessions, their downloads, usage, viewers) work against the real service
in-process (fake model workers)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from aiortc import RTCSessionDescription

from service.runtime.recordings import RecordingState
from tests.support.fakes.webrtc_client import BrowserPeer
from tests.support.service_harness import running_service, wait_status
from tests.support.waits import until
from tests.support.webhook_receiver import webhook_receiver
from transport.client import InvalidInputError, ServiceClient, SessionNotFoundError, UnauthorizedError
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
# Operations of the document no client calls, with the reason.
NOT_FOR_CLIENTS = {
    "livekit_webhook": "LiveKit's server calls it, signed with the LiveKit API secret",
    "health": "a liveness probe for the orchestrator (Kubernetes), not for clients: it says the process is up",
    "ready": "a readiness probe for the orchestrator and load balancer; a client learns the same from a create's "
    "503 not_ready/draining (UnavailableError)",
    "metrics": "Prometheus scrapes it (text exposition), no client",
}
_DOCS = Path(__file__).resolve().parents[4] / "docs" / "client.md"


async def test_every_operation_has_a_client_method() -> None:
    async with running_service() as svc:
        schema = (await svc.client.get("/openapi.json")).json()
    operations = {operation["operationId"] for methods in schema["paths"].values() for operation in methods.values()}
    missing = sorted(operations - CLIENT_METHODS.keys() - NOT_FOR_CLIENTS.keys())
    assert not missing, f"these operations have no ServiceClient method: {missing} (add one, then CLIENT_METHODS)"
    assert not (CLIENT_METHODS.keys() | NOT_FOR_CLIENTS.keys()) - operations, "an operation listed here is gone"
    absent = sorted(name for name in CLIENT_METHODS.values() if not callable(getattr(ServiceClient, name, None)))
    assert not absent, f"ServiceClient lacks {absent}"


def _documented_calls() -> list[tuple[set[str], set[str]]]:
    """docs/client.md's table of the service client: per row, the methods its `call` column names and the
    operation ids its `operation` column names."""
    text = _DOCS.read_text()
    section = text[text.index("## What the service client gives") : text.index("## What a stream gives")]
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        call, operation, _what = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        spans = re.findall(r"`([^`]+)`", call)
        methods = {found for span in spans for found in re.findall(r"(?:service\.|^)(\w+)\(", span)}
        methods |= {found for span in spans for found in re.findall(r"^async for \w+ in service\.(\w+)\(", span)}
        rows.append((methods, set(re.findall(r"`([a-z_]+)`", operation))))
    return rows


def test_docs_client_md_lists_every_client_method_with_its_operation() -> None:
    rows = _documented_calls()
    undocumented = sorted(
        f"{operation} → {method}"
        for operation, method in CLIENT_METHODS.items()
        if not any(method in methods and operation in operations for methods, operations in rows)
    )
    assert not undocumented, f"docs/client.md's table of the service client lacks {undocumented}"
    named = {operation for _methods, operations in rows for operation in operations}
    assert named <= CLIENT_METHODS.keys(), (
        f"docs/client.md names operations no method calls: {named - CLIENT_METHODS.keys()}"
    )
    documented = {method for methods, _operations in rows for method in methods}
    unknown = sorted(method for method in documented if not callable(getattr(ServiceClient, method, None)))
    assert not unknown, f"docs/client.md names calls ServiceClient lacks: {unknown}"


def test_the_documented_calls_are_read_from_the_table() -> None:
    # The check above reads what it should: a row per call, the methods and operations of each.
    rows = _documented_calls()
    assert ({"pause", "resume"}, {"pause_session", "resume_session"}) in rows
    assert ({"follow", "wait_streaming"}, {"session_events"}) in rows
    assert len(rows) >= len(set(CLIENT_METHODS.values())) - 2


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


async def test_a_create_with_its_own_webhook_url_gets_its_events_there() -> None:
    async with webhook_receiver() as receiver:
        prefix = receiver.url.rsplit("/", 1)[0] + "/"
        async with (
            running_service(
                webhook_allowed_prefixes=prefix, webhook_allow_private=True, webhook_secret="s" * 32
            ) as svc,
            ServiceClient("http://testserver", http=svc.client) as client,
        ):
            with pytest.raises(InvalidInputError) as refused:
                await client.create(webhook_url="http://127.0.0.1:1/elsewhere")
            assert refused.value.code == "webhook_url_not_allowed"
            created = await client.create(webhook_url=receiver.url)
            await receiver.wait_for(
                lambda: any(event["data"]["session_id"] == created.id for event in receiver.events("session.running")),
                "the session's running event at its own URL",
            )


async def test_a_share_link_made_through_the_client_watches_until_revoked() -> None:
    transport = EmbeddedTransport(EmbeddedConfig(max_viewers=2))
    secret = "token-secret-for-tests-0123456789abcdef"
    async with (
        running_service(transport=transport, world=PACED, token_secret=secret) as svc,  # type: ignore[arg-type]
        ServiceClient("http://testserver", http=svc.client) as owner,
    ):
        created = await owner.create()
        link = await owner.share(created.id)
        assert link.watch_url.startswith(f"/?watch={created.id}&token=")
        assert link.watch_token not in repr(link)
        watcher = owner.with_token(link.watch_token)
        seen = await watcher.get(created.id)
        assert (seen.id, seen.transport) == (created.id, None)  # a watch token sees no controller's join details
        await owner.revoke_share(created.id, link.share_id)
        with pytest.raises(UnauthorizedError) as revoked:
            await watcher.get(created.id)
        assert revoked.value.code == "token_revoked"
