"""Who may do what: without a valid key no `/v1` route answers anything but 401 (every route, from the OpenAPI
schema); one key cannot read, delete, follow, offer to or mint viewer tokens for another key's sessions; LiveKit
tokens carry exactly the documented grants and room, and identities are unique per session; secrets (API keys,
LIVEKIT_API_SECRET, REDIS_URL) appear in no log line at DEBUG, no answer and no metric; CORS answers only
configured origins."""

from __future__ import annotations

import base64
import json
import logging
import re
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from livekit import api

from tests.support.fakes.livekit import sign_webhook, webhook_body
from tests.support.fakes.webrtc_client import BrowserPeer
from tests.support.fakes.world import FakeWorld
from tests.support.reliability import (
    LIVEKIT_KEY,
    LIVEKIT_SECRET,
    App,
    LiveKit,
    livekit_app,
    paced_fakes,
    running_app,
)
from tests.support.serving import serve
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport

ALICE_KEY = "alice-key-0123456789abcdef0123"
BOB_KEY = "bob-key-0123456789abcdef01234567"
KEYS = f"{ALICE_KEY},{BOB_KEY}"
ALICE = {"Authorization": f"Bearer {ALICE_KEY}"}
BOB = {"Authorization": f"Bearer {BOB_KEY}"}
JOIN_TTL_S = 60


def _routes(app: App) -> list[tuple[str, str]]:
    """Every (method, path template) under /v1 in the service's own OpenAPI document."""
    paths: dict[str, dict[str, Any]] = app.app.openapi()["paths"]
    return [
        (method.upper(), path)
        for path, operations in paths.items()
        if path.startswith("/v1/")
        for method in operations
        if method in ("get", "post", "put", "patch", "delete")
    ]


def _fill(path: str, session_id: str) -> str:
    return re.sub(r"\{[^}]+\}", session_id, path)


BAD_CREDENTIALS: list[dict[str, str]] = [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer "},
    {"Authorization": "Bearer not-a-key"},
    {"Authorization": f"Bearer {ALICE_KEY[:-1]}"},  # a prefix of a real key
    {"Authorization": f"Bearer {ALICE_KEY}x"},
    {"Authorization": f"Basic {base64.b64encode(ALICE_KEY.encode()).decode()}"},
    {"Authorization": ALICE_KEY},  # no scheme
    {"Authorization": f"Token {ALICE_KEY}"},
    {"X-API-Key": ALICE_KEY},
    {"Cookie": f"api_key={ALICE_KEY}"},
]


async def _probe_without_a_key(app: App, session_id: str, *, livekit: bool) -> dict[tuple[str, str], set[int]]:
    """Every /v1 route, with a live and an unknown session id, under every bad credential: 401 only (the webhook,
    authenticated by LiveKit's signature instead, is 404 where LiveKit is not the transport; the watch route,
    authenticated by a viewer credential instead, answers `viewer_token_invalid`)."""
    seen: dict[tuple[str, str], set[int]] = {}
    for method, template in _routes(app):
        for target in (session_id, "no-such-session"):
            for headers in BAD_CREDENTIALS:
                url = _fill(template, target) + f"?api_key={ALICE_KEY}&token={ALICE_KEY}"
                body = {"sdp": "v=0", "type": "offer"} if template.endswith(("/webrtc", "/watch")) else {}
                response = await app.client.request(method, url, headers=headers, json=body)
                seen.setdefault((method, template), set()).add(response.status_code)
                if template == "/v1/livekit/webhook" and not livekit:
                    assert (response.status_code, response.json()["error"]["code"]) == (404, "not_found")
                    continue
                assert response.status_code == 401, (method, url, headers, response.text)
                if template != "/v1/livekit/webhook":
                    assert response.headers["www-authenticate"].startswith("Bearer")
                expected = "viewer_token_invalid" if template.endswith("/watch") else "unauthorized"
                assert response.json()["error"]["code"] == expected
    return seen


