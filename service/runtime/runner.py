"""`SessionRunner`: the life of one admitted session on its model worker, run as that session's own task.

`run(session, worker)` creates the session on its model worker, starts its single output reader (which fans chunks
out and asks for the close when generation ends or fails), attaches the transport (an adopted session's reader starts
after it: its first chunks are the ones its client has not seen), waits for a close request, closes
the session on the worker (drain, escalated to cancel on request; a best-effort cancel-close when it stopped early),
stops the reader, finishes the session (final state and status, the admission slot back exactly once) and detaches
the transport. Cancellation (shutdown) runs the same cleanup in `finally`.

The runner holds no session table and no admission: it is given the transport, the tuning, the observer and four
callbacks (`RunnerCallbacks`), through which it asks for a close, says that a session runs, gives a slot back and
says that a session ended. `ServiceRuntime` builds one runner and spawns `run` for every admitted session.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from pipeline.bidirectional import (
    BidirectionalService,
    CheckpointingService,
    ChunkItem,
    ChunkOutput,
    ChunkPart,
    CloseMode,
    PortableCheckpoint,
    SessionSummary,
)
from service.errors import lookup
from service.runtime.delivery import SessionDelivery
from service.runtime.port import LiveSessionPort
from service.runtime.recordings import RecordingStore, SessionRecording
from service.runtime.records import RuntimeTuning, SessionObserver
from service.runtime.sessions import Session, SessionState
from transport.base import ErrorStatus, ReportsDelivery, Transport, WaitsForClient
from transport.errors import CallerTokenError, CallerTokenRefusedError, RoomInUseError, RoomNotFoundError

__all__ = ["RunnerCallbacks", "SessionRunner"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunnerCallbacks:
    """What a runner asks of whoever owns the sessions; each is synchronous and called on the event loop.

    - `request_close(session, mode, reason)`: close the session (the transport's "client gone" and `Stop`, the end
      or failure of generation, a transport that could not attach);
    - `running(session)`: the session has just moved to RUNNING (the owner marks it draining if the service drains);
    - `release_slot(session)`: give the ended session's admission slot back (called exactly once per session);
    - `ended(session)`: the session reached its final state (after its slot went back, before the transport is
      detached);
    - `set_paused(session, paused)`: a `pause` (True) or `resume` (False) from the client's control channel; raises
      a `ServiceError` when the session cannot (the port answers the client with its code);
    - `generated(session, chunk)`: the session's model worker produced `chunk` (usage metering counts it);
    - `save_checkpoint(session, checkpoint, resumable)`: `checkpoint` is what a successor goes on from now (the
      session after the last chunk the transport delivered, `service.runtime.delivery`); `resumable`: the worker
      goes on from its checkpoints.
    """

    request_close: Callable[[Session, CloseMode, str], None]
    running: Callable[[Session], None]
    release_slot: Callable[[Session], None]
    ended: Callable[[Session], None]
    set_paused: Callable[[Session, bool], None]
    generated: Callable[[Session, ChunkOutput], None] = lambda _session, _chunk: None
    save_checkpoint: Callable[[Session, PortableCheckpoint, bool], None] = lambda _session, _checkpoint, _r: None


class SessionRunner:
    """Runs admitted sessions on their model workers and binds them to the transport (one `run` task per session).

    Example::

        runner = SessionRunner(transport, tuning, observer, RunnerCallbacks(...))
        tasks.spawn(runner.run(session, workers[session.worker]), name=f"session-{session.id}")

    Ordering: create on the worker, then the output reader, then the transport attach, then RUNNING; at the end the
    worker close, then the reader's end, then the final state and the slot's release, then the transport detach.
    Cancellation: cancelling `run` (shutdown) cancels the reader, cancel-closes the session on the worker (bounded by
    `tuning.shutdown_close_s`), finishes it with reason "shutdown" and detaches the transport before it re-raises.
    """

    def __init__(
        self,
        transport: Transport | None,
        tuning: RuntimeTuning,
        observer: SessionObserver,
        callbacks: RunnerCallbacks,
        *,
        recordings: RecordingStore | None = None,
    ) -> None:
        self._transport = transport
        self._tuning = tuning
        self._observer = observer
        self._callbacks = callbacks
        self._recordings = recordings

    async def run(self, session: Session, worker: BidirectionalService) -> None:
        """The admitted session's whole life on `worker`. Cancellation (shutdown) still publishes a final status,
        gives the slot back and detaches the transport in `finally`."""
        request_close = self._callbacks.request_close
        delivery = self._delivery(session, worker)
        port = LiveSessionPort(session, worker, request_close, self._callbacks.set_paused, delivered=delivery.delivered)
        attached = False
        reader: asyncio.Task[None] | None = None
        recording: SessionRecording | None = None
        # From the create call on, the worker may hold state for the session (even if create fails half-way).
        on_worker = True
        try:
            try:
                await worker.create_session(session.id, session.prepared)
            except Exception as exc:
                index = session.worker if session.worker is not None else 0
                logger.exception("session %s: model worker %d could not create it", session.id, index)
                session.record_failure("create_failed", f"the model worker could not create the session: {exc}")
                return
            if not session.close_requested.is_set():
                recording = self._record(session)
                # An adopted session's first chunks are the ones its client has not seen (the checkpoint's
                # `next_chunk` on): its reader starts once the transport took the session, so that none is published
                # before the transport listens (the worker's queue holds them: its generation waits meanwhile).
                read_after_attach = session.prepared.resume is not None and self._transport is not None
                if not read_after_attach:
                    reader = self._start_reader(session, worker, delivery, recording)
                if self._transport is not None:
                    try:
                        session.attached(await self._transport.attach(port))
                        attached = True
                    except (RoomNotFoundError, RoomInUseError, CallerTokenError, CallerTokenRefusedError) as exc:
                        # The caller's room went away (or was taken), or the caller's token does not (or no longer)
                        # work: the caller's doing.
                        logger.warning("session %s: %s", session.id, exc)
                        spec = lookup(exc)  # the error table's code: room_in_use, livekit_token_refused, ...
                        session.record_failure(spec.code if spec is not None else "transport_failed", str(exc))
                        session.request_close(CloseMode.CANCEL, "transport_failed")
                    except Exception as exc:
                        logger.exception("session %s: the transport could not attach it", session.id)
                        session.record_failure("transport_failed", f"the transport could not attach: {exc}")
                        session.request_close(CloseMode.CANCEL, "transport_failed")
                if session.state is SessionState.ADMITTED:
                    session.move(SessionState.RUNNING)
                    self._callbacks.running(session)
                if read_after_attach:
                    await self._client_back(session)
                    reader = self._start_reader(session, worker, delivery, recording)
            await session.close_requested.wait()
            summary = await self._close_on_worker(session, worker)
            on_worker = False
            if reader is not None:
                await self._stop_reader(session, reader)
                reader = None
            if recording is not None:
                recording.finish()  # every chunk is in: finalised off this task, after the session's end
            if session.handing_off:
                await self._deliver_first(session, delivery)
            delivery.close()  # nothing published after its end here (its release deletes what was)
            self._finish(session, summary)
        finally:
            delivery.close()
            if reader is not None:
                reader.cancel()
                await asyncio.gather(reader, return_exceptions=True)
            if recording is not None:
                recording.finish()
            if on_worker:
                await self._abandon_on_worker(session, worker)
            self._finish(session, None, reason="shutdown")
            if attached and self._transport is not None:
                try:
                    await self._transport.detach(session.id, session.reason or session.state.value)
                except Exception:
                    logger.exception("session %s: the transport failed to detach it", session.id)

    async def _client_back(self, session: Session) -> None:
        """An adopted session on a transport that can say when its client is back waits for it, at most
        `resume_client_wait_s`, before its first chunk is read: the embedded transport's client reconnects, a LiveKit
        client (which stayed in the room) subscribes to the adopter's new track. The worker's queue holds the chunks
        after the checkpoint (its generation waits), so they are sent once the client is there instead of to
        nobody."""
        transport: object = self._transport  # a capability beyond `Transport` (the routes ask the same way)
        if not isinstance(transport, WaitsForClient):
            return
        started = asyncio.get_running_loop().time()
        connected = asyncio.ensure_future(transport.client_connected(session.id))
        closing = asyncio.ensure_future(session.close_requested.wait())
        try:
            await asyncio.wait(
                {connected, closing}, timeout=self._tuning.resume_client_wait_s, return_when="FIRST_COMPLETED"
            )
        finally:
            for task in (connected, closing):
                task.cancel()
            await asyncio.gather(connected, closing, return_exceptions=True)
        waited = asyncio.get_running_loop().time() - started
        if connected.done() and not connected.cancelled() and connected.exception() is None:
            logger.info("session %s: its client is back %.2f s after the adoption; generating on", session.id, waited)
        elif not session.close_requested.is_set():
            logger.warning("session %s: its client is not back after %.1f s; generating on", session.id, waited)

    def _start_reader(
        self,
        session: Session,
        worker: BidirectionalService,
        delivery: SessionDelivery,
        recording: SessionRecording | None,
    ) -> asyncio.Task[None]:
        reader = self._read_outputs(session, worker, delivery, recording)
        return asyncio.create_task(reader, name=f"outputs-{session.id}")

    def _delivery(self, session: Session, worker: BidirectionalService) -> SessionDelivery:
        """The session's checkpoints, each published once the transport delivered its chunk (at once when the
        transport reports no delivery)."""
        resumable = isinstance(worker, CheckpointingService) and worker.resumable
        transport = self._transport
        tracks = transport.reports_delivery if isinstance(transport, ReportsDelivery) else False

        def publish(checkpoint: PortableCheckpoint) -> None:
            if not session.terminal:
                self._callbacks.save_checkpoint(session, checkpoint, resumable)

        return SessionDelivery(publish, tracks_delivery=tracks)

    async def _deliver_first(self, session: Session, delivery: SessionDelivery) -> None:
        """A session handed off has stopped on its worker: the transport sends what was generated (the client keeps
        playing), at most `hand_off_deliver_s`, so that its last checkpoint, the one its adopter goes on from, is the
        last chunk's (docs/continuity.md, "Hand-off on drain")."""
        started = asyncio.get_running_loop().time()
        settled = await delivery.wait_settled(self._tuning.hand_off_deliver_s)
        waited = asyncio.get_running_loop().time() - started
        through = delivery.ledger.delivered_through
        if settled:
            logger.info(
                "session %s: hand-off after its chunks were sent (through %d, %.2f s; %s)",
                session.id,
                through,
                waited,
                self._pacer_figures(session),
            )
        else:
            logger.warning(
                "session %s: hand-off after %.1f s with chunks unsent (through %d): the adopter generates them again",
                session.id,
                waited,
                through,
            )

    def _pacer_figures(self, session: Session) -> str:
        """The binding's pacer and track counters, for the hand-off's log line (what the client may have missed)."""
        if self._transport is None:
            return "no transport"
        try:
            stats = self._transport.binding_statistics(session.id)
        except Exception as exc:  # a transport that lost the session meanwhile: the figures are only for the log
            return f"no binding figures: {exc!r}"
        pacer = stats.pacer
        return (
            f"pacer sent {pacer.frames_sent}, dropped late {pacer.dropped_late}, overflow {pacer.dropped_overflow}, "
            f"pending {pacer.pending}; unsent {stats.frames_unsent}; track dropped {stats.track_dropped}"
        )

    def _finish(self, session: Session, summary: SessionSummary | None, *, reason: str | None = None) -> None:
        """The admitted session is over: final state and status, then its slot goes back (exactly once)."""
        if session.terminal:
            return
        if summary is not None and summary.failure:
            session.record_failure("model_failure", summary.failure)
        if session.failure is not None:
            state, final = SessionState.FAILED, session.failure[0]
        else:
            state, final = SessionState.CLOSED, reason or session.close_reason or "closed"
        session.move(state, reason=final)
        if session.slot_released():
            self._callbacks.release_slot(session)
        logger.info("session %s %s (%s)", session.id, state.value, final)
        self._callbacks.ended(session)

    async def _close_on_worker(self, session: Session, worker: BidirectionalService) -> SessionSummary | None:
        """`close_session` with the requested mode; a later cancel request escalates a drain in flight."""
        mode = session.close_mode or CloseMode.DRAIN
        closing = asyncio.create_task(worker.close_session(session.id, mode), name=f"close-{session.id}")
        helpers: list[asyncio.Task[object]] = []
        try:
            if mode is CloseMode.DRAIN:
                escalated = asyncio.create_task(session.escalated.wait(), name=f"escalation-{session.id}")
                helpers.append(escalated)
                await asyncio.wait({closing, escalated}, return_when=asyncio.FIRST_COMPLETED)
                if not closing.done():
                    logger.info("session %s: close escalated from drain to cancel", session.id)
                    cancel = worker.close_session(session.id, CloseMode.CANCEL)
                    helpers.append(asyncio.create_task(cancel, name=f"cancel-{session.id}"))
            outcome = (await asyncio.gather(closing, *helpers[1:], return_exceptions=True))[0]
        finally:
            pending = [task for task in (closing, *helpers) if not task.done()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if isinstance(outcome, SessionSummary):
            return outcome
        logger.error("session %s: closing it on the worker failed: %r", session.id, outcome)
        session.record_failure("close_failed", f"closing the session on the model worker failed: {outcome}")
        return None

    async def _abandon_on_worker(self, session: Session, worker: BidirectionalService) -> None:
        """Best-effort cancel-close when the runner stopped before a regular close (a failed create, or shutdown
        cancelled it mid-way); errors are logged only."""
        try:
            async with asyncio.timeout(self._tuning.shutdown_close_s):
                await worker.close_session(session.id, CloseMode.CANCEL)
        except Exception as exc:
            logger.warning("session %s: best-effort cancel-close on the worker failed: %r", session.id, exc)

    async def _stop_reader(self, session: Session, reader: asyncio.Task[None]) -> None:
        done, _ = await asyncio.wait({reader}, timeout=self._tuning.reader_stop_s)
        if not done:
            logger.warning("session %s: outputs did not end after close; cancelling the reader", session.id)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    def _record(self, session: Session) -> SessionRecording | None:
        """Start the session's recording when it asked for one (its end or failure is the recording's own)."""
        if not session.record or self._recordings is None:
            return None

        def on_stop(code: str, message: str) -> None:
            if not session.terminal:
                session.statuses.publish(ErrorStatus(code, message))

        prepared = session.prepared
        size = (prepared.width, prepared.height, round(prepared.fps))
        recording = self._recordings.record(
            session.id, session.owner, size, _replay_header(session), on_stop, webhook_url=session.webhook_url
        )
        session.recording_started(recording)
        return recording

    async def _read_outputs(
        self,
        session: Session,
        worker: BidirectionalService,
        delivery: SessionDelivery,
        recording: SessionRecording | None = None,
    ) -> None:
        """The session's single output reader: fans chunks out (the recording gets each one, never waiting); its end
        or failure closes the session. A chunk's parts (progressive decode) go to the transport only, ahead of the
        chunk: the chunk itself, whole, is what the status, the recording and the counters see.

        One item per step of the event loop: the worker's outputs come at once when several wait (an adopted
        session's first chunks, held until its client was back or its binding attached; any chunks generated while
        the loop was busy), and a subscriber's buffer holds two items (`SessionBuffers.chunks`, the oldest dropped),
        so the transport's feed, waiting on it, takes each before the next is published. Published back to back, a
        hand-off's adopter lost its first chunk before the pacer ever saw it (docs/continuity.md)."""
        request_close = self._callbacks.request_close
        iterator: AsyncIterator[ChunkItem] = worker.outputs(session.id, parts=True)
        try:
            async for chunk in iterator:
                if isinstance(chunk, ChunkPart):
                    session.publish_part(chunk)
                    await asyncio.sleep(0)  # the subscribers take it (above)
                    continue
                session.publish_chunk(chunk)
                if recording is not None:
                    recording.offer(chunk)
                self._callbacks.generated(session, chunk)
                delivery.read(chunk.index)
                if isinstance(worker, CheckpointingService):
                    checkpoint = worker.checkpoint(session.id)  # the session after this chunk: held until it is sent
                    if checkpoint is not None:
                        delivery.generated(checkpoint)
                self._observer.chunk(session, chunk)
                await asyncio.sleep(0)  # the subscribers take it (above), after its bookkeeping
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if session.close_mode is not CloseMode.CANCEL:
                logger.warning("session %s: generation failed: %s", session.id, exc)
                session.record_failure("model_failure", str(exc) or type(exc).__name__)
            request_close(session, CloseMode.CANCEL, "model_failure")
            return
        finally:
            aclose = getattr(iterator, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
        request_close(session, CloseMode.DRAIN, "completed")


_REPLAYED = ("seed", "fps", "chunk_size", "compute_scale")


def _replay_header(session: Session) -> str:
    """The comment at the top of a recording's control trace: the session and the command that replays it."""
    config = session.config_view
    options = [f"--{name.replace('_', '-')} {config[name]}" for name in _REPLAYED if name in config]
    options.append(f"--resolution {session.prepared.width}x{session.prepared.height}")
    if config.get("hud") is False:
        options.append("--no-hud")
    return (
        f"lingstream recording of session {session.id}: the controls applied to each chunk.\n"
        f"config: {json.dumps(dict(config), sort_keys=True, separators=(',', ':'))}\n"
        "replay: lingstream generate --controls THIS_FILE --out OUT.mp4 --frames FRAMES "
        f"{' '.join(options)} [--image THE_SAME_IMAGE]"
    )
