"""The REST API, black-box through HTTP: every status code, state and limit."""

from __future__ import annotations

import asyncio
import base64
import io
from collections.abc import AsyncGenerator, AsyncIterator

import httpx
import pytest
from PIL import Image

from pipeline.bidirectional import CloseMode, ControlState, ResetPose, Stop
from tests.support.fakes.clock import FakeClock
from tests.support.service_harness import RecordingTransport, metric, running_service, wait_status
from tests.support.waits import until
from transport.base import ChunkStatus, DoneStatus, ErrorStatus, StateStatus


def _png(width: int, height: int) -> str:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()


async def test_an_empty_body_creates_an_admitted_session_with_the_documented_body() -> None:
    async with running_service() as svc:
        response = await svc.create({})
        assert response.status_code == 201
        body = response.json()
        assert response.headers["location"] == f"/v1/sessions/{body['id']}"
        assert body["status"] == "running"
        assert body["queue_position"] is None
        assert body["transport"] is None
        assert body["config"] == {"fps": 10, "seed": 0, "prompt": ""}
        assert body["video"] == {"width": 8, "height": 8, "fps": 10.0}
        assert body["error"] is None
        assert body["reason"] is None
        assert body["created_at"].endswith("Z")
        assert len(body["id"]) >= 20
        assert svc.world.prepare_threads
        assert "MainThread" not in svc.world.prepare_threads


async def test_a_full_instance_queues_with_a_live_position_and_a_freed_slot_admits_the_head() -> None:
    async with running_service(queue_size=4) as svc:
        first = (await svc.create()).json()
        second = await svc.create({"config": {"fps": 5}})
        third = await svc.create()
        assert (second.status_code, third.status_code) == (202, 202)
        assert (second.json()["queue_position"], third.json()["queue_position"]) == (1, 2)
        assert second.json()["status"] == "queued"
        deleted = await svc.client.delete(f"/v1/sessions/{first['id']}")
        assert deleted.status_code == 200
        assert deleted.json()["status"] == "closed"
        admitted = await wait_status(svc, second.json()["id"], "running")
        assert admitted["config"]["fps"] == 5
        assert (await svc.client.get(f"/v1/sessions/{third.json()['id']}")).json()["queue_position"] == 1


async def test_queued_sessions_are_admitted_in_fifo_order() -> None:
    async with running_service(queue_size=10) as svc:
        holder = (await svc.create()).json()["id"]
        queued = [(await svc.create()).json()["id"] for _ in range(5)]
        order = [holder]
        for expected in queued:
            await svc.client.delete(f"/v1/sessions/{order[-1]}")
            await wait_status(svc, expected, "running")
            order.append(expected)
        assert svc.world.created == [holder, *queued]


@pytest.mark.parametrize("queue_size", [0, 1])
async def test_a_full_queue_rejects_with_429_and_retry_after(queue_size: int) -> None:
    async with running_service(queue_size=queue_size) as svc:
        for _ in range(1 + queue_size):
            assert (await svc.create()).status_code in (201, 202)
        rejected = await svc.create()
        assert rejected.status_code == 429
        assert rejected.json()["error"]["code"] == "queue_full"
        assert int(rejected.headers["retry-after"]) >= 1
        listed = (await svc.client.get("/v1/sessions")).json()["sessions"]
        assert len(listed) == 1 + queue_size  # a rejected create is never stored


async def test_queue_timeout_expires_a_waiting_session() -> None:
    clock = FakeClock()
    async with running_service(clock=clock, queue_timeout=10, queue_heartbeat_timeout=1000) as svc:
        await svc.create()
        waiting = (await svc.create()).json()["id"]
        clock.advance(9)
        assert (await svc.client.get(f"/v1/sessions/{waiting}")).json()["status"] == "queued"
        clock.advance(2)
        body = (await svc.client.get(f"/v1/sessions/{waiting}")).json()
        assert (body["status"], body["reason"], body["queue_position"]) == ("expired", "queue_timeout", None)
        text = (await svc.client.get("/metrics")).text
        assert metric(text, 'lingstream_admissions_total{result="expired"}') == 1