async def test_without_a_valid_key_no_v1_route_answers_anything_but_401() -> None:
    transport = EmbeddedTransport(EmbeddedConfig())
    async with running_app(paced_fakes, transport=transport, api_keys=KEYS, queue_size=2) as app:
        session = (await app.create(headers=ALICE)).json()
        seen = await _probe_without_a_key(app, session["id"], livekit=False)
        assert ("POST", "/v1/sessions/{session_id}/webrtc") in seen
        assert (await app.client.get(f"/v1/sessions/{session['id']}", headers=ALICE)).json()["status"] == "running"
    async with livekit_app(api_keys=KEYS, queue_size=2) as lk:
        session = (await lk.app.create(headers=ALICE)).json()
        seen = await _probe_without_a_key(lk.app, session["id"], livekit=True)
        assert {("POST", "/v1/sessions/{session_id}/viewers"), ("POST", "/v1/livekit/webhook")} <= set(seen)
        assert len(seen) >= 7


async def test_a_key_cannot_touch_another_keys_sessions() -> None:
    transport = EmbeddedTransport(EmbeddedConfig())
    async with running_app(paced_fakes, transport=transport, api_keys=KEYS, queue_size=4) as app:
        running = (await app.create(headers=ALICE)).json()
        queued = (await app.create(headers=ALICE)).json()
        assert (running["status"], queued["status"]) == ("running", "queued")
        peer = BrowserPeer()
        try:
            offer = {"sdp": await peer.offer(), "type": "offer"}
            for session in (running, queued):
                sid = session["id"]
                for method, url, body in (
                    ("GET", f"/v1/sessions/{sid}", None),
                    ("GET", f"/v1/sessions/{sid}/events", None),
                    ("DELETE", f"/v1/sessions/{sid}", None),
                    ("DELETE", f"/v1/sessions/{sid}?mode=cancel", None),
                    ("POST", f"/v1/sessions/{sid}/webrtc", offer),
                    ("POST", f"/v1/sessions/{sid}/viewers", None),
                ):
                    answer = await app.client.request(method, url, headers=BOB, json=body)
                    assert (answer.status_code, answer.json()["error"]["code"]) == (404, "session_not_found"), url
        finally:
            await peer.close()
        listed = (await app.client.get("/v1/sessions", headers=BOB)).json()["sessions"]
        assert listed == []
        mine = {s["id"] for s in (await app.client.get("/v1/sessions", headers=ALICE)).json()["sessions"]}
        assert mine == {running["id"], queued["id"]}
        # Nothing BOB did changed them: the running one still runs, the queued one keeps its place.
        assert (await app.client.get(f"/v1/sessions/{running['id']}", headers=ALICE)).json()["status"] == "running"
        still = (await app.client.get(f"/v1/sessions/{queued['id']}", headers=ALICE)).json()
        assert (still["status"], still["queue_position"]) == ("queued", 1)
        assert app.workers[0].close_calls == []
    async with livekit_app(api_keys=KEYS) as lk:
        session = (await lk.app.create(headers=ALICE)).json()
        minted = await lk.app.client.post(f"/v1/sessions/{session['id']}/viewers", headers=BOB)
        assert (minted.status_code, minted.json()["error"]["code"]) == (404, "session_not_found")
        assert "token" not in minted.text
        fresh = (await lk.app.client.get(f"/v1/sessions/{session['id']}", headers=BOB)).json()
        assert "transport" not in fresh


def _claims(token: str) -> dict[str, Any]:
    """The JWT's claims exactly as signed (verified with the project's key and secret first)."""
    api.TokenVerifier(LIVEKIT_KEY, LIVEKIT_SECRET).verify(token)
    payload = token.split(".")[1]
    decoded: dict[str, Any] = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    return decoded


def _check_token(token: str, *, role: str, identity: str, room: str, session_id: str, video: dict[str, Any]) -> None:
    claims = _claims(token)
    # The service participant alone is of kind `agent` and may set its own attributes (the session's state lives there).
    service = role == "service"
    assert set(claims) == {"name", "metadata", "video", "sub", "iss", "nbf", "exp", *(["kind"] if service else [])}, (
        claims
    )
    assert claims.get("kind") == ("agent" if service else None)
    assert claims["video"] == {"roomJoin": True, "room": room, "canUpdateOwnMetadata": service, **video}
    assert claims["sub"] == identity
    assert claims["iss"] == LIVEKIT_KEY
    assert claims["name"] == role
    assert json.loads(claims["metadata"]) == {"session_id": session_id, "role": role}
    assert 0 < claims["exp"] - claims["nbf"] <= JOIN_TTL_S
    assert claims["exp"] >= time.time()


