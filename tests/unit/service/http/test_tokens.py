"""Client tokens, session tokens and share links through the real app in-process (issue #35): what each token
reaches, its bounds and expiry (a wall clock the test moves), its creates counted and charged to the parent key,
origins, revocation, the event stream's `?access_token=`, and a walk over every route of the app with another
session's token, so that a route added later cannot forget the check."""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from service.logs import TokenRedactionFilter
from service.tokens import SESSION_TOKEN_MAX_S
from tests.support.service_harness import Harness, SseStream, running_service, wait_status
from transport.embedded.config import EmbeddedConfig
from transport.embedded.transport import EmbeddedTransport

ALICE_KEY, BOB_KEY = "key-alice-0123456789abcdef", "key-bob-0123456789abcdef"
ALICE = {"Authorization": f"Bearer {ALICE_KEY}"}
BOB = {"Authorization": f"Bearer {BOB_KEY}"}
TOKEN_SECRET = "token-secret-for-tests-0123456789abcdef"
ORIGIN = "https://app.example.com"
PACED = {"pace_s": 0.05, "frame_size": 32}


class WallClock:
    """The wall clock tokens are minted and checked on, moved by the test."""

    def __init__(self) -> None:
        self.now = time.time()  # sessions end on the runtime's own wall clock: start from it

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def service(wall: WallClock | None = None, *, transport: bool = False, **settings: Any) -> AsyncIterator[Harness]:
    defaults: dict[str, Any] = {"api_keys": f"{ALICE_KEY},{BOB_KEY}", "token_secret": TOKEN_SECRET}
    embedded = EmbeddedTransport(EmbeddedConfig(max_viewers=2)) if transport else None
    async with running_service(
        wall_clock=wall or WallClock(),
        transport=embedded,  # type: ignore[arg-type]
        world=PACED if transport else None,
        **{**defaults, **settings},
    ) as svc:
        svc.headers = ALICE  # wait_status reads as Alice
        yield svc


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def client_token(svc: Harness, headers: dict[str, str] = ALICE, **body: Any) -> str:
    minted = await svc.client.post("/v1/client_tokens", json=body, headers=headers)
    assert minted.status_code == 201, minted.text
    token: str = minted.json()["token"]
    return token


async def token_session(svc: Harness, token: str, body: Any = None, **headers: str) -> dict[str, Any]:
    created = await svc.create(body, headers={**bearer(token), **headers})
    assert created.status_code in (201, 202), created.text
    session: dict[str, Any] = created.json()
    return session


async def test_a_client_token_creates_one_session_and_its_session_token_runs_it() -> None:
    wall = WallClock()
    async with service(wall) as svc:
        minted = await svc.client.post("/v1/client_tokens", json={}, headers=ALICE)
        assert minted.status_code == 201
        body = minted.json()
        assert body["max_creates"] == 1
        assert body["record"] is False
        assert body["origins"] == []
        assert body["expires_at"] == int(wall.now + 300)
        session = await token_session(svc, body["token"])
        sid, session_token = session["id"], session["session_token"]
        assert session_token
        assert session["session_token_expires_at"] > wall.now
        # the session is the parent key's: its owner lists it, its usage counts it
        listed = (await svc.client.get("/v1/sessions", headers=ALICE)).json()["sessions"]
        assert [s["id"] for s in listed] == [sid]
        assert (await svc.client.get("/v1/usage", headers=ALICE)).json()["sessions"] == 1
        # the session token: its own session only
        assert (await svc.client.get(f"/v1/sessions/{sid}", headers=bearer(session_token))).status_code == 200
        paused = await svc.client.post(f"/v1/sessions/{sid}/pause", headers=bearer(session_token))
        assert paused.status_code == 200, paused.text
        resumed = await svc.client.post(f"/v1/sessions/{sid}/resume", headers=bearer(session_token))
        assert resumed.status_code == 200
        # ...and nothing of the key's
        for method, path in (("GET", "/v1/sessions"), ("GET", "/v1/usage"), ("POST", "/v1/client_tokens")):
            refused = await svc.client.request(method, path, headers=bearer(session_token))
            assert code(refused) == (403, "token_scope"), (method, path)
        assert code(await svc.create(headers=bearer(session_token))) == (403, "token_scope")
        # the client token made its one session: a second create is refused, on any body
        assert code(await svc.create(headers=bearer(body["token"]))) == (403, "token_exhausted")
        # and a client token reaches no session
        assert code(await svc.client.get(f"/v1/sessions/{sid}", headers=bearer(body["token"]))) == (
            403,
            "token_scope",
        )
        ended = await svc.client.delete(f"/v1/sessions/{sid}", headers=bearer(session_token))
        assert ended.status_code in (200, 202)


