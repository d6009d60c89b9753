"""Which chunk a received frame shows, and whether it is a keep-warm repeat: `ChunkTracker`, the pure labelling
core of a `LiveStream` (the rules a reader relies on are in `transport.client.stream`'s docstring; how the RTP offset
is found, in the class's). It reads no clock and no socket: times and timestamps are given to it, so its tests drive
it arrival by arrival."""

from __future__ import annotations

import bisect
from collections import deque

from transport.base import ChunkStatus
from transport.session.pacing import REPEAT_PTS_OFFSET, grid_offset, is_repeat_pts

__all__ = ["ChunkTracker"]

_PENDING_LIMIT = 64  # stamped statuses waiting for their frame; more means frames are lost, the oldest go
_KEPT_STATUSES = 512  # stamped statuses kept to label frames read later (a few hundred chunks back)
_FIT_STATUSES = 32  # the recent statuses the RTP offset is fitted over
_FIT_FRAMES = 128  # the recent frames it is fitted over
_EARLY_S = 0.005  # a frame may come this much before its status and still count as after it (clock jitter)
_PAIR_WINDOW_S = 1.0  # how long after its status a frame may come to be considered its frame


class ChunkTracker:
    """Which chunk a received frame shows (see `transport.client.stream`'s docstring). Pure: times are given.

    With RTP timestamps (the embedded transport), `status(chunk, at)` and `frame(rtp, at)` record what arrived when,
    and `label(rtp)` names the chunk a frame shows, any time later (a status that comes after its frame still labels
    it). aiortc hands out a frame's RTP timestamp counted from the first frame received, so a frame's presentation
    timestamp is its RTP timestamp plus one offset per connection: the presentation timestamp of that first frame,
    which the service sends in chunk statuses (`stream_base_pts`) once the frame went out. Until then (and with a
    service that does not send it) the offset is fitted over the recent statuses and frames: each candidate pairs a
    status with a frame that arrived near it; a candidate is refused when more than a tenth of the statuses it pairs
    with a frame would have been overtaken by that frame (a chunk's first frame leaves the service with its status
    and takes the longer way: encoding, RTP, decoding); of the rest, the one whose frames follow their statuses most
    closely (smallest median delay) wins. Under a load that delays every frame by more than a frame interval behind
    its status, a fitted offset can be a frame off. A keep-warm repeat sent just before a chunk's first frame may
    arrive after its status and pair with it more closely than the chunk's frame does; with the session's `fps`
    known, a candidate under which a recent frame lies `REPEAT_PTS_OFFSET` *before* the statuses' grid is refused
    (nothing lies there: generated frames are on the grid, repeats after it; it is what pairing a status with a
    repeat makes of the generated frames).

    With frame ids (LiveKit frame metadata: the service stamps every frame with its index in the session's video and
    every `chunk` status with its first frame's, `first_frame_id`), `frame_id(id)` records a frame's arrival and says
    whether it is a keep-warm repeat (an id not newer than the newest one received: a repeat carries the id of the
    frame it repeats), and `label_id(id)` names its chunk, any time later: the status with the greatest
    `first_frame_id` not above the id. A frame between a known chunk and a later known one whose statuses in between
    were lost (LiveKit sends small `chunk` statuses lossy) is labelled None rather than guessed. So is a frame past
    the newest known chunk's end (its first frame id plus the chunk length learnt from the last two consecutive
    statuses): the frame overtook its own chunk's status (video and data travel apart), which `awaits_status(id)`
    says, so a reader can wait for that status a moment rather than take the previous chunk's label.

    Without RTP timestamps or frame ids (LiveKit without frame metadata), `frame(None, at)` gives each status, in
    order, to the next frame that arrives. Not once a frame with an id came: the service stamps every frame, so one
    without is none of the session's (a new track's source placeholder, issue #33) and is labelled None; given the
    statuses in order, it took the oldest waiting one (statuses are queued for that mode whatever the frames carry),
    and a follower's labels went back to a chunk it had left.
    """

    __slots__ = (
        "_by_id",
        "_by_pts",
        "_current",
        "_exact",
        "_fits",
        "_fps",
        "_fresh",
        "_ids",
        "_newest_id",
        "_offset",
        "_pending",
        "_recent_frames",
        "_recent_statuses",
        "_sorted",
        "_span",
    )

    def __init__(self, fps: float | None = None) -> None:
        self._fps = fps  # the session's frame rate: lets the fit refuse an offset fitted on a repeat
        self._by_pts: dict[int, ChunkStatus] = {}
        self._sorted: list[int] = []
        self._recent_statuses: deque[tuple[int, float]] = deque(maxlen=_FIT_STATUSES)
        self._recent_frames: deque[tuple[int, float]] = deque(maxlen=_FIT_FRAMES)
        self._offset: int | None = None
        self._exact = False  # the offset came from the service (`stream_base_pts`), not from a fit
        self._fits = 0
        self._pending: deque[ChunkStatus] = deque()  # without timestamps: statuses waiting for the next frame
        self._current: ChunkStatus | None = None
        self._fresh = False
        self._by_id: dict[int, ChunkStatus] = {}
        self._ids: list[int] = []  # the known statuses' first frame ids, sorted
        self._newest_id: int | None = None
        self._span: int | None = None  # frames in a chunk: between the last two consecutive chunks' first frame ids

    @property
    def offset(self) -> int | None:
        """A frame's presentation timestamp minus its RTP timestamp, once fitted."""
        return self._offset

    @property
    def exact(self) -> bool:
        """The offset came from the service (`stream_base_pts`), not from a fit."""
        return self._exact

    def is_repeat(self, pts: int, fps: float) -> bool:
        """Whether the frame presented at `pts` is a keep-warm repeat: off the grid of the stamped chunk statuses'
        first frames. Judged only with the service's offset (a fitted one may have been fitted on a repeat)."""
        if not self._exact or not self._sorted:
            return False
        return is_repeat_pts(pts, self._sorted[-1], fps)

    def status(self, chunk: ChunkStatus, at: float) -> None:
        if chunk.first_frame_id is not None:
            if chunk.first_frame_id not in self._by_id:
                bisect.insort(self._ids, chunk.first_frame_id)
                if len(self._ids) > _KEPT_STATUSES:
                    del self._by_id[self._ids.pop(0)]
            self._by_id[chunk.first_frame_id] = chunk
            if len(self._ids) >= 2 and self._ids[-1] == chunk.first_frame_id:  # the newest: learn the chunk length
                previous = self._by_id[self._ids[-2]]
                if previous.index == chunk.index - 1:
                    self._span = chunk.first_frame_id - self._ids[-2]
        pts = chunk.first_frame_pts
        if pts is None:
            return  # no frame was stamped for it (none left to pace, or it went out early): it labels no frame
        if len(self._pending) >= _PENDING_LIMIT:
            self._pending.popleft()
        self._pending.append(chunk)
        if pts not in self._by_pts:
            bisect.insort(self._sorted, pts)
            if len(self._sorted) > _KEPT_STATUSES:
                del self._by_pts[self._sorted.pop(0)]
        self._by_pts[pts] = chunk
        if chunk.stream_base_pts is not None:
            self._offset, self._exact = chunk.stream_base_pts, True
        if self._exact:
            return
        self._recent_statuses.append((pts, at))
        self._fits += 1
        if self._fits <= _FIT_STATUSES or self._fits % 8 == 0:
            self._fit()

    def frame(self, rtp: int | None, at: float) -> tuple[ChunkStatus | None, bool]:
        """Record a frame's arrival. Without a timestamp, its label by arrival order (chunk, first of it)."""
        if rtp is not None:
            if not self._exact:
                self._recent_frames.append((rtp, at))
                if self._offset is None and self._recent_statuses:
                    self._fit()
            return None, False
        if self._newest_id is not None:
            return None, False  # frames carry ids here (class docstring): this one is none of the session's
        if self._pending:
            self._current, self._fresh = self._pending.popleft(), True
        first, self._fresh = self._fresh, False
        return self._current, first

    def frame_id(self, frame_id: int) -> bool:
        """Record the arrival of a frame stamped `frame_id`; whether it is a keep-warm repeat (an id already
        received: generated frames' ids only grow)."""
        repeat = self._newest_id is not None and frame_id <= self._newest_id
        if not repeat:
            self._newest_id = frame_id
        return repeat

    def label_id(self, frame_id: int) -> tuple[ChunkStatus | None, bool]:
        """The chunk the frame stamped `frame_id` shows and whether it is that chunk's first frame; None when no
        status received names a chunk it can be in for sure (see the class docstring)."""
        at = bisect.bisect_right(self._ids, frame_id) - 1
        if at < 0:
            return None, False
        chunk = self._by_id[self._ids[at]]
        if at + 1 < len(self._ids) and self._by_id[self._ids[at + 1]].index != chunk.index + 1:
            return None, False  # the next chunk's status was lost: the frame may be its, or a later one's
        if self.awaits_status(frame_id):
            return None, False  # past the newest known chunk: its own chunk's status has not come yet
        return chunk, frame_id == chunk.first_frame_id

    def awaits_status(self, frame_id: int) -> bool:
        """Whether the frame stamped `frame_id` lies past the newest known chunk's end (its chunk's status is still
        on its way, or lost). While the chunk length is not known yet (one status so far), any frame past that chunk's
        first frame waits: it may be the next chunk's, whose status tells the length."""
        if not self._ids:
            return False
        if self._span is None:  # one chunk known, its length not: a frame past its first may be the next chunk's
            return frame_id > self._ids[-1] and len(self._ids) == 1
        return frame_id >= self._ids[-1] + self._span

    def label(self, rtp: int) -> tuple[ChunkStatus | None, bool, int | None]:
        """The chunk a frame with this RTP timestamp shows, whether it is that chunk's first frame, and the frame's
        presentation timestamp (all None/False until the offset is known)."""
        if self._offset is None:
            return None, False, None
        pts = rtp + self._offset
        # One tick of slack: the track and the status round the same slot's timestamp separately.
        at = bisect.bisect_right(self._sorted, pts + 1) - 1
        if at < 0:
            return None, False, pts
        first_pts = self._sorted[at]
        return self._by_pts[first_pts], abs(first_pts - pts) <= 1, pts

    def _fit(self) -> None:
        arrivals = dict(self._recent_frames)
        statuses = tuple(self._recent_statuses)
        candidates = {
            pts - rtp
            for pts, status_at in statuses
            for rtp, frame_at in self._recent_frames
            if -_EARLY_S <= frame_at - status_at <= _PAIR_WINDOW_S
        }
        ranked: list[tuple[float, int, int]] = []  # (median delay, -pairs, offset)
        for offset in candidates:
            delays = sorted(
                arrivals[pts - offset] - status_at for pts, status_at in statuses if pts - offset in arrivals
            )
            overtaken = sum(1 for delay in delays if delay < -_EARLY_S)
            if not delays or overtaken * 10 > len(delays):
                continue
            ranked.append((delays[len(delays) // 2], -len(delays), offset))
        for _, _, offset in sorted(ranked):
            if not self._fitted_on_a_repeat(offset, statuses[-1][0]):
                self._offset = offset
                return

    def _fitted_on_a_repeat(self, offset: int, reference_pts: int) -> bool:
        fps = self._fps
        if fps is None:
            return False
        return any(
            abs(grid_offset(rtp + offset, reference_pts, fps) + REPEAT_PTS_OFFSET) <= 1
            for rtp, _ in self._recent_frames
        )
