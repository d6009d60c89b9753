"""What a model with history needs to rebuild a session's caches after a re-seed: the clean latents of the chunks
its KV cache holds, kept in a bounded ring in the service process (issue #33, docs/continuity.md).

LingBot-World-Fast's DiT leaves each chunk's K/V in its rolling cache by a clean pass at t = 0 over the chunk's
final latent x0 (`sampler.denoise_chunk`), with the chunk's condition (from the base latent and the chunk index),
its camera and its prompt. Replaying that pass over the same inputs, chunk after chunk from chunk 0, writes the same
K/V (`sampler.prefill_chunk`), so a re-seed that holds every chunk since 0 rebuilds the cache exactly. A chunk's K/V
past the first layer depend on what it attended to, so once the ring has turned (a chunk was evicted), the oldest
chunks the window still holds were computed against chunks no longer held: their replay is close, not equal. The
ring keeps `lookback` chunks before the window so that their replay has a history of its own (measured in
docs/continuity.md).

    ChunkRecord    what the denoise side knows of a chunk besides its latent: its camera, its prompt, the session
                   generator's state after it, and the `HistorySpec` saying which chunks the ring keeps
    ChunkHistory   a record with its latent `[16, F, h, w]` (float32, on the CPU): one chunk of history
    HistorySpec    the sink chunks (kept for good) and the recent chunks (the window's plus the lookback)
    SessionHistory the bounded ring: the sink chunks and the most recent ones, oldest first; immutable (a
                   checkpoint holds one), `append` returns the next

`SessionHistory.parts` / `from_parts` serialise it per chunk (a JSON header and the latent's float32 bytes), so a
store outside the process writes each chunk once and drops the ones the ring let go (`service/scaleout/checkpoints.py`).
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.errors import CheckpointVersionError

__all__ = ["ChunkHistory", "ChunkRecord", "HistorySpec", "SessionHistory"]

_LENGTH = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class HistorySpec:
    """Which chunks a session's history keeps: chunks `0 .. sink_chunks - 1` for good (the cache's sink) and the
    `recent_chunks` newest others (the chunks the window holds, plus a lookback before them)."""

    sink_chunks: int
    recent_chunks: int

    def __post_init__(self) -> None:
        if self.sink_chunks < 0 or self.recent_chunks < 1:
            raise ValueError(f"HistorySpec: need sink_chunks >= 0 and recent_chunks >= 1, got {self}")

    @classmethod
    def for_cache(
        cls, chunk_frames: int, window_frames: int | None, sink_frames: int, capacity_frames: int, lookback_chunks: int
    ) -> HistorySpec:
        """The chunks a rolling cache of `window_frames` (sink `sink_frames`) holds, plus `lookback_chunks` before
        them; without a window, every chunk of its `capacity_frames`."""
        if window_frames is None:
            return cls(0, -(-capacity_frames // chunk_frames))
        sink = -(-sink_frames // chunk_frames)
        window = -(-(window_frames - sink_frames) // chunk_frames)
        return cls(sink, window + lookback_chunks)


@dataclass(frozen=True, slots=True, eq=False)
class ChunkRecord:
    """A chunk as the denoise side saw it, without its latent (the latent artifact carries that)."""

    chunk_index: int
    camera: CameraChunk
    prompt: str
    generator_state: bytes
    """`torch.Generator.get_state()` of the session's generator after the chunk (CPU: 5 056 bytes; CUDA: 16)."""
    spec: HistorySpec

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # Across a process boundary the camera's tensors travel as numpy arrays, inside the pickle: a tensor would
        # get a shared-memory segment of its own from torch's reductions (milliseconds each, every chunk).
        camera = self.camera
        fields = (camera.start.numpy(), camera.relative.numpy(), camera.translation_scale, camera.intrinsics)
        return (_record, (self.chunk_index, fields, self.prompt, self.generator_state, self.spec))


@dataclass(frozen=True, slots=True, eq=False)
class ChunkHistory:
    """One chunk of a session's history: its record and its clean latent `[16, F, h, w]` (float32, CPU)."""

    record: ChunkRecord
    latent: torch.Tensor

    def __reduce__(self) -> tuple[object, tuple[object, ...]]:
        # The latent as a numpy array inside the pickle (1.2 MB at 832x480: 0.4 ms), not a shared-memory segment
        # of its own (15 ms through the worker's reply pickler), as `ChunkRecord.__reduce__`.
        return (_chunk, (self.record, self.latent.detach().cpu().numpy()))

    @property
    def chunk_index(self) -> int:
        return self.record.chunk_index

    @property
    def nbytes(self) -> int:
        return self.latent.numel() * self.latent.element_size()

    def to_bytes(self) -> bytes:
        """A 4-byte header length, the JSON header (index, shape, camera, prompt, generator state), the latent's
        float32 bytes."""
        record = self.record
        camera = record.camera
        header = {
            "chunk_index": record.chunk_index,
            "shape": list(self.latent.shape),
            "start": camera.start.tolist(),
            "relative": camera.relative.tolist(),
            "translation_scale": camera.translation_scale,
            "prompt": record.prompt,
            "generator_state": base64.b64encode(record.generator_state).decode(),
            "spec": [record.spec.sink_chunks, record.spec.recent_chunks],
        }
        data = json.dumps(header, separators=(",", ":")).encode()
        latent = self.latent.detach().to("cpu", torch.float32).contiguous().numpy().tobytes()
        return _LENGTH.pack(len(data)) + data + latent

    @classmethod
    def from_bytes(cls, data: bytes, config: LingBotSessionConfig) -> ChunkHistory:
        """The inverse of `to_bytes` (the camera's intrinsics are the session's); `CheckpointVersionError` for bytes
        that are not a chunk of history."""
        try:
            (length,) = _LENGTH.unpack_from(data)
            header = json.loads(data[_LENGTH.size : _LENGTH.size + length])
            shape = [int(size) for size in header["shape"]]
            raw = np.frombuffer(data[_LENGTH.size + length :], dtype=np.float32)
            if raw.size != int(np.prod(shape)):
                raise ValueError(f"the latent holds {raw.size} values, not {shape}")
            camera = CameraChunk(
                start=torch.tensor(header["start"], dtype=torch.float64),
                relative=torch.tensor(header["relative"], dtype=torch.float64),
                translation_scale=float(header["translation_scale"]),
                intrinsics=config.camera_intrinsics(),
            )
            sink, recent = header["spec"]
            record = ChunkRecord(
                chunk_index=int(header["chunk_index"]),
                camera=camera,
                prompt=str(header["prompt"]),
                generator_state=base64.b64decode(header["generator_state"]),
                spec=HistorySpec(int(sink), int(recent)),
            )
        except (struct.error, ValueError, KeyError, TypeError) as exc:
            raise CheckpointVersionError(f"not a chunk of session history: {exc}") from exc
        return cls(record, torch.from_numpy(raw.copy()).reshape(shape))