async def test_a_client_token_makes_at_most_its_creates_and_a_refused_create_keeps_its_place() -> None:
    async with service(queue_size=0) as svc:
        token = await client_token(svc, max_creates=2)
        first = await token_session(svc, token)
        assert first["status"] == "running" or first["status"] == "admitted"
        # the only slot is taken and the queue holds none: 429, and the token keeps its second create
        full = await svc.create(headers=bearer(token))
        assert code(full) == (429, "queue_full")
        await svc.client.delete(f"/v1/sessions/{first['id']}?mode=cancel", headers=bearer(first["session_token"]))
        await wait_status(svc, first["id"], "cancelled", "closed")
        second = await token_session(svc, token)
        assert second["session_token"] != first["session_token"]
        assert code(await svc.create(headers=bearer(token))) == (403, "token_exhausted")


async def test_the_parent_keys_quota_holds_for_its_tokens() -> None:
    async with service(key_max_running=1, max_sessions_per_worker=4) as svc:
        await svc.create(headers=ALICE)
        token = await client_token(svc, max_creates=3)
        refused = await svc.create(headers=bearer(token))
        assert code(refused) == (429, "quota_exceeded")
        # Bob's quota is his own: his token still creates
        bob = await token_session(svc, await client_token(svc, BOB))
        assert bob["status"] in ("admitted", "running")


async def test_a_token_expires_on_its_clock_and_its_session_token_with_its_session() -> None:
    wall = WallClock()
    async with service(wall, reconnect_grace=5.0) as svc:
        token = await client_token(svc, ttl_seconds=60)
        wall.now += 61
        assert code(await svc.create(headers=bearer(token))) == (401, "token_expired")
        wall.now = time.time()  # back to the runtime's wall clock, which its sessions end on
        session = await token_session(svc, await client_token(svc))
        sid, session_token = session["id"], session["session_token"]
        await svc.client.delete(f"/v1/sessions/{sid}?mode=cancel", headers=bearer(session_token))
        await wait_status(svc, sid, "cancelled", "closed")
        # within the reconnect grace after the end, the page still reads the final status
        assert (await svc.client.get(f"/v1/sessions/{sid}", headers=bearer(session_token))).status_code == 200
        wall.now += SESSION_TOKEN_MAX_S / 2  # long past the grace: the token ended with its session
        assert code(await svc.client.get(f"/v1/sessions/{sid}", headers=bearer(session_token))) == (
            401,
            "token_expired",
        )
        wall.now += SESSION_TOKEN_MAX_S  # and past its own exp too
        assert code(await svc.client.get(f"/v1/sessions/{sid}", headers=bearer(session_token))) == (
            401,
            "token_expired",
        )


