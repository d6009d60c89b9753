"""The shared session registry as the service reads it: what a replica stores in Redis about a session, and how
any replica turns that record back into a `SessionSnapshot`.

With the redis admission backend (`service.scaleout.runtime`) a session's ticket hash is also its registry record:
admission's own fields (state, position, owner replica, failure) plus what the owner replica publishes (a status,
its reason and a JSON body). This module owns the two formats the service puts there and their decoding:

- the *payload* of a create: the client's config and image, so that whichever replica admits the session can run
  `prepare` again (`encode_payload` / `decode_payload`; a `PreparedSession` cannot cross processes), and the
  caller's LiveKit room it is to be published into, if any (`payload_caller_room`);
- the *body*: a compact JSON form of a `SessionSnapshot` (config, video size, transport details, error), written at
  create time and on every status change of the owner (`encode_body`);
- `remote_snapshot`: the snapshot a GET on any replica answers, admission's fields winning over the body where they
  are newer (a live queue position, a session failed because its replica died);
- `RegistryStream`: an event stream (SSE) of a session this replica does not run, fed by the admission events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from admission import AdmissionClosedError, TicketState, UnknownTicketError
from service.errors import AdmissionUnavailableError
from service.runtime.sessions import TERMINAL_STATES, SessionSnapshot, SessionState
from service.scaleout.redis_side.records import SharedTicketView
from transport.base import CallerRoom, ResumedRoom

__all__ = [
    "CreatePayload",
    "RegistryStream",
    "body_resumed_room",
    "body_webhook_url",
    "decode_payload",
    "encode_body",
    "encode_payload",
    "failed_body",
    "payload_caller_room",
    "payload_records",
    "remote_snapshot",
]

logger = logging.getLogger(__name__)

_QUEUE_ONLY_STATES = frozenset({SessionState.QUEUED, SessionState.EXPIRED, SessionState.CANCELLED})
_LOST_MESSAGES = {
    "replica_lost": "the replica that ran the session ({replica}) stopped responding; the session was lost",
    "admission_record_lost": "the shared admission backend lost the session's record; the session was stopped",
    "admission_state_lost": "the shared admission backend lost the queued session; create it again",
}


# --------------------------------------------------------------------------------------------- payload and body


@dataclass(frozen=True, slots=True)
class CreatePayload:
    """A create request as the replica that admits it rebuilds the session from: the worker's config, the image
    bytes, and the session's running-time limit (the caller's room: `payload_caller_room`)."""

    config: dict[str, object]
    image: bytes | None
    max_seconds: float | None = None
    webhook_url: str | None = None


def encode_payload(
    config: Mapping[str, object],
    image: bytes | None,
    caller_room: CallerRoom | None = None,
    *,
    record: bool = False,
    max_seconds: float | None = None,
    webhook_url: str | None = None,
) -> bytes:
    """The create request as bytes: one JSON line (the config, the caller's room, whether the session is recorded,
    its time limit), then the raw image bytes."""
    fields: dict[str, object] = {"config": dict(config), "image": image is not None, "max_seconds": max_seconds}
    if caller_room is not None:
        # A caller's token rides along (the replica that admits the session joins with it): the payload is as
        # secret as the token, and lives only as long as the queued create.
        fields["livekit"] = {
            "room": caller_room.name,
            "controller_identity": caller_room.controller_identity,
            "url": caller_room.url,
            "token": caller_room.token,
            "agent_identity": caller_room.agent_identity,
        }
    if record:
        fields["record"] = True
    if webhook_url is not None:
        fields["webhook_url"] = webhook_url
    return json.dumps(fields, separators=(",", ":")).encode() + b"\n" + (image or b"")


def payload_caller_room(raw: bytes) -> CallerRoom | None:
    """The caller's LiveKit room of an `encode_payload` payload (None when it named none); `ValueError` for a
    malformed one."""
    head = json.loads(raw.partition(b"\n")[0])
    room = head.get("livekit") if isinstance(head, dict) else None
    if room is None:
        return None
    if not isinstance(room, dict) or not isinstance(room.get("room"), str):
        raise ValueError("not a lingstream create payload")

    def text(name: str) -> str | None:
        value = room.get(name)
        return value if isinstance(value, str) else None

    return CallerRoom(
        room["room"],
        text("controller_identity"),
        url=text("url"),
        token=text("token"),
        agent_identity=text("agent_identity"),
    )


def payload_records(raw: bytes) -> bool:
    """Whether the create request in `raw` (from `encode_payload`) asked for a recording."""
    head, _, _ = raw.partition(b"\n")
    data = json.loads(head)
    return isinstance(data, dict) and data.get("record") is True


def decode_payload(raw: bytes) -> CreatePayload:
    """`encode_payload` reversed; raises `ValueError` for anything else."""
    head, separator, image = raw.partition(b"\n")
    data = json.loads(head) if separator else None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise ValueError("not a lingstream create payload")
    limit = data.get("max_seconds")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int | float) or limit <= 0):
        raise ValueError("not a lingstream create payload: max_seconds")
    hook = data.get("webhook_url")
    if hook is not None and not isinstance(hook, str):
        raise ValueError("not a lingstream create payload: webhook_url")
    return CreatePayload(
        data["config"], image if data.get("image") else None, None if limit is None else float(limit), hook
    )


def encode_body(snapshot: SessionSnapshot, *, webhook_url: str | None = None) -> str:
    """The registry body of a snapshot (compact JSON; join details included, so Redis must be trusted), with the
    create's own webhook endpoint (`body_webhook_url`: where the replica that declares it lost sends its end)."""
    return json.dumps(
        {
            "state": snapshot.state.value,
            "reason": snapshot.reason,
            "created_at": snapshot.created_at,
            "updated_at": snapshot.updated_at,
            "transport": None if snapshot.transport is None else dict(snapshot.transport),
            "config": dict(snapshot.config),
            "width": snapshot.width,
            "height": snapshot.height,
            "fps": snapshot.fps,
            "error": None if snapshot.error is None else list(snapshot.error),
            "max_seconds": snapshot.max_seconds,
            "ends_at": snapshot.ends_at,
            "record": snapshot.record,  # the recording itself is the owning replica's (served there only)
            "webhook_url": webhook_url,
        },
        separators=(",", ":"),
        default=str,
    )


