"""The clip's file: H.264 (yuv420p) in MP4 at a constant frame rate, written through PyAV on one worker thread.

`h264_encoder` picks libx264 when PyAV's FFmpeg has it (else FFmpeg's default H.264 encoder); `Mp4Writer` encodes
each chunk's frames in order while the model generates the next chunk. libx264 writes the same file for the same
frames only when it is kept off its AVX-512 code: `x264_params` says how on this CPU (`asm=AVX2`, read from
`/proc/cpuinfo`). Errors are `service.offline.clip`'s: an output that cannot be opened is a `UsageError`, a failure
while encoding a `GenerationError`.
"""

from __future__ import annotations

import asyncio
import functools
import platform
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import numpy.typing as npt

from service.offline.clip import GenerationError, UsageError

__all__ = ["Mp4Writer", "h264_encoder", "read_cpu_flags", "x264_params"]

_CRF = 18
_PRESET = "fast"
_CPUINFO = Path("/proc/cpuinfo")
_X86_64 = frozenset({"x86_64", "amd64"})
_AVX512 = frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})
"""The CPU flags with which libx264 turns on its AVX-512 code (it needs all five)."""


def h264_encoder() -> str:
    """libx264 when PyAV's FFmpeg has it, else FFmpeg's default H.264 encoder; `GenerationError` when none."""
    if "libx264" in av.codecs_available:
        return "libx264"
    try:
        return str(av.codec.Codec("h264", "w").name)
    except Exception as exc:  # PyAV raises its own error types for a missing encoder
        raise GenerationError(f"PyAV's FFmpeg has no H.264 encoder: {exc}") from None


def x264_params(machine: str, cpu_flags: frozenset[str] | None) -> str | None:
    """The `x264-params` that keep libx264 deterministic on this CPU (None: its defaults already are).

    libx264's AVX-512 kernels for the MB-tree (the lookahead's propagation through B-frames) read memory the encoder
    never wrote, so on an AVX-512 CPU the bitstream depends on what the heap held before: two runs over identical
    frames write different files (run with MALLOC_PERTURB_=85 and =170 to see it every time). Its AVX2 kernels are
    clean, so an AVX-512 CPU gets `asm=AVX2`, which every AVX-512 CPU supports: the same speed, size and quality,
    with AVX-512 off. Without the CPU's flags (not Linux) an x86-64 CPU might have AVX-512, so MB-tree goes instead:
    files about 40% larger at the same CRF (measured on a reference-model clip), but the same every time. Other CPUs
    run no AVX-512 code.
    """
    if machine.lower() not in _X86_64:
        return None
    if cpu_flags is None:
        return "mbtree=0"
    return "asm=AVX2" if _AVX512.issubset(cpu_flags) else None


@functools.cache
def _host_x264_params() -> str | None:
    return x264_params(platform.machine(), read_cpu_flags(_CPUINFO))


def read_cpu_flags(cpuinfo: Path) -> frozenset[str] | None:
    """The first CPU's feature flags from `/proc/cpuinfo` (None when it cannot be read or lists none)."""
    try:
        text = cpuinfo.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == "flags":
            return frozenset(value.split())
    return None


class Mp4Writer:
    """H.264 (yuv420p) in MP4 at a constant frame rate: frame n has pts n in a time base of 1/fps.

    Encoding runs on one worker thread, so chunks are written in order while the model generates the next one.
    `close` waits for that thread, flushes the encoder and closes the container (idempotent); with no frame written
    FFmpeg never creates the file.
    """

    def __init__(self, path: Path, width: int, height: int, fps: int, encoder: str) -> None:
        self._fps = fps
        self._time_base = Fraction(1, fps)
        try:
            self._container = av.open(str(path), mode="w", format="mp4", container_options={"movflags": "+faststart"})
        except (OSError, av.FFmpegError) as exc:
            raise UsageError(f"--out: cannot write {path}: {exc}") from None
        try:
            stream = self._container.add_stream(encoder, rate=fps)
            if not isinstance(stream, av.VideoStream):
                raise GenerationError(f"{encoder} is not a video encoder")
            stream.width = width
            stream.height = height
            stream.pix_fmt = "yuv420p"
            if encoder == "libx264":
                options: dict[str, object] = {"crf": str(_CRF), "preset": _PRESET}
                params = _host_x264_params()
                if params is not None:
                    options["x264-params"] = params
                stream.options = options
        except BaseException:
            self._container.close()
            raise
        self._stream = stream
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mp4-writer")
        self._closed = False
        self.frames = 0

    async def write(self, frames: npt.NDArray[np.uint8]) -> None:
        await asyncio.get_running_loop().run_in_executor(self._executor, self._encode, frames)

    def _encode(self, frames: npt.NDArray[np.uint8]) -> None:
        try:
            for image in frames:
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="rgb24")
                frame.pts = self.frames
                frame.time_base = self._time_base
                for packet in self._stream.encode(frame):
                    self._container.mux(packet)
                self.frames += 1
        except (OSError, av.FFmpegError) as exc:
            raise GenerationError(f"writing the MP4 failed after {self.frames} frames: {exc}") from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.shutdown(wait=True)
        try:
            if self.frames:
                for packet in self._stream.encode(None):
                    self._container.mux(packet)
        finally:
            self._container.close()
