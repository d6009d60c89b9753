"""What every session binding shares, whichever connection it serves the session over (LiveKit room, WebRTC peer).

A binding serves one session to one client across connections that come and go. `BindingCore` owns what does not
depend on the kind of connection: the binding's lifecycle (`BindingState`, checked against the binding's own
transition table), its background tasks (feeding the frame pacer from the session's chunks, pacing, relaying the
session's status messages into the outbox, sending the outbox), the grace timer that ends a session whose client
never came or did not come back, the control intake and its replies, and the common steps of closing. A binding
composes one core and gives it the connection-specific parts as callables: where a due frame goes, how a status
message is encoded for its wire, what to do when the grace expires, and itself as the `StatusLink` the outbox
sends on.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from pipeline.bidirectional import ChunkItem, ChunkOutput, ChunkPart
from pipeline.clock import Clock, MonotonicClock
from transport.base import ChunkStatus, DoneStatus, SessionPort, StateStatus, StatusMessage
from transport.session.control import ControlIntake, ControlStatistics
from transport.session.delivery import DeliveryWatermark
from transport.session.outbox import (
    Outbound,
    OutboxStatistics,
    StatusLink,
    StatusOutbox,
    encode_outbound,
    flush_status,
    relay_status,
)
from transport.session.pacing import FramePacer, PacedFrame, PacerStatistics, PacingConfig, frame_pts
from transport.session.timers import GraceTimer, Timers

__all__ = [
    "TERMINAL_BINDING_STATES",
    "BindingCore",
    "BindingCoreStatistics",
    "BindingLifecycle",
    "BindingSettings",
    "BindingState",
    "DeliverFrame",
    "EncodeStatus",
    "PartFeed",
    "TransitionTable",
]

logger = logging.getLogger(__name__)


class BindingState(enum.Enum):
    NEW = "new"  # created; start() not called yet
    JOINING = "joining"  # the first join is in progress (LiveKit only: the embedded binding serves from start())
    LIVE = "live"  # serving: frames and status go to the current connection, whenever there is one
    REJOINING = "rejoining"  # the room connection was lost, not for good: joining again (LiveKit only)
    OVER = "over"  # the client is gone for good and client_gone was called; waiting for detach
    CLOSED = "closed"  # detached: tasks stopped, the connection closed


TERMINAL_BINDING_STATES: frozenset[BindingState] = frozenset({BindingState.CLOSED})
_ENDED_STATES = frozenset({BindingState.OVER, BindingState.CLOSED})

TransitionTable = Mapping[BindingState, frozenset[BindingState]]
"""Each state a binding can be in, with the states it may move to. A state without a row is never entered."""


class BindingLifecycle:
    """The state of one binding and the only place it changes: `move` checks the binding's transition table.

    `wait_live()` returns once the binding is LIVE (at once if it is), for a sender waiting for its link.
    """

    def __init__(self, kind: str, session_id: str, transitions: TransitionTable) -> None:
        for state, moves in transitions.items():
            if state in TERMINAL_BINDING_STATES and moves:
                raise ValueError(f"the terminal state {state} has moves in the {kind} transition table")
            missing = moves.difference(transitions)
            if missing:
                raise ValueError(f"the {kind} transition table leads from {state} to {missing} but has no row for it")
        if BindingState.NEW not in transitions:
            raise ValueError(f"the {kind} transition table has no row for {BindingState.NEW}")
        self._kind = kind
        self._session_id = session_id
        self._transitions = transitions
        self._state = BindingState.NEW
        self._live = asyncio.Event()

    @property
    def state(self) -> BindingState:
        return self._state

    @property
    def ended(self) -> bool:
        """The client is gone for good (OVER) or the binding is closed: no more presence changes."""
        return self._state in _ENDED_STATES

    @property
    def closed(self) -> bool:
        return self._state in TERMINAL_BINDING_STATES

    def move(self, new: BindingState) -> None:
        allowed = self._transitions.get(self._state, frozenset())
        if new not in allowed:
            raise RuntimeError(
                f"{self._kind} binding of session {self._session_id!r} cannot move from {self._state} to {new}"
            )
        logger.debug("session %s: binding %s -> %s", self._session_id, self._state.value, new.value)
        self._state = new
        if new is BindingState.LIVE:
            self._live.set()
        else:
            self._live.clear()

    async def wait_live(self) -> None:
        await self._live.wait()


class BindingSettings(Protocol):
    """What the core reads from a transport's configuration (`LiveKitConfig` and `EmbeddedConfig` both have it)."""

    @property
    def ring_frames(self) -> int: ...

    @property
    def reanchor_after(self) -> float: ...

    @property
    def idle_frame_interval(self) -> float: ...

    @property
    def status_max_bytes(self) -> int: ...

    @property
    def status_flush_timeout(self) -> float: ...


