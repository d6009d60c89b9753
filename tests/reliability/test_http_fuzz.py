"""OpenAPI-driven fuzzing (schemathesis) of every endpoint with both real transports active — the embedded WebRTC
one and LiveKit (over the in-process fake RoomService and scripted rooms) — so the transport routes (`/webrtc`,
`/viewers`, `/livekit/webhook`) run their real handlers instead of answering 404; plus hypothesis-driven offers
and webhooks aimed at a live session, which generated ids never hit. No input may get a 5xx answer.

Bounded: 25 derandomized examples per operation and transport, no example database. Schemathesis ends an app's
lifespan after each test item, so every item gets a fresh app (the schema is read from one more).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.app import create_app
from service.settings import load_settings
from tests.support.fakes.livekit import FakeRoomFactory, FakeRoomService, sign_webhook, webhook_body
from tests.support.fakes.webrtc_client import BrowserPeer
from tests.support.fakes.world import FakeWorld
from tests.support.reliability import running_app
from tests.support.service_harness import FAST
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport
from transport.livekit.config import LiveKitConfig
from transport.livekit.transport import LiveKitTransport

schemathesis = pytest.importorskip("schemathesis", reason="the OpenAPI fuzz run needs schemathesis (dev extra)")

KEY, SECRET = "devkey", "secret-that-is-long-enough-for-hs256-0123456789"
EXAMPLES = settings(
    max_examples=25, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)


class _RoomServiceThread:
    """The fake Twirp RoomService on its own event loop and thread: schemathesis drives each app on a loop of its
    own, and the LiveKit transport calls the RoomService over real HTTP on loopback from there."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = FakeRoomService(KEY, SECRET)
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-room-service", daemon=True)
        self.url = ""

    def __enter__(self) -> _RoomServiceThread:
        self.thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


_ROOMS = _RoomServiceThread()


def _settings() -> Any:
    return load_settings(queue_size=4, max_request_bytes=64 * 1024, max_image_bytes=16 * 1024)


def _workers(settings: Any) -> list[FakeWorld]:
    # Idle workers: nothing may run in the background while hypothesis draws a case (span ids use `random`).
    return [FakeWorld() for _ in range(settings.num_workers)]


def _embedded_app() -> FastAPI:
    return create_app(_settings(), worker_factory=_workers, transport=EmbeddedTransport(EmbeddedConfig()), tuning=FAST)


def _livekit_transport(url: str) -> LiveKitTransport:
    config = LiveKitConfig(url=url or "http://127.0.0.1:9", api_key=KEY, api_secret=SECRET)
    return LiveKitTransport(config, room_factory=FakeRoomFactory(KEY, SECRET))


def _livekit_app() -> FastAPI:
    return create_app(_settings(), worker_factory=_workers, transport=_livekit_transport(_ROOMS.url), tuning=FAST)


embedded_schema = schemathesis.openapi.from_asgi("/openapi.json", _embedded_app())
livekit_schema = schemathesis.openapi.from_asgi("/openapi.json", _livekit_app())
CHECKS = [schemathesis.checks.not_a_server_error, schemathesis.specs.openapi.checks.response_schema_conformance]


@pytest.fixture(scope="module")
def room_service() -> Iterator[_RoomServiceThread]:
    with _ROOMS:
        yield _ROOMS


@pytest.fixture
def embedded_app() -> FastAPI:
    return _embedded_app()


@pytest.fixture
def livekit_app(room_service: _RoomServiceThread) -> FastAPI:
    return _livekit_app()


def test_both_schemas_document_the_transport_routes() -> None:
    for schema in (embedded_schema, livekit_schema):
        paths = set(schema.raw_schema["paths"])
        assert {"/v1/sessions/{session_id}/webrtc", "/v1/sessions/{session_id}/viewers", "/v1/livekit/webhook"} <= paths


@embedded_schema.parametrize()  # type: ignore[untyped-decorator]
@EXAMPLES
def test_no_request_gets_a_server_error_with_the_embedded_transport(case: Any, embedded_app: FastAPI) -> None:
    case.call_and_validate(app=embedded_app, checks=CHECKS)


@livekit_schema.parametrize()  # type: ignore[untyped-decorator]
@EXAMPLES
def test_no_request_gets_a_server_error_with_the_livekit_transport(case: Any, livekit_app: FastAPI) -> None:
    case.call_and_validate(app=livekit_app, checks=CHECKS)


# -- aimed at a live session ----------------------------------------------------------------------------------------