CONTROLLER = {"canPublish": False, "canSubscribe": True, "canPublishData": True}
VIEWER = {"canPublish": False, "canSubscribe": True, "canPublishData": False}
SERVICE = {"canPublish": True, "canSubscribe": False, "canPublishData": True, "canPublishSources": ["camera"]}


async def test_tokens_carry_exactly_the_documented_grants_and_identities_are_unique_per_session() -> None:
    async with livekit_app(max_sessions_per_worker=4) as lk:
        sessions = [(await lk.app.create()).json() for _ in range(4)]
        identities: list[str] = []
        rooms: set[str] = set()
        for session in sessions:
            sid, details = session["id"], session["transport"]
            room = details["room"]
            rooms.add(room)
            _check_token(
                details["token"],
                role="controller",
                identity=details["identity"],
                room=room,
                session_id=sid,
                video=CONTROLLER,
            )
            assert details["identity"].startswith("ctl-")
            fresh = (await lk.app.client.get(f"/v1/sessions/{sid}")).json()["transport"]
            assert fresh["identity"] == details["identity"]  # a rejoin keeps the identity ...
            _check_token(
                fresh["token"],
                role="controller",
                identity=details["identity"],
                room=room,
                session_id=sid,
                video=CONTROLLER,
            )
            viewers = [(await lk.app.client.post(f"/v1/sessions/{sid}/viewers")).json() for _ in range(2)]
            for viewer in viewers:
                assert viewer["room"] == room
                assert viewer["identity"].startswith("view-")
                _check_token(
                    viewer["token"], role="viewer", identity=viewer["identity"], room=room, session_id=sid, video=VIEWER
                )
            (service_room,) = [r for r in lk.rooms.rooms if r.identity == details["service_identity"]]
            (_url, service_token, _options) = service_room.connects[0]
            _check_token(
                service_token,
                role="service",
                identity=details["service_identity"],
                room=room,
                session_id=sid,
                video=SERVICE,
            )
            identities += [details["identity"], details["service_identity"], *(v["identity"] for v in viewers)]
        assert len(rooms) == len(sessions)
        assert len(set(identities)) == len(identities) == 4 * len(sessions)  # ... and nobody shares one


SECRET_KEYS = ("alice-secret-api-key-4f1c9b7e2d", "bob-secret-api-key-8a3e6c0f51")
LIVEKIT_TEST_SECRET = "livekit-secret-that-must-not-leak-9d2b7f1c3e5a"
REDIS_PASSWORD = "redis-password-that-must-not-leak-6b1f"
REDIS_URL = f"redis://:{REDIS_PASSWORD}@127.0.0.1:6390/0"


def _leaks(text: str) -> list[str]:
    secrets = [*SECRET_KEYS, LIVEKIT_TEST_SECRET, REDIS_PASSWORD, REDIS_URL]
    return [secret for secret in secrets if secret in text]


