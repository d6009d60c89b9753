"""When a `LiveStream` joins its session again, and when it gives up: `Reconnector`, the pure core of the client's
automatic reconnect (issue #33, docs/continuity.md), and `ReconnectPolicy`, its bounds.

A replica that dies takes its side of the peer connection with it; with the Redis backend another replica adopts
the session from its checkpoint and goes on with the same id (docs/continuity.md). The client has to notice and
join again through the service, which routes it to whichever replica now runs the session. Noticing is the hard
part on the embedded transport: aiortc calls a connection failed only after its ICE consent checks fail (about 30
s), so the core also watches the stream: when nothing arrived for `stall_s` (no frame, no status, and no RTCP sender
report, which the service's video sender sends every 0.5-1.5 s however idle the session: `EmbeddedLink` tells the
stream of each), it asks the service about the session (`probe`). The service's answer decides:

- **ended** (closed, failed, expired, cancelled): the stream ends with the session's reason and error code;
- **running**, or **recovering** because its replica was lost (`reason` starting with `replica_lost`), while
  nothing arrives: the connection is broken (even the sender reports stopped), so the stream joins again;
- **paused**, **draining**, or **recovering** on its own replica (a model worker restarting, `worker_lost`): nothing
  says the replica is gone (the registry says `running` on a dead replica until the reaper turns the session into
  an orphan, `recovering`, one replica TTL after its last heartbeat); the core asks again every `probe_interval_s`
  and keeps the connection meanwhile.

A connection the link reports *failed* (the peer connection's ICE checks failed) goes straight to joining again. One it
reports *closed* (the data channel or the peer connection closed from the other side) is first asked about: the service
closes a controller's connection when another offer rebinds the session (a second client with the same credential took
over) and when the session ends, so only a session `recovering` (its replica lost, or handed off: a draining replica
tells the client `recovering` over the connection before it closes it, and such a close is joined again even if the
adopter already runs the session when the service is asked) is joined again; an
ended one ends the stream with its reason, any other ends it as before (`connection lost`), so that two clients never
take the session from each other in turn. Joining again: ask the service; an ended session ends the stream; one that
streams (join details given) is joined (an offer through the service); a refusal (the session is not yet adopted, the
offer reached a replica that does not run it: `409`, the service unreachable) waits a back-off (`first_delay_s` doubling
to `max_delay_s`) and tries again, until `budget_s` after the connection was given up; then the stream ends with
`reconnect_timeout`. The default budget (60 s, the same as `@lingstream/client`'s `REJOIN_BUDGET_MS`) is the longest a
session can take to come back on the service's defaults: the replica TTL (10 s: the reaper orphans the session one TTL
after the replica's last heartbeat), then the adoption wait (30 s: an orphan no replica took by then fails
`replica_lost`, which the client is told when it asks), then the adopter's rebuild and the new connection (the other
20 s); a service with a longer `LINGSTREAM_REPLICA_TTL` should be given a longer budget.

Pure: no awaits, no clock of its own. The shell (`transport.client.stream`) tells it what happened, with the time,
and asks `next_step(now)` what to do; its tests drive it step by step.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = [
    "RECONNECT_TIMEOUT",
    "End",
    "Join",
    "Probe",
    "ReconnectPhase",
    "ReconnectPolicy",
    "Reconnector",
    "SessionView",
    "Step",
    "Wait",
]

RECONNECT_TIMEOUT = "reconnect_timeout"  # the stable code of a stream that could not join its session again in time
_TERMINAL = frozenset({"closed", "expired", "failed", "cancelled"})
_REPLICA_LOST = "replica_lost"


@dataclass(frozen=True, slots=True)
class ReconnectPolicy:
    """The bounds of the automatic reconnect (see the module docstring). `budget_s`: how long after a connection
    was given up the stream keeps trying to join again; `first_delay_s` doubling to `max_delay_s`: the back-off
    between tries; `stall_s`: how long a stream may receive nothing before the service is asked about its session;
    `probe_interval_s`: how often it is asked again while the silence goes on (a paused session)."""

    budget_s: float = 60.0
    first_delay_s: float = 0.25
    max_delay_s: float = 2.0
    stall_s: float = 3.0
    probe_interval_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("budget_s", "first_delay_s", "max_delay_s", "stall_s", "probe_interval_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"ReconnectPolicy.{name} must be positive, got {value}")
        if self.max_delay_s < self.first_delay_s:
            raise ValueError(
                f"ReconnectPolicy.max_delay_s ({self.max_delay_s}) must not be below first_delay_s "
                f"({self.first_delay_s})"
            )


@dataclass(frozen=True, slots=True)
class SessionView:
    """What the service said about the session (from its body): `status`, `reason`, `error` (code, message) when it
    failed, and whether it can be joined now (`joinable`: it streams and has join details)."""

    status: str
    reason: str | None
    error: tuple[str, str] | None
    joinable: bool

    @property
    def ended(self) -> bool:
        return self.status in _TERMINAL

    @property
    def replica_lost(self) -> bool:
        return (self.reason or "").startswith(_REPLICA_LOST)


@dataclass(frozen=True, slots=True)
class Wait:
    """Nothing to do until `until` (or until something happens)."""

    until: float


@dataclass(frozen=True, slots=True)
class Probe:
    """Ask the service about the session; answer with `probed` or `probe_failed`."""


@dataclass(frozen=True, slots=True)
class Join:
    """Join the session again (an offer through the service); answer with `joined` or `join_failed`."""


@dataclass(frozen=True, slots=True)
class End:
    """Give up: the stream ends with `reason`; `error` (code, message) when there is one to report."""

    reason: str
    error: tuple[str, str] | None


Step = Wait | Probe | Join | End


class ReconnectPhase(enum.Enum):
    CONNECTED = "connected"  # frames or statuses arrive (or arrived less than `stall_s` ago)
    SUSPECT = "suspect"  # silent for `stall_s`: the service is asked what the session does
    RECOVERING = "recovering"  # the connection was given up: joining again, within the budget
    ENDED = "ended"  # the session ended, or the budget ran out; nothing more to do


_MOVES: dict[ReconnectPhase, frozenset[ReconnectPhase]] = {
    ReconnectPhase.CONNECTED: frozenset({ReconnectPhase.SUSPECT, ReconnectPhase.RECOVERING, ReconnectPhase.ENDED}),
    ReconnectPhase.SUSPECT: frozenset({ReconnectPhase.CONNECTED, ReconnectPhase.RECOVERING, ReconnectPhase.ENDED}),
    ReconnectPhase.RECOVERING: frozenset({ReconnectPhase.CONNECTED, ReconnectPhase.ENDED}),
    ReconnectPhase.ENDED: frozenset(),
}


class Reconnector:
    """The decisions of one stream's automatic reconnect (module docstring). Tell it what happened (`activity`,
    `link_lost`, `probed`, `probe_failed`, `joined`, `join_failed`, `ended`) and ask `next_step(now)`."""

    def __init__(self, policy: ReconnectPolicy, now: float) -> None:
        self.policy = policy
        self._phase = ReconnectPhase.CONNECTED
        self._last_activity = now
        self._next_probe = now
        self._lost_at: float | None = None  # when the connection was given up (RECOVERING)
        self._why = ""
        self._next_try = now
        self._tries = 0
        self._busy = False  # a Probe or Join was handed out and not answered yet
        self._end: End | None = None
        self._join_next = False
        self._closed_why: str | None = None  # the link reported the connection closed: ask before joining again
        self._told_recovering = False  # the last state the connection told: recovering (a hand-off closes it next)
        self.reconnects = 0
        self.last_recovery_s: float | None = None  # from giving the connection up to joining again

    @property
    def phase(self) -> ReconnectPhase:
        return self._phase

    @property
    def lost_why(self) -> str:
        """Why the connection was given up (RECOVERING), for the `recovering` state's detail."""
        return self._why

    def _move(self, to: ReconnectPhase) -> None:
        if to is self._phase:
            return
        if to not in _MOVES[self._phase]:
            raise RuntimeError(f"a reconnect cannot go from {self._phase.value} to {to.value}")
        self._phase = to

    # -- what happened ------------------------------------------------------------------------------------------

    def activity(self, now: float) -> None:
        """A frame or a status arrived over the current connection."""
        self._last_activity = now
        if self._phase is ReconnectPhase.SUSPECT and not self._busy and self._closed_why is None:
            self._move(ReconnectPhase.CONNECTED)

    def told(self, state: str) -> None:
        """The service told the session's state over the current connection. `recovering` right before it closes
        the connection is a hand-off (its replica drains and gives the session to another; docs/continuity.md):
        that close is joined again whatever the service says when asked (the adopter may already run it), unless
        the session ended."""
        self._told_recovering = state == "recovering"

    def link_lost(self, now: float, why: str, *, failed: bool) -> None:
        """The link reported the connection over: `failed` (ICE consent lost: join again) or closed from the other
        side (ask the service first; see the module docstring)."""
        if self._phase not in (ReconnectPhase.CONNECTED, ReconnectPhase.SUSPECT):
            return
        if failed:
            self._give_up_connection(now, why)
            return
        self._closed_why = why
        self._next_probe = now
        self._move(ReconnectPhase.SUSPECT)

    def ended(self, reason: str) -> None:
        """The session ended over the connection (`done`) or the user closed the stream: nothing more to do."""
        if self._phase is not ReconnectPhase.ENDED:
            self._end = End(reason, None)
            self._move(ReconnectPhase.ENDED)

    def probed(self, now: float, view: SessionView) -> None:
        self._busy = False
        if self._phase is ReconnectPhase.ENDED:
            return
        if view.ended:
            self._finish(End(view.reason or view.status, view.error))
            return
        if self._phase is ReconnectPhase.RECOVERING:
            if view.joinable:
                self._next_try = now  # join at once
                self._join_next = True
            else:
                self._back_off(now)
            return
        if self._closed_why is not None:
            if view.status == "recovering" or self._told_recovering:
                self._give_up_connection(now, self._closed_why)
            else:
                self._finish(End(f"connection lost: {self._closed_why}", None))
            return
        silent_for = now - self._last_activity
        if silent_for < self.policy.stall_s:
            self._move(ReconnectPhase.CONNECTED)  # something arrived while the service was asked
            return
        if view.status == "running" or (view.status == "recovering" and view.replica_lost):
            self._give_up_connection(now, f"nothing received for {silent_for:.1f} s while the session is {view.status}")
            return
        self._next_probe = now + self.policy.probe_interval_s  # paused, draining, a worker recovering: silence is fine

    def probe_failed(self, now: float, why: str) -> None:
        """The service could not be asked (unreachable, an error answer)."""
        self._busy = False
        if self._phase is ReconnectPhase.RECOVERING:
            self._why = self._why or why
            self._back_off(now)
        elif self._phase is ReconnectPhase.SUSPECT:
            if self._closed_why is not None:  # the connection is gone and the service cannot say why: join again
                self._give_up_connection(now, self._closed_why)
                self._back_off(now)
                return
            self._next_probe = now + self.policy.probe_interval_s

    def joined(self, now: float) -> None:
        self._busy = False
        self._join_next = False
        if self._phase is not ReconnectPhase.RECOVERING:
            return
        assert self._lost_at is not None
        self.reconnects += 1
        self._told_recovering = False
        self.last_recovery_s = now - self._lost_at
        self._last_activity = now
        self._lost_at = None
        self._tries = 0
        self._move(ReconnectPhase.CONNECTED)

    def join_failed(self, now: float, why: str) -> None:
        self._busy = False
        self._join_next = False
        if self._phase is ReconnectPhase.RECOVERING:
            self._back_off(now)

    # -- what to do ---------------------------------------------------------------------------------------------

    def next_step(self, now: float) -> Step:
        policy = self.policy
        match self._phase:
            case ReconnectPhase.ENDED:
                assert self._end is not None
                return self._end
            case ReconnectPhase.CONNECTED:
                stall_at = self._last_activity + policy.stall_s
                if now < stall_at:
                    return Wait(stall_at)
                self._move(ReconnectPhase.SUSPECT)
                self._next_probe = now
                return self._hand_out(Probe())
            case ReconnectPhase.SUSPECT:
                if self._busy:
                    return Wait(now + policy.probe_interval_s)
                if now < self._next_probe:
                    return Wait(self._next_probe)
                return self._hand_out(Probe())
            case ReconnectPhase.RECOVERING:
                assert self._lost_at is not None
                deadline = self._lost_at + policy.budget_s
                if now >= deadline:
                    why = f"{self._why}; the session could not be joined again within {policy.budget_s:g} s"
                    return self._finish(End(f"connection lost: {why}", (RECONNECT_TIMEOUT, why)))
                if self._busy:
                    return Wait(min(deadline, now + policy.probe_interval_s))
                if now < self._next_try:
                    return Wait(min(self._next_try, deadline))
                return self._hand_out(Join() if self._join_next else Probe())
        raise AssertionError(self._phase)  # pragma: no cover - every phase is matched above

    # -- helpers ------------------------------------------------------------------------------------------------

    def _hand_out(self, step: Probe | Join) -> Step:
        self._busy = True
        return step

    def _give_up_connection(self, now: float, why: str) -> None:
        self._lost_at = now
        self._why = why
        self._next_try = now
        self._tries = 0
        self._join_next = False
        self._closed_why = None
        self._move(ReconnectPhase.RECOVERING)

    def _back_off(self, now: float) -> None:
        delay = min(self.policy.first_delay_s * (2**self._tries), self.policy.max_delay_s)
        self._tries += 1
        self._next_try = now + delay

    def _finish(self, end: End) -> End:
        self._end = end
        self._busy = False
        self._move(ReconnectPhase.ENDED)
        return end
