"""Bad input at the HTTP edge and on the control channel: oversized bodies (declared, chunked, and against a real
server), image bombs (huge dimensions in a tiny PNG/JPEG/WebP/GIF/BMP header: 413 without allocating), wrong
content types, unknown fields, invalid session configs for the real LingBot worker (hypothesis), and control data
from identities that are not the session's controller (LiveKit binding over the scripted room: ignored, counted).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import socket
import struct
import time
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.bidirectional import ControlState
from service.workers import build_workers
from tests.support.fakes.livekit import FakeRoomFactory, FakeRoomService
from tests.support.fakes.transport_timers import FakeTimers
from tests.support.fakes.world import FakeWorld
from tests.support.reliability import WAIT_S, App, running_app
from tests.support.serving import serve
from tests.support.waits import until
from transport.livekit.config import LiveKitConfig
from transport.livekit.transport import LiveKitTransport
from transport.protocol import encode_control

LIMITS: dict[str, Any] = {"max_request_bytes": 64 * 1024, "max_image_bytes": 16 * 1024, "max_image_pixels": 1 << 20}


def _fake(settings: Any) -> list[FakeWorld]:
    return [FakeWorld() for _ in range(settings.num_workers)]


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


# -- bodies ---------------------------------------------------------------------------------------------------------


async def test_oversized_bodies_are_refused_before_anything_reads_them() -> None:
    async with running_app(_fake, **LIMITS) as app:
        too_big = b"{" + b" " * LIMITS["max_request_bytes"] + b"}"
        routes = [
            "/v1/sessions",
            "/v1/sessions/x/webrtc",
            "/v1/sessions/x/viewers",
            "/v1/sessions/x/watch",
            "/v1/livekit/webhook",
            "/nowhere",
        ]
        for path in routes:
            declared = await app.client.post(path, content=too_big, headers={"content-type": "application/json"})
            assert _error(declared) == (413, "payload_too_large"), path

        async def chunked() -> AsyncIterator[bytes]:
            for _ in range(64):
                yield b" " * 4096  # 256 KiB in all, no Content-Length

        streamed = await app.client.post(
            "/v1/sessions", content=chunked(), headers={"content-type": "application/json"}
        )
        assert _error(streamed) == (413, "payload_too_large")
        assert not any(app.runtime.statistics().sessions.values())  # every live state (paused too) is empty


async def test_deeply_nested_json_within_the_limit_is_a_422() -> None:
    async with running_app(_fake, **LIMITS) as app:
        depth = 20_000
        nested = '{"config": {"a": ' + "[" * depth + "]" * depth + "}}"
        assert len(nested) < LIMITS["max_request_bytes"]
        answer = await app.client.post("/v1/sessions", content=nested, headers={"content-type": "application/json"})
        assert answer.status_code == 422, answer.text
        deep_object = '{"config": ' + '{"a": ' * 5000 + "1" + "}" * 5000 + "}"
        answer = await app.client.post(
            "/v1/sessions", content=deep_object, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 422, answer.text


def _raw_request(port: int, head: bytes, body_chunks: Iterator[bytes]) -> bytes:
    """Send a request over a plain socket (a client that lies about or streams its body); the server's answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        with contextlib.suppress(OSError):  # the server may answer and close while we still send
            for chunk in body_chunks:
                sock.sendall(chunk)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
        return answer


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    raise AssertionError("no VmRSS")


async def test_a_real_server_refuses_lying_and_endless_uploads_without_buffering_them(tmp_path: Path) -> None:
    with serve(tmp_path, LINGSTREAM_MAX_REQUEST_BYTES="131072", LINGSTREAM_MAX_IMAGE_BYTES="65536") as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=10.0) as client:
            await service.wait_ready(client)
            before = _rss_mb(service.process.pid)
            head = b"POST /v1/sessions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            declared = await asyncio.to_thread(
                _raw_request, service.port, head + b"Content-Length: 1000000000000\r\n\r\n", iter([b"{}"])
            )
            assert declared.startswith(b"HTTP/1.1 413"), declared[:200]
            assert b'"payload_too_large"' in declared

            def endless() -> Iterator[bytes]:  # 32 MiB of chunked upload, refused after the first 128 KiB
                piece = b"x" * 65536
                for _ in range(512):
                    yield b"10000\r\n" + piece + b"\r\n"

            started = time.monotonic()
            chunked = await asyncio.to_thread(
                _raw_request, service.port, head + b"Transfer-Encoding: chunked\r\n\r\n", endless()
            )
            assert chunked.startswith(b"HTTP/1.1 413"), chunked[:200]
            assert time.monotonic() - started < 10
            assert _rss_mb(service.process.pid) - before < 16  # far below the 32 MiB sent: nothing was buffered
            assert (await client.get("/healthz")).status_code == 200
    assert "Traceback" not in service.output()