def body_webhook_url(raw: str | None) -> str | None:
    """The create's own webhook endpoint a body (`encode_body`) carries, if any."""
    return _text(_decode_body(raw).get("webhook_url"))


def body_resumed_room(raw: str | None) -> ResumedRoom | None:
    """The LiveKit room a session streamed in, from the join details its old replica (lost, or handing it off)
    published in the body: what an adopter joins again (`SessionPort.resumed_room`), the service's own room or a
    caller's. None without LiveKit details."""
    details = _decode_body(raw).get("transport")
    if not isinstance(details, dict) or details.get("kind") != "livekit":
        return None
    room, controller, service = details.get("room"), details.get("identity"), details.get("service_identity")
    if not (isinstance(room, str) and isinstance(controller, str) and isinstance(service, str)):
        return None
    return ResumedRoom(room, controller, service)


def failed_body(raw: str | None, state: SessionState, code: str, message: str) -> str:
    """A body `raw` (the one stored at create time) for a session that ended before it ran: `state` (failed, or
    closed at shutdown) with `code` as its reason, and the error when it failed."""
    body = _decode_body(raw)
    body.update(state=state.value, reason=code, error=[code, message] if state is SessionState.FAILED else None)
    return json.dumps(body, separators=(",", ":"), default=str)


def _decode_body(raw: str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        logger.warning("registry: ignoring a body that is not JSON")
        return {}
    return body if isinstance(body, dict) else {}


# --------------------------------------------------------------------------------------------- snapshots


def remote_snapshot(view: SharedTicketView) -> SessionSnapshot:
    """The session as the registry knows it: admission's state and position, the owner's status and body, and a
    failure recorded by admission itself (a dead replica, lost records) over anything the owner said."""
    body = _decode_body(view.body)
    state = _state_of(view)
    failure = view.failure
    if state in (SessionState.EXPIRED, SessionState.CANCELLED):
        reason = failure or (view.reason.value if view.reason is not None else state.value)
    elif state is SessionState.QUEUED:
        reason = None
    else:
        reason = failure or view.status_reason or _text(body.get("reason"))
    error: tuple[str, str] | None = None
    if state is SessionState.FAILED:
        if failure:
            code = failure.split(":", 1)[0].strip()
            template = _LOST_MESSAGES.get(code, "the session failed ({failure})")
            error = (code, template.format(replica=view.replica or "?", failure=failure))
        elif isinstance(body.get("error"), list) and len(body["error"]) == 2:
            error = (str(body["error"][0]), str(body["error"][1]))
        else:
            error = (reason or "failed", f"the session failed ({reason or 'no reason given'})")
    transport = body.get("transport")
    updated = _number(body.get("updated_at")) or view.ended_at or view.admitted_at or view.created_at
    return SessionSnapshot(
        id=view.ticket_id,
        state=state,
        reason=reason,
        queue_position=view.position if state is SessionState.QUEUED else None,
        created_at=_number(body.get("created_at")) or view.created_at,
        updated_at=max(updated, view.ended_at or 0.0),
        transport=MappingProxyType(dict(transport)) if isinstance(transport, dict) else None,
        config=MappingProxyType(dict(body["config"])) if isinstance(body.get("config"), dict) else MappingProxyType({}),
        width=int(_number(body.get("width")) or 0),
        height=int(_number(body.get("height")) or 0),
        fps=float(_number(body.get("fps")) or 0.0),
        error=error,
        sequence=view.version,
        max_seconds=_number(body.get("max_seconds")),
        ends_at=_number(body.get("ends_at")),
        record=body.get("record") is True,
    )


def _state_of(view: SharedTicketView) -> SessionState:
    if view.state is TicketState.QUEUED:
        return SessionState.QUEUED
    if view.state is TicketState.EXPIRED:
        return SessionState.EXPIRED
    if view.state in (TicketState.CANCELLED, TicketState.REJECTED):
        return SessionState.CANCELLED
    if view.failure:
        return SessionState.FAILED
    try:
        status = SessionState(view.status) if view.status else None
    except ValueError:
        status = None
    ended = view.state is TicketState.RELEASED
    if status is None or status in _QUEUE_ONLY_STATES:
        return SessionState.CLOSED if ended else SessionState.ADMITTED
    if ended and status not in TERMINAL_STATES:
        return SessionState.CLOSED  # released without a final status (its owner could not publish it)
    return status


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


# --------------------------------------------------------------------------------------------- event streams


class RegistryStream:
    """The event stream of a session followed through the registry (queued anywhere, or run by another replica).

    Problem: an SSE client may be on any replica, while the session's changes happen in Redis (queue moves) or on
    its owner replica (status changes). Every replica hears every ticket's admission events; each one of this
    session's wakes the stream, which then reads the record once (coalescing whatever came meanwhile) and yields a
    snapshot when anything a client sees changed (state, position, status). Example::

        stream = RegistryStream(read, first_view, follow=runtime.follow_ticket)
        with stream:
            snapshot = await anext(stream)        # ends (StopAsyncIteration) after the terminal snapshot

    Ordering: snapshots in the order read; each carries a sequence one above the previous (the SSE id).
    Backpressure: none needed, one pending wake at most (a flag, not a queue). Cancellation: cancelling a pending
    `__anext__` loses nothing (the wake is kept for the next call). While Redis is unreachable no events come and
    the stream waits. `follow(ticket_id, wake)` registers the wake and returns its unregister. `close()` ends it,
    a pending `__anext__` included (StopAsyncIteration, without another read): the SSE response that reads it ends,
    and its client follows the session again through another replica (a draining one closes them all).
    """

    def __init__(
        self,
        read: Callable[[str], Awaitable[SharedTicketView]],
        first: SharedTicketView,
        *,
        follow: Callable[[str, asyncio.Event], Callable[[], None]],
    ) -> None:
        self._read = read
        self._id = first.ticket_id
        self._wake = asyncio.Event()
        self._stop_following = follow(self._id, self._wake)
        self._last = _seen(first)
        self._sequence = first.version
        self._ended = remote_snapshot(first).terminal
        self._closed = False

    def __enter__(self) -> RegistryStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __aiter__(self) -> RegistryStream:
        return self

    async def __anext__(self) -> SessionSnapshot:
        while True:
            if self._ended or self._closed:
                raise StopAsyncIteration
            await self._wake.wait()
            self._wake.clear()
            if self._closed:
                raise StopAsyncIteration  # closed while waiting (the replica drains): nothing more is read
            try:
                view = await self._read(self._id)
            except asyncio.CancelledError:
                self._wake.set()
                raise
            except (AdmissionUnavailableError, AdmissionClosedError):
                continue  # no events come while Redis is away; a wake after it returns reads again
            except UnknownTicketError:
                continue  # Redis lost its data: the owner re-creates the record, or the creator reports it lost
            seen = _seen(view)
            if seen == self._last:
                continue
            self._last = seen
            snapshot = remote_snapshot(view)
            self._sequence += 1
            self._ended = snapshot.terminal
            return dataclasses.replace(snapshot, sequence=self._sequence)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._stop_following()
            self._wake.set()


def _seen(view: SharedTicketView) -> tuple[object, ...]:
    return (view.state, view.position, view.status, view.status_reason, view.failure, view.version)