async def test_a_silent_client_loses_its_place_and_polling_keeps_it() -> None:
    clock = FakeClock()
    async with running_service(clock=clock, queue_timeout=1000, queue_heartbeat_timeout=5) as svc:
        await svc.create()
        polled = (await svc.create()).json()["id"]
        silent = (await svc.create()).json()["id"]
        for _ in range(3):
            clock.advance(4)
            assert (await svc.client.get(f"/v1/sessions/{polled}")).json()["status"] == "queued"
        sessions = {s["id"]: s for s in (await svc.client.get("/v1/sessions")).json()["sessions"]}
        assert (sessions[silent]["status"], sessions[silent]["reason"]) == ("expired", "heartbeat_lost")
        assert sessions[polled]["queue_position"] == 1


async def test_delete_cancels_a_queued_session_and_is_idempotent() -> None:
    async with running_service() as svc:
        await svc.create()
        queued = (await svc.create()).json()["id"]
        for _ in range(2):
            response = await svc.client.delete(f"/v1/sessions/{queued}?mode=cancel")
            assert response.status_code == 200
            assert (response.json()["status"], response.json()["reason"]) == ("cancelled", "client_cancelled")


async def test_session_history_bounds_the_finished_sessions_get_can_read() -> None:
    async with running_service(session_history=2, queue_size=4) as svc:
        assert svc.runtime.config.admission.finished_history == 2  # the tickets behind them are bounded too
        ended = []
        for _ in range(3):
            running = (await svc.create()).json()["id"]
            queued = (await svc.create()).json()["id"]
            await svc.client.delete(f"/v1/sessions/{queued}?mode=cancel")
            await svc.client.delete(f"/v1/sessions/{running}")
            ended += [queued, running]
        for forgotten in ended[:-2]:
            gone = await svc.client.get(f"/v1/sessions/{forgotten}")
            assert (gone.status_code, gone.json()["error"]["code"]) == (404, "session_not_found")
        kept = [(await svc.client.get(f"/v1/sessions/{sid}")).json()["status"] for sid in ended[-2:]]
        assert kept == ["cancelled", "closed"]
        assert {s["id"] for s in (await svc.client.get("/v1/sessions")).json()["sessions"]} == set(ended[-2:])


async def test_delete_closes_a_running_session_with_drain_by_default() -> None:
    async with running_service() as svc:
        session = (await svc.create()).json()["id"]
        response = await svc.client.delete(f"/v1/sessions/{session}")
        assert response.status_code == 200
        assert (response.json()["status"], response.json()["reason"]) == ("closed", "client_deleted")
        assert svc.world.close_calls == [(session, CloseMode.DRAIN)]
        again = await svc.client.delete(f"/v1/sessions/{session}?mode=cancel")
        assert again.status_code == 200
        assert again.json()["status"] == "closed"
        assert len(svc.world.close_calls) == 1


async def test_a_slow_drain_answers_202_and_a_cancel_escalates_it() -> None:
    async with running_service() as svc:
        svc.world.hold_drain_closes = True
        session = (await svc.create()).json()["id"]
        closing = await svc.client.delete(f"/v1/sessions/{session}?mode=drain")
        assert closing.status_code == 202
        assert (closing.json()["status"], closing.json()["reason"]) == ("draining", "client_deleted")
        cancelled = await svc.client.delete(f"/v1/sessions/{session}?mode=cancel")
        assert cancelled.status_code == 200
        assert cancelled.json()["status"] == "closed"
        assert svc.world.close_calls == [(session, CloseMode.DRAIN), (session, CloseMode.CANCEL)]


