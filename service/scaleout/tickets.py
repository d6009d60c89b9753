"""`TicketCalls`: the ticket commands of one replica's `RedisAdmission`, each one script call and what its reply means.

Create, read, heartbeat, cancel, release, close and pause requests, the registry writes and reads, the payload and
the wait for admission. Each builds its script's arguments, runs it through the `RedisLink` and turns the reply into
a `SharedTicketView` or the `admission` error it stands for. What an outage leaves undone (a create whose outcome
is unknown, a release) is written into the mirror's `deferred` table for the maintenance pass to replay.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import secrets
import time
from typing import Any

from redis.exceptions import ResponseError

from admission import (
    AdmissionClosedError,
    AdmissionConfig,
    AdmissionInvariantError,
    IllegalTransitionError,
    KeyQuota,
    TicketExistsError,
    TicketReason,
    TicketState,
    UnknownTicketError,
)
from service.errors import AdmissionUnavailableError
from service.scaleout.link import UNAVAILABLE, UNAVAILABLE_MESSAGE, RedisLink
from service.scaleout.redis_side.mirror import ReplicaMirror
from service.scaleout.redis_side.records import (
    NotTicketOwnerError,
    ScriptReply,
    SharedAdmissionEvent,
    SharedTicketView,
    decode_fields,
    decode_text,
    decode_view,
)

__all__ = ["CLOSE_MODES", "TicketCalls"]

logger = logging.getLogger(__name__)

CLOSE_MODES = frozenset({"drain", "cancel"})


class TicketCalls:
    """The ticket commands (see `RedisAdmission` for the contract each one keeps; the details are here).

    Every call but `create` and `release` goes through `RedisLink.call`, so an outage raises
    `AdmissionUnavailableError`. Cancelling a call cancels only the wait for Redis: a cancelled `create` is aborted
    and a cancelled `release` replayed by the next maintenance pass.
    """

    def __init__(self, link: RedisLink, mirror: ReplicaMirror, config: AdmissionConfig) -> None:
        self._link = link
        self._mirror = mirror
        self._config = config
        self._waiters: dict[str, set[asyncio.Future[SharedTicketView]]] = {}
        mirror.subscribe(self._wake_waiters)

    async def create(
        self, owner: str, *, ticket_id: str | None = None, payload: bytes | None = None, body: str | None = None
    ) -> SharedTicketView:
        """ADMITTED onto this replica, QUEUED (global `position`), or REJECTED (QUEUE_FULL with `retry_after_s`,
        DRAINING, or RUNNING_QUOTA / QUEUED_QUOTA: the owner's quota from `config.quota_of(owner)`, checked in the
        same script as the admission decision). `payload` (opaque bytes, e.g. the request) is kept while the ticket
        waits, for whichever replica admits it (`take_payload`). `body` is the registry body from the start (what
        GETs on other replicas read until the owner publishes one). Raises `TicketExistsError`, and
        `AdmissionUnavailableError` while Redis cannot be reached."""
        self._link.require_started()
        ticket_id = ticket_id if ticket_id is not None else secrets.token_urlsafe(12)
        if self._mirror.draining:
            return self._reject(ticket_id, owner, TicketReason.DRAINING, None, time.time())
        if not self._link.available:
            raise AdmissionUnavailableError(UNAVAILABLE_MESSAGE)
        config = self._config
        heartbeat_ms = 0 if config.queue_heartbeat_timeout is None else round(config.queue_heartbeat_timeout * 1000)
        args: list[str | int | bytes] = [
            *(ticket_id, owner, secrets.token_hex(8), config.queue_size, round(config.queue_timeout * 1000)),
            *(heartbeat_ms, round(config.default_session_seconds * 1000), config.max_retry_after_s),
            *((1, payload) if payload is not None else (0, b"")),
            *((1, body) if body is not None else (0, "")),
            *_bounds(config.quota_of(owner)),
        ]
        self._mirror.create_started(ticket_id)  # the reply carries the position: the follower waits for it
        try:
            return await self._create_once(ticket_id, owner, args)
        finally:
            self._mirror.create_ended(ticket_id)

    async def _create_once(self, ticket_id: str, owner: str, args: list[str | int | bytes]) -> SharedTicketView:
        """The create script and what its reply means (`create`'s answers and errors)."""
        departures = self._mirror.departures
        try:
            reply = await self._link.run("create", *args)
        except UNAVAILABLE as exc:
            self._mirror.deferred[ticket_id] = "abort"  # it may exist: take it back once Redis answers
            self._link.lost_contact(exc)
            raise AdmissionUnavailableError(UNAVAILABLE_MESSAGE) from exc
        except asyncio.CancelledError:
            self._mirror.deferred[ticket_id] = "abort"
            self._link.kick.set()
            raise
        except ResponseError as exc:
            raise AdmissionInvariantError(f"admission script 'create' failed: {exc}") from exc
        if reply.code == "exists":
            raise TicketExistsError(ticket_id)
        if reply.code == "unregistered":
            self._link.registration_lapsed()
            raise AdmissionUnavailableError(UNAVAILABLE_MESSAGE)
        if reply.code == "rejected":
            reason, retry_after, now_ms = reply.result
            refusal = TicketReason(decode_text(reason))
            if refusal is not TicketReason.QUEUE_FULL:  # draining, or the owner's quota
                return self._reject(ticket_id, owner, refusal, None, int(now_ms) / 1000)
            return self._reject(ticket_id, owner, TicketReason.QUEUE_FULL, int(retry_after), int(now_ms) / 1000)
        view = decode_view(decode_fields(reply.result))
        if view.state is TicketState.QUEUED and self._mirror.departures == departures:
            self._mirror.position_current(ticket_id)  # nothing left the queue meanwhile: its position is exact
        return view

    async def get(self, ticket_id: str) -> SharedTicketView:
        return _ok(ticket_id, await self._link.call("get", ticket_id))

    async def heartbeat(self, ticket_id: str, *, owner: str | None = None) -> SharedTicketView:
        """Push a queued ticket's heartbeat deadline out (with `owner`, only if it is that owner's) and return the
        snapshot as `get` does, in one script call."""
        timeout = self._config.queue_heartbeat_timeout
        hb_ms = 0 if timeout is None else round(timeout * 1000)
        return _ok(ticket_id, await self._link.call("heartbeat", ticket_id, hb_ms, owner or ""))

    async def cancel(self, ticket_id: str) -> SharedTicketView:
        reply = await self._link.call("cancel", ticket_id)
        if reply.code == "illegal":
            hint = "an admitted session ends with release() by its owner, or request_close() from anywhere"
            raise IllegalTransitionError(ticket_id, "admitted", "cancelled", hint)
        return _ok(ticket_id, reply)

    async def release(self, ticket_id: str) -> SharedTicketView:
        """While Redis is unreachable, the release of a slot held here is remembered and replayed (the returned view
        is then this replica's own, marked RELEASED); a lost session the service stopped frees its slot here."""
        link = self._link
        link.require_started()
        zombie = self._mirror.end_zombie(ticket_id)  # a lost session the service stopped: its slot is free again
        try:
            reply = await link.run("release", ticket_id, self._config.session_length_window)
        except UNAVAILABLE as exc:
            link.lost_contact(exc)
            if zombie is not None:
                return zombie
            held = self._mirror.forget_held(ticket_id)
            if held is None:
                raise AdmissionUnavailableError(UNAVAILABLE_MESSAGE) from exc
            self._mirror.deferred[ticket_id] = "release"
            logger.warning("redis admission: release of %s deferred until Redis is back", ticket_id)
            return dataclasses.replace(held, state=TicketState.RELEASED, reason=TicketReason.SESSION_ENDED)
        except asyncio.CancelledError:
            if self._mirror.holds(ticket_id):
                self._mirror.deferred[ticket_id] = "release"
                link.kick.set()
            raise
        except ResponseError as exc:
            raise AdmissionInvariantError(f"admission script 'release' failed: {exc}") from exc
        if reply.code == "unknown" and zombie is not None:
            return zombie
        if reply.code == "elsewhere":
            raise NotTicketOwnerError(ticket_id, decode_view(decode_fields(reply.result)).replica)
        return _ok(ticket_id, reply)

    async def request_close(self, ticket_id: str, mode: str = "drain") -> SharedTicketView:
        if mode not in CLOSE_MODES:
            raise ValueError(f"mode must be one of {sorted(CLOSE_MODES)}, got {mode!r}")
        return _ok(ticket_id, await self._link.call("request_close", ticket_id, mode))

    async def request_pause(self, ticket_id: str, paused: bool) -> tuple[str, SharedTicketView]:
        reply = await self._link.call("request_pause", ticket_id, "pause" if paused else "resume")
        return reply.code, _ok(ticket_id, reply)

    async def publish_status(
        self,
        ticket_id: str,
        status: str,
        *,
        reason: str | None = None,
        body: str | None = None,
        paused_for_s: float | None = None,
    ) -> SharedTicketView:
        paused = "" if paused_for_s is None else str(max(0, round(paused_for_s * 1000)))
        args = (ticket_id, status, reason or "", *((1, body) if body is not None else (0, "")), paused)
        reply = await self._link.call("publish_status", *args)
        if reply.code == "elsewhere":
            raise NotTicketOwnerError(ticket_id, decode_view(decode_fields(reply.result)).replica)
        return _ok(ticket_id, reply)

    async def list_tickets(
        self, owner: str | None, state: TicketState | None, worker: int | None, replica: str | None
    ) -> tuple[SharedTicketView, ...]:
        filters = (owner or "", state.value if state else "", "" if worker is None else worker, replica or "")
        reply = await self._link.call("list", *filters)
        return tuple(decode_view(decode_fields(flat)) for flat in reply.result)

    async def take_payload(self, ticket_id: str) -> bytes | None:
        payload = self._mirror.take_payload(ticket_id)
        if payload is not None:
            return payload
        link = self._link
        try:
            raw: Any = await link.timed(link.redis.get(f"{link.prefix}p:{ticket_id}"))
        except UNAVAILABLE as exc:
            link.lost_contact(exc)
            raise AdmissionUnavailableError(UNAVAILABLE_MESSAGE) from exc
        return None if raw is None else bytes(raw)

    async def wait_until_admitted(self, ticket_id: str) -> SharedTicketView:
        future: asyncio.Future[SharedTicketView] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(ticket_id, set()).add(future)  # before the read: no event can slip between
        try:
            view = await self.get(ticket_id)
            if view.state is not TicketState.QUEUED:
                return view
            return await future
        finally:
            futures = self._waiters.get(ticket_id)
            if futures is not None:
                futures.discard(future)
                if not futures:
                    del self._waiters[ticket_id]

    def fail_waiters(self) -> None:
        """The backend closed: every pending `wait_until_admitted` raises `AdmissionClosedError`."""
        waiters, self._waiters = self._waiters, {}
        for futures in waiters.values():
            for future in futures:
                if not future.done():
                    future.set_exception(AdmissionClosedError("the redis admission backend closed while waiting"))

    def _reject(
        self, ticket_id: str, owner: str, reason: TicketReason, retry_after_s: int | None, now: float
    ) -> SharedTicketView:
        view = SharedTicketView(
            ticket_id=ticket_id,
            owner=owner,
            state=TicketState.REJECTED,
            reason=reason,
            position=None,
            worker=None,
            retry_after_s=retry_after_s,
            created_at=now,
            admitted_at=None,
            ended_at=now,
            queue_deadline=None,
            heartbeat_deadline=None,
            origin=self._link.replica_id,
        )
        return self._mirror.reject(view)

    def _wake_waiters(self, event: SharedAdmissionEvent) -> None:
        if event.ticket.state is not TicketState.QUEUED:
            for future in self._waiters.pop(event.ticket.ticket_id, set()):
                if not future.done():
                    future.set_result(event.ticket)


def _ok(ticket_id: str, reply: ScriptReply) -> SharedTicketView:
    if reply.code == "unknown":
        raise UnknownTicketError(ticket_id)
    return decode_view(decode_fields(reply.result))


def _bounds(quota: KeyQuota) -> tuple[int, int]:
    """A quota as the create script takes it: max_running, max_queued, -1 for no bound."""
    return (
        -1 if quota.max_running is None else quota.max_running,
        -1 if quota.max_queued is None else quota.max_queued,
    )
