"""The LingBot chunk contract: how a session's video frames split into latent frames and chunks.

The video VAE compresses time 4x causally: the first latent frame covers exactly one video frame, every later latent
frame covers four. So a clip of `frame_num = 4n + 1` video frames has `(frame_num - 1) / 4 + 1` latent frames, and
the DiT generates them `chunk_size` latent frames at a time. Chunk 0 therefore decodes to `4 * (chunk_size - 1) + 1`
video frames and every later chunk to `4 * chunk_size`.

Truncation to one chunk: when a clip has fewer latent frames than `chunk_size` (e.g. `frame_num = 5`, 2 latent
frames, with `chunk_size = 3`), the whole clip is generated as a single, shorter chunk whose size is the clip's latent
frame count. `ChunkPlan.chunk_size` is then that truncated size and `ChunkPlan.requested_chunk_size` keeps the asked
one. A clip with *more* latent frames than `chunk_size` must be a whole multiple of it; anything else is rejected
with a `ChunkContractError` that names the nearest valid frame counts on both sides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.lingbot.errors import ChunkContractError

__all__ = [
    "SPATIAL_COMPRESSION",
    "TEMPORAL_COMPRESSION",
    "ChunkPlan",
    "frame_num_for_duration",
    "frame_num_for_latent_frames",
    "latent_frames_for",
    "validate_frame_num",
]

TEMPORAL_COMPRESSION = 4
"""Video frames per latent frame (after the first latent frame, which covers one video frame)."""
SPATIAL_COMPRESSION = 8
"""Video pixels per latent pixel along each axis."""

_MAX_CHUNK_SIZE = 1024


def frame_num_for_latent_frames(latent_frames: int) -> int:
    """The video frame count of `latent_frames` latent frames: `4 * (latent_frames - 1) + 1`."""
    if latent_frames < 1:
        raise ChunkContractError(f"latent frame count must be >= 1, got {latent_frames}")
    return TEMPORAL_COMPRESSION * (latent_frames - 1) + 1


def validate_frame_num(frame_num: int) -> None:
    """Reject a frame count that is not `4n + 1` (n >= 0), naming the nearest valid counts."""
    _check_int("frame_num", frame_num)
    if frame_num < 1:
        raise ChunkContractError(f"frame_num must be 4n+1 and >= 1, got {frame_num}; smallest valid: 1")
    if (frame_num - 1) % TEMPORAL_COMPRESSION != 0:
        lower = frame_num - (frame_num - 1) % TEMPORAL_COMPRESSION
        raise ChunkContractError(
            f"frame_num {frame_num} is not 4n+1; nearest valid: {lower} or {lower + TEMPORAL_COMPRESSION}"
        )


def latent_frames_for(frame_num: int) -> int:
    """Latent frames of a `4n + 1` frame clip: `(frame_num - 1) / 4 + 1`."""
    validate_frame_num(frame_num)
    return (frame_num - 1) // TEMPORAL_COMPRESSION + 1


def frame_num_for_duration(seconds: float, fps: int, chunk_size: int) -> int:
    """The longest whole-chunk `frame_num` whose media duration does not exceed `seconds` at `fps`.

    The result always holds a whole number (>= 1) of full chunks, never a truncated one. When even one chunk is
    longer than `seconds`, the smallest valid value, one full chunk (`4 * (chunk_size - 1) + 1` frames), is returned.
    """
    if not (isinstance(seconds, int | float) and math.isfinite(seconds) and seconds > 0):
        raise ChunkContractError(f"duration must be a finite number of seconds > 0, got {seconds!r}")
    _check_int("fps", fps)
    if fps < 1:
        raise ChunkContractError(f"fps must be >= 1, got {fps}")
    _check_chunk_size(chunk_size)
    max_frames = math.floor(seconds * fps + 1e-9)
    # Whole-chunk frame counts are 4 * (k * chunk_size - 1) + 1 for k >= 1; take the largest k that fits.
    k = (max_frames + TEMPORAL_COMPRESSION - 1) // (TEMPORAL_COMPRESSION * chunk_size)
    return frame_num_for_latent_frames(max(1, k) * chunk_size)


@dataclass(frozen=True, slots=True)
class ChunkPlan:
    """How one clip of `frame_num` video frames splits into chunks of `chunk_size` latent frames.

    Build it with `ChunkPlan.create(frame_num, chunk_size)`, which applies the truncation rule of the module
    docstring; the constructor only accepts an already consistent plan.
    """

    frame_num: int
    chunk_size: int
    """Latent frames per chunk actually used (smaller than requested only when the clip is truncated to one chunk)."""
    requested_chunk_size: int

    def __post_init__(self) -> None:
        latent = latent_frames_for(self.frame_num)
        _check_chunk_size(self.chunk_size)
        _check_chunk_size(self.requested_chunk_size)
        if self.chunk_size > self.requested_chunk_size:
            raise ChunkContractError(
                f"chunk_size {self.chunk_size} exceeds requested_chunk_size {self.requested_chunk_size}"
            )
        if self.chunk_size != self.requested_chunk_size and self.chunk_size != latent:
            raise ChunkContractError(
                f"a truncated chunk must span the whole clip ({latent} latent frames), got chunk_size {self.chunk_size}"
            )
        if latent % self.chunk_size != 0:
            raise ChunkContractError(_not_multiple_message(self.frame_num, latent, self.chunk_size))

    @classmethod
    def create(cls, frame_num: int, chunk_size: int) -> ChunkPlan:
        """Validate `frame_num` against `chunk_size` and plan the chunks (truncating to one chunk if too short)."""
        _check_int("frame_num", frame_num)
        _check_chunk_size(chunk_size)
        if frame_num < 1 or (frame_num - 1) % TEMPORAL_COMPRESSION != 0:
            lower, upper = _valid_neighbours(frame_num, chunk_size)
            below = "" if lower is None else f"{lower} or "
            try:
                validate_frame_num(frame_num)
            except ChunkContractError as exc:
                raise ChunkContractError(f"{exc}; nearest valid for chunk_size {chunk_size}: {below}{upper}") from None
        latent = (frame_num - 1) // TEMPORAL_COMPRESSION + 1
        if latent < chunk_size:
            return cls(frame_num=frame_num, chunk_size=latent, requested_chunk_size=chunk_size)
        if latent % chunk_size != 0:
            raise ChunkContractError(_not_multiple_message(frame_num, latent, chunk_size))
        return cls(frame_num=frame_num, chunk_size=chunk_size, requested_chunk_size=chunk_size)

    @property
    def latent_frames(self) -> int:
        return (self.frame_num - 1) // TEMPORAL_COMPRESSION + 1

    @property
    def num_chunks(self) -> int:
        return self.latent_frames // self.chunk_size

    @property
    def truncated(self) -> bool:
        """True when the clip is shorter than one requested chunk and runs as one truncated chunk."""
        return self.chunk_size != self.requested_chunk_size

    def frames_in_chunk(self, chunk_index: int) -> int:
        """Video frames chunk `chunk_index` decodes to: `4*(chunk_size-1)+1` for chunk 0, `4*chunk_size` after."""
        self._check_index(chunk_index)
        if chunk_index == 0:
            return TEMPORAL_COMPRESSION * (self.chunk_size - 1) + 1
        return TEMPORAL_COMPRESSION * self.chunk_size

    def first_frame_of_chunk(self, chunk_index: int) -> int:
        """Index (in the whole clip) of the first video frame chunk `chunk_index` decodes to."""
        self._check_index(chunk_index)
        if chunk_index == 0:
            return 0
        return TEMPORAL_COMPRESSION * (chunk_index * self.chunk_size - 1) + 1

    def latent_range(self, chunk_index: int) -> tuple[int, int]:
        """`(start, stop)` latent frame indices (stop exclusive) of chunk `chunk_index`."""
        self._check_index(chunk_index)
        start = chunk_index * self.chunk_size
        return start, start + self.chunk_size

    def chunk_of_frame(self, frame_index: int) -> int:
        """The chunk that decodes video frame `frame_index`."""
        _check_int("frame_index", frame_index)
        if not 0 <= frame_index < self.frame_num:
            raise ChunkContractError(f"frame index {frame_index} outside the clip [0, {self.frame_num})")
        if frame_index == 0:
            return 0
        return ((frame_index - 1) // TEMPORAL_COMPRESSION + 1) // self.chunk_size

    def _check_index(self, chunk_index: int) -> None:
        _check_int("chunk_index", chunk_index)
        if not 0 <= chunk_index < self.num_chunks:
            raise ChunkContractError(
                f"chunk index {chunk_index} outside the plan: valid 0..{self.num_chunks - 1} "
                f"({self.num_chunks} chunks of {self.chunk_size} latent frames)"
            )


def _check_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ChunkContractError(f"{name} must be an int, got {type(value).__name__}")


def _check_chunk_size(chunk_size: int) -> None:
    _check_int("chunk_size", chunk_size)
    if not 1 <= chunk_size <= _MAX_CHUNK_SIZE:
        raise ChunkContractError(f"chunk_size must be in 1..{_MAX_CHUNK_SIZE}, got {chunk_size}")


def _is_valid(latent: int, chunk_size: int) -> bool:
    return latent >= 1 and (latent < chunk_size or latent % chunk_size == 0)


def _valid_neighbours(frame_num: int, chunk_size: int) -> tuple[int | None, int]:
    """The nearest valid frame counts strictly below and at-or-above `frame_num` for `chunk_size`."""
    # Latent counts are valid when below chunk_size (truncated clip) or a multiple of it.
    latent_floor = max(0, (frame_num - 1) // TEMPORAL_COMPRESSION + 1) if frame_num >= 1 else 0
    lower_latent = latent_floor
    if frame_num >= 1 and (frame_num - 1) % TEMPORAL_COMPRESSION == 0:
        lower_latent -= 1
    while lower_latent >= 1 and not _is_valid(lower_latent, chunk_size):
        lower_latent -= 1
    upper_latent = max(1, latent_floor + 1)
    while not _is_valid(upper_latent, chunk_size):
        upper_latent += 1
    lower = frame_num_for_latent_frames(lower_latent) if lower_latent >= 1 else None
    return lower, frame_num_for_latent_frames(upper_latent)


def _not_multiple_message(frame_num: int, latent: int, chunk_size: int) -> str:
    lower_latent = latent // chunk_size * chunk_size
    upper_latent = lower_latent + chunk_size
    return (
        f"frame_num {frame_num} gives {latent} latent frames, not a multiple of chunk_size {chunk_size}; "
        f"nearest valid: {frame_num_for_latent_frames(lower_latent)} ({lower_latent} latent frames) "
        f"or {frame_num_for_latent_frames(upper_latent)} ({upper_latent} latent frames)"
    )