async def test_draining_rejects_creates_with_503_and_flips_readiness() -> None:
    async with running_service() as svc:
        assert (await svc.client.get("/readyz")).status_code == 200
        started = await svc.client.post("/internal/drain")
        assert started.status_code == 202
        assert started.json()["draining"] is True
        rejected = await svc.create()
        assert rejected.status_code == 503
        assert rejected.json()["error"]["code"] == "draining"
        ready = await svc.client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"]["code"] == "draining"
        assert (await svc.client.get("/healthz")).status_code == 200


async def test_an_unready_worker_makes_the_instance_unready_and_refuses_creates() -> None:
    async with running_service() as svc:
        svc.world.set_ready(False)
        ready = await svc.client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["error"]["code"] == "not_ready"
        assert "model worker" in ready.json()["error"]["message"]
        refused = await svc.create()
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "not_ready"
        svc.world.set_ready(True)
        assert (await svc.create()).status_code == 201


async def test_api_keys_guard_v1_and_each_key_sees_only_its_own_sessions() -> None:
    key_a, key_b = "key-a-0123456789abcdef", "key-b-0123456789abcdef"
    async with running_service(api_keys=f"{key_a},{key_b}", max_sessions_per_worker=2) as svc:
        anonymous = await svc.create()
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["code"] == "unauthorized"
        assert anonymous.headers["www-authenticate"].startswith("Bearer")
        wrong = await svc.create(headers={"Authorization": "Bearer not-a-key"})
        assert wrong.status_code == 401
        basic = await svc.client.get("/v1/sessions", headers={"Authorization": f"Basic {key_a}"})
        assert basic.status_code == 401
        a_headers = {"Authorization": f"Bearer {key_a}"}
        b_headers = {"Authorization": f"Bearer {key_b}"}
        mine = (await svc.create(headers=a_headers)).json()["id"]
        assert (await svc.client.get(f"/v1/sessions/{mine}", headers=b_headers)).status_code == 404
        assert (await svc.client.delete(f"/v1/sessions/{mine}", headers=b_headers)).status_code == 404
        assert (await svc.client.get("/v1/sessions", headers=b_headers)).json()["sessions"] == []
        assert [s["id"] for s in (await svc.client.get("/v1/sessions", headers=a_headers)).json()["sessions"]] == [mine]
        owner = svc.controller.get(mine).owner
        assert key_a not in owner
        assert owner.startswith("key-")
        for path in ("/healthz", "/readyz", "/metrics"):
            assert (await svc.client.get(path)).status_code == 200


async def test_reference_images_are_bounded_in_bytes_pixels_and_format() -> None:
    async with running_service(max_image_pixels=20 * 20, max_image_bytes=4096, max_sessions_per_worker=4) as svc:
        assert (await svc.create({"image": _png(16, 16)})).status_code == 201
        too_many_pixels = await svc.create({"image": _png(32, 32)})
        assert (too_many_pixels.status_code, too_many_pixels.json()["error"]["code"]) == (413, "image_too_large")
        too_many_bytes = await svc.create({"image": base64.b64encode(b"\x89PNG" + b"0" * 5000).decode()})
        assert (too_many_bytes.status_code, too_many_bytes.json()["error"]["code"]) == (413, "image_too_large")
        not_an_image = await svc.create({"image": base64.b64encode(b"hello, world").decode()})
        assert (not_an_image.status_code, not_an_image.json()["error"]["code"]) == (415, "unsupported_media_type")
        not_base64 = await svc.create({"image": "***"})
        assert (not_base64.status_code, not_base64.json()["error"]["code"]) == (422, "invalid_request")