DeliverFrame = Callable[[PacedFrame], bool]
"""Hands a due frame to the current connection; False when there is none to take it (the frame is counted unsent).
Called by the pacer on the event loop: it must not block."""

_HELD_STATUSES = 8  # chunk statuses waiting for their first frame; beyond it the oldest goes out without a pts
_PACED_REMEMBERED = 16  # chunks whose first frame went out before their status came: their pts, for that status

EncodeStatus = Callable[[StatusMessage], Outbound]
"""Encodes one of the session's status messages for the binding's wire (and picks its reliability)."""


class PartFeed:
    """Which frames of a session's chunk stream still go to the pacer, where chunks come in parts (progressive decode).

    A chunk's `ChunkPart`s come ahead of its `ChunkOutput`, which carries all its frames again. Each part is paced as
    it comes if it continues the chunk's frames without a gap; the whole chunk then brings only the frames no part
    brought. A part that does not continue (a slow subscriber lost the one before it) is skipped, and its frames come
    with the whole chunk; parts of a chunk already paced whole are skipped. `next(item)` returns what to push (None:
    nothing new)."""

    def __init__(self) -> None:
        self._chunk = -1
        self._fed = 0  # frames of chunk `_chunk` pushed so far (offsets below it)

    def next(self, item: ChunkItem) -> ChunkOutput | ChunkPart | None:
        if isinstance(item, ChunkPart):
            if item.index != self._chunk:
                if item.index < self._chunk or item.offset != 0:
                    return None
                self._chunk, self._fed = item.index, 0
            if item.offset != self._fed:
                return None
            self._fed += len(item.frames)
            return item
        if item.index != self._chunk:
            self._chunk, self._fed = item.index, len(item.frames)
            return item
        done, self._fed = self._fed, max(self._fed, len(item.frames))
        if done >= len(item.frames):
            return None
        if done == 0:
            return item
        rest = item.frames[done:]
        return ChunkPart(item.session_id, item.index, rest, item.fps, item.first_frame_index + done, done)


@dataclass(frozen=True, slots=True)
class BindingCoreStatistics:
    """`frames_delivered`: frames a connection took; `frames_unsent`: frames the pacer released with no connection
    to take them (generated frames only: keep-warm repeats are the pacer's `idle_frames_sent`). `tasks`:
    background tasks running now."""

    state: BindingState
    tasks: int
    timer_pending: bool
    frames_delivered: int
    frames_unsent: int
    control: ControlStatistics
    pacer: PacerStatistics
    outbox: OutboxStatistics