async def test_secrets_appear_in_no_log_answer_or_metric(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    texts: list[str] = []
    owner = {"Authorization": f"Bearer {SECRET_KEYS[0]}"}

    async def call(lk: LiveKit, method: str, url: str, **kwargs: Any) -> httpx.Response:
        response = await lk.app.client.request(method, url, **kwargs)
        texts.append(f"{response.status_code} {dict(response.headers)} {response.text}")
        return response

    async with livekit_app(
        api_keys=",".join(SECRET_KEYS), livekit_api_secret=LIVEKIT_TEST_SECRET, redis_url=REDIS_URL, log_level="DEBUG"
    ) as lk:
        created = await call(lk, "POST", "/v1/sessions", json={"config": {"fps": 10}}, headers=owner)
        sid = created.json()["id"]
        for headers in (
            {},
            {"Authorization": f"Bearer {SECRET_KEYS[0][:-2]}"},
            {"Authorization": f"Basic {SECRET_KEYS[1]}"},
        ):
            await call(lk, "GET", f"/v1/sessions/{sid}", headers=headers)
        await call(lk, "POST", "/v1/sessions", json={"config": {"nope": 1}}, headers=owner)
        await call(lk, "POST", "/v1/sessions", content=b"{", headers={**owner, "content-type": "application/json"})
        await call(lk, "GET", f"/v1/sessions/{sid}", headers=owner)
        await call(lk, "POST", f"/v1/sessions/{sid}/viewers", headers=owner)
        body = webhook_body("participant_left", "lingstream-x", "ctl-x")
        forged = sign_webhook(body, LIVEKIT_KEY, "forged-secret-that-is-long-enough-0123456789")
        await call(lk, "POST", "/v1/livekit/webhook", content=body, headers={"Authorization": forged})
        await call(
            lk,
            "POST",
            "/v1/livekit/webhook",
            content=body,
            headers={"Authorization": sign_webhook(body, LIVEKIT_KEY, LIVEKIT_TEST_SECRET)},
        )
        for path in (
            "/metrics",
            "/openapi.json",
            "/docs",
            "/page-config.json",
            "/readyz",
            "/healthz",
            "/internal/drain",
        ):
            await call(lk, "GET", path)
        await call(lk, "DELETE", f"/v1/sessions/{sid}", headers=owner)
        await call(lk, "GET", "/metrics")
    assert not _leaks("\n".join(texts))
    assert not _leaks(caplog.text), "a secret was logged"
    assert any(record.levelno == logging.DEBUG for record in caplog.records)  # DEBUG really was captured


async def test_a_real_server_logs_no_secret_at_debug_even_when_its_settings_are_refused(tmp_path: Path) -> None:
    secrets = {
        "LINGSTREAM_API_KEYS": ",".join(SECRET_KEYS),
        "LINGSTREAM_REDIS_URL": REDIS_URL,
        "LINGSTREAM_LOG_LEVEL": "DEBUG",
        "LINGSTREAM_HOST": "127.0.0.1",
        "LINGSTREAM_DRAIN_TIMEOUT": "1",
    }
    with serve(tmp_path, **secrets) as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=10.0) as client:
            await service.wait_ready(client)
            owner = {"Authorization": f"Bearer {SECRET_KEYS[1]}"}
            answers = [
                await client.post("/v1/sessions", json={}, headers=owner),
                await client.get("/v1/sessions", headers={"Authorization": f"Bearer {SECRET_KEYS[1]}0"}),
                await client.post("/v1/sessions", json={"config": {"fps": "x"}}, headers=owner),
                await client.get("/metrics"),
            ]
        service.process.terminate()
        service.process.wait(15)
    assert not _leaks(service.output()), "a secret was logged"
    assert '"level": "DEBUG"' in service.output()
    assert not _leaks("\n".join(f"{a.headers} {a.text}" for a in answers))
    # A start refused for its settings names the variable, never the value.
    with serve(tmp_path, factory=None, LIVEKIT_API_SECRET=LIVEKIT_TEST_SECRET, **secrets) as refused:
        assert refused.process.wait(30) == 2
    assert "LIVEKIT" in refused.output()
    assert not _leaks(refused.output())


async def test_cors_answers_only_configured_origins() -> None:
    good = "https://app.example"
    async with running_app(lambda s: [FakeWorld()], cors_origins=good) as app:
        preflight = {
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization,content-type",
        }
        allowed = await app.client.options("/v1/sessions", headers={"Origin": good, **preflight})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == good
        assert "access-control-allow-credentials" not in allowed.headers
        assert "POST" in allowed.headers["access-control-allow-methods"]
        for origin in (
            "https://evil.example",
            "https://app.example.evil.example",
            "http://app.example",
            "https://app.example:8443",
            "null",
            "https://APP.example",
            good + "/",
        ):
            refused = await app.client.options("/v1/sessions", headers={"Origin": origin, **preflight})
            assert not any(name.startswith("access-control-") for name in refused.headers), (origin, refused.headers)
            assert refused.json()["error"]["code"] == "bad_request"  # the one error shape, like every answer
            simple = await app.client.get("/healthz", headers={"Origin": origin})
            assert not any(name.startswith("access-control-") for name in simple.headers), origin
        same = await app.client.get("/healthz", headers={"Origin": good})
        assert same.headers["access-control-allow-origin"] == good
    async with running_app(lambda s: [FakeWorld()]) as app:  # CORS off unless configured
        preflight_off = await app.client.options(
            "/v1/sessions", headers={"Origin": good, "Access-Control-Request-Method": "POST"}
        )
        assert not any(name.startswith("access-control-") for name in preflight_off.headers)
        simple_off = await app.client.get("/healthz", headers={"Origin": good})
        assert not any(name.startswith("access-control-") for name in simple_off.headers)