async def test_bounds_of_a_client_token() -> None:
    async with service(max_session_seconds=600) as svc:
        over = await svc.client.post("/v1/client_tokens", json={"max_seconds": 601}, headers=ALICE)
        assert code(over) == (422, "max_seconds_over_limit")
        assert code(await svc.client.post("/v1/client_tokens", json={"ttl_seconds": 601}, headers=ALICE)) == (
            422,
            "invalid_request",
        )
        assert code(await svc.client.post("/v1/client_tokens", json={"record": True}, headers=ALICE)) == (
            422,
            "recording_not_configured",
        )
        assert code(await svc.client.post("/v1/client_tokens", json={"origins": ["app.example.com"]}, headers=ALICE))[
            0
        ] == (422)
        token = await client_token(svc, max_seconds=30, max_creates=3)
        assert code(await svc.create({"max_seconds": 31}, headers=bearer(token))) == (403, "token_bounds")
        assert code(await svc.create({"record": True}, headers=bearer(token))) == (403, "token_bounds")
        defaulted = await token_session(svc, token)
        assert defaulted["max_seconds"] == 30
        shorter = await token_session(svc, token, {"max_seconds": 10})
        assert shorter["max_seconds"] == 10
        # the refused creates took none of the three
        assert (await svc.create(headers=bearer(token))).status_code in (201, 202)


async def test_origins_bind_a_client_token_and_its_session_tokens() -> None:
    async with service() as svc:
        token = await client_token(svc, origins=[ORIGIN + "/"], max_creates=2)
        assert code(await svc.create(headers=bearer(token))) == (403, "origin_not_allowed")  # no Origin: refused
        evil = {**bearer(token), "Origin": "https://evil.example"}
        assert code(await svc.create(headers=evil)) == (403, "origin_not_allowed")
        session = await token_session(svc, token, Origin=ORIGIN)
        sid, session_token = session["id"], session["session_token"]
        # a session token: another origin is refused; no Origin (a same-origin GET) passes
        other = {**bearer(session_token), "Origin": "https://evil.example"}
        assert code(await svc.client.get(f"/v1/sessions/{sid}", headers=other)) == (403, "origin_not_allowed")
        assert (await svc.client.get(f"/v1/sessions/{sid}", headers=bearer(session_token))).status_code == 200
        same = {**bearer(session_token), "Origin": ORIGIN}
        assert (await svc.client.get(f"/v1/sessions/{sid}", headers=same)).status_code == 200


async def test_tokens_refused_when_forged_rotated_or_their_key_is_gone() -> None:
    async with service() as svc:
        token = await client_token(svc)
        head, payload, signature = token.split(".")
        forged = f"{head}.{payload}.{signature[:-2]}{'AA' if not signature.endswith('AA') else 'BB'}"
        assert code(await svc.create(headers=bearer(forged))) == (401, "token_invalid")
        assert code(await svc.create(headers=bearer(f"{head}.{payload}."))) == (401, "token_invalid")
    # the secret rotated: the old one still verifies while listed as previous, not after
    rotated: dict[str, Any] = {"token_secret": "a-new-token-secret-0123456789abcdef!!"}
    async with service(**rotated, token_secret_previous=TOKEN_SECRET) as svc:
        assert (await svc.create(headers=bearer(token))).status_code in (201, 202)
    async with service(token_secret="a-new-token-secret-0123456789abcdef!!") as svc:
        assert code(await svc.create(headers=bearer(token))) == (401, "token_invalid")
    # Alice's key was removed: her tokens ended with it
    async with service(api_keys=BOB_KEY) as svc:
        assert code(await svc.create(headers=bearer(token))) == (401, "token_invalid")


async def test_without_a_token_secret_minting_answers_404_and_tokens_are_unknown_keys() -> None:
    async with service() as svc:
        token = await client_token(svc)
    async with service(token_secret=None) as svc:
        assert code(await svc.client.post("/v1/client_tokens", headers=ALICE)) == (404, "tokens_not_configured")
        assert code(await svc.create(headers=bearer(token))) == (401, "unauthorized")


async def test_a_session_token_for_one_session_reaches_no_other() -> None:
    async with service(max_sessions_per_worker=4) as svc:
        mine = await token_session(svc, await client_token(svc))
        same_key = (await svc.create(headers=ALICE)).json()
        bobs = (await svc.create(headers=BOB)).json()
        session_token = mine["session_token"]
        for other in (same_key["id"], bobs["id"], "no-such-session"):
            for method, path in (
                ("GET", f"/v1/sessions/{other}"),
                ("DELETE", f"/v1/sessions/{other}"),
                ("POST", f"/v1/sessions/{other}/pause"),
                ("GET", f"/v1/sessions/{other}/recording"),
            ):
                refused = await svc.client.request(method, path, headers=bearer(session_token))
                # the same answer for a session of its key, another key's and none at all: nothing leaks
                assert code(refused) == (404, "session_not_found"), (method, path)
        for sid in (same_key["id"], bobs["id"]):
            assert (await svc.client.get(f"/v1/sessions/{sid}", headers=ALICE if sid != bobs["id"] else BOB)).json()[
                "status"
            ] in ("admitted", "running")