# -- images ---------------------------------------------------------------------------------------------------------


def _png(width: int, height: int) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    pixels = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")


def _jpeg(width: int, height: int) -> bytes:
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00" + sof


def _webp(width: int, height: int) -> bytes:
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little")
    vp8x += (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", 4 + len(vp8x)) + b"WEBP" + vp8x


def _gif(width: int, height: int) -> bytes:
    # A 1x1 GIF (header, screen descriptor, 2-colour table, image descriptor, LZW data) claiming other dimensions.
    screen = struct.pack("<HH", width, height) + b"\x81\x00\x00" + b"\x00" * 12
    image = b"\x2c" + struct.pack("<HHHH", 0, 0, width, height) + b"\x00" + b"\x08\x04\x00\x01\x04\x04\x00"
    return b"GIF87a" + screen + image + b"\x3b"


def _bmp(width: int, height: int) -> bytes:
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, 24, 0, 0, 0, 0, 0, 0)
    return b"BM" + struct.pack("<IHHI", 14 + len(info), 0, 0, 14 + len(info)) + info


BOMBS = {
    "png": _png(50_000, 50_000),
    "png at the default limit": _png(4097, 4096),
    "jpeg": _jpeg(65_500, 65_500),
    "webp": _webp(16_384, 16_384),
    "gif": _gif(65_535, 65_535),
    "bmp": _bmp(30_000, 30_000),
}


async def test_image_bombs_are_413_without_allocating_their_pixels() -> None:
    async with running_app(build_workers, max_image_pixels=16 * 1024 * 1024) as app:
        for name, data in BOMBS.items():
            assert len(data) < 200, name
            body = {"config": {"width": 64, "height": 48}, "image": base64.b64encode(data).decode()}
            tracemalloc.start()
            try:
                answer = await app.client.post("/v1/sessions", json=body)
                _, peak = tracemalloc.get_traced_memory()
            finally:
                tracemalloc.stop()
            assert _error(answer) == (413, "image_too_large"), (name, answer.text)
            assert peak < 4 * 1024 * 1024, f"{name}: {peak / 1e6:.1f} MB allocated while refusing it"
        assert app.runtime.statistics().sessions["running"] == 0


async def test_images_that_are_not_images_or_not_base64_are_refused() -> None:
    async with running_app(build_workers) as app:
        cases = {
            "text": (base64.b64encode(b"hello, I am not a picture").decode(), (415, "unsupported_media_type")),
            "truncated png": (base64.b64encode(_png(64, 48)[:30]).decode(), None),
            "not base64": ("@@@@", (422, "invalid_request")),
            "empty": ("", (422, "invalid_request")),
            "a path": ("/etc/passwd", (422, "invalid_request")),
        }
        for name, (image, expected) in cases.items():
            answer = await app.client.post("/v1/sessions", json={"config": {"width": 64, "height": 48}, "image": image})
            assert answer.status_code < 500, (name, answer.text)
            assert answer.status_code in (413, 415, 422), (name, answer.text)
            if expected is not None:
                assert _error(answer) == expected, name


# -- content types and fields ---------------------------------------------------------------------------------------


async def test_wrong_content_types_are_415_and_unknown_fields_422() -> None:
    async with running_app(_fake, queue_size=8) as app:
        body = json.dumps({"config": {"fps": 10}}).encode()
        for content_type in (
            None,
            "text/plain",
            "text/json",
            "multipart/form-data; boundary=x",
            "application/x-www-form-urlencoded",
            "application/json-seq",
            "application/xml",
            "image/png",
        ):
            headers = {} if content_type is None else {"content-type": content_type}
            answer = await app.client.post("/v1/sessions", content=body, headers=headers)
            assert _error(answer) == (415, "unsupported_media_type"), content_type
        accepted = await app.client.post(
            "/v1/sessions", content=body, headers={"content-type": "application/vnd.x+json"}
        )
        assert accepted.status_code in (201, 202)
        latin = await app.client.post(
            "/v1/sessions", content=b'{"config": {"x": "\xe9"}}', headers={"content-type": "application/json"}
        )
        assert _error(latin) == (422, "invalid_request")

        invalid_request = [
            {"foo": 1},
            {"config": {}, "image": None, "extra": True},
            {"config": "fps=10"},
            {"config": [1, 2]},
            {"config": None},
            {"image": 5},
            [],
            "text",
            None,
        ]
        for payload in invalid_request:
            raw = json.dumps(payload).encode()
            answer = await app.client.post("/v1/sessions", content=raw, headers={"content-type": "application/json"})
            assert _error(answer) == (422, "invalid_request"), payload
        for config in ({"unknown": 1}, {"fps": 0}, {"fps": True}, {"fps": 1.5}, {"seed": -1}, {"fps": "10"}):
            answer = await app.client.post("/v1/sessions", json={"config": config})
            assert _error(answer) == (422, "invalid_config"), config
        assert _error(await app.client.delete("/v1/sessions/x?mode=now")) == (422, "invalid_request")
        assert _error(await app.client.put("/v1/sessions")) == (405, "method_not_allowed")


