"""An offline clip's records: what `lingstream generate` is asked for, what it reports, what it made, and its errors.

`GenerateRequest` is one clip to make (output path, session config, image, control trace); `Progress` is where
generation stands after each written chunk; `ChunkRecord` is one written chunk; `GenerateResult` is the whole run,
and its `report()` the JSON written by `--report`. `UsageError` (exit 2) is refused input, found before anything is
generated; `GenerationError` (exit 1) is a failure once generation started. `service.offline.generate` makes the
clip and `service.offline.mp4` writes it; both raise these errors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.bidirectional import SessionSummary
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.metrics import SessionMetricsSnapshot, Summary
from service.offline.control_trace import TraceEntry

__all__ = [
    "ChunkRecord",
    "GenerateRequest",
    "GenerateResult",
    "GenerationError",
    "Progress",
    "UsageError",
]


class UsageError(Exception):
    """Bad options or inputs (exit 2); always raised before any frame is generated or any output file written."""


class GenerationError(Exception):
    """Generation started but failed (exit 1): the session failed or the encoder could not write."""


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    """One offline clip: where to write it, the session config (`LingBotSessionConfig` fields), image and trace.

    `image` is the reference image's encoded bytes (PNG/JPEG/WebP; None: the built-in scene). `trace` is the parsed
    control trace (empty: a still camera); it is placed on the clip, and checked against it, once the config is known.
    """

    out: Path
    config: Mapping[str, object] = field(default_factory=dict)
    image: bytes | None = None
    trace: Sequence[TraceEntry] = ()
    trace_source: str = "<trace>"
    torch_threads: int | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    """Where generation stands after a chunk was written."""

    chunks_done: int
    chunks_total: int
    frames_written: int
    elapsed_s: float
    real_time_factor: float | None
    """p95 chunk period so far ÷ media seconds per chunk (None until two chunks were emitted)."""
    eta_s: float | None


@dataclass(frozen=True, slots=True)
class ChunkRecord:
    """One written chunk: what it was generated from and how long it took."""

    index: int
    frames: int
    applied_seq: int
    keys: tuple[str, ...]
    reset_pose: bool
    wall_s: float
    """Time from the previous chunk's arrival (for chunk 0: from session creation) to this chunk's arrival."""
    control_to_output_s: float | None
    lease_wait_s: float | None
    """How long the session waited for this chunk's control (the trace gate): the driver's share of the wall time."""


@dataclass(frozen=True, slots=True)
class GenerateResult:
    out: Path
    """The MP4 (it does not exist when not a single frame was written)."""
    config: LingBotSessionConfig
    encoder: str
    chunks_planned: int
    chunks: tuple[ChunkRecord, ...]
    frames: int
    wall_s: float
    interrupted: bool
    metrics: SessionMetricsSnapshot | None
    """The scheduler's view of the session, read while it was still open."""
    summary: SessionSummary | None
    """What closing the session reported (cleanup failures, slot leaks)."""

    @property
    def media_s(self) -> float:
        return self.frames / self.config.fps

    @property
    def media_s_per_chunk(self) -> float:
        return self.config.chunk_media_s

    @property
    def real_time_factor(self) -> float | None:
        """p95 chunk period ÷ media seconds per chunk (DESIGN 3.3); None with fewer than two chunks."""
        if self.metrics is None or self.metrics.chunk_period.p95 is None:
            return None
        return self.metrics.chunk_period.p95 / self.media_s_per_chunk

    def report(self) -> dict[str, object]:
        """The JSON report (`--report`): timings per chunk and per stage, latency, chunk period, RTF, config."""
        metrics = self.metrics
        return {
            "output": str(self.out),
            "interrupted": self.interrupted,
            "frames": self.frames,
            "chunks": len(self.chunks),
            "chunks_planned": self.chunks_planned,
            "frames_planned": self.config.chunk_plan.frame_num,
            "media_s": self.media_s,
            "media_s_per_chunk": self.media_s_per_chunk,
            "wall_s": self.wall_s,
            "seed": self.config.seed,
            "fps": self.config.fps,
            "width": self.config.width,
            "height": self.config.height,
            "encoder": self.encoder,
            "config": self.config.to_mapping(),
            "real_time_factor": self.real_time_factor,
            "wall_over_media": self.wall_s / self.media_s if self.frames else None,
            "first_output_latency_s": None if metrics is None else metrics.first_output_latency,
            "chunk_period_s": None if metrics is None else _summary(metrics.chunk_period),
            "control_to_output_s": None if metrics is None else _summary(metrics.control_to_output),
            "stages": {}
            if metrics is None
            else {
                stage: {"duration_s": _summary(summary), "queued_s": _summary(metrics.stage_queued[stage])}
                for stage, summary in sorted(metrics.stage_durations.items())
            },
            "idle_s_by_reason": {} if metrics is None else dict(metrics.idle_by_reason),
            "per_chunk": [asdict(record) for record in self.chunks],
            "session": None
            if self.summary is None
            else {
                "chunks": self.summary.chunks,
                "failure": self.summary.failure,
                "cleanup_failures": dict(self.summary.cleanup_failures),
                "slot_leaks": self.summary.slot_leaks,
            },
        }


def _summary(summary: Summary) -> dict[str, float | int | None]:
    return {"count": summary.count, "mean": summary.mean, "p50": summary.p50, "p95": summary.p95, "max": summary.max}