async def test_the_event_stream_takes_a_token_in_its_query_but_never_a_key() -> None:
    async with service() as svc:
        session = await token_session(svc, await client_token(svc))
        sid = session["id"]
        path = f"/v1/sessions/{sid}/events?access_token={session['session_token']}"
        async with SseStream(svc.app, path) as stream:
            assert stream.status == 200
            event = await stream.next_event()
            assert event is not None
            assert event["id"] == sid
        async with SseStream(svc.app, f"/v1/sessions/{sid}/events?access_token={ALICE_KEY}") as stream:
            assert stream.status == 401
        other = (await svc.create(headers=BOB)).json()["id"]
        async with SseStream(svc.app, f"/v1/sessions/{other}/events?access_token={session['session_token']}") as s:
            assert s.status == 404


async def test_a_share_link_watches_mints_viewers_and_is_revoked_everywhere() -> None:
    async with service(transport=True) as svc:
        session = await token_session(svc, await client_token(svc))
        sid, session_token = session["id"], session["session_token"]
        await wait_status(svc, sid, "running")
        shared = await svc.client.post(
            f"/v1/sessions/{sid}/viewers", json={"share": True}, headers=bearer(session_token)
        )
        assert shared.status_code == 201, shared.text
        link = shared.json()
        assert link["kind"] == "share"
        query = parse_qs(urlsplit(link["watch_url"]).query)
        assert query["watch"] == [sid]
        assert query["token"] == [link["watch_token"]]
        watch = bearer(link["watch_token"])
        # it reads its session, without the controller's join details
        read = await svc.client.get(f"/v1/sessions/{sid}", headers=watch)
        assert read.status_code == 200
        assert read.json()["transport"] is None
        assert (await svc.client.get(f"/v1/sessions/{sid}", headers=bearer(session_token))).json()["transport"]
        async with SseStream(svc.app, f"/v1/sessions/{sid}/events?access_token={link['watch_token']}") as stream:
            event = await stream.next_event()
            assert event is not None
            assert event["transport"] is None
        # each use mints a viewer's credential, within MAX_VIEWERS (2 here)
        for _ in range(2):
            viewer = await svc.client.post(f"/v1/sessions/{sid}/viewers", headers=watch)
            assert viewer.status_code == 201
            assert viewer.json()["viewer_token"]
        assert code(await svc.client.post(f"/v1/sessions/{sid}/viewers", headers=watch)) == (429, "too_many_viewers")
        # it steers nothing, ends nothing, shares nothing
        for method, path, body in (
            ("DELETE", f"/v1/sessions/{sid}", None),
            ("POST", f"/v1/sessions/{sid}/pause", None),
            ("POST", f"/v1/sessions/{sid}/webrtc", {"sdp": "v=0", "type": "offer"}),
            ("POST", f"/v1/sessions/{sid}/viewers", {"share": True}),
            ("GET", f"/v1/sessions/{sid}/recording", None),
        ):
            refused = await svc.client.request(method, path, json=body, headers=watch)
            assert code(refused) == (403, "token_scope"), (method, path)
        # revoked by the session token: refused from then on
        revoked = await svc.client.delete(
            f"/v1/sessions/{sid}/viewers/{link['share_id']}", headers=bearer(session_token)
        )
        assert revoked.status_code == 200
        assert revoked.json() == {"share_id": link["share_id"], "revoked": True}
        assert code(await svc.client.get(f"/v1/sessions/{sid}", headers=watch)) == (401, "token_revoked")
        # another key cannot revoke (nor learn of) Alice's shares
        again = await svc.client.delete(f"/v1/sessions/{sid}/viewers/{link['share_id']}", headers=BOB)
        assert code(again) == (404, "session_not_found")
        text = (await svc.client.get("/metrics")).text
        assert session_token not in text
        assert link["watch_token"] not in text
        assert link["share_id"] not in text