async def test_a_chunked_body_over_the_limit_is_refused_before_parsing() -> None:
    async def body() -> AsyncIterator[bytes]:
        for _ in range(10):
            yield b"x" * 1024

    async with running_service(max_request_bytes=8192, max_image_bytes=1024) as svc:
        response = await svc.client.post("/v1/sessions", content=body(), headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "payload_too_large"
        assert svc.world.prepare_threads == []


async def test_a_generation_failure_fails_the_session_and_frees_its_slot() -> None:
    async with running_service() as svc:
        broken = (await svc.create()).json()["id"]
        waiting = (await svc.create()).json()["id"]
        svc.world.fail(broken, "the denoiser exploded")
        failed = await wait_status(svc, broken, "failed")
        assert failed["error"] == {"code": "model_failure", "message": "the denoiser exploded"}
        await wait_status(svc, waiting, "running")
        text = (await svc.client.get("/metrics")).text
        assert metric(text, 'lingstream_sessions_ended_total{state="failed"}') == 1


async def test_a_create_failure_answers_500_and_gives_the_slot_back() -> None:
    async with running_service() as svc:
        svc.world.fail_creates = True
        response = await svc.create()
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "session_failed"
        svc.world.fail_creates = False
        assert (await svc.create()).status_code == 201
        assert svc.runtime.statistics().slot_mismatch == 0


async def test_the_transport_gets_chunks_status_and_control_through_the_session_port() -> None:
    transport = RecordingTransport()
    async with running_service(transport=transport, max_sessions_per_worker=2) as svc:
        body = (await svc.create({"config": {"fps": 12}})).json()
        session = body["id"]
        assert body["transport"] == {"kind": "fake", "room": f"room-{session}"}
        port = transport.ports[session]
        assert (port.width, port.height, port.fps) == (8, 8, 12.0)
        chunks = port.chunks()
        assert isinstance(chunks, AsyncGenerator)  # closed below, as a transport closes it on detach
        pending = asyncio.ensure_future(anext(chunks))
        await asyncio.sleep(0)
        svc.world.emit(session, 1)
        chunk = await asyncio.wait_for(pending, 5)
        assert chunk.index == 0
        assert chunk.frames.shape == (1, 8, 8, 3)
        await chunks.aclose()
        port.push_control(ControlState(seq=1, keys=frozenset({"w"})))
        port.push_control(ResetPose())
        assert svc.world.controls[session] == [ControlState(seq=1, keys=frozenset({"w"})), ResetPose()]
        port.push_control(Stop())
        closed = await wait_status(svc, session, "closed")
        assert closed["reason"] == "client_stop"
        await until(lambda: transport.detached, "the transport to detach", every=0)
        assert transport.detached == [(session, "client_stop")]
        statuses = transport.statuses[session]
        assert ChunkStatus(index=0, applied_seq=-1, keys=(), timings={"fake": 0.0}, first_frame_id=0) in statuses
        assert statuses[-1] == DoneStatus("client_stop")
        assert StateStatus("running", None) in statuses

        other = (await svc.create()).json()["id"]
        transport.ports[other].client_gone("grace expired")
        gone = await wait_status(svc, other, "closed")
        assert gone["reason"] == "client_gone: grace expired"
        assert svc.world.close_calls[-1] == (other, CloseMode.CANCEL)


async def test_a_failing_attach_fails_the_session_with_a_final_error() -> None:
    async with running_service(transport=RecordingTransport(fail_attach=True)) as svc:
        response = await svc.create()
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "session_failed"
        assert svc.runtime.statistics().admission.retained_total == 0
        assert svc.world.live == 0


async def test_a_slow_chunk_subscriber_gets_the_latest_chunks() -> None:
    transport = RecordingTransport()
    async with running_service(transport=transport) as svc:
        session = (await svc.create()).json()["id"]
        chunks = transport.ports[session].chunks()
        assert isinstance(chunks, AsyncGenerator)
        first = asyncio.ensure_future(anext(chunks))
        await asyncio.sleep(0)
        svc.world.emit(session, 1)
        assert (await asyncio.wait_for(first, 5)).index == 0
        svc.world.emit(session, 6)  # chunks 1..6 while this subscriber is not reading (it holds 2)
        statuses = transport.statuses[session]
        await until(
            lambda: any(isinstance(s, ChunkStatus) and s.index == 6 for s in statuses), "the status of chunk 6", every=0
        )
        assert [(await anext(chunks)).index, (await anext(chunks)).index] == [5, 6]
        await chunks.aclose()


async def test_metrics_expose_states_and_admission_without_session_ids() -> None:
    async with running_service(queue_size=3) as svc:
        ids = [(await svc.create()).json()["id"] for _ in range(3)]
        response = await svc.client.get("/metrics")
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        text = response.text
        assert metric(text, 'lingstream_sessions{state="running"}') == 1
        assert metric(text, 'lingstream_sessions{state="queued"}') == 2
        assert metric(text, "lingstream_admission_queue_depth") == 2
        assert metric(text, 'lingstream_admissions_total{result="admitted"}') == 1
        assert metric(text, 'lingstream_admissions_total{result="queued"}') == 2
        assert metric(text, "lingstream_admission_slot_mismatch") == 0
        assert not any(session in text for session in ids)


async def test_internal_drain_is_loopback_only() -> None:
    async with running_service(client=("10.1.2.3", 40000)) as remote:
        for method in ("GET", "POST"):
            refused = await remote.client.request(method, "/internal/drain")
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "forbidden"
        assert not remote.runtime.draining
    async with running_service() as local:
        proxied = await local.client.post("/internal/drain", headers={"X-Forwarded-For": "203.0.113.9"})
        assert proxied.status_code == 403
        status = await local.client.get("/internal/drain")
        assert status.status_code == 200
        assert status.json() == {
            "draining": False,
            "complete": False,
            "running": 0,
            "queued": 0,
            "deadline_in_s": None,
        }


async def test_a_drain_cancels_the_queue_and_ends_running_sessions_by_the_deadline() -> None:
    transport = RecordingTransport()
    async with running_service(transport=transport, drain_timeout=0.4) as svc:
        running = (await svc.create()).json()["id"]
        queued = (await svc.create()).json()["id"]
        started = await svc.client.post("/internal/drain")
        assert started.json()["running"] == 1
        assert started.json()["queued"] == 0
        body = (await svc.client.get(f"/v1/sessions/{queued}")).json()
        assert (body["status"], body["reason"]) == ("cancelled", "draining")
        body = (await svc.client.get(f"/v1/sessions/{running}")).json()
        assert (body["status"], body["reason"]) == ("draining", "service_draining")
        transport.ports[running].push_control(ControlState(seq=7, keys=frozenset({"a"})))
        assert svc.world.controls[running] == [ControlState(seq=7, keys=frozenset({"a"}))]
        await asyncio.wait_for(svc.runtime.wait_drained(), 5)
        body = (await svc.client.get(f"/v1/sessions/{running}")).json()
        assert (body["status"], body["reason"]) == ("closed", "service_drain")
        await until(lambda: transport.detached, "the transport to detach", every=0)
        assert transport.statuses[running][-1] == DoneStatus("service_drain")
        status = (await svc.client.get("/internal/drain")).json()
        assert status["complete"] is True
        assert status["running"] == 0


async def test_a_drain_cancels_sessions_whose_drain_close_hangs() -> None:
    async with running_service(drain_timeout=0.4) as svc:
        svc.world.hold_drain_closes = True
        running = (await svc.create()).json()["id"]
        svc.runtime.start_drain("test")
        await asyncio.wait_for(svc.runtime.wait_drained(), 5)
        body = (await svc.client.get(f"/v1/sessions/{running}")).json()
        assert (body["status"], body["reason"]) == ("closed", "service_drain")
        assert svc.world.close_calls == [(running, CloseMode.DRAIN), (running, CloseMode.CANCEL)]


async def test_shutdown_closes_every_session_with_a_final_status() -> None:
    transport = RecordingTransport()
    async with running_service(transport=transport, queue_size=2) as svc:
        running = (await svc.create()).json()["id"]
        queued = (await svc.create()).json()["id"]
        runtime = svc.runtime
        controller = svc.controller
        world = svc.world
    assert transport.statuses[running][-1] == DoneStatus("shutdown")
    assert transport.stopped
    assert world.stopped
    assert world.live == 0
    assert controller.get(queued).state.value == "cancelled"
    assert runtime.statistics().admission.retained_total == 0


async def test_cors_answers_only_configured_origins() -> None:
    async with running_service(cors_origins="https://app.example") as svc:
        allowed = await svc.client.get("/v1/sessions", headers={"Origin": "https://app.example"})
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        other = await svc.client.get("/v1/sessions", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in other.headers
        # A request without an Origin (a health check, a server-side client) is answered as usual.
        plain = await svc.client.get("/v1/sessions")
        assert plain.status_code == 200
        assert "access-control-allow-origin" not in plain.headers
    async with running_service() as svc:
        off = await svc.client.get("/v1/sessions", headers={"Origin": "https://app.example"})
        assert "access-control-allow-origin" not in off.headers


async def test_openapi_documents_the_api() -> None:
    async with running_service() as svc:
        schema = (await svc.client.get("/openapi.json")).json()
        assert {"/v1/sessions", "/v1/sessions/{session_id}", "/v1/sessions/{session_id}/events"} <= set(schema["paths"])
        assert "/internal/drain" not in schema["paths"]
        assert (await svc.client.get("/docs")).status_code == 200


# Generated clients name their calls after these: a rename is a breaking change to every SDK, so it is pinned here.
OPERATION_IDS = {
    ("POST", "/v1/sessions"): "create_session",
    ("GET", "/v1/sessions"): "list_sessions",
    ("GET", "/v1/sessions/{session_id}"): "get_session",
    ("DELETE", "/v1/sessions/{session_id}"): "delete_session",
    ("POST", "/v1/sessions/{session_id}/pause"): "pause_session",
    ("POST", "/v1/sessions/{session_id}/resume"): "resume_session",
    ("GET", "/v1/sessions/{session_id}/events"): "session_events",
    ("GET", "/v1/sessions/{session_id}/recording"): "get_recording",
    ("GET", "/v1/sessions/{session_id}/recording/controls"): "get_recording_controls",
    ("POST", "/v1/sessions/{session_id}/webrtc"): "answer_webrtc_offer",
    ("POST", "/v1/sessions/{session_id}/viewers"): "add_viewer",
    ("POST", "/v1/sessions/{session_id}/watch"): "answer_watch_offer",
    ("DELETE", "/v1/sessions/{session_id}/viewers/{share_id}"): "revoke_share",
    ("POST", "/v1/client_tokens"): "create_client_token",
    ("POST", "/v1/livekit/webhook"): "livekit_webhook",
    ("GET", "/v1/usage"): "get_usage",
    ("GET", "/v1/recordings"): "list_recordings",
    ("GET", "/healthz"): "health",
    ("GET", "/readyz"): "ready",
    ("GET", "/metrics"): "metrics",
}


async def test_every_operation_id_is_named_after_its_route() -> None:
    async with running_service() as svc:
        schema = (await svc.client.get("/openapi.json")).json()
    found = {
        (method.upper(), path): operation["operationId"]
        for path, operations in schema["paths"].items()
        for method, operation in operations.items()
    }
    assert found == OPERATION_IDS, "a route was added, removed or renamed: pin its operation id in OPERATION_IDS"


async def test_failed_statuses_reach_the_transport_before_done() -> None:
    transport = RecordingTransport()
    async with running_service(transport=transport) as svc:
        session = (await svc.create()).json()["id"]
        svc.world.fail(session, "decoder fell over")
        await wait_status(svc, session, "failed")
        await until(lambda: transport.detached, "the transport to detach", every=0)
        assert transport.statuses[session][-2:] == [
            ErrorStatus("model_failure", "decoder fell over"),
            DoneStatus("model_failure"),
        ]


def test_httpx_is_the_client_under_test() -> None:
    assert httpx.__version__
