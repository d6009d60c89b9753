"""`SessionDirectory`: the answers about sessions that the HTTP routes ask `ServiceRuntime` for.

A session with a record here (`SessionTable`) is answered from it; any other (queued in a shared queue, or run by
another replica) by the admission backend, which, with one instance, knows no other (404 `session_not_found`). The
same split decides reads (`lookup`, `follow`, `sessions_of`), heartbeats, closes and pauses (`delete`, `pause`: a
session with a record here is closed or paused by the `SessionConductor`), and what only the replica that runs a
session can answer (`lookup_here`: its transport routes; `recording`: a recording stays where it was made). Every
call runs on the event loop; cancelling one loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib

from pipeline.bidirectional import CloseMode
from service.errors import (
    AdmissionUnavailableError,
    RecordingFailedError,
    RecordingInProgressError,
    RecordingNotFoundError,
    SessionNotFoundError,
)
from service.runtime.backend import AdmissionBackend
from service.runtime.conductor import SessionConductor
from service.runtime.fanout import Subscription
from service.runtime.recording_catalog import RecordingEntry
from service.runtime.recordings import RecordingOutcome, RecordingState, RecordingStore
from service.runtime.records import RuntimeTuning, SnapshotStream
from service.runtime.session_table import SessionTable
from service.runtime.sessions import SessionSnapshot, SessionState

__all__ = ["SessionDirectory"]


class SessionDirectory:
    """Answers for the sessions of one runtime, here or through its admission backend (see the module docstring)."""

    def __init__(
        self,
        *,
        table: SessionTable,
        backend: AdmissionBackend,
        conductor: SessionConductor,
        tuning: RuntimeTuning,
        recordings: RecordingStore | None,
    ) -> None:
        self._table = table
        self._backend = backend
        self._conductor = conductor
        self._tuning = tuning
        self._recordings = recordings

    def get(self, owner: str, session_id: str) -> SessionSnapshot:
        """The live snapshot of a session with a record here; a GET of a queued session is a heartbeat."""
        session = self._table.visible(owner, session_id)
        self.heartbeat(session_id)
        return session.snapshot()

    def subscribe(self, owner: str, session_id: str) -> tuple[SessionSnapshot, Subscription[SessionSnapshot]]:
        """The current snapshot of a session with a record here and a subscription to every later one (ends after
        the terminal snapshot)."""
        session = self._table.visible(owner, session_id)
        subscription = session.snapshots.subscribe()
        self.heartbeat(session_id)
        return session.snapshot(), subscription

    def heartbeat(self, session_id: str) -> None:
        """A client of the session is still there (a GET, or an open event stream): a queued session (here, or in
        a queue shared with other replicas) keeps its place."""
        session = self._table.get(session_id)
        if session is not None and session.state is not SessionState.QUEUED:
            return
        self._backend.heartbeat(session_id)

    async def lookup(self, owner: str, session_id: str) -> SessionSnapshot:
        """The session's live snapshot (`get`, or the backend's record)."""
        if session_id in self._table:
            return self.get(owner, session_id)
        return await self._backend.lookup(owner, session_id)

    def runs_here(self, session_id: str) -> bool:
        """Whether this instance's transport holds (or held) the session's binding: it is past the queue here."""
        session = self._table.get(session_id)
        return session is not None and session.state is not SessionState.QUEUED

    async def lookup_here(self, owner: str, session_id: str) -> SessionSnapshot:
        """The session for a route bound to this instance's transport (the WebRTC offer, viewer tokens); one that
        another replica runs raises `SessionElsewhereError`."""
        if session_id in self._table:
            return self.get(owner, session_id)
        return await self._backend.lookup_here(owner, session_id)

    async def recording(self, owner: str, session_id: str) -> RecordingOutcome:
        """The finished recording of a session of `owner`. Raises `SessionNotFoundError`, `RecordingInProgressError`
        (the session has not ended, or the recording is being finalised), `RecordingFailedError`,
        `RecordingNotFoundError` (not recorded, removed by retention, or recorded by another replica: a recording
        stays on the replica that ran the session), or `SessionElsewhereError` while another replica runs it.

        With an object store every replica answers from the catalog entry (its owner checked first: another key's
        recording is 404 `session_not_found`, as an unknown session); READY carries presigned URLs."""
        store = self._recordings
        if store is not None and store.objects is not None:
            entry = await self._entry(store, session_id)
            if entry is not None:
                if entry.owner != owner:
                    raise SessionNotFoundError(session_id)
                return self._entry_outcome(store, entry)
        session = self._table.get(session_id)
        if session is None:
            snapshot = await self._backend.lookup_here(owner, session_id)  # SessionElsewhereError while it runs
            if not snapshot.terminal:
                raise RecordingInProgressError(f"session {session_id!r} has not ended yet")
            if store is not None and store.objects is not None:
                raise RecordingNotFoundError(f"no recording of session {session_id!r} is known")
            raise RecordingNotFoundError(
                f"no recording of session {session_id!r} on this replica: a recording stays on the replica that "
                "ran the session"
            )
        session = self._table.visible(owner, session_id)
        outcome = self._recordings.outcome(session_id) if self._recordings is not None else None
        if not session.record:
            raise RecordingNotFoundError(f'session {session_id!r} was not created with "record": true')
        if not session.terminal:
            raise RecordingInProgressError(
                f"session {session_id!r} is {session.state.value}; its recording is served once it has ended"
            )
        if outcome is None:
            raise RecordingNotFoundError(f"session {session_id!r} ended before anything was recorded")
        if outcome.state in (RecordingState.RECORDING, RecordingState.FINISHING):
            raise RecordingInProgressError(f"the recording of session {session_id!r} is being finalised; retry shortly")
        if outcome.state is RecordingState.FAILED:
            raise RecordingFailedError(f"the recording of session {session_id!r} stopped: {outcome.reason}")
        if outcome.state is RecordingState.READY and outcome.video_url is not None:
            return outcome  # in the object store (the catalog could not say so: it was not written)
        if outcome.state is RecordingState.REMOVED or outcome.video is None or not outcome.video.exists():
            # (A file gone while still READY: retention removed it a moment ago and has not said so yet.)
            reason = outcome.reason or "removed to keep the recordings' retention (oldest first)"
            raise RecordingNotFoundError(f"the recording of session {session_id!r} was {reason}")
        return outcome

    @staticmethod
    async def _entry(store: RecordingStore, session_id: str) -> RecordingEntry | None:
        try:
            return await store.catalog.get(session_id)
        except Exception as exc:
            raise AdmissionUnavailableError(
                f"the recordings catalog cannot be read now; retry shortly ({exc})"
            ) from exc

    @staticmethod
    def _entry_outcome(store: RecordingStore, entry: RecordingEntry) -> RecordingOutcome:
        session_id = entry.session_id
        if entry.state in (RecordingState.RECORDING, RecordingState.FINISHING, RecordingState.UPLOADING):
            raise RecordingInProgressError(
                f"the recording of session {session_id!r} is {entry.state.value}; it is served once uploaded"
            )
        if entry.state is RecordingState.FAILED:
            raise RecordingFailedError(f"the recording of session {session_id!r} stopped: {entry.reason}")
        outcome = store.outcome_of(entry)
        if outcome.video_url is None:
            reason = entry.reason or "removed to keep the recordings' retention (oldest first)"
            raise RecordingNotFoundError(f"the recording of session {session_id!r} was {reason}")
        return outcome

    async def recordings_of(self, owner: str, since: float, after: str | None, limit: int) -> list[RecordingEntry]:
        """`owner`'s recordings that are not removed, started at `since` or later, after the cursor `after`, oldest
        first, at most `limit` (none when recording is off). Raises `AdmissionUnavailableError` when a shared
        catalog cannot be read."""
        if self._recordings is None:
            return []
        try:
            return await self._recordings.catalog.of_owner(owner, since, after, limit)
        except ValueError:
            raise
        except Exception as exc:
            raise AdmissionUnavailableError(
                f"the recordings catalog cannot be read now; retry shortly ({exc})"
            ) from exc

    async def sessions_of(self, owner: str) -> list[SessionSnapshot]:
        """The owner's sessions, oldest first: the live ones admission knows of (every replica's, when it is
        shared) and the finished ones this instance remembers; a record here wins over the backend's."""
        known = await self._backend.sessions_of(owner)
        found = {session.id: session.snapshot() for session in self._table.of_owner(owner)}
        for snapshot in known:
            found.setdefault(snapshot.id, snapshot)
        return sorted(found.values(), key=lambda snapshot: snapshot.created_at)

    async def follow(self, owner: str, session_id: str) -> tuple[SessionSnapshot, SnapshotStream]:
        """The current snapshot and a stream of every later one (ends after the terminal one). A session queued in
        a shared queue is followed through the backend while it can be reached (it may start on another replica)."""
        session = self._table.get(session_id)
        shared = self._backend.shares_queue and self._backend.available
        if session is not None and (session.state is not SessionState.QUEUED or not shared):
            return self.subscribe(owner, session_id)
        return await self._backend.follow(owner, session_id)

    async def delete(self, owner: str, session_id: str, mode: CloseMode) -> SessionSnapshot:
        """End the session (idempotent): cancel it while queued, else close it with `mode` and wait a little."""
        session = self._table.get(session_id)
        if session is None or (session.state is SessionState.QUEUED and self._backend.shares_queue):
            return await self._backend.delete(owner, session_id, mode)
        session = self._table.visible(owner, session_id)
        self._conductor.request_close(session, mode, "client_deleted")
        if not session.terminal:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._tuning.delete_wait_s):
                    await session.ended.wait()
        return session.snapshot()

    async def pause(self, owner: str, session_id: str, paused: bool) -> SessionSnapshot:
        """Pause (`paused`) or resume the session (idempotent). A session run by another replica is asked through
        the backend. Raises `SessionNotFoundError`, `SessionQueuedError` or `SessionNotStreamingError`."""
        session = self._table.get(session_id)
        if session is None or (session.state is SessionState.QUEUED and self._backend.shares_queue):
            return await self._backend.set_paused(owner, session_id, paused)
        session = self._table.visible(owner, session_id)
        self._conductor.set_paused(session, paused)
        return session.snapshot()
