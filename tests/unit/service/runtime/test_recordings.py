"""Recordings through the real service in-process (fake model workers): `"record": true`, GET of the MP4 and its
control trace once the session ended, the stable codes of every refusal, and a recording that stops (a write error,
an encoder that falls behind) while the session and its stream go on."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
from aiortc import RTCSessionDescription

from pipeline.bidirectional import ControlState
from service.app import runtime_of
from service.runtime.recordings import RECORDING_FAILED, RECORDING_OVERRUN, RecordingState
from tests.support.fakes.recording_writers import StalledWriters, failing_writer
from tests.support.fakes.webrtc_client import BrowserPeer
from tests.support.service_harness import FAST, Harness, metric, running_service, wait_status
from tests.support.waits import until
from transport.base import ErrorStatus
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport

API_KEYS = "key-alice-0123456789abcdef,key-bob-0123456789abcdef"
ALICE = {"Authorization": "Bearer key-alice-0123456789abcdef"}
BOB = {"Authorization": "Bearer key-bob-0123456789abcdef"}
PACED = {"pace_s": 0.05, "frame_size": 32}
_WAIT = 10.0


def _names(directory: Path) -> list[str]:
    return sorted(path.name for path in directory.iterdir())


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def _state(svc: Harness, session_id: str) -> RecordingState | None:
    store = runtime_of(svc.app)._recordings
    assert store is not None
    outcome = store.outcome(session_id)
    return None if outcome is None else outcome.state


async def _recording(svc: Harness, session_id: str) -> dict[str, Any] | None:
    body = (await svc.client.get(f"/v1/sessions/{session_id}")).json()
    assert body["record"] is True
    recording: dict[str, Any] | None = body["recording"]
    return recording


async def _recording_metrics(svc: Harness) -> dict[str, float]:
    text = (await svc.client.get("/metrics")).text
    names = {
        "started": "lingstream_recordings_started_total",
        "completed": "lingstream_recordings_completed_total",
        "failed": 'lingstream_recordings_stopped_total{reason="failed"}',
        "overrun": 'lingstream_recordings_stopped_total{reason="overrun"}',
        "written": "lingstream_recordings_written_bytes_total",
        "active": "lingstream_recordings_active",
    }
    return {key: metric(text, name) for key, name in names.items()}


@contextlib.asynccontextmanager
async def with_peer(svc: Harness, session: dict[str, Any]) -> AsyncIterator[BrowserPeer]:
    peer = BrowserPeer()
    try:
        url = session["transport"]["offer_url"]
        answer = (await svc.client.post(url, json={"sdp": await peer.offer(), "type": "offer"})).json()
        await peer.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        async with asyncio.timeout(_WAIT):
            await peer.opened.wait()
        yield peer
    finally:
        await peer.close()


async def test_a_recorded_session_is_served_as_an_mp4_with_its_control_trace_once_it_ended(tmp_path: Path) -> None:
    async with running_service(world=PACED, recordings_dir=tmp_path) as svc:
        created = await svc.create({"record": True})
        assert created.status_code == 201
        assert created.json()["record"] is True
        sid = created.json()["id"]
        await until(
            lambda: svc.world.live == 1 and svc.world._sessions[sid].index >= 6,
            "one live session past its sixth chunk",
            within=_WAIT,
            every=0,
        )
        await until(
            lambda: svc.runtime._table[sid].snapshot().recording is not None,
            "the session's recording to start",
            within=_WAIT,
            every=0,
        )
        recording = await _recording(svc, sid)
        assert recording is not None
        assert (recording["state"], recording["code"]) == ("recording", None)
        assert (await _recording_metrics(svc))["active"] == 1
        running = await svc.client.get(f"/v1/sessions/{sid}/recording")
        assert _error(running) == (409, "recording_in_progress")
        assert "running" in running.json()["error"]["message"]
        assert (await svc.client.delete(f"/v1/sessions/{sid}")).json()["status"] == "closed"
        chunks = svc.world.summaries[sid].chunks
        await until(
            lambda: _state(svc, sid) is RecordingState.READY, "the recording to be ready", within=_WAIT, every=0
        )

        video = await svc.client.get(f"/v1/sessions/{sid}/recording")
        assert video.status_code == 200
        assert video.headers["content-type"] == "video/mp4"
        with av.open(io.BytesIO(video.content), mode="r") as container:
            stream = container.streams.video[0]
            assert (stream.codec_context.name, stream.width, stream.height) == ("h264", 32, 32)
            assert stream.average_rate == 10
            levels = [float(frame.to_ndarray(format="rgb24").mean()) for frame in container.decode(stream)]
        # Exactly the frames generated: one per chunk here, chunk i a flat grey of level i.
        assert len(levels) == chunks
        assert np.allclose(levels, np.arange(chunks), atol=2.5), levels

        trace = await svc.client.get(f"/v1/sessions/{sid}/recording/controls")
        assert trace.status_code == 200
        entries = [json.loads(line) for line in trace.text.splitlines() if not line.startswith("#")]
        assert entries == [{"chunk": index, "keys": []} for index in range(chunks)]
        assert f"session {sid}" in trace.text.splitlines()[0]
        # Nothing half-written is left; the final names are the only files.
        assert _names(tmp_path) == [f"{sid}.controls.jsonl", f"{sid}.mp4"]
        # The session's body and the metrics say the same: one complete recording of exactly these bytes.
        size = len(video.content) + len(trace.content)
        assert await _recording(svc, sid) == {"state": "ready", "code": None, "frames": chunks, "bytes": size}
        figures = await _recording_metrics(svc)
        assert figures == {"started": 1, "completed": 1, "failed": 0, "overrun": 0, "written": size, "active": 0}
        plain = (await svc.create({})).json()
        assert (plain["record"], plain["recording"]) == (False, None)


async def test_recording_requests_are_refused_with_stable_codes(tmp_path: Path) -> None:
    async with running_service(world=PACED) as svc:
        refused = await svc.create({"record": True})
        assert _error(refused) == (422, "recording_not_configured")
        assert "LINGSTREAM_RECORDINGS_DIR" in refused.json()["error"]["message"]
        assert (await svc.client.get("/v1/sessions")).json()["sessions"] == []
        assert _error(await svc.create({"record": "yes"})) == (422, "invalid_request")
    async with running_service(world=PACED, recordings_dir=tmp_path, api_keys=API_KEYS, queue_size=2) as svc:
        plain = (await svc.create({}, headers=ALICE)).json()["id"]
        queued = (await svc.create({"record": True}, headers=ALICE)).json()
        assert queued["status"] == "queued"
        url = f"/v1/sessions/{plain}/recording"
        assert _error(await svc.client.get(url)) == (401, "unauthorized")
        assert _error(await svc.client.get(url, headers=BOB)) == (404, "session_not_found")
        assert _error(await svc.client.get("/v1/sessions/nope/recording", headers=ALICE)) == (404, "session_not_found")
        assert _error(await svc.client.get(url, headers=ALICE)) == (404, "recording_not_found")
        waiting = await svc.client.get(f"/v1/sessions/{queued['id']}/recording", headers=ALICE)
        assert _error(waiting) == (409, "recording_in_progress")
        await svc.client.delete(f"/v1/sessions/{queued['id']}", headers=ALICE)
        cancelled = await svc.client.get(f"/v1/sessions/{queued['id']}/recording", headers=ALICE)
        assert _error(cancelled) == (404, "recording_not_found")  # it never ran, so nothing was recorded
        assert _error(await svc.client.get(url + "/controls", headers=ALICE)) == (404, "recording_not_found")


async def test_a_write_error_stops_the_recording_with_a_status_and_the_session_goes_on(tmp_path: Path) -> None:
    transport = EmbeddedTransport(EmbeddedConfig())
    async with running_service(
        world=PACED,
        transport=transport,  # type: ignore[arg-type]
        recordings_dir=tmp_path,
        recording_writer=failing_writer(fail_after=3),
    ) as svc:
        session = (await svc.create({"record": True})).json()
        sid = session["id"]
        async with with_peer(svc, session) as peer:
            status = await peer.next_status()
            while not isinstance(status, ErrorStatus):
                status = await peer.next_status()
            assert status.code == RECORDING_FAILED
            assert "No space left on device" in status.message
            assert "the session goes on" in status.message
            # The session still streams and takes control after the recording stopped.
            await peer.next_frame()
            peer.send(ControlState(4, frozenset({"w"})))
            await until(
                lambda: ControlState(4, frozenset({"w"})) in svc.world.controls[sid],
                "the control at sequence 4",
                within=_WAIT,
                every=0,
            )
            assert (await svc.client.get(f"/v1/sessions/{sid}")).json()["status"] == "running"
        await svc.client.delete(f"/v1/sessions/{sid}")
        failed = await svc.client.get(f"/v1/sessions/{sid}/recording")
        assert _error(failed) == (404, "recording_failed")
        assert "No space left on device" in failed.json()["error"]["message"]
        assert _names(tmp_path) == []  # the partial files were removed
        recording = await _recording(svc, sid)
        assert recording is not None
        assert (recording["state"], recording["code"], recording["frames"]) == ("failed", RECORDING_FAILED, 3)
        figures = await _recording_metrics(svc)
        assert (figures["started"], figures["completed"], figures["failed"], figures["overrun"]) == (1, 0, 1, 0)
        assert figures["written"] == recording["bytes"]  # written before it stopped, then removed


async def test_a_recording_that_falls_behind_is_dropped_and_the_stream_is_not(tmp_path: Path) -> None:
    stalled = StalledWriters()
    transport = EmbeddedTransport(EmbeddedConfig())
    frame_bytes = 32 * 32 * 3
    async with running_service(
        world=PACED,
        transport=transport,  # type: ignore[arg-type]
        tuning=dataclasses.replace(FAST, recording_queue_bytes=8 * frame_bytes),  # 8 chunks of one frame
        recordings_dir=tmp_path,
        recording_writer=stalled.factory,
    ) as svc:
        session = (await svc.create({"record": True})).json()
        sid = session["id"]
        async with with_peer(svc, session) as peer:
            status = await peer.next_status()
            while not isinstance(status, ErrorStatus):
                status = await peer.next_status()
            assert status.code == RECORDING_OVERRUN
            # The stream goes on: frames keep reaching the peer connection after the recording was dropped.
            before = transport.session_statistics(sid).frames_offered
            await until(
                lambda: transport.session_statistics(sid).frames_offered >= before + 5,
                "5 more frames offered",
                within=_WAIT,
                every=0,
            )
            await peer.next_frame()
        assert _state(svc, sid) is RecordingState.FAILED
        await wait_status(svc, sid, "running")
        await svc.client.delete(f"/v1/sessions/{sid}")
        assert _error(await svc.client.get(f"/v1/sessions/{sid}/recording")) == (404, "recording_failed")
        assert _names(tmp_path) == []
        assert stalled.made
        assert stalled.made[0].closed
        recording = await _recording(svc, sid)
        assert recording is not None
        assert (recording["state"], recording["code"]) == ("failed", RECORDING_OVERRUN)
        figures = await _recording_metrics(svc)
        assert (figures["started"], figures["completed"], figures["failed"], figures["overrun"]) == (1, 0, 0, 1)


async def test_a_recording_removed_by_retention_answers_404(tmp_path: Path) -> None:
    async with running_service(
        world=PACED, recordings_dir=tmp_path, recordings_max_count=1, max_sessions_per_worker=2
    ) as svc:
        first = (await svc.create({"record": True})).json()["id"]
        second = (await svc.create({"record": True})).json()["id"]
        await until(
            lambda: all(svc.world._sessions[s].index >= 2 for s in (first, second)),
            "both sessions past their second chunk",
            within=_WAIT,
            every=0,
        )
        await svc.client.delete(f"/v1/sessions/{first}")
        await until(
            lambda: _state(svc, first) is RecordingState.READY, "the first recording to be ready", within=_WAIT, every=0
        )
        assert (await svc.client.get(f"/v1/sessions/{first}/recording")).status_code == 200
        await svc.client.delete(f"/v1/sessions/{second}")
        await until(
            lambda: _state(svc, second) is RecordingState.READY,
            "the second recording to be ready",
            within=_WAIT,
            every=0,
        )
        # Retention runs once the second is ready (off the loop): wait for it to have removed the first. A GET racing
        # it is served whole from the handle it opened, or answers 404 (routes._recording_file), never a 500.
        await until(
            lambda: _state(svc, first) is RecordingState.REMOVED,
            "the first recording to be removed",
            within=_WAIT,
            every=0,
        )
        removed = await svc.client.get(f"/v1/sessions/{first}/recording")
        assert _error(removed) == (404, "recording_not_found")
        assert "oldest first" in removed.json()["error"]["message"]
        assert (await svc.client.get(f"/v1/sessions/{second}/recording")).status_code == 200
        assert _names(tmp_path) == [f"{second}.controls.jsonl", f"{second}.mp4"]
