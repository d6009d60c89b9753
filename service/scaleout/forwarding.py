"""`Forwarder`: a replica passes a session's transport route on to the replica that runs the session (issue #33).

A few routes act on the transport of the replica that runs the session: the embedded transport's WebRTC offer, a
viewer's details, a viewer's offer (`ForwardedRoute`). Behind a plain load balancer (a Kubernetes Service without
affinity to the replica that adopted a session, or that admitted it from the queue) they reach any replica. Every
replica advertises an address the others reach (`LINGSTREAM_REPLICA_URL`, kept in Redis with its liveness key, the
same TTL: `RedisAdmission.replica_url`); one that gets such a route for a session another live replica runs sends
the request there and answers with the owner's answer. The media then flows between the client and the owner
directly (the owner's ICE candidates are in its SDP answer).

What is forwarded, and what is not:

- only the fixed paths of `ForwardedRoute` (built from the route and the session id, never from the request's URL),
  only to an address a live replica advertised in Redis (checked by `check_replica_url` again when read): a caller
  chooses neither where nor what;
- the method, the query, the body, and the allowed request headers (`request_headers`: the caller's
  `Authorization`, `Content-Type`, `Accept`, `Origin`, the trace context), never hop-by-hop or others; the owner
  checks the credential as for any request. The answer's status, body and allowed headers (`answer_headers`) come
  back, with `Lingstream-Forwarded-To` naming the owner;
- one hop only: a forwarded request carries `Lingstream-Forwarded-By: <replica id>`, and a replica that gets one for
  a session it does not run answers 409 `session_on_other_replica` (`ForwardOutcome.LOOP`): the owner may have
  changed a moment ago, the client's retry finds the new one;
- no address (the owner advertises none, or its liveness lapsed), Redis unreachable, the owner unreachable or slower
  than `timeout_s`: 409 `session_on_other_replica` as without forwarding, saying that a retry may succeed.

`Forwarder.forward` decides in that order (pure checks first, then one Redis read, then one HTTP request); every
outcome is reported to `on_result(route, outcome)` (`lingstream_forwarded_requests_total`). Cancelling `forward`
cancels the request in flight.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote, urlsplit

import httpx

from admission import AdmissionError
from service.errors import ServiceError, SessionElsewhereError

__all__ = [
    "FORWARDED_BY",
    "FORWARDED_TO",
    "FORWARD_TIMEOUT_S",
    "ForwardOutcome",
    "ForwardedAnswer",
    "ForwardedRoute",
    "Forwarder",
    "ReplicaDirectory",
    "ResultHook",
    "answer_headers",
    "check_replica_url",
    "request_headers",
    "was_forwarded",
]

logger = logging.getLogger(__name__)

FORWARDED_BY = "Lingstream-Forwarded-By"
"""The header a forwarded request carries: the id of the replica that forwarded it (one hop only)."""
FORWARDED_TO = "Lingstream-Forwarded-To"
"""The header of a forwarded answer: the id of the replica that answered it."""
FORWARD_TIMEOUT_S = 10.0
"""How long the owner may take to answer a forwarded request (an offer's answer waits for the owner's ICE
gathering, a second or two): past it, 409 `session_on_other_replica` (the client's reconnect retries)."""

# Lower-case names. Everything else stays behind: hop-by-hop headers (Connection, Keep-Alive, TE, Upgrade,
# Transfer-Encoding, Proxy-*), Host (the owner's), cookies, and whatever a client adds.
_REQUEST_HEADERS = frozenset(
    {"authorization", "content-type", "accept", "origin", "user-agent", "traceparent", "tracestate"}
)
_ANSWER_HEADERS = frozenset({"content-type", "retry-after", "www-authenticate", "lingstream-replica", "location"})


class ForwardedRoute(enum.Enum):
    """A transport route a replica forwards to the session's owner (the value is the metrics label)."""

    OFFER = "webrtc"  # POST /v1/sessions/{id}/webrtc: the controller's offer (embedded transport)
    VIEWERS = "viewers"  # POST /v1/sessions/{id}/viewers: a viewer's details (minted by the owner's transport)
    WATCH = "watch"  # POST /v1/sessions/{id}/watch: a viewer's offer (its credential is good only on the owner)

    def path(self, session_id: str) -> str:
        """The route's fixed path for `session_id` (quoted: an id can never name another path)."""
        return f"/v1/sessions/{quote(session_id, safe='')}/{self.value}"


class ForwardOutcome(enum.Enum):
    """What became of a request to forward (the value is the metrics label)."""

    ANSWERED = "answered"  # the owner answered (whatever its status): its answer was returned
    LOOP = "loop"  # the request was forwarded already: 409 here
    NO_URL = "no_url"  # the owner advertises no address, or its liveness lapsed, or Redis could not say: 409
    UNREACHABLE = "unreachable"  # connecting to the owner or reading its answer failed: 409
    TIMEOUT = "timeout"  # the owner did not answer within the timeout: 409


@dataclass(frozen=True, slots=True)
class ForwardedAnswer:
    """The owner's answer, to be returned as is: its status, body and the allowed headers."""

    status: int
    body: bytes
    headers: tuple[tuple[str, str], ...]


class ReplicaDirectory(Protocol):
    """Where the replicas are (the Redis backend: `RedisAdmissionBackend`)."""

    async def replica_url(self, replica_id: str) -> str | None:
        """The address `replica_id` advertises while it is alive (None: none, or lapsed). May raise `ServiceError`
        (Redis unreachable) or `AdmissionError` (closing)."""
        ...

    async def runs_on(self, session_id: str) -> str | None:
        """The other replica that runs `session_id` now, for a route that has no API key to look it up with (a
        viewer's offer); None when this replica runs it, nobody does, or it is unknown."""
        ...


ResultHook = Callable[[ForwardedRoute, ForwardOutcome], None]


def check_replica_url(value: str) -> str:
    """A replica's base URL as the others may use it: `http://` or `https://`, a host, no credentials, no query or
    fragment, no path beyond `/`; returned without a trailing slash. `ValueError` otherwise (the setting's message).
    An IPv6 host written without brackets (`http://fd00::7:8000`, what the chart's `http://$(POD_IP):<port>` gives
    on an IPv6 pod) is read as address and port, and returned bracketed."""
    parts = urlsplit(_bracket_ipv6(value))
    try:
        host = parts.hostname if parts.port is not None or not parts.netloc.endswith(":") else None
    except ValueError:  # a port that is not a number
        host = None
    if parts.scheme not in ("http", "https") or not host:
        raise ValueError(f"must be an http:// or https:// URL with a host (e.g. http://10.0.3.7:8000), got {value!r}")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials")
    if parts.query or parts.fragment or parts.path not in ("", "/"):
        raise ValueError(f"must be the service's base URL, without a path, query or fragment, got {value!r}")
    return f"{parts.scheme}://{parts.netloc}"


def _bracket_ipv6(value: str) -> str:
    """`scheme://<IPv6 address>:<port>[/]` with the brackets the address needs; any other value as it is."""
    scheme, sep, rest = value.partition("://")
    netloc, slash, path = rest.partition("/")
    if not sep or "[" in netloc or "@" in netloc or netloc.count(":") < 2:
        return value
    host, _, port = netloc.rpartition(":")
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return value
    return f"{scheme}://[{host}]:{port}{slash}{path}"


def request_headers(headers: Iterable[tuple[str, str]], forwarded_by: str) -> dict[str, str]:
    """The headers the forwarded request carries: the allowed ones of the caller's, and `Lingstream-Forwarded-By`."""
    kept = {name.lower(): value for name, value in headers if name.lower() in _REQUEST_HEADERS}
    kept[FORWARDED_BY.lower()] = forwarded_by
    return kept


def answer_headers(headers: Iterable[tuple[str, str]], answered_by: str) -> tuple[tuple[str, str], ...]:
    """The headers of the owner's answer that go back to the caller, and `Lingstream-Forwarded-To`."""
    kept = [(name.lower(), value) for name, value in headers if name.lower() in _ANSWER_HEADERS]
    return (*kept, (FORWARDED_TO.lower(), answered_by))


def was_forwarded(headers: Iterable[tuple[str, str]]) -> bool:
    """Whether a request came from another replica (it carries `Lingstream-Forwarded-By`)."""
    return any(name.lower() == FORWARDED_BY.lower() for name, _ in headers)


class Forwarder:
    """Forwards a transport route to the replica that runs the session (see the module docstring).

    `replica_id` is this replica's (sent in `Lingstream-Forwarded-By`); `directory` says where replicas are;
    `transport` replaces httpx's network transport (tests: `httpx.MockTransport`); `timeout_s` bounds each request;
    `on_result` is told every outcome. `aclose()` closes the HTTP client.
    """

    def __init__(
        self,
        replica_id: str,
        directory: ReplicaDirectory,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = FORWARD_TIMEOUT_S,
        on_result: ResultHook | None = None,
    ) -> None:
        self._replica = replica_id
        self._directory = directory
        self._on_result = on_result
        # No redirects (an answer goes back as it is), no proxies from the environment (the owner is on the pods'
        # network), a pool shared by every forwarded request of this replica.
        self._client = httpx.AsyncClient(
            transport=transport, timeout=httpx.Timeout(timeout_s), follow_redirects=False, trust_env=False
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def runs_on(self, session_id: str) -> str | None:
        """The other replica that runs `session_id` (None: this one, nobody, unknown, or Redis could not say)."""
        try:
            return await self._directory.runs_on(session_id)
        except (ServiceError, AdmissionError):
            return None

    async def forward(
        self,
        route: ForwardedRoute,
        elsewhere: SessionElsewhereError,
        *,
        method: str,
        headers: Iterable[tuple[str, str]],
        query: str,
        body: bytes,
    ) -> ForwardedAnswer:
        """Send the request to `elsewhere.replica` and return its answer; raises a `SessionElsewhereError` (409)
        when the request was forwarded already or the owner cannot be reached (see the module docstring)."""
        headers = tuple(headers)
        owner = elsewhere.replica
        if was_forwarded(headers):
            self._report(route, ForwardOutcome.LOOP)
            raise elsewhere
        try:
            advertised = await self._directory.replica_url(owner)
        except (ServiceError, AdmissionError) as exc:
            logger.info("forwarding %s to %s: cannot read its address: %s", route.value, owner, exc)
            advertised = None
        base = _checked(advertised, owner)
        if base is None:
            self._report(route, ForwardOutcome.NO_URL)
            raise _refused(elsewhere, "it advertises no address (LINGSTREAM_REPLICA_URL) or is no longer alive")
        url = base + route.path(elsewhere.session_id) + (f"?{query}" if query else "")
        try:
            answer = await self._client.request(
                method, url, headers=request_headers(headers, self._replica), content=body
            )
        except httpx.TimeoutException:
            self._report(route, ForwardOutcome.TIMEOUT)
            raise _refused(elsewhere, "it did not answer in time") from None
        except httpx.HTTPError as exc:
            logger.info("forwarding %s to %s failed: %r", route.value, owner, exc)
            self._report(route, ForwardOutcome.UNREACHABLE)
            raise _refused(elsewhere, "it could not be reached") from None
        self._report(route, ForwardOutcome.ANSWERED)
        return ForwardedAnswer(answer.status_code, answer.content, answer_headers(answer.headers.items(), owner))

    def _report(self, route: ForwardedRoute, outcome: ForwardOutcome) -> None:
        if self._on_result is not None:
            self._on_result(route, outcome)


def _checked(advertised: str | None, owner: str) -> str | None:
    """An address read from Redis, checked as the setting is (anything else there is not used)."""
    if advertised is None:
        return None
    try:
        return check_replica_url(advertised)
    except ValueError as exc:
        logger.warning("replica %s advertises an address that is not used: %s", owner, exc)
        return None


def _refused(elsewhere: SessionElsewhereError, why: str) -> SessionElsewhereError:
    return SessionElsewhereError(
        elsewhere.session_id,
        elsewhere.replica,
        detail=f"this replica could not forward the request there: {why}; retry shortly (the session may be moving "
        "to another replica)",
    )