@dataclass(frozen=True, slots=True, eq=False)
class SessionHistory:
    """The chunks a re-seed replays, oldest first (module docstring). Bounded by the newest chunk's `HistorySpec`."""

    chunks: tuple[ChunkHistory, ...] = ()

    def append(self, chunk: ChunkHistory) -> SessionHistory:
        """This history with `chunk` added and what its spec no longer keeps dropped. A chunk that does not follow
        the newest held (a re-seed without history went on meanwhile) starts a history without the ones before."""
        held = self.chunks
        if held and chunk.chunk_index != held[-1].chunk_index + 1:
            held = ()
        spec = chunk.record.spec
        sink = [c for c in held if c.chunk_index < spec.sink_chunks]
        if chunk.chunk_index < spec.sink_chunks:
            return SessionHistory((*sink, chunk))
        others = [c for c in held if c.chunk_index >= spec.sink_chunks]
        recent = others[max(0, len(others) - (spec.recent_chunks - 1)) :] if spec.recent_chunks > 1 else []
        return SessionHistory((*sink, *recent, chunk))

    @property
    def complete(self) -> bool:
        """Whether it holds every chunk from chunk 0 on: a replay then rebuilds the caches exactly."""
        return all(c.chunk_index == i for i, c in enumerate(self.chunks))

    @property
    def newest(self) -> ChunkHistory | None:
        return self.chunks[-1] if self.chunks else None

    @property
    def nbytes(self) -> int:
        """The latents' bytes (what the ring costs the service process)."""
        return sum(c.nbytes for c in self.chunks)

    def prime(self, before: int) -> torch.Tensor | None:
        """The latent frames `[16, n, h, w]` of the newest run of consecutive chunks ending at chunk `before - 1`
        (a decoder re-seeded at `before` is primed with them; from chunk 0 when the history is complete, which makes
        a causal decoder's state exactly the uninterrupted one's). None: the history does not reach `before - 1`."""
        run: list[torch.Tensor] = []
        expected = before - 1
        for chunk in reversed(self.chunks):
            if chunk.chunk_index > expected:
                continue
            if chunk.chunk_index != expected:
                break
            run.append(chunk.latent)
            expected -= 1
        return torch.cat(run[::-1], dim=1) if run else None

    def before(self, chunk_index: int) -> SessionHistory:
        """The chunks before `chunk_index` only: what a re-seed at `chunk_index` replays. A checkpoint held until
        its chunk was delivered (docs/continuity.md) holds none newer; a store that kept newer latents (written
        before the client saw their chunks) must not feed them to a session that goes on from an earlier chunk."""
        if not self.chunks or self.chunks[-1].chunk_index < chunk_index:
            return self
        return SessionHistory(tuple(c for c in self.chunks if c.chunk_index < chunk_index))

    def indices(self) -> tuple[int, ...]:
        return tuple(c.chunk_index for c in self.chunks)

    def parts(self) -> dict[int, ChunkHistory]:
        """The chunks by index (a store writes each one once, `ChunkHistory.to_bytes`)."""
        return {c.chunk_index: c for c in self.chunks}

    @classmethod
    def from_parts(
        cls, indices: Sequence[int], parts: Mapping[int, bytes], config: LingBotSessionConfig
    ) -> SessionHistory:
        """The history of chunks `indices` from their serialised parts; `CheckpointVersionError` if one is missing."""
        missing = [index for index in indices if index not in parts]
        if missing:
            raise CheckpointVersionError(f"the checkpoint's history lacks chunk(s) {missing}")
        chunks = tuple(ChunkHistory.from_bytes(parts[index], config) for index in indices)
        if tuple(c.chunk_index for c in chunks) != tuple(indices):
            raise CheckpointVersionError("the checkpoint's history parts do not match their indices")
        return cls(chunks)


def _record(
    chunk_index: int, camera: tuple[object, ...], prompt: str, generator_state: bytes, spec: HistorySpec
) -> ChunkRecord:
    start, relative, scale, intrinsics = camera
    chunk = CameraChunk(torch.from_numpy(start), torch.from_numpy(relative), scale, intrinsics)  # type: ignore[arg-type]
    return ChunkRecord(chunk_index, chunk, prompt, generator_state, spec)


def _chunk(record: ChunkRecord, latent: npt.NDArray[np.float32]) -> ChunkHistory:
    return ChunkHistory(record, torch.from_numpy(latent))
