"""`WebhookEmitter`, the runtime's `SessionEvents`: turns each moment of a session into a signed event for each of
its endpoints and hands the deliveries to the `WebhookDispatcher`.

Synchronous and cheap, on the event loop, never raises (a failure is logged: webhooks must not end a session). It
keeps one small tally per running session that has endpoints, from `session.running` to `session.ended` (when it
started running, the frames it generated here), so that the ended event can report its times and frames. A session
lost with another replica (`session_lost`) gets its `session.ended` from the replica that declared it lost: its
times from the registry (running up to the lost replica's last heartbeat), its frames unknown (`null`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from service.api_keys import key_id
from service.runtime.recording_catalog import RecordingEntry, recording_event_data
from service.runtime.records import LostSession, SessionEventKind
from service.runtime.sessions import Session, SessionState
from service.webhooks.dispatcher import WebhookDispatcher
from service.webhooks.events import SessionTally, WebhookEvent, new_event_id
from service.webhooks.outbox import Delivery
from service.webhooks.targets import WebhookTargets

__all__ = ["WebhookEmitter", "event_data"]

logger = logging.getLogger(__name__)


def event_data(
    session: Session,
    kind: SessionEventKind,
    details: Mapping[str, object] | None,
    tally: SessionTally,
    now: float,
) -> dict[str, object]:
    """The event's `data`: the session as of `now` (status, reason, error), the kind's `details`, and on
    `session.ended` its times and frames."""
    failure = session.failure if session.state is SessionState.FAILED else None
    data: dict[str, object] = {
        "session_id": session.id,
        "key_id": key_id(session.owner),
        "status": session.state.value,
        "reason": session.reason,
        "error": None if failure is None else {"code": failure[0], "message": failure[1]},
    }
    if details:
        data.update(details)
    if kind is SessionEventKind.ENDED:
        data.update(tally.times(session.created_at, now))
        data["frames"] = tally.frames
    return data


class WebhookEmitter:
    """Implements `service.runtime.records.SessionEvents` (see the module docstring). `clock`: wall seconds."""

    def __init__(
        self, targets: WebhookTargets, dispatcher: WebhookDispatcher, *, clock: Callable[[], float] = time.time
    ) -> None:
        self._targets = targets
        self._dispatcher = dispatcher
        self._clock = clock
        self._tallies: dict[str, SessionTally] = {}

    @property
    def dispatcher(self) -> WebhookDispatcher:
        return self._dispatcher

    def session_event(
        self, session: Session, kind: SessionEventKind, details: Mapping[str, object] | None = None
    ) -> None:
        try:
            self._emit(session, kind, details)
        except Exception:
            logger.exception("webhooks: the %s event could not be queued", kind.value)

    def generated(self, session: Session, frames: int) -> None:
        tally = self._tallies.get(session.id)
        if tally is not None:
            tally.frames += frames

    def session_lost(self, lost: LostSession) -> None:
        try:
            self._emit_lost(lost)
        except Exception:
            logger.exception("webhooks: the session.ended event of a lost session could not be queued")

    def _emit_lost(self, lost: LostSession) -> None:
        snapshot = lost.snapshot
        if not self._targets.of(lost.owner, lost.webhook_url):
            return
        code, message = snapshot.error if snapshot.error is not None else ("replica_lost", "its replica was lost")
        data: dict[str, object] = {
            "session_id": snapshot.id,
            "key_id": key_id(lost.owner),
            "status": snapshot.state.value,
            "reason": code,
            "error": {"code": code, "message": message},
        }
        data.update(SessionTally(running_at=lost.running_from).times(snapshot.created_at, lost.lost_at))
        data["frames"] = None  # counted on the lost replica
        self._offer(lost.owner, lost.webhook_url, SessionEventKind.ENDED, data, self._clock())

    def recording_lost(self, entry: RecordingEntry) -> None:
        try:
            if not self._targets.of(entry.owner, entry.webhook_url):
                return
            data: dict[str, object] = {
                "session_id": entry.session_id,
                "key_id": key_id(entry.owner),
                "status": None,  # the session's own end is its `session.ended` (this replica may not know it)
                "reason": None,
                "error": None,
                "recording": recording_event_data(entry),
            }
            self._offer(entry.owner, entry.webhook_url, SessionEventKind.RECORDING_FAILED, data, self._clock())
        except Exception:
            logger.exception("webhooks: the recording.failed event of a lost recording could not be queued")

    def _emit(self, session: Session, kind: SessionEventKind, details: Mapping[str, object] | None) -> None:
        if not self._targets.of(session.owner, session.webhook_url):
            return
        now = self._clock()
        # A tally lives from running to ended, both on this replica (a queued session may be handed to another).
        if kind is SessionEventKind.ENDED:
            tally = self._tallies.pop(session.id, None) or SessionTally()
        elif kind is SessionEventKind.RUNNING:
            tally = self._tallies.setdefault(session.id, SessionTally())
            if tally.running_at is None:
                tally.running_at = now
        else:
            tally = self._tallies.get(session.id) or SessionTally()
        self._offer(session.owner, session.webhook_url, kind, event_data(session, kind, details, tally, now), now)

    def _offer(
        self, owner: str, webhook_url: str | None, kind: SessionEventKind, data: Mapping[str, object], now: float
    ) -> None:
        """One event with `data` to each endpoint of `owner` (and the create's own `webhook_url`)."""
        urls = self._targets.of(owner, webhook_url)
        event = WebhookEvent(new_event_id(), kind.value, now, data)
        body = event.body()
        configured = self._targets.of(owner, None)
        self._dispatcher.offer(
            [
                Delivery(
                    id=f"{event.id}.{index}",
                    event_id=event.id,
                    url=url,
                    body=body,
                    created_at=now,
                    guarded=url not in configured,
                )
                for index, url in enumerate(urls)
            ]
        )
