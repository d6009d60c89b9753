"""Frame writers for recordings (the `service.runtime.recordings.FrameWriter` seam) that tests control: one that
writes raw bytes (no encoder), one that fails after some chunks, one that stalls until released."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import numpy as np
import numpy.typing as npt

from service.runtime.recordings import FrameWriter, WriterFactory

__all__ = ["RawWriter", "StalledWriters", "failing_writer"]


class RawWriter:
    """Appends each chunk's raw RGB bytes to the file (opened at once, like the MP4 writer)."""

    def __init__(self, path: Path, width: int, height: int, fps: int) -> None:
        self.path = path
        self.size = (width, height, fps)
        self.frames = 0
        self.closed = False
        self._handle = path.open("wb")

    async def write(self, frames: npt.NDArray[np.uint8]) -> None:
        self._handle.write(np.ascontiguousarray(frames).tobytes())
        self.frames += len(frames)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._handle.close()


def failing_writer(fail_after: int) -> WriterFactory:
    """Writers that raise ENOSPC ("No space left on device") on the write after `fail_after` chunks."""

    class Failing(RawWriter):
        chunks = 0

        async def write(self, frames: npt.NDArray[np.uint8]) -> None:
            if self.chunks >= fail_after:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.chunks += 1
            await super().write(frames)

    def factory(path: Path, width: int, height: int, fps: int) -> FrameWriter:
        return Failing(path, width, height, fps)

    return factory


class StalledWriters:
    """Writers that take the first chunk, then wait for `release` before every further one: an encoder that cannot
    keep up. `factory` makes them; `made` lists them."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.made: list[RawWriter] = []

    def factory(self, path: Path, width: int, height: int, fps: int) -> FrameWriter:
        release = self.release

        class Stalled(RawWriter):
            async def write(self, frames: npt.NDArray[np.uint8]) -> None:
                if self.frames:
                    await release.wait()
                await super().write(frames)

        writer = Stalled(path, width, height, fps)
        self.made.append(writer)
        return writer
