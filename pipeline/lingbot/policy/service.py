"""`LingBotService`: the `BidirectionalService` one model worker runs for LingBot sessions.

It owns the worker's orchestrator (encode, denoise and decode actors, built by `pipeline.lingbot.graph.actors` from a
`WorldModel` on threads or a `ProcessPlacement` on worker processes) and one `LingBotSession` policy plus one
chunk-loop task per session. Its cross-session policy is the execution lease (`ChunkLease`, e.g.
`admission.ExecutionLease`): one grant per chunk's DiT (its decode runs after the grant, beside the next DiT call),
round-robin across sessions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, overload

import numpy as np
import numpy.typing as npt
import torch

from pipeline.bidirectional import (
    ChunkItem,
    ChunkOutput,
    CloseMode,
    ControlMessage,
    Pause,
    PreparedSession,
    RecoveryListener,
    RecoveryNotice,
    ServiceStatistics,
    SessionSummary,
)
from pipeline.clock import Clock, MonotonicClock
from pipeline.errors import PipelineError, SessionExistsError, UnknownSessionError
from pipeline.lingbot.config import (
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    LingBotSessionConfig,
    decode_reference_image,
)
from pipeline.lingbot.continuity import SessionCheckpoint
from pipeline.lingbot.graph.actors import ProcessPlacement, build_actors
from pipeline.lingbot.policy.recovery import RecoveryBudget, RecoveryState, RecoveryTracker
from pipeline.lingbot.policy.session import ChunkLease, LingBotSession
from pipeline.lingbot.seam import WorldModel
from pipeline.orchestrator import StreamingPipelineOrchestrator
from pipeline.process import WorkerStatistics

if TYPE_CHECKING:
    from pipeline.lingbot.models.warmup import WarmUp

__all__ = ["LingBotService"]

logger = logging.getLogger(__name__)

_KEPT_SUMMARIES = 1024
_RELEASE_RETRIES = 10
_RELEASE_RETRY_MAX_S = 30.0
_READY_POLL_S = 0.05
"""How often a recovering session looks whether its workers are back (the process actors report no event for it)."""


class LingBotService:
    """One model worker's LingBot sessions (see `pipeline.bidirectional.BidirectionalService` for the contract).

    Example::

        service = LingBotService(ReferenceWorldModel("cpu"), lease=ExecutionLease())
        await service.start()
        prepared = service.prepare({}, None)          # every field defaults; no image = the default scene
        await service.create_session("s1", prepared)  # prefetch of condition[0..1] starts at once
        service.push_control("s1", ControlState(1, frozenset({"w"})))
        async for chunk in service.outputs("s1"): ...
        summary = await service.close_session("s1")

    With `realtime` (the default) each session generates at most about one chunk ahead of playback; offline
    generation turns it off to run as fast as the model allows. Stage placement: given a `WorldModel`, the three
    stages run on three `LocalStageActor` threads of this process; given a `ProcessPlacement`, they run in worker
    process groups as its plan says (the DiT sharded over its ranks, decode co-located or in its own group, latents
    between groups through tensor channels; `pipeline.lingbot.graph.actors`). Encode is always its own actor; model work
    never runs on the event loop. `start()` starts the process groups together; `aclose()` stops them and closes the
    channels, leaving no process behind.

    A stage whose per-session release fails leaves the session id poisoned in the orchestrator (and its model-side
    cache possibly resident); the service retries the failed releases in the background with exponential back-off
    (`release_retry_s` doubling up to 30 s, `_RELEASE_RETRIES` attempts), which clears the poison once one succeeds.

    `progressive_decode` (a `ProgressiveDecoder`, on either placement): the decode stage hands each chunk over one
    latent frame at a time as it is decoded (on processes as partial replies of the decode call, through shared
    memory); `outputs(session_id, parts=True)` yields those `ChunkPart`s ahead of each chunk, so a transport can
    start playing a chunk before all of it is decoded. Off, chunks come whole (`progressive_decode` reports which).

    Recovery (`recovery`, a `RecoveryBudget`; None: off, a failed pipeline session fails its session as before). When
    a session's orchestrator session fails (a worker group died, a stage raised), its chunk loop does not end: the
    session keeps its lease membership and, in the service above, its admission slot; the failed orchestrator session
    is cancel-closed and released; recovery listeners are told (`RecoveryNotice`, recovering); once the orchestrator is
    ready again (the group restarted), the session is re-seeded from its checkpoint (`LingBotSession.reseed`) and its
    loop goes on; the first chunk after it completes the recovery (a notice with `recovery_s`). `RecoveryTracker`
    decides (`recovery.py`): a failure a re-seed cannot fix, repeated failures or a recovery over its time end the
    session with its failure, as without recovery. A stop or close while recovering ends the session without a failure;
    a cancel (close with CANCEL, `aclose`) cancels the recovery where it stands. docs/continuity.md has the design.

    `chunks_in_flight` (2 by default): how many chunks of one session may be in flight at once; 2 lets chunk k + 1
    denoise while chunk k decodes (the lease grants only the DiT: `session.py`), 1 is the order before issue #32 (one
    chunk from control to frames, then the next). In real time the just-in-time schedule dates the second from where
    the first's playback should end (`playout.py`).

    `history` bounds what stays of finished sessions: this many summaries (so a repeated `close_session` answers
    the same) and as many orchestrator close reports; the oldest are forgotten first.
    """

    def __init__(
        self,
        model: WorldModel | ProcessPlacement,
        *,
        lease: ChunkLease | None = None,
        clock: Clock | None = None,
        edge_capacity: int = 2,
        max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
        torch_threads: int | None = None,
        realtime: bool = True,
        release_retry_s: float = 0.5,
        history: int = _KEPT_SUMMARIES,
        check_config: Callable[[LingBotSessionConfig], None] | None = None,
        progressive_decode: bool = True,
        recovery: RecoveryBudget | None = None,
        warmed_up: WarmUp | None = None,
        chunks_in_flight: int = 2,
    ) -> None:
        if history < 1:
            raise ValueError(f"history must be at least 1, got {history}")
        self._clock = clock or MonotonicClock()
        self._lease = lease
        self._max_image_bytes = max_image_bytes
        self._max_image_pixels = max_image_pixels
        self._torch_threads = torch_threads
        self._realtime = realtime
        self._release_retry_s = release_retry_s
        self._check_config = check_config
        if chunks_in_flight < 1:
            raise ValueError(f"chunks_in_flight must be at least 1, got {chunks_in_flight}")
        self._chunks_in_flight = chunks_in_flight
        self._retries: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._actors = build_actors(model, edge_capacity, on_part=self._post_part if progressive_decode else None)
        self._orchestrator = StreamingPipelineOrchestrator(
            self._actors.spec, self._actors.actors, clock=self._clock, kept_reports=history
        )
        self._orchestrator.add_stage_listener(self._actors.denoise_stage, self._on_denoised)
        self._sessions: dict[str, LingBotSession] = {}
        self._loops: dict[str, asyncio.Task[None]] = {}
        self._finals: dict[str, asyncio.Task[SessionSummary]] = {}
        self._summaries: OrderedDict[str, SessionSummary] = OrderedDict()
        self._history = history
        self._chunks = 0
        self._stale = 0
        self._recovery = recovery
        self._trackers: dict[str, RecoveryTracker] = {}
        self._recovery_listeners: list[RecoveryListener] = []
        self._recovered: dict[str, int] = {}
        self._unrecovered = 0
        self._warmed_up = warmed_up

    @property
    def orchestrator(self) -> StreamingPipelineOrchestrator:
        return self._orchestrator

    @property
    def ready(self) -> bool:
        return self._orchestrator.ready

    @property
    def stages(self) -> tuple[str, ...]:
        """The orchestrator's stages: encode, denoise, decode on every placement (a co-located decode runs on the
        DiT group's second call lane)."""
        return tuple(self._actors.actors)

    @property
    def progressive_decode(self) -> bool:
        """Whether chunks are handed over in parts as they are decoded (the class docstring)."""
        return self._actors.progressive_decode

    @property
    def warmed_up(self) -> WarmUp | None:
        """The model's warm-up before this worker was built (`models/warmup.py`; None: none, or not known here)."""
        return self._warmed_up

    @property
    def recovery(self) -> RecoveryBudget | None:
        """The recovery budget (None: sessions are not rebuilt after a worker loss)."""
        return self._recovery

    def add_recovery_listener(self, listener: RecoveryListener) -> None:
        """`RecoveringService`: tell `listener` (on the loop) when a session starts and ends a recovery."""
        self._recovery_listeners.append(listener)

    def recovery_statistics(self) -> tuple[Mapping[str, int], int]:
        """Sessions recovered so far by cause, and sessions whose recovery was given up."""
        return MappingProxyType(dict(self._recovered)), self._unrecovered

    def worker_statistics(self) -> Mapping[str, WorkerStatistics]:
        """The worker process groups by stage (process ids, incarnation, restarts); empty on threads."""
        return MappingProxyType(self._actors.worker_statistics())

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._torch_threads is not None:
            torch.set_num_threads(self._torch_threads)
        workers = list(self._actors.workers.values())
        results = await asyncio.gather(*(worker.start() for worker in workers), return_exceptions=True)
        failure = next((result for result in results if isinstance(result, BaseException)), None)
        if failure is not None:
            await asyncio.gather(*(worker.aclose() for worker in workers), return_exceptions=True)
            self._actors.close()
            raise failure
        await self._orchestrator.start()

    async def aclose(self) -> None:
        for session_id in list(self._sessions):
            await self.close_session(session_id, CloseMode.CANCEL)
        retries = list(self._retries.values())
        for task in retries:
            task.cancel()
        await asyncio.gather(*retries, return_exceptions=True)
        # Every session is closed: stop the process groups together (each takes its ranks' exit time), then the
        # orchestrator, whose own stop of those actors is then a no-op.
        await asyncio.gather(*(worker.aclose() for worker in self._actors.workers.values()), return_exceptions=True)
        await self._orchestrator.aclose()
        self._actors.close()

    def prepare(self, config: Mapping[str, object], image: bytes | None) -> PreparedSession:
        """Validate the config (`SessionConfigError`; also the model's own limits, `check_config`) and decode the
        image bounded (`ImageInputError`)."""
        parsed = LingBotSessionConfig.from_mapping(config)
        if self._check_config is not None:
            self._check_config(parsed)
        tensor = None
        if image is not None:
            tensor = decode_reference_image(
                image,
                max_bytes=self._max_image_bytes,
                max_pixels=self._max_image_pixels,
                size=(parsed.width, parsed.height),
            )
        return PreparedSession(
            config=parsed,
            width=parsed.width,
            height=parsed.height,
            fps=float(parsed.fps),
            frame_limit=parsed.resolved_frame_num,
            image=tensor,
        )

    async def create_session(self, session_id: str, prepared: PreparedSession) -> None:
        if session_id in self._sessions:
            raise SessionExistsError(f"session {session_id!r} is already running on this worker")
        config = prepared.config
        if not isinstance(config, LingBotSessionConfig):
            raise TypeError("prepared.config must come from LingBotService.prepare")
        image = prepared.image if isinstance(prepared.image, torch.Tensor) else None
        pace = config.chunk_media_s if self._realtime else None
        session = LingBotSession(
            session_id,
            config,
            image,
            self._orchestrator,
            self._clock,
            self._lease,
            pace_ahead_s=pace,
            chunks_in_flight=self._chunks_in_flight,
        )
        resume = prepared.resume
        if resume is not None and prepared.paused:
            session.push(Pause())  # handed off paused: it asks for no chunk until a Resume
        if resume is None:
            session.open()
        elif isinstance(resume, SessionCheckpoint):
            session.restore(resume)  # adopted: it goes on where its checkpoint left it
        else:
            raise TypeError("prepared.resume must be a SessionCheckpoint")
        self._sessions[session_id] = session
        self._summaries.pop(session_id, None)
        if self._recovery is not None:
            tracker = RecoveryTracker(self._recovery)
            self._trackers[session_id] = tracker
            session.on_chunk = lambda: self._chunk_out(session, tracker)
        if isinstance(resume, SessionCheckpoint):
            started = self._clock.now() - max(0.0, prepared.down_s)
            self._count_adoption(session, prepared.resume_cause, started, at_once=prepared.paused)
        self._loops[session_id] = asyncio.get_running_loop().create_task(self._drive(session))

    @property
    def resumable(self) -> bool:
        """`CheckpointingService`: `create_session` goes on from a `SessionCheckpoint` (`PreparedSession.resume`)."""
        return True

    def checkpoint(self, session_id: str) -> SessionCheckpoint | None:
        """The session's checkpoint at its last chunk boundary (`CheckpointingService`; None: unknown here)."""
        session = self._sessions.get(session_id)
        return None if session is None else session.checkpoint

    def _session(self, session_id: str) -> LingBotSession:
        session = self._sessions.get(session_id)
        if session is None:
            raise UnknownSessionError(f"no session {session_id!r} on this worker")
        return session

    def push_control(self, session_id: str, message: ControlMessage) -> None:
        self._session(session_id).push(message)

    @overload
    def outputs(self, session_id: str, *, parts: Literal[False] = False) -> AsyncIterator[ChunkOutput]: ...

    @overload
    def outputs(self, session_id: str, *, parts: bool) -> AsyncIterator[ChunkItem]: ...

    def outputs(self, session_id: str, *, parts: bool = False) -> AsyncIterator[ChunkItem]:
        """The session's chunks; with `parts`, each chunk's `ChunkPart`s ahead of it (progressive decode)."""
        return self._session(session_id).chunks(parts=parts)

    async def close_session(self, session_id: str, mode: CloseMode = CloseMode.DRAIN) -> SessionSummary:
        summary = self._summaries.get(session_id)
        if summary is not None and session_id not in self._sessions:
            return summary
        session = self._session(session_id)
        loop_task = self._loops.get(session_id)
        if loop_task is not None and not loop_task.done():
            if mode is CloseMode.DRAIN:
                session.request_stop()
            else:
                loop_task.cancel()
            await asyncio.wait({loop_task})
        return await self._finalize(session, mode)

    def statistics(self) -> ServiceStatistics:
        return ServiceStatistics(
            ready=self.ready,
            sessions=len(self._sessions),
            chunks=self._chunks + sum(s.chunks_emitted for s in self._sessions.values()),
            stale_controls=self._stale + sum(s.stale_controls for s in self._sessions.values()),
            orchestrator=self._orchestrator.statistics(),
            lease=self._lease.statistics() if self._lease is not None else None,
        )

    # -- internals -------------------------------------------------------------------------------------------

    def _post_part(self, session_id: str, chunk_index: int, offset: int, frames: npt.NDArray[np.uint8]) -> None:
        """The decode stage's part sink: from its thread onto the loop, in order (on the loop already, as the
        processes placement calls it, the part is taken at once)."""
        loop = self._loop
        if loop is None:
            return
        if _running_loop() is loop:
            self._deliver_part(session_id, chunk_index, offset, frames)
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody reads the session any more
            loop.call_soon_threadsafe(self._deliver_part, session_id, chunk_index, offset, frames)

    def _deliver_part(self, session_id: str, chunk_index: int, offset: int, frames: npt.NDArray[np.uint8]) -> None:
        session = self._sessions.get(session_id)
        if session is not None:
            session.take_part(chunk_index, offset, frames)

    def _on_denoised(self, session_id: str, sequence_id: int) -> None:
        session = self._sessions.get(session_id)
        if session is None:
            return
        session.denoised(sequence_id)  # its lease grant goes back while the chunk decodes
        if self._orchestrator.session_state(session_id).value == "open":
            session.refill()

    async def _drive(self, session: LingBotSession) -> None:
        tracker = self._trackers.get(session.session_id)
        while True:
            try:
                await session.run()
                if tracker is None or not self._pipeline_failed(session):
                    break
                if not await self._recover(session, tracker):
                    break
            except asyncio.CancelledError:
                if tracker is not None:
                    tracker.stopped()
                return
            except Exception as exc:
                session.failure = f"{type(exc).__name__}: {exc}"
                logger.exception("session %s: chunk loop crashed", session.session_id)
                break
        if tracker is not None and tracker.state is not RecoveryState.FAILED:
            tracker.stopped()
        # a natural end (plan done, stop, failure) releases the session's resources at once
        await self._finalize(session, CloseMode.DRAIN)

    def _pipeline_failed(self, session: LingBotSession) -> bool:
        """After the chunk loop returned: whether it ended because its orchestrator session failed under it (not a
        stop, not the end of the plan)."""
        if session.stop_requested:
            return False
        return session.failure is not None or not session.is_finished()

    async def _recover(self, session: LingBotSession, tracker: RecoveryTracker) -> bool:
        """Re-seed `session` after its orchestrator session failed; False when it cannot be (its `failure` then says
        why) or was stopped meanwhile. Cancellation: the caller's (`_drive`'s) contract."""
        sid = session.session_id
        try:
            report = await self._orchestrator.close_session(sid, CloseMode.CANCEL)
        except PipelineError as exc:
            session.failure = session.failure or f"close failed: {exc}"
            tracker.give_up("the failed pipeline session could not be closed")
            return False
        reason = session.failure or report.failure or "the pipeline session ended"
        has_checkpoint = session.checkpoint is not None and not report.failed_stages
        decision = tracker.failed(self._clock.now(), reason, has_checkpoint=has_checkpoint)
        if not decision.recover:
            session.failure = f"{reason} (not rebuilt: {decision.why})"
            self._unrecovered += 1
            logger.warning("session %s: not rebuilt (%s): %s", sid, decision.why, reason)
            return False
        cause = decision.cause.value if decision.cause is not None else "unknown"
        logger.warning("session %s: rebuilding it (attempt %d, %s): %s", sid, decision.attempt, cause, reason)
        session.failure = None
        self._notify(RecoveryNotice(sid, True, cause, decision.attempt))
        while not self._orchestrator.ready:
            if session.stop_requested:
                tracker.stopped()
                return False
            if tracker.expired(self._clock.now()):
                session.failure = f"{reason} (not rebuilt: {tracker.give_up('its workers did not come back in time')})"
                self._unrecovered += 1
                return False
            await asyncio.sleep(_READY_POLL_S)
        if session.stop_requested:
            tracker.stopped()
            return False
        try:
            session.reseed()
        except PipelineError as exc:  # e.g. the id is poisoned: the old session's release failed
            session.failure = f"{reason} (not rebuilt: {tracker.give_up(f'it could not be reopened: {exc}')})"
            self._unrecovered += 1
            return False
        return True

    def _chunk_out(self, session: LingBotSession, tracker: RecoveryTracker) -> None:
        """A chunk was handed to the reader: it completes a recovery in progress."""
        cause = tracker.cause
        attempt = tracker.attempts
        seconds = tracker.rebuilt(self._clock.now())
        if seconds is None:
            return
        name = cause.value if cause is not None else "unknown"
        self._recovered[name] = self._recovered.get(name, 0) + 1
        logger.info("session %s: rebuilt in %.2f s (%s, attempt %d)", session.session_id, seconds, name, attempt)
        self._notify(RecoveryNotice(session.session_id, False, name, attempt, seconds))

    def _count_adoption(self, session: LingBotSession, cause: str, started: float, *, at_once: bool) -> None:
        """An adopted session's first chunk completes its recovery from leaving its replica: counted under `cause`
        (`PreparedSession.resume_cause`: replica_lost or replica_draining), seconds from `started` (its lost
        replica's last heartbeat or its hand-off, `PreparedSession.down_s` before its restore here), and told to the
        listeners, before the chunk's own callback. `at_once` (adopted paused): its restore completes it, now; its
        first chunk waits for its client's resume, which is no part of the recovery."""
        if at_once:
            self._adopted(session.session_id, cause, started)
            return
        after = session.on_chunk

        def first_chunk() -> None:
            session.on_chunk = after
            self._adopted(session.session_id, cause, started)
            if after is not None:
                after()

        session.on_chunk = first_chunk

    def _adopted(self, session_id: str, cause: str, started: float) -> None:
        seconds = self._clock.now() - started
        self._recovered[cause] = self._recovered.get(cause, 0) + 1
        logger.info("session %s: adopted (%s), back %.2f s after it left its replica", session_id, cause, seconds)
        self._notify(RecoveryNotice(session_id, False, cause, 1, seconds))

    def _notify(self, notice: RecoveryNotice) -> None:
        for listener in self._recovery_listeners:
            try:
                listener(notice)
            except Exception:
                logger.exception("recovery listener failed for session %s", notice.session_id)

    def _finalize(self, session: LingBotSession, mode: CloseMode) -> asyncio.Task[SessionSummary]:
        task = self._finals.get(session.session_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._close(session, mode))
            self._finals[session.session_id] = task
        return task

    async def _close(self, session: LingBotSession, mode: CloseMode) -> SessionSummary:
        session_id = session.session_id
        if self._lease is not None:
            self._lease.remove_session(session_id)
        failure = session.failure
        cleanup: Mapping[str, str] = {}
        leaks = 0
        tracker = self._trackers.get(session_id)
        interrupted = tracker is not None and tracker.interrupted
        try:
            report = await self._orchestrator.close_session(session_id, mode, drain_timeout=30.0)
            if not interrupted:  # a recovery stopped half-way: the failure that started it is not the session's
                failure = failure or report.failure
            cleanup = report.failed_stages
            leaks = report.slot_leaks
            if cleanup and session_id not in self._retries:
                retry = asyncio.get_running_loop().create_task(self._retry_release(session_id))
                self._retries[session_id] = retry
        except PipelineError as exc:
            failure = failure or f"close failed: {exc}"
        session.end_output(failure)
        summary = SessionSummary(session_id, session.chunks_emitted, failure, cleanup, leaks)
        self._chunks += session.chunks_emitted
        self._stale += session.stale_controls
        self._sessions.pop(session_id, None)
        self._loops.pop(session_id, None)
        self._finals.pop(session_id, None)
        self._trackers.pop(session_id, None)
        self._summaries[session_id] = summary
        while len(self._summaries) > self._history:
            self._summaries.popitem(last=False)
        return summary

    async def _retry_release(self, session_id: str) -> None:
        """Retry a poisoned session's failed stage releases with back-off until one succeeds (or give up, logged).

        Cancellation contract: only `aclose()` cancels it, just before the orchestrator stops; a release in flight
        is then abandoned with the rest of the orchestrator's work.
        """
        delay = self._release_retry_s
        try:
            for attempt in range(1, _RELEASE_RETRIES + 1):
                await asyncio.sleep(delay)
                try:
                    report = await self._orchestrator.retry_release(session_id)
                except PipelineError as exc:
                    logger.warning("session %s: release retry %d could not run: %s", session_id, attempt, exc)
                    return
                if not report.failed_stages:
                    logger.info("session %s: release retry %d succeeded; the id is usable again", session_id, attempt)
                    return
                logger.warning(
                    "session %s: release retry %d failed: %s", session_id, attempt, dict(report.failed_stages)
                )
                delay = min(delay * 2, _RELEASE_RETRY_MAX_S)
            logger.error("session %s: giving up releasing stages after %d retries", session_id, _RELEASE_RETRIES)
        finally:
            self._retries.pop(session_id, None)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # a stage thread: no loop runs there
        return None