class BindingCore:
    """The task, timer and status machinery of one session binding, composed into each kind of binding.

    Problem: a binding serves a session over connections that come and go, but four loops must run for the
    binding's whole life, whatever the connection, and stop together exactly once: feeding the pacer from the
    session's chunks, pacing frames out to the current connection, relaying the session's status messages into the
    outbox, and sending the outbox on the binding's link. Binding-specific work (a rejoin, closing a failed peer
    connection) runs as tasks with the same owner. The core spawns, holds and finally cancels them all, so that no
    task outlives its binding.

    Example::

        # in the binding's __init__ (self is the StatusLink):
        self._core = BindingCore(
            port, kind="LiveKit", task_prefix="lk", settings=config, transitions=_TRANSITIONS, timers=timers,
            clock=clock, link=self, deliver=self._deliver, encode=self._encode_status,
            on_grace_expired=self._grace_expired,
        )
        # start():
        self._core.move(BindingState.LIVE)
        self._core.start_timer(config.initial_join_timeout, "the controller never joined")
        self._core.start_serving()
        # close():
        if await self._core.aclose(reason):
            await self._leave_room()     # the connection goes last, after every task stopped

    Ordering: `start_serving` starts the loops in this order: feed, pace, relay, send. Status messages reach the
    client in the order the session published them (one relay, one sender); `put_first` (a greeting) is the only
    way ahead of the queue. The grace timer's expiry is passed on only while the binding has not ended (OVER or
    CLOSED), so a timer that fires after the client came back or after detach changes nothing. `aclose()` moves to
    CLOSED before it cancels anything, so SDK callbacks that run during the teardown see CLOSED and stand aside; the
    binding closes its connection only after every task has stopped.

    Backpressure: none reaches the session. Frames wait in the pacer's bounded ring (`ring_frames`; the oldest is
    dropped on overflow, late frames are dropped), status messages in the outbox's bounded queue (64, the oldest is
    dropped); `deliver` and `reply` never block. Failures are scoped: a task that raises is logged with the session
    id and dropped, the others go on.

    Cancellation: `aclose()` first lets the last status messages out when the link is ready (the session's final
    `done`), bounded by `status_flush_timeout`; then it moves to CLOSED, cancels the grace timer, closes the pacer
    (pending frames are dropped), cancels every task once and awaits them all. It returns True to the one call that
    did this, and the binding then closes its connection; it returns False at once when the binding was already
    closed (a call that was flushing concurrently returns False once the other has moved to CLOSED, possibly before
    the other's teardown finished). Cancelling `aclose()` during the flush leaves everything running and `aclose()`
    may be called again. Spawning after CLOSED raises: no task is left without an owner.
    """

    def __init__(
        self,
        port: SessionPort,
        *,
        kind: str,
        task_prefix: str,
        settings: BindingSettings,
        transitions: TransitionTable,
        timers: Timers,
        clock: Clock | None,
        link: StatusLink,
        deliver: DeliverFrame,
        encode: EncodeStatus,
        on_grace_expired: Callable[[str], None],
        reply_to: str | None = None,
    ) -> None:
        self._port = port
        self._kind = kind
        self._task_prefix = task_prefix
        self._settings = settings
        self._link = link
        self._deliver = deliver
        self._encode = encode
        self._on_grace_expired = on_grace_expired
        self._reply_to = reply_to
        self._lifecycle = BindingLifecycle(kind, port.session_id, transitions)
        self._timer = GraceTimer(timers, self._grace_expired)
        clock = clock if clock is not None else MonotonicClock()
        self._pacer = FramePacer(
            PacingConfig(
                fps=port.fps,
                width=port.width,
                height=port.height,
                ring_frames=settings.ring_frames,
                reanchor_after=settings.reanchor_after,
                idle_frame_interval=settings.idle_frame_interval,
            ),
            clock=clock,
        )
        self._intake = ControlIntake(port, self.reply, clock=clock)
        self._outbox = StatusOutbox()
        self._tasks: set[asyncio.Task[None]] = set()
        self._relay: asyncio.Task[None] | None = None
        self._last_state: StateStatus | None = None
        self._frames_delivered = 0
        self._frames_unsent = 0
        self._held: deque[ChunkStatus] = deque()
        self._fed_through = -1
        self._paced_first: OrderedDict[int, int] = OrderedDict()  # chunk index -> its first paced frame's pts
        self._delivery = DeliveryWatermark()  # how far the pacer got, told to the port (`SessionPort.delivered`)

    @property
    def session_id(self) -> str:
        return self._port.session_id

    @property
    def intake(self) -> ControlIntake:
        """Where the binding hands the client's control messages."""
        return self._intake

    @property
    def outbox(self) -> StatusOutbox:
        return self._outbox

    # -- lifecycle ------------------------------------------------------------------------------------------------

    @property
    def state(self) -> BindingState:
        return self._lifecycle.state

    @property
    def ended(self) -> bool:
        """OVER or CLOSED: the client is gone for good or the binding is detached."""
        return self._lifecycle.ended

    @property
    def closed(self) -> bool:
        return self._lifecycle.closed

    def move(self, new: BindingState) -> None:
        """Change state; a move the binding's transition table does not allow raises `RuntimeError`."""
        self._lifecycle.move(new)

    async def wait_live(self) -> None:
        await self._lifecycle.wait_live()

    def over(self, reason: str) -> None:
        """The client is gone for good: stop the grace timer, move to OVER and tell the session (once)."""
        if self.ended:
            return
        self._timer.cancel()
        self.move(BindingState.OVER)
        logger.info("session %s: the client is gone: %s", self.session_id, reason)
        try:
            self._port.client_gone(reason)
        except Exception:
            logger.exception("session %s: client_gone failed", self.session_id)

    # -- tasks ----------------------------------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Run `coro` as a task the core owns (named `<prefix>-<name>:<session id>`); `aclose()` cancels it."""
        task_name = f"{self._task_prefix}-{name}:{self.session_id}"
        if self.closed:
            coro.close()
            raise RuntimeError(
                f"the {self._kind} binding of session {self.session_id!r} is closed; not starting {name}"
            )
        task = asyncio.get_running_loop().create_task(coro, name=task_name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("session %s: task %s failed", self.session_id, task.get_name(), exc_info=task.exception())

    def start_serving(self) -> None:
        """Start the four loops: feed the pacer, pace frames to `deliver`, relay status, send the outbox."""
        self.spawn(self._feed(), "feed")
        self.spawn(self._pacer.run(self._sink), "pacer")
        self._relay = self.spawn(relay_status(self._port, self._outbox, self._encode_relayed), "status")
        self.spawn(self._outbox.run(self._link), "send")

    async def _feed(self) -> None:
        parts = PartFeed()
        async for item in self._port.chunks():
            frames = parts.next(item)
            if frames is not None:
                self._pacer.push_chunk(frames)
            self._fed_through = max(self._fed_through, item.index)
            if isinstance(item, ChunkOutput):
                count = item.frames.shape[0] if item.frames.ndim == 4 else 1
                self._delivered(self._delivery.fed(item.index, item.first_frame_index + count - 1))

    def _delivered(self, through: int | None) -> None:
        """Tell the session its chunks up to `through` left the pacer (None: nothing new)."""
        if through is None:
            return
        try:
            self._port.delivered(through)
        except Exception:
            logger.exception("session %s: delivered(%d) failed", self.session_id, through)

    def _sink(self, frame: PacedFrame) -> None:
        if frame.repeat:
            # Keep-warm: the last frame again, to whoever is connected. No generated frame: not counted as one
            # (the pacer counts repeats), and no chunk status goes out with it.
            self._deliver(frame)
            return
        if self._deliver(frame):
            self._frames_delivered += 1
        else:
            self._frames_unsent += 1
        # Sent or not (no connection: the client's clock moves on all the same), the frame left the pacer.
        self._delivered(self._delivery.released(frame.chunk_index, frame.frame_index))
        # A held chunk status goes out with its first frame, stamped with that frame's presentation timestamp.
        pts = frame_pts(frame, self._port.fps)
        if frame.chunk_index not in self._paced_first:
            self._paced_first[frame.chunk_index] = pts
            while len(self._paced_first) > _PACED_REMEMBERED:
                self._paced_first.popitem(last=False)
        while self._held and self._held[0].index <= frame.chunk_index:
            status = self._held.popleft()
            if status.index == frame.chunk_index:
                status = replace(status, first_frame_pts=pts)
            self._outbox.put(self._encode(status))

    # -- grace timer ----------------------------------------------------------------------------------------------

    def start_timer(self, delay: float, reason: str) -> None:
        """(Re)start the grace timer: unless cancelled, `on_grace_expired(reason)` runs in `delay` seconds."""
        self._timer.start(delay, reason)

    def cancel_timer(self) -> None:
        self._timer.cancel()

    def _grace_expired(self, reason: str) -> None:
        if self.ended:
            return
        self._on_grace_expired(reason)

    # -- status ---------------------------------------------------------------------------------------------------

    @property
    def last_state(self) -> StateStatus | None:
        """The session's latest `state` status (a client that (re)connects is told it)."""
        return self._last_state

    def encode_reply(self, message: StatusMessage) -> Outbound:
        """A reply to the client (control errors, the current state): reliable, addressed to `reply_to`."""
        return encode_outbound(message, max_bytes=self._settings.status_max_bytes, destination=self._reply_to)

    def reply(self, message: StatusMessage) -> None:
        self._outbox.put(self.encode_reply(message))

    def _encode_relayed(self, message: StatusMessage) -> Outbound | None:
        """Chunk statuses whose frames are still to be paced (or not yet fed) are held until the first of them is
        sent, so that the client learns which presented frame starts the chunk (`first_frame_pts`); `done` lets
        every held status out first. Bounded (`_HELD_STATUSES`, the oldest goes out unstamped). A status that comes
        after its chunk's first frame was paced (the pacer sent it at once: the relay and the feed race) is stamped
        with that frame's pts, remembered for the last `_PACED_REMEMBERED` chunks, whether or not later frames of its
        chunk are still waiting to be paced."""
        # A status whose chunk's first frame went out already is stamped at once (its later frames may still wait:
        # progressive decode paces a chunk's first part before the chunk, and so its status, is complete). A status
        # that overtook its chunk (the feed task has not run yet) is held too, once frames have flowed.
        if isinstance(message, ChunkStatus) and message.first_frame_pts is None:
            paced = self._paced_first.get(message.index)
            if paced is not None:
                return self._encode(replace(message, first_frame_pts=paced))
        if isinstance(message, ChunkStatus) and (
            0 <= self._fed_through < message.index or self._pacer.holds_chunk(message.index)
        ):
            if len(self._held) >= _HELD_STATUSES:
                self._outbox.put(self._encode(self._held.popleft()))
            self._held.append(message)
            return None
        if isinstance(message, DoneStatus):
            while self._held:
                self._outbox.put(self._encode(self._held.popleft()))
        if isinstance(message, StateStatus):
            self._last_state = message
        return self._encode(message)

    # -- closing --------------------------------------------------------------------------------------------------

    async def aclose(self, reason: str) -> bool:
        """Flush, then stop everything the core owns (see the class docstring). True for the call that closed."""
        if self.closed:
            return False
        logger.info("session %s: closing the %s binding (%s)", self.session_id, self._kind, reason)
        if self._link.link_ready:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.status_flush_timeout):
                    await flush_status(self._relay, self._outbox)
        if self.state in TERMINAL_BINDING_STATES:  # read again after the await: a concurrent call closed it
            return False
        self.move(BindingState.CLOSED)
        self._timer.cancel()
        self._pacer.close()
        tasks = tuple(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return True

    def statistics(self) -> BindingCoreStatistics:
        return BindingCoreStatistics(
            state=self.state,
            tasks=len(self._tasks),
            timer_pending=self._timer.pending,
            frames_delivered=self._frames_delivered,
            frames_unsent=self._frames_unsent,
            control=self._intake.statistics(),
            pacer=self._pacer.statistics(),
            outbox=self._outbox.statistics(),
        )
