"""A LingBot session's checkpoint: what it takes to rebuild the session on a fresh model-worker group and go on.

`SessionCheckpoint` is taken by the session policy (`policy/session.py`) at every chunk boundary, when a chunk is
handed to the reader. It is a frozen record with an explicit `version`, built from what the service process already
holds (no tensor is copied, nothing is asked of the workers), so it costs a few microseconds per chunk:

    config                  the session's parsed config (seed, size, chunk size, pose steps, ...)
    image                   the reference image tensor (the same object the session was created with, held once)
    next_chunk              the chunk to generate next (every chunk before it was handed to the reader)
    pose                    the camera pose after chunk `next_chunk - 1`, integrated in the service process from the
                            same snapshots the denoise stage used (`camera.PoseIntegrator`: the same code, so the same
                            floats)
    prompt, prompt_seq      the newest prompt and its sequence number
    applied_seq             the newest control snapshot a chunk was generated from
    latest                  the newest control snapshot received (seq and keys)
    frames_emitted          the stream clock: frames handed to the reader (the first frame index of `next_chunk`)
    taken_at                when it was taken (the session's clock)
    history                 a model with history's chunks (`history.SessionHistory`: the clean latents, cameras and
                            prompts of the chunks its KV cache holds, and the generator's state), empty for the
                            reference model; a reference to the session's ring, never copied

Re-seeding the reference model needs nothing else: its frames depend only on (base latent, camera, prompt, seed,
chunk index), so a session rebuilt at chunk k from this record produces exactly the frames an uninterrupted run
would have (tested). LingBot-World-Fast rebuilds its rolling KV cache from `history` by a prefill (the clean pass
of each chunk replayed in order) and primes the VAE's causal feature cache with the same latents: exact while the
history holds every chunk since 0, close after the ring turned (docs/continuity.md has the figures).

`ResumePoint` is the part of a checkpoint that travels to the workers with the re-seeded session's first condition
request: the chunk to start at, the camera pose to start from, and the history to replay (None: none).

`to_bytes` / `from_bytes` serialise a checkpoint (a JSON header, the image's raw float32 bytes, then each chunk of
history) for a store outside the process; `header_bytes`, `image_data` and `history.parts()` are the same in pieces,
so a store writes the image once and each chunk of history once. Version 2 added the history; a version 1 checkpoint
still reads (an empty history: the model re-seeds without it); an unknown version is refused
(`CheckpointVersionError`).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.lingbot.camera import CameraPose
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import CheckpointVersionError
from pipeline.lingbot.history import SessionHistory

__all__ = ["CHECKPOINT_VERSION", "NO_HISTORY", "READABLE_VERSIONS", "ResumePoint", "SessionCheckpoint"]

NO_HISTORY = SessionHistory()
"""The history of a model without one (the reference model), or of a version 1 checkpoint."""

CHECKPOINT_VERSION = 2
READABLE_VERSIONS = frozenset({1, 2})
"""1: no history (re-seeds without it); 2: with the model's history."""
_HEADER = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a re-seeded session starts on the workers: chunk `chunk_index`, the camera at `pose`, and the chunks
    of history a model with history replays (None or empty: it goes on without)."""

    chunk_index: int
    pose: CameraPose
    history: SessionHistory | None = None


@dataclass(frozen=True, slots=True, eq=False)
class SessionCheckpoint:
    """One session at a chunk boundary (module docstring). Compared by identity: it holds a tensor."""

    session_id: str
    config: LingBotSessionConfig
    image: torch.Tensor | None
    next_chunk: int
    pose: CameraPose
    prompt: str
    prompt_seq: int
    applied_seq: int
    latest: ControlSnapshot | None
    frames_emitted: int
    taken_at: float
    history: SessionHistory = NO_HISTORY
    version: int = CHECKPOINT_VERSION

    @property
    def resume_point(self) -> ResumePoint:
        history = self.history.before(self.next_chunk)  # never a chunk the session goes on to generate again
        return ResumePoint(self.next_chunk, self.pose, history if history.chunks else None)

    def state_bytes(self) -> int:
        """Bytes this checkpoint holds beyond the session's own objects (the image is shared with the session and
        counted once, by `image_bytes`): the record and its small fields, and the history's latents."""
        return len(self._header()) + self.history.nbytes

    @property
    def image_bytes(self) -> int:
        return 0 if self.image is None else self.image.numel() * self.image.element_size()

    def header_bytes(self) -> bytes:
        """The record without its image (JSON): what a store writes at every chunk boundary."""
        return self._header()

    def image_data(self) -> bytes | None:
        """The image as float32 bytes (None: no image): what a store writes once per session."""
        return None if self.image is None else self.image.detach().to(torch.float32).contiguous().numpy().tobytes()

    def history_indices(self) -> tuple[int, ...]:
        return self.history.indices()

    def history_part(self, chunk_index: int) -> bytes:
        """Chunk `chunk_index` of the history serialised (`KeyError` for one it does not hold)."""
        return self.history.parts()[chunk_index].to_bytes()

    def history_parts(self) -> dict[int, bytes]:
        """Each chunk of history serialised (`ChunkHistory.to_bytes`), by chunk index: what a store writes once per
        chunk (the header lists the indices a reader needs)."""
        return {index: chunk.to_bytes() for index, chunk in self.history.parts().items()}

    @classmethod
    def from_parts(
        cls, header: bytes, image: bytes | None, history: Mapping[int, bytes] | None = None
    ) -> SessionCheckpoint:
        """The inverse of `header_bytes`, `image_data` and `history_parts` (`CheckpointVersionError` for anything
        else, or for a chunk of history the header lists and `history` lacks)."""
        return cls._parse(header, image or b"", history or {})

    def to_bytes(self) -> bytes:
        """Serialised: a 4-byte header length, the JSON header, the image's float32 bytes (if any), then each chunk
        of history as a 4-byte length and its bytes, oldest first."""
        header = self._header()
        image = self.image_data() or b""
        chunks = b"".join(_HEADER.pack(len(part)) + part for part in self.history_parts().values())
        return _HEADER.pack(len(header)) + header + image + chunks

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionCheckpoint:
        try:
            (length,) = _HEADER.unpack_from(data)
            header_data = data[_HEADER.size : _HEADER.size + length]
            header = json.loads(header_data)
            shape = header["image_shape"]
            image_size = 0 if shape is None else 4 * int(np.prod(shape))
            indices = header.get("history", [])
        except (struct.error, ValueError, KeyError, TypeError) as exc:
            raise CheckpointVersionError(f"not a session checkpoint: {exc}") from exc
        offset = _HEADER.size + length
        image = data[offset : offset + image_size]
        offset += image_size
        parts: dict[int, bytes] = {}
        try:
            for index in indices:
                (size,) = _HEADER.unpack_from(data, offset)
                parts[int(index)] = data[offset + _HEADER.size : offset + _HEADER.size + size]
                offset += _HEADER.size + size
                if offset > len(data):
                    raise struct.error(f"chunk {index} needs {offset - len(data)} bytes more")
        except struct.error as exc:
            raise CheckpointVersionError(f"the checkpoint's history is cut short: {exc}") from exc
        if header.get("version") == 1:
            image = data[_HEADER.size + length :]  # version 1: the image is the rest (its length is checked)
        return cls._parse(header_data, image, parts)

    @classmethod
    def _parse(cls, header_data: bytes, image_data: bytes, parts: Mapping[int, bytes]) -> SessionCheckpoint:
        try:
            header = json.loads(header_data)
            version = header["version"]
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointVersionError(f"not a session checkpoint: {exc}") from exc
        if version not in READABLE_VERSIONS:
            raise CheckpointVersionError(f"checkpoint version {version!r} is not one of {sorted(READABLE_VERSIONS)}")
        config = LingBotSessionConfig.from_mapping(header["config"])
        image = None
        shape = header["image_shape"]
        if shape is not None:
            raw = np.frombuffer(image_data, dtype=np.float32)
            if raw.size != int(np.prod(shape)):
                raise CheckpointVersionError(f"the checkpoint's image holds {raw.size} values, not {shape}")
            image = torch.from_numpy(raw.copy()).reshape(shape)
        history = NO_HISTORY
        if version >= 2:
            history = SessionHistory.from_parts([int(i) for i in header["history"]], parts, config)
        latest = header["latest"]
        return cls(
            session_id=header["session_id"],
            config=config,
            image=image,
            next_chunk=header["next_chunk"],
            pose=CameraPose(**header["pose"]),
            prompt=header["prompt"],
            prompt_seq=header["prompt_seq"],
            applied_seq=header["applied_seq"],
            latest=None if latest is None else ControlSnapshot.from_keys(latest["seq"], latest["keys"]),
            frames_emitted=header["frames_emitted"],
            taken_at=header["taken_at"],
            history=history,
        )

    def _header(self) -> bytes:
        pose = self.pose
        latest = self.latest
        header = {
            "version": self.version,
            "session_id": self.session_id,
            "config": self.config.to_mapping(),
            "image_shape": None if self.image is None else list(self.image.shape),
            "next_chunk": self.next_chunk,
            "pose": {"x": pose.x, "y": pose.y, "z": pose.z, "yaw": pose.yaw, "pitch": pose.pitch},
            "prompt": self.prompt,
            "prompt_seq": self.prompt_seq,
            "applied_seq": self.applied_seq,
            "latest": None if latest is None else {"seq": latest.seq, "keys": sorted(latest.keys)},
            "frames_emitted": self.frames_emitted,
            "taken_at": self.taken_at,
            "history": list(self.history.indices()),
        }
        return json.dumps(header, separators=(",", ":")).encode()
