"""Shared helpers for the LingBot tests: drive a reference session and measure image motion."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np
import torch

from pipeline.lingbot.camera import CameraController
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.reference.model import ReferenceWorldModel


def small_config(**overrides: object) -> LingBotSessionConfig:
    """A 128x64 session with a short plan, the size most model tests use."""
    chunk_size = overrides.get("chunk_size", 3)
    assert isinstance(chunk_size, int)
    values: dict[str, object] = {"width": 128, "height": 64, "frame_num": 4 * (chunk_size * 8 - 1) + 1}
    values.update(overrides)
    return LingBotSessionConfig.from_mapping(values)


def open_session(
    model: ReferenceWorldModel, session_id: str, config: LingBotSessionConfig, image: torch.Tensor | None = None
) -> CameraController:
    model.encoder.create_cache(session_id, config)
    base = model.encoder.encode_reference(session_id, image)
    model.denoiser.create_cache(session_id, config, base)
    model.decoder.create_cache(session_id, config)
    return CameraController(config.pose_steps(), config.camera_intrinsics())


def close_session(model: ReferenceWorldModel, session_id: str) -> None:
    model.decoder.release_cache(session_id)
    model.denoiser.release_cache(session_id)
    model.encoder.release_cache(session_id)


def generate_chunk(
    model: ReferenceWorldModel,
    session_id: str,
    camera: CameraController,
    chunk_index: int,
    keys: Sequence[str],
    chunk_size: int,
    prompt: str = "",
) -> torch.Tensor:
    control = camera.chunk_control(ControlSnapshot.from_keys(chunk_index, keys), chunk_index, chunk_size)
    latent = model.denoiser.denoise_chunk(session_id, chunk_index, chunk_size, control.camera, prompt=prompt)
    return model.decoder.decode_chunk(session_id, chunk_index, latent)


def run_session(
    config: LingBotSessionConfig,
    keys_per_chunk: Sequence[Sequence[str]],
    *,
    image: torch.Tensor | None = None,
    model: ReferenceWorldModel | None = None,
    session_id: str = "s",
) -> list[torch.Tensor]:
    """Encode, then generate one chunk per entry of `keys_per_chunk`; returns each chunk's frames."""
    model = model if model is not None else ReferenceWorldModel()
    camera = open_session(model, session_id, config, image)
    chunks = [
        generate_chunk(model, session_id, camera, index, keys, config.chunk_size)
        for index, keys in enumerate(keys_per_chunk)
    ]
    close_session(model, session_id)
    return chunks


def digest(chunks: Sequence[torch.Tensor]) -> str:
    sha = hashlib.sha256()
    for chunk in chunks:
        sha.update(chunk.numpy().tobytes())
    return sha.hexdigest()


def gray(frame: torch.Tensor) -> np.ndarray:
    """uint8 `[H, W, 3]` -> float64 `[H, W]` luminance."""
    weights = np.array([0.299, 0.587, 0.114])
    luminance: np.ndarray = frame.numpy().astype(np.float64) @ weights
    return luminance


def content_shift(
    before: np.ndarray,
    after: np.ndarray,
    rows: slice,
    cols: slice,
    max_shift: int = 10,
    max_dy: int | None = None,
) -> tuple[int, int]:
    """The integer `(dy, dx)` by which the content of the region moved from `before` to `after`.

    Found by exhaustive search: the shift minimising the mean squared difference between `before[y, x]` and
    `after[y + dy, x + dx]` over the region (which must stay that far from the borders). `max_dy` narrows the
    vertical search.
    """
    ref = before[rows, cols]
    best: tuple[float, int, int] | None = None
    vertical = max_shift if max_dy is None else max_dy
    for dy in range(-vertical, vertical + 1):
        for dx in range(-max_shift, max_shift + 1):
            moved = after[rows.start + dy : rows.stop + dy, cols.start + dx : cols.stop + dx]
            error = float(np.mean((ref - moved) ** 2))
            if best is None or error < best[0]:
                best = (error, dy, dx)
    assert best is not None
    return best[1], best[2]
