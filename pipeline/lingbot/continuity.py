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

Re-seeding the reference model needs nothing else: its frames depend only on (base latent, camera, prompt, seed,
chunk index), so a session rebuilt at chunk k from this record produces exactly the frames an uninterrupted run
would have (tested). What a model with history needs besides (LingBot-World-Fast's rolling KV cache and the VAE's
causal feature cache) is in docs/continuity.md.

`ResumePoint` is the part of a checkpoint that travels to the workers with the re-seeded session's first condition
request: the chunk to start at and the camera pose to start from.

`to_bytes` / `from_bytes` serialise a checkpoint (a JSON header and the image's raw float32 bytes) for a store
outside the process (Redis, a later slice); an unknown version is refused (`CheckpointVersionError`).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.lingbot.camera import CameraPose
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import CheckpointVersionError

__all__ = ["CHECKPOINT_VERSION", "ResumePoint", "SessionCheckpoint"]

CHECKPOINT_VERSION = 1
_HEADER = struct.Struct(">I")


@dataclass(frozen=True, slots=True)
class ResumePoint:
    """Where a re-seeded session starts on the workers: chunk `chunk_index`, the camera at `pose`."""

    chunk_index: int
    pose: CameraPose


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
    version: int = CHECKPOINT_VERSION

    @property
    def resume_point(self) -> ResumePoint:
        return ResumePoint(self.next_chunk, self.pose)

    def state_bytes(self) -> int:
        """Bytes this checkpoint holds beyond the session's own objects (the image is shared with the session and
        counted once, by `image_bytes`): the record and its small fields."""
        return len(self._header())

    @property
    def image_bytes(self) -> int:
        return 0 if self.image is None else self.image.numel() * self.image.element_size()

    def header_bytes(self) -> bytes:
        """The record without its image (JSON): what a store writes at every chunk boundary."""
        return self._header()

    def image_data(self) -> bytes | None:
        """The image as float32 bytes (None: no image): what a store writes once per session."""
        return None if self.image is None else self.image.detach().to(torch.float32).contiguous().numpy().tobytes()

    @classmethod
    def from_parts(cls, header: bytes, image: bytes | None) -> SessionCheckpoint:
        """The inverse of `header_bytes` and `image_data` (`CheckpointVersionError` for anything else)."""
        return cls.from_bytes(_HEADER.pack(len(header)) + header + (image or b""))

    def to_bytes(self) -> bytes:
        """Serialised: a 4-byte header length, the JSON header, then the image's float32 bytes (if any)."""
        header = self._header()
        image = b"" if self.image is None else self.image.detach().to(torch.float32).contiguous().numpy().tobytes()
        return _HEADER.pack(len(header)) + header + image

    @classmethod
    def from_bytes(cls, data: bytes) -> SessionCheckpoint:
        try:
            (length,) = _HEADER.unpack_from(data)
            header = json.loads(data[_HEADER.size : _HEADER.size + length])
            version = header["version"]
        except (struct.error, ValueError, KeyError, TypeError) as exc:
            raise CheckpointVersionError(f"not a session checkpoint: {exc}") from exc
        if version != CHECKPOINT_VERSION:
            raise CheckpointVersionError(f"checkpoint version {version!r} is not {CHECKPOINT_VERSION}")
        config = LingBotSessionConfig.from_mapping(header["config"])
        image = None
        shape = header["image_shape"]
        if shape is not None:
            raw = np.frombuffer(data[_HEADER.size + length :], dtype=np.float32)
            if raw.size != int(np.prod(shape)):
                raise CheckpointVersionError(f"the checkpoint's image holds {raw.size} values, not {shape}")
            image = torch.from_numpy(raw.copy()).reshape(shape)
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
        }
        return json.dumps(header, separators=(",", ":")).encode()
