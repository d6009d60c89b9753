"""Tokens across two replicas on one real redis-server (issue #35): a client token's creates are counted once for the
deployment whichever replica takes them, a session token made by one replica works on the other, and a share revoked
on one is refused by the other."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx

from tests.support.fakes.redis_server import RedisServer
from tests.support.service_harness import Harness, running_service

KEY = "key-alice-0123456789abcdef"
ALICE = {"Authorization": f"Bearer {KEY}"}
SECRET = "token-secret-for-tests-0123456789abcdef"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def code(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


@contextlib.asynccontextmanager
async def replicas(redis_server: RedisServer) -> AsyncIterator[tuple[Harness, Harness]]:
    settings: dict[str, Any] = {
        "api_keys": KEY,
        "token_secret": SECRET,
        "admission_backend": "redis",
        "redis_url": redis_server.url,
        "max_sessions_per_worker": 4,
    }
    async with (
        running_service(replica_id="replica-a", **settings) as a,
        running_service(replica_id="replica-b", **settings) as b,
    ):
        yield a, b


async def test_a_client_tokens_creates_are_counted_across_replicas(redis_server: RedisServer) -> None:
    async with replicas(redis_server) as (a, b):
        minted = await a.client.post("/v1/client_tokens", json={"max_creates": 2}, headers=ALICE)
        token = minted.json()["token"]
        first = await a.create(headers=bearer(token))
        second = await b.create(headers=bearer(token))
        assert (first.status_code, second.status_code) == (201, 201), (first.text, second.text)
        for replica in (a, b):
            assert code(await replica.create(headers=bearer(token))) == (403, "token_exhausted")
        # the session token one replica made reads its session on the other
        session = first.json()
        read = await b.client.get(f"/v1/sessions/{session['id']}", headers=bearer(session["session_token"]))
        assert read.status_code == 200
        assert read.json()["id"] == session["id"]


async def test_a_share_revoked_on_one_replica_is_refused_by_the_other(redis_server: RedisServer) -> None:
    async with replicas(redis_server) as (a, b):
        created = (await a.create(headers=ALICE)).json()
        sid = created["id"]
        # no transport here: a share link needs one, so make its watch token as the replica would
        codec = a.app.state.authenticator.codec
        watch, grant = codec.mint_watch(a.app.state.authenticator.keys.match(KEY), sid, expires_at=codec.now() + 60)
        assert (await b.client.get(f"/v1/sessions/{sid}", headers=bearer(watch))).status_code == 200
        revoked = await a.client.delete(f"/v1/sessions/{sid}/viewers/{grant.share_id}", headers=ALICE)
        assert revoked.status_code == 200
        assert code(await b.client.get(f"/v1/sessions/{sid}", headers=bearer(watch))) == (401, "token_revoked")
