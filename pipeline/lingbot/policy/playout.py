"""When a real-time session starts its next chunk: just in time for playback, not a whole chunk ahead (issue #16).

A key press shows on screen when the first chunk generated from it is played. Every frame generated before that
chunk and still waiting to be played stands between the press and the photon, so a session should hold as little
generated video ahead of playback as it can without running dry. `PlayoutScheduler` tracks, on the session's own
clock, when playback of what was generated ends, and dates the next chunk's start from it::

    a chunk plays from    max(ready_at, end of the previous chunk)     (back to back while the stream continues)
    it plays until        its start + len(frames) / fps
    chunk k+1 starts at   end of chunk k - p95(generation time) - margin,   margin = clamp(f * p95, min, max)

Generation time is measured from `started` (the session wants the chunk; the lease wait counts) to `ready`, over
the last `window` chunks. Until one is measured the next chunk starts at once. After an idle pause the end lies in
the past and the next chunk starts at once and plays as soon as it is ready: nothing is owed for the pause. An
under-run is a chunk that was started while the stream was still playing and came ready after it had ended: the
viewer saw the last frame stand still for `underrun_s` (counted in frames, `underrun_frames`). A chunk started
after the stream had ended (the session was idle) is no under-run.

Progressive decode (a chunk's frames handed over in parts as they are decoded, `ready(..., parts=...)`). A chunk's
playback starts when its *first part* is ready (or when the previous chunk ends, if later) and goes on part by part;
a later part that comes after the frames before it have played is a stall inside the chunk, counted as an under-run
like a late chunk (also in a chunk that started after an idle pause). The chunk's generation time, the figure the
next chunk's start is dated from, is then how long after `started` its playback could begin without any stall:
`max over parts (ready_i - started - frames before part i / fps)`, which is `ready - started` for a chunk in one
part. So under-runs stay honest (a stall at the chunk's start or in its middle is counted) and the schedule only
gains from the first part where the later parts keep pace with playback. The margin stays that of the whole chunk
(`margin_fraction` of the p95 of `ready - started`): how much a chunk's generation time varies follows all of its
work, not its first part's, and the later parts must still keep pace when it runs slow.

Two chunks in flight (issue #32: chunk k + 1's DiT runs while chunk k decodes). While chunk k is still being
generated, chunk k + 1's start is dated from where chunk k's playback is expected to end: ready `p95` after its start
(or when the stream before it ends, if later), then its frames long (`due(frames_in_flight=...)`). When generation
keeps up with playback that is after chunk k is ready anyway (nothing changes); when it does not, chunk k + 1 starts
while chunk k decodes, which is what the overlap is for. Each `started` is one chunk: `ready` completes the oldest
started chunk, `abandon` forgets the newest, `abandon_all` every one (a re-seed). A chunk started while another is
being generated counts as continuing the stream (its lateness is an under-run).

Pure: no awaits, no threads; every call takes the time, so a test drives it with any clock.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from admission.summary import percentile

__all__ = ["ChunkPlayout", "PlayoutConfig", "PlayoutScheduler", "PlayoutStatistics"]


@dataclass(frozen=True, slots=True)
class PlayoutConfig:
    """The scheduler's knobs. `margin_fraction` of the p95 generation time, clamped to `[min_margin_s,
    max_margin_s]`, is the safety margin a chunk should be ready by before the previous one ends; `window` is how
    many recent generation times the p95 is taken over."""

    fps: float
    min_margin_s: float = 0.03
    max_margin_s: float = 0.25
    margin_fraction: float = 0.5
    window: int = 32

    def __post_init__(self) -> None:
        if not (math.isfinite(self.fps) and self.fps > 0):
            raise ValueError(f"fps must be positive, got {self.fps}")
        if not 0 <= self.min_margin_s <= self.max_margin_s:
            raise ValueError(f"need 0 <= min_margin_s <= max_margin_s, got {self.min_margin_s}, {self.max_margin_s}")
        if self.margin_fraction < 0:
            raise ValueError(f"margin_fraction must not be negative, got {self.margin_fraction}")
        if self.window < 1:
            raise ValueError(f"window must be at least 1, got {self.window}")


@dataclass(frozen=True, slots=True)
class ChunkPlayout:
    """Where one ready chunk lands on the playback timeline.

    `lead_s`: how long its first frame waits to be played (video generated ahead of playback; 0 when it plays at
    once). `underrun_s`/`underrun_frames`: how long, and for how many frame slots, the stream had nothing to play
    before it (0 unless the stream was meant to continue)."""

    starts_at: float
    ends_at: float
    lead_s: float
    underrun_s: float
    underrun_frames: int


@dataclass(frozen=True, slots=True)
class PlayoutStatistics:
    """Since the session opened: `chunks` and `frames` scheduled, `underruns` (chunks late for a continuing
    stream) and the `underrun_frames` they cost, the largest `max_lead_s`, and the current `generation_p95_s`
    (None before the first chunk) and `margin_s`."""

    chunks: int
    frames: int
    underruns: int
    underrun_frames: int
    max_lead_s: float
    generation_p95_s: float | None
    margin_s: float


class PlayoutScheduler:
    """The just-in-time chunk schedule of one session (see the module docstring).

    Per chunk, in order: `due()` says when to start it (a time on the caller's clock; at or before `now` means at
    once; `due(frames_in_flight=n)` while a started chunk of n frames is not ready yet), `started(now)` when the
    session begins it (before waiting for the lease), `ready(now, frames)` when its frames are out (the oldest
    started chunk), or `abandon()` when the newest started one was not generated after all.
    `ready(now, frames, parts=[(ready_at, frames), ...])` for a chunk handed over in parts (progressive decode, the
    module docstring).
    """

    def __init__(self, config: PlayoutConfig) -> None:
        self._config = config
        self._generation: deque[float] = deque(maxlen=config.window)
        self._complete: deque[float] = deque(maxlen=config.window)
        self._end: float | None = None
        self._starts: deque[tuple[float, bool]] = deque()  # started, not ready: (when, continues the stream)
        self._chunks = 0
        self._frames = 0
        self._underruns = 0
        self._underrun_frames = 0
        self._max_lead = 0.0

    @property
    def config(self) -> PlayoutConfig:
        return self._config

    @property
    def playout_end(self) -> float | None:
        """When playback of everything generated so far ends (None before the first chunk)."""
        return self._end

    def generation_p95(self) -> float | None:
        return percentile(self._generation, 95)

    def margin(self) -> float:
        p95 = percentile(self._complete, 95)
        config = self._config
        if p95 is None:
            return config.max_margin_s
        return min(config.max_margin_s, max(config.min_margin_s, config.margin_fraction * p95))

    def due(self, frames_in_flight: int = 0) -> float:
        """When the next chunk should start: its generation then ends a margin before the previous one's playback.
        With a chunk of `frames_in_flight` frames started and not ready yet, that one's playback end is estimated
        from its start (the module docstring)."""
        p95 = self.generation_p95()
        if p95 is None:
            return -math.inf
        end = self._end
        if self._starts:
            expected_ready = self._starts[-1][0] + p95
            end = (expected_ready if end is None else max(expected_ready, end)) + frames_in_flight / self._config.fps
        if end is None:
            return -math.inf
        return end - p95 - self.margin()

    @property
    def in_flight(self) -> int:
        """Chunks started and not ready (nor abandoned) yet."""
        return len(self._starts)

    def started(self, now: float) -> None:
        continuing = bool(self._starts) or (self._end is not None and now < self._end)
        self._starts.append((now, continuing))

    def abandon(self) -> None:
        """The newest started chunk was not generated after all (the session paused while it waited): forget its
        start."""
        if self._starts:
            self._starts.pop()

    def abandon_all(self) -> None:
        """No started chunk will be ready (a re-seed starts over): forget every start."""
        self._starts.clear()

    def ready(self, now: float, frames: int, *, parts: Sequence[tuple[float, int]] = ()) -> ChunkPlayout:
        """The chunk is complete at `now` with `frames` frames; `parts`: when each part of it was ready and how many
        frames it held, in order (empty: one part, ready `now`). Parts that hold fewer than `frames` are completed by
        a last part ready `now`."""
        if not self._starts:
            raise RuntimeError("ready() without started(): the scheduler did not see this chunk begin")
        if frames < 0:
            raise ValueError(f"frames must not be negative, got {frames}")
        timeline = [(at, count) for at, count in parts if count > 0]
        covered = sum(count for _, count in timeline)
        if covered > frames:
            raise ValueError(f"the parts hold {covered} frames, more than the chunk's {frames}")
        if covered < frames or not timeline:
            timeline.append((now, frames - covered))
        fps = self._config.fps
        started_at, continuing = self._starts.popleft()
        self._generation.append(max(0.0, max(at - started_at - before / fps for at, before in _offsets(timeline))))
        self._complete.append(max(0.0, now - started_at))
        previous_end = self._end
        first_at = timeline[0][0]
        starts_at = first_at if previous_end is None else max(first_at, previous_end)
        stall = 0.0
        if continuing and previous_end is not None and first_at > previous_end:
            stall += first_at - previous_end
        cursor = starts_at
        for at, count in timeline:
            if at > cursor:  # the part came after the frames before it had played: the stream stood still
                stall += at - cursor
                cursor = at
            cursor += count / fps
        underrun_s = 0.0
        underrun_frames = 0
        if stall > 0:
            underrun_s = stall
            underrun_frames = math.ceil(stall * fps - 1e-9)
            self._underruns += 1
            self._underrun_frames += underrun_frames
        ends_at = cursor
        lead = max(0.0, starts_at - first_at)
        self._end = ends_at
        self._chunks += 1
        self._frames += frames
        self._max_lead = max(self._max_lead, lead)
        return ChunkPlayout(starts_at, ends_at, lead, underrun_s, underrun_frames)

    def statistics(self) -> PlayoutStatistics:
        return PlayoutStatistics(
            chunks=self._chunks,
            frames=self._frames,
            underruns=self._underruns,
            underrun_frames=self._underrun_frames,
            max_lead_s=self._max_lead,
            generation_p95_s=self.generation_p95(),
            margin_s=self.margin(),
        )


def _offsets(timeline: Sequence[tuple[float, int]]) -> list[tuple[float, int]]:
    """Each part's ready time with the frames before it in the chunk."""
    out: list[tuple[float, int]] = []
    before = 0
    for at, count in timeline:
        out.append((at, before))
        before += count
    return out
