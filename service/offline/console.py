"""What `lingstream generate` shows on a terminal: a one-line progress bar while it runs, a summary line at the end.

`ProgressBar.update` takes each `service.offline.clip.Progress` (chunks done of total, the current real-time factor, the
ETA) and redraws one carriage-return line; `finish` ends that line. `summary_line` says what was written: frames,
media seconds, chunks, size, seed, wall time and RTF, and whether generation was interrupted.
"""

from __future__ import annotations

from typing import TextIO

from service.offline.clip import GenerateResult, Progress

__all__ = ["ProgressBar", "summary_line"]


class ProgressBar:
    """One carriage-return line on a terminal: chunks done/total, the current real-time factor, the ETA."""

    _WIDTH = 24

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._shown = 0

    def update(self, progress: Progress) -> None:
        filled = self._WIDTH * progress.chunks_done // max(1, progress.chunks_total)
        rtf = "   -" if progress.real_time_factor is None else f"{progress.real_time_factor:4.2f}"
        eta = "-" if progress.eta_s is None else _clock(progress.eta_s)
        line = (
            f"[{'#' * filled}{'.' * (self._WIDTH - filled)}] {progress.chunks_done}/{progress.chunks_total} chunks"
            f"  RTF {rtf}  ETA {eta}"
        )
        self._stream.write("\r" + line.ljust(self._shown))
        self._stream.flush()
        self._shown = len(line)

    def finish(self) -> None:
        if self._shown:
            self._stream.write("\n")
            self._stream.flush()
            self._shown = 0


def _clock(seconds: float) -> str:
    whole = max(0, round(seconds))
    return f"{whole // 60}:{whole % 60:02d}"


def summary_line(result: GenerateResult) -> str:
    rtf = "-" if result.real_time_factor is None else f"{result.real_time_factor:.2f}"
    head = "interrupted: " if result.interrupted else ""
    where = str(result.out) if result.frames else "no file (no frame was generated)"
    return (
        f"{head}{where}: {result.frames} frames ({result.media_s:.2f} s at {result.config.fps} fps, "
        f"{len(result.chunks)}/{result.chunks_planned} chunks, {result.config.width}x{result.config.height}, "
        f"seed {result.config.seed}) in {result.wall_s:.2f} s, RTF {rtf}"
    )
