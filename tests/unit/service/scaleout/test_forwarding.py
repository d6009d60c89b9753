"""`Forwarder`: a transport route of a session another replica runs goes to that replica's advertised address, once,
with the caller's credential and nothing else; anything in the way answers 409 as without forwarding. The HTTP seam
is httpx's own (`httpx.MockTransport`: the owner replica as the test writes it), the directory a dictionary."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from service.errors import AdmissionUnavailableError, SessionElsewhereError, lookup
from service.scaleout.forwarding import (
    FORWARDED_BY,
    FORWARDED_TO,
    ForwardedRoute,
    Forwarder,
    ForwardOutcome,
    ResultHook,
    answer_headers,
    check_replica_url,
    request_headers,
    was_forwarded,
)

pytestmark = pytest.mark.timeout(10)


class Directory:
    """Replica id -> advertised address; `down` makes every read fail as an unreachable Redis does."""

    def __init__(self, urls: dict[str, str], runs: dict[str, str] | None = None) -> None:
        self.urls = urls
        self.runs = runs or {}
        self.down = False
        self.reads: list[str] = []

    async def replica_url(self, replica_id: str) -> str | None:
        self.reads.append(replica_id)
        if self.down:
            raise AdmissionUnavailableError("the shared admission backend is unavailable; retry shortly")
        return self.urls.get(replica_id)

    async def runs_on(self, session_id: str) -> str | None:
        if self.down:
            raise AdmissionUnavailableError("the shared admission backend is unavailable; retry shortly")
        return self.runs.get(session_id)


def _owner(seen: list[httpx.Request], status: int = 200) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            status,
            json={"sdp": "v=0 answer", "type": "answer"},
            headers={"Connection": "close", "Set-Cookie": "a=b", "Retry-After": "3", "X-Internal": "1"},
        )

    return httpx.MockTransport(handle)


def _recorder() -> tuple[list[tuple[ForwardedRoute, ForwardOutcome]], ResultHook]:
    results: list[tuple[ForwardedRoute, ForwardOutcome]] = []
    return results, lambda route, outcome: results.append((route, outcome))


CALLER = [
    ("Authorization", "Bearer session-token"),
    ("Content-Type", "application/json"),
    ("Origin", "https://game.example"),
    ("Connection", "keep-alive"),
    ("Keep-Alive", "timeout=5"),
    ("Transfer-Encoding", "chunked"),
    ("Upgrade", "h2c"),
    ("Proxy-Authorization", "Basic eA=="),
    ("Host", "front-door.example"),
    ("Cookie", "session=1"),
    ("X-Forwarded-For", "10.0.0.9"),
]


def _elsewhere(session: str = "s-1", replica: str = "r1") -> SessionElsewhereError:
    return SessionElsewhereError(session, replica)


async def test_an_offer_goes_to_the_owners_address_and_its_answer_comes_back() -> None:
    seen: list[httpx.Request] = []
    results, hook = _recorder()
    forwarder = Forwarder("r2", Directory({"r1": "http://10.0.3.7:8000"}), transport=_owner(seen, 201), on_result=hook)
    try:
        answer = await forwarder.forward(
            ForwardedRoute.OFFER, _elsewhere(), method="POST", headers=CALLER, query="a=1", body=b'{"sdp":"v=0"}'
        )
    finally:
        await forwarder.aclose()
    (request,) = seen
    assert str(request.url) == "http://10.0.3.7:8000/v1/sessions/s-1/webrtc?a=1"
    assert request.method == "POST"
    assert request.content == b'{"sdp":"v=0"}'
    assert request.headers["authorization"] == "Bearer session-token"
    assert request.headers["origin"] == "https://game.example"
    assert request.headers[FORWARDED_BY] == "r2"
    for hop in ("keep-alive", "transfer-encoding", "upgrade", "proxy-authorization", "cookie", "x-forwarded-for"):
        assert hop not in request.headers, hop
    assert request.headers["host"] == "10.0.3.7:8000"  # the owner's, not the front door's
    assert answer.status == 201
    assert answer.body == b'{"sdp":"v=0 answer","type":"answer"}'
    headers = dict(answer.headers)
    assert headers["content-type"] == "application/json"
    assert headers["retry-after"] == "3"
    assert headers[FORWARDED_TO.lower()] == "r1"
    assert not {"connection", "set-cookie", "x-internal"} & set(headers)
    assert results == [(ForwardedRoute.OFFER, ForwardOutcome.ANSWERED)]


async def test_the_owners_refusal_is_returned_as_it_is() -> None:
    seen: list[httpx.Request] = []
    forwarder = Forwarder("r2", Directory({"r1": "http://10.0.3.7:8000/"}), transport=_owner(seen, 401))
    try:
        answer = await forwarder.forward(
            ForwardedRoute.WATCH, _elsewhere(), method="POST", headers=[], query="", body=b""
        )
    finally:
        await forwarder.aclose()
    assert answer.status == 401
    assert str(seen[0].url) == "http://10.0.3.7:8000/v1/sessions/s-1/watch"


async def test_a_session_id_cannot_name_another_path() -> None:
    seen: list[httpx.Request] = []
    forwarder = Forwarder("r2", Directory({"r1": "http://10.0.3.7:8000"}), transport=_owner(seen))
    try:
        await forwarder.forward(
            ForwardedRoute.VIEWERS, _elsewhere("../../internal/drain?x"), method="POST", headers=[], query="", body=b""
        )
    finally:
        await forwarder.aclose()
    assert seen[0].url.raw_path == b"/v1/sessions/..%2F..%2Finternal%2Fdrain%3Fx/viewers"


async def test_a_forwarded_request_is_never_forwarded_again() -> None:
    seen: list[httpx.Request] = []
    results, hook = _recorder()
    directory = Directory({"r1": "http://10.0.3.7:8000"})
    forwarder = Forwarder("r3", directory, transport=_owner(seen), on_result=hook)
    elsewhere = _elsewhere()
    try:
        with pytest.raises(SessionElsewhereError) as raised:
            await forwarder.forward(
                ForwardedRoute.OFFER,
                elsewhere,
                method="POST",
                headers=[*CALLER, ("lingstream-forwarded-by", "r2")],
                query="",
                body=b"",
            )
    finally:
        await forwarder.aclose()
    assert raised.value is elsewhere
    assert seen == []
    assert directory.reads == []
    assert results == [(ForwardedRoute.OFFER, ForwardOutcome.LOOP)]


@pytest.mark.parametrize(
    ("urls", "down", "outcome"),
    [
        ({}, False, ForwardOutcome.NO_URL),  # advertises none, or its liveness lapsed
        ({"r1": "http://10.0.3.7:8000"}, True, ForwardOutcome.NO_URL),  # Redis unreachable
        ({"r1": "ftp://10.0.3.7"}, False, ForwardOutcome.NO_URL),  # not an address the setting allows
        ({"r1": "http://10.0.3.7:8000/elsewhere"}, False, ForwardOutcome.NO_URL),
    ],
)
async def test_an_owner_without_a_usable_address_answers_409(
    urls: dict[str, str], down: bool, outcome: ForwardOutcome
) -> None:
    seen: list[httpx.Request] = []
    results, hook = _recorder()
    directory = Directory(urls)
    directory.down = down
    forwarder = Forwarder("r2", directory, transport=_owner(seen), on_result=hook)
    try:
        with pytest.raises(SessionElsewhereError) as raised:
            await forwarder.forward(ForwardedRoute.OFFER, _elsewhere(), method="POST", headers=[], query="", body=b"")
    finally:
        await forwarder.aclose()
    assert seen == []
    assert raised.value.replica == "r1"
    assert "retry shortly" in str(raised.value)
    spec = lookup(raised.value)
    assert spec is not None
    assert (spec.status, spec.code) == (409, "session_on_other_replica")
    assert results == [(ForwardedRoute.OFFER, outcome)]


async def test_an_unreachable_owner_answers_409() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    results, hook = _recorder()
    forwarder = Forwarder(
        "r2", Directory({"r1": "http://10.0.3.7:8000"}), transport=httpx.MockTransport(refuse), on_result=hook
    )
    try:
        with pytest.raises(SessionElsewhereError, match="could not be reached"):
            await forwarder.forward(ForwardedRoute.OFFER, _elsewhere(), method="POST", headers=[], query="", body=b"")
    finally:
        await forwarder.aclose()
    assert results == [(ForwardedRoute.OFFER, ForwardOutcome.UNREACHABLE)]


async def test_an_owner_slower_than_the_timeout_answers_409() -> None:
    async def stall(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(5)  # the owner never answering in time
        return httpx.Response(200)

    results, hook = _recorder()
    forwarder = Forwarder(
        "r2",
        Directory({"r1": "http://10.0.3.7:8000"}),
        transport=_TimingOut(stall),
        timeout_s=0.05,
        on_result=hook,
    )
    try:
        with pytest.raises(SessionElsewhereError, match="did not answer in time"):
            await forwarder.forward(ForwardedRoute.OFFER, _elsewhere(), method="POST", headers=[], query="", body=b"")
    finally:
        await forwarder.aclose()
    assert results == [(ForwardedRoute.OFFER, ForwardOutcome.TIMEOUT)]


class _TimingOut(httpx.AsyncBaseTransport):
    """A transport that honours the request's read timeout as httpx's network transport does (MockTransport
    ignores timeouts): past it, `httpx.ReadTimeout`."""

    def __init__(self, handler: object) -> None:
        self._handler = handler

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        timeout = request.extensions["timeout"]["read"]
        try:
            async with asyncio.timeout(timeout):
                return await self._handler(request)  # type: ignore[operator,no-any-return]
        except TimeoutError:
            raise httpx.ReadTimeout("timed out", request=request) from None


async def test_runs_on_is_none_when_redis_cannot_say() -> None:
    directory = Directory({}, runs={"s-1": "r1"})
    forwarder = Forwarder("r2", directory)
    try:
        assert await forwarder.runs_on("s-1") == "r1"
        assert await forwarder.runs_on("s-2") is None
        directory.down = True
        assert await forwarder.runs_on("s-1") is None
    finally:
        await forwarder.aclose()


def test_which_routes_forward_and_their_fixed_paths() -> None:
    assert {route.path("s") for route in ForwardedRoute} == {
        "/v1/sessions/s/webrtc",
        "/v1/sessions/s/viewers",
        "/v1/sessions/s/watch",
    }


def test_header_filters_keep_only_the_allowed_ones() -> None:
    kept = request_headers(CALLER, "r2")
    assert kept == {
        "authorization": "Bearer session-token",
        "content-type": "application/json",
        "origin": "https://game.example",
        "lingstream-forwarded-by": "r2",
    }
    # A caller's own Lingstream-Forwarded-By is replaced by this replica's.
    assert request_headers([(FORWARDED_BY, "spoofed")], "r2") == {"lingstream-forwarded-by": "r2"}
    assert answer_headers([("Location", "/x"), ("Server", "uvicorn"), ("Lingstream-Replica", "r9")], "r1") == (
        ("location", "/x"),
        ("lingstream-replica", "r9"),
        ("lingstream-forwarded-to", "r1"),
    )
    assert was_forwarded([("LINGSTREAM-FORWARDED-BY", "r2")])
    assert not was_forwarded(CALLER)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("http://10.0.3.7:8000", "http://10.0.3.7:8000"),
        ("http://10.0.3.7:8000/", "http://10.0.3.7:8000"),
        ("https://pod-a.lingstream.svc:8443", "https://pod-a.lingstream.svc:8443"),
        ("http://[fd00::7]:8000", "http://[fd00::7]:8000"),
        # the chart's http://$(POD_IP):<port> on an IPv6 pod: bracketed here
        ("http://fd00::7:8000", "http://[fd00::7]:8000"),
        ("http://2001:db8:0:1::a:8000/", "http://[2001:db8:0:1::a]:8000"),
    ],
)
def test_replica_urls_that_are_accepted(value: str, expected: str) -> None:
    assert check_replica_url(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "10.0.3.7:8000",
        "ftp://10.0.3.7",
        "http://",
        "http://10.0.3.7:port",
        "http://10.0.3.7:",
        "http://user:secret@10.0.3.7:8000",
        "http://10.0.3.7:8000/v1",
        "http://10.0.3.7:8000?x=1",
        "http://10.0.3.7:8000#x",
        "http://fd00::zz:8000",
        "http://fd00::7:port",
    ],
)
def test_replica_urls_that_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="must"):
        check_replica_url(value)