_NOBODY = "no-such-session-000000"


def _sample_path(template: str, session_id: str) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: session_id if m.group(1) == "session_id" else "0123abcd", template)


async def _ask(
    svc: Harness, method: str, template: str, body: Any, token: str, in_query: bool, session_id: str
) -> httpx.Response:
    path = _sample_path(template, session_id)
    if in_query:
        return await svc.client.request(method, f"{path}?access_token={token}", json=body)
    return await svc.client.request(method, path, json=body, headers=bearer(token))


async def test_every_route_refuses_another_sessions_token() -> None:
    # Walks every operation of the app's OpenAPI document (every public route, so a route added later is covered
    # without being listed here): a session token and a watch token of Alice's session A never reach Bob's session
    # B, nor Alice's own session C, on any route, in the header or the query; a client token reaches no session.
    # Whatever a route answers, it is no success and names nothing of B or C.
    async with service(transport=True, max_sessions_per_worker=4) as svc:
        a = await token_session(svc, await client_token(svc))
        await wait_status(svc, a["id"], "running")
        share = await svc.client.post(
            f"/v1/sessions/{a['id']}/viewers", json={"share": True}, headers=bearer(a["session_token"])
        )
        tokens = {
            "session": a["session_token"],
            "watch": share.json()["watch_token"],
            "client": await client_token(svc),
        }
        b = (await svc.create(headers=BOB)).json()["id"]
        c = (await svc.create(headers=ALICE)).json()["id"]
        document = (await svc.client.get("/openapi.json")).json()
        operations = [
            (method.upper(), template)
            for template, methods in document["paths"].items()
            for method in methods
            if template not in _OPEN_ROUTES
        ]
        assert ("POST", "/v1/sessions") in operations
        walked = 0
        for method, template in operations:
            body = {"sdp": "v=0", "type": "offer"} if method == "POST" else None
            for kind, token in tokens.items():
                for in_query in (False, True):
                    call = (svc, method, template, body, token, in_query)
                    unknown = await _ask(*call, _NOBODY)
                    for victim in (b, c):
                        answer = await _ask(*call, victim)
                        where = (kind, method, template, in_query)
                        assert answer.status_code >= 400, (*where, answer.status_code)
                        # the answer a session that never existed gets: nothing tells B or C exists
                        assert answer.status_code == unknown.status_code, where
                        assert answer.text.replace(victim, _NOBODY) == unknown.text, where
                        walked += 1
        assert walked >= len(operations) * 12
        # the sessions were never touched
        for sid, headers in ((b, BOB), (c, ALICE)):
            assert (await svc.client.get(f"/v1/sessions/{sid}", headers=headers)).json()["status"] == "running"


# Operations that read no API key or token (nothing to refuse; their own checks are tested elsewhere): health,
# metrics, LiveKit's signed webhook.
_OPEN_ROUTES = frozenset({"/healthz", "/readyz", "/metrics", "/v1/livekit/webhook"})


def test_tokens_never_reach_a_log_line(caplog: pytest.LogCaptureFixture) -> None:
    token = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJrZXkifQ.c2lnbmF0dXJlX29mX3Rva2Vu"
    record = logging.LogRecord(
        "uvicorn.access",
        logging.INFO,
        __file__,
        1,
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:1", "GET", f"/?watch=abc&token={token}", "1.1", 200),
        None,
    )
    TokenRedactionFilter().filter(record)
    assert token not in record.getMessage()
    assert "token=[redacted]" in record.getMessage()
    record = logging.LogRecord("x", logging.INFO, __file__, 1, f"Authorization: Bearer {token}", None, None)
    TokenRedactionFilter().filter(record)
    assert token not in record.getMessage()