sdp_lines = st.sampled_from(
    [
        "v=0",
        "o=- 1 1 IN IP4 127.0.0.1",
        "s=-",
        "t=0 0",
        "m=video 9 UDP/TLS/RTP/SAVPF 96",
        "m=application 9 UDP/DTLS/SCTP webrtc-datachannel",
        "c=IN IP4 0.0.0.0",
        "a=rtpmap:96 VP8/90000",
        "a=mid:0",
        "a=recvonly",
        "a=setup:actpass",
        "a=fingerprint:sha-256 00:11",
        "a=ice-ufrag:x",
        "a=ice-pwd:y",
        "a=candidate:1 1 udp 1 127.0.0.1 9 typ host",
        "a=group:BUNDLE 0",
        "a=sctp-port:5000",
        "m=audio 0 RTP/AVP 0",
    ]
)
offers = st.one_of(
    st.fixed_dictionaries(
        {
            "sdp": st.one_of(
                st.lists(st.one_of(sdp_lines, st.text(max_size=30)), max_size=25).map("\r\n".join), st.text()
            ),
            "type": st.one_of(st.just("offer"), st.text(max_size=10)),
        }
    ),
    st.dictionaries(st.text(max_size=8), st.one_of(st.text(max_size=20), st.integers(), st.none()), max_size=4),
)


async def test_offers_to_a_live_session_never_get_a_server_error() -> None:
    transport = EmbeddedTransport(EmbeddedConfig(answer_timeout=5.0))
    async with running_app(_workers, transport=transport) as app:
        session = (await app.create()).json()
        url = session["transport"]["offer_url"]
        answers: list[int] = []
        run = _runner(asyncio.get_running_loop())
        browser = BrowserPeer()
        real = (await browser.offer()).split("\r\n")
        await browser.close()
        edits = st.tuples(st.sampled_from(["drop", "dup", "replace", "cut"]), st.integers(0, 200), sdp_lines)
        mutated = st.lists(edits, min_size=1, max_size=3).map(lambda chosen: _mutate(real, chosen))

        @settings(
            max_examples=60, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(
            offers
            | mutated.map(lambda sdp: {"sdp": sdp, "type": "offer"})
            | st.just({"sdp": "\r\n".join(real), "type": "offer"}),
            st.sampled_from(["application/json", "application/json", "text/plain", "application/x+json"]),
        )
        def probe(body: dict[str, Any], content_type: str) -> None:
            answers.append(run(app.client.post(url, json=body, headers={"content-type": content_type})))

        await asyncio.to_thread(probe)
        assert all(status < 500 for status in answers), sorted(set(answers))
        assert set(answers) <= {200, 415, 422}, sorted(set(answers))
        assert 200 in answers  # valid (or still valid) offers ran the whole answer path too
        assert (await app.get(session["id"]))["status"] == "running"


def _mutate(lines: list[str], edits: list[tuple[str, int, str]]) -> str:
    """An SDP offer with some lines dropped, duplicated, replaced, or the text cut short."""
    result = list(lines)
    for op, where, text in edits:
        index = where % max(1, len(result))
        if op == "drop" and result:
            del result[index]
        elif op == "dup" and result:
            result.insert(index, result[index])
        elif op == "replace" and result:
            result[index] = text
        elif op == "cut":
            joined = "\r\n".join(result)
            result = joined[: where * len(joined) // 200].split("\r\n")
    return "\r\n".join(result)


webhook_events = st.sampled_from(
    ["participant_joined", "participant_left", "room_finished", "room_started", "track_published", "", "x" * 300]
)


async def test_webhooks_never_get_a_server_error_signed_or_not(room_service: _RoomServiceThread) -> None:
    transport = _livekit_transport(room_service.url)
    async with running_app(_workers, transport=transport) as app:
        session = (await app.create()).json()
        room, identity = session["transport"]["room"], session["transport"]["identity"]
        answers: list[int] = []
        run = _runner(asyncio.get_running_loop())

        @settings(
            max_examples=80, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
        )
        @given(
            st.one_of(
                st.tuples(
                    webhook_events,
                    st.sampled_from([room, "lingstream-other", ""]),
                    st.sampled_from([identity, None, "ctl-x"]),
                ).map(lambda args: webhook_body(*args)),
                st.text(max_size=200),
                st.binary(max_size=200).map(lambda raw: raw.decode("latin-1")),
            ),
            st.sampled_from(["good", "forged", "missing", "garbage", "bearer"]),
        )
        def probe(body: str, signature: str) -> None:
            headers = {"content-type": "application/webhook+json"}
            if signature == "good":
                headers["authorization"] = sign_webhook(body, KEY, SECRET)
            elif signature == "bearer":
                headers["authorization"] = "Bearer " + sign_webhook(body, KEY, SECRET)
            elif signature == "forged":
                headers["authorization"] = sign_webhook(body, KEY, "another-secret-that-is-long-enough-0123456789")
            elif signature == "garbage":
                headers["authorization"] = "x" * 50
            answers.append(run(app.client.post("/v1/livekit/webhook", content=body.encode(), headers=headers)))

        await asyncio.to_thread(probe)
        assert set(answers) <= {200, 401}, sorted(set(answers))
        assert 200 in answers
        assert 401 in answers


def _runner(loop: asyncio.AbstractEventLoop) -> Any:
    """Hypothesis drives examples synchronously (in a worker thread here); each request runs on the test's loop."""

    def run(request: Any) -> int:
        response: httpx.Response = asyncio.run_coroutine_threadsafe(request, loop).result(30)
        return response.status_code

    return run
