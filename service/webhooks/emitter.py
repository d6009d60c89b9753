"""`WebhookEmitter`, the runtime's `SessionEvents`: turns each moment of a session into a signed event for each of
its endpoints and hands the deliveries to the `WebhookDispatcher`.

Synchronous and cheap, on the event loop, never raises (a failure is logged: webhooks must not end a session). It
keeps one small tally per running session that has endpoints, from `session.running` to `session.ended` (when it
started running, the frames it generated here), so that the ended event can report its times and frames.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from service.api_keys import key_id
from service.runtime.records import SessionEventKind
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

    def _emit(self, session: Session, kind: SessionEventKind, details: Mapping[str, object] | None) -> None:
        urls = self._targets.of(session.owner, session.webhook_url)
        if not urls:
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
        event = WebhookEvent(new_event_id(), kind.value, now, event_data(session, kind, details, tally, now))
        body = event.body()
        configured = self._targets.of(session.owner, None)
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