config_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 16, 32, 48, 64, 720, 1280, 1281, 4 * 3 + 1, 2**63]),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
config_names = st.sampled_from(
    [
        "fps",
        "chunk_size",
        "frame_num",
        "max_duration_s",
        "seed",
        "move_step",
        "yaw_step_deg",
        "pitch_step_deg",
        "pitch_limit_deg",
        "hud",
        "width",
        "height",
        "compute_scale",
        "schedule",
        "prompt",
        "unknown",
        "",
    ]
)


async def test_invalid_session_configs_for_the_real_worker_are_422_never_5xx() -> None:
    # One slot, no queue, and a session holding the slot: a config the worker accepts is answered 429 at once,
    # so no generated config ever starts a (possibly huge) session; a rejected one is a 422 naming the field.
    async with running_app(build_workers, queue_size=0) as app:
        holder = await app.create({"config": {"width": 32, "height": 32}})
        assert holder.status_code == 201
        loop = asyncio.get_running_loop()
        answers: list[tuple[int, str]] = []

        @settings(
            max_examples=120, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(st.dictionaries(config_names, config_values, max_size=5))
        def probe(config: dict[str, Any]) -> None:
            future = asyncio.run_coroutine_threadsafe(app.client.post("/v1/sessions", json={"config": config}), loop)
            response = future.result(30)
            code = response.json().get("error", {}).get("code", "")
            answers.append((response.status_code, code))
            assert response.status_code in (422, 429), (config, response.text)
            if response.status_code == 422:
                assert code in ("invalid_config", "invalid_request"), (config, response.text)

        await asyncio.to_thread(probe)
        assert {status for status, _ in answers} == {422, 429}
        assert app.runtime.statistics().sessions["running"] == 1


# -- control from the wrong identity --------------------------------------------------------------------------------

KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"


@contextlib.asynccontextmanager
async def _livekit_app() -> AsyncIterator[tuple[App, LiveKitTransport, FakeRoomFactory]]:
    server = FakeRoomService(KEY, SECRET)
    url = await server.start()
    factory = FakeRoomFactory(KEY, SECRET)
    config = LiveKitConfig(url=url, api_key=KEY, api_secret=SECRET)
    transport = LiveKitTransport(config, room_factory=factory, timers=FakeTimers())
    try:
        workers = lambda s: [FakeWorld(pace_s=0.05, frame_size=32) for _ in range(s.num_workers)]  # noqa: E731
        async with running_app(workers, transport=transport, max_sessions_per_worker=2) as app:
            yield app, transport, factory
    finally:
        await server.close()


async def test_control_from_anyone_but_the_controller_is_ignored_and_counted() -> None:
    async with _livekit_app() as (app, transport, factory):
        mine = (await app.create()).json()
        other = (await app.create()).json()
        sid, details = mine["id"], mine["transport"]
        room = next(r for r in factory.rooms if r.identity == details["service_identity"])
        controller = details["identity"]
        viewer = (await app.client.post(f"/v1/sessions/{sid}/viewers")).json()["identity"]
        room.participant_joins(controller)
        room.participant_joins(viewer)
        snapshot = encode_control(ControlState(7, frozenset({"w"})))
        impostors = [
            viewer,  # a viewer (its token cannot publish data; a modified client could still try)
            other["transport"]["identity"],  # the controller of another session
            details["service_identity"],  # the service's own identity
            controller + "x",  # a look-alike
            "",
            None,  # the server itself (no participant)
        ]
        for identity in impostors:
            room.receive_data(snapshot, identity)
        room.receive_data(snapshot, controller, topic="lingstream.status")  # right sender, wrong topic
        room.receive_data(b"\xff" * 5000, viewer)  # garbage from an impostor is not even decoded
        world = app.workers[0]
        assert world.controls[sid] == []
        stats = transport.session_statistics(sid)
        assert stats.data_foreign == len(impostors) + 1
        assert stats.data_other_topic == 1
        assert stats.control.received == 0  # nothing reached the decoder
        room.receive_data(snapshot, controller)
        await until(
            lambda: world.controls[sid] == [ControlState(7, frozenset({"w"}))],
            "the controller's control",
            within=WAIT_S,
        )
        assert transport.session_statistics(sid).control.forwarded == 1
        assert world.controls[other["id"]] == []
