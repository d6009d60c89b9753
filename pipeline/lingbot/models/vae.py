"""The Wan VAE (diffusers' `AutoencoderKLWan`), streamed per session: the reference encoded once, latents decoded
chunk by chunk with the session's causal feature cache.

The Wan2.1 VAE is causal in time: 16 latent channels, 8x spatial and 4x temporal compression, the first latent frame
one video frame, every later one four. Its encoder and decoder keep, per causal convolution, the last input frames of
the previous call (the "feature cache"); diffusers' public `encode`/`decode` clear that cache on every call, so this
module calls `encoder`/`decoder` directly with a cache of its own per session, the way diffusers does inside them
(one frame, then four at a time to encode; one latent frame at a time to decode, `first_chunk` only for the very
first), followed by the quant convs and the clamp. Decoding a session in chunks is therefore the same sequence of
operations as diffusers' one-shot `decode` of the whole latent: the frames are equal bit for bit (tested).

Normalisation: diffusers returns raw latents; the DiT works on `(raw - latents_mean) / latents_std` per channel
(the model's config). `encode_reference` returns normalised latents, `decode_chunk` takes them.

The reference prefix. The real model conditions every latent frame on `y`, the VAE encoding of the reference image
followed by zero frames for the whole video. The encoder's response to zero frames fades frame by frame (measured
with random weights: geometric decay, then bit-identical frames from latent frame ~21 on), so `encode_reference`
encodes zero chunks only until a new latent frame equals the one before it (or `max_prefix_frames` is reached) and
the seam's `slice_condition` repeats that last frame for the rest of the session: identical to encoding the whole
video when the prefix converged, and otherwise off by the last frame-to-frame change (reported by `PrefixEncoding`).

Concurrency: one `StreamingVAE` is used by one stage thread at a time; its sessions' caches are independent.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.lingbot.errors import ModelInputError, ModelSessionError
from pipeline.lingbot.models.checkpoint import DIT_WEIGHTS, load_strict, locate_checkpoint
from pipeline.lingbot.models.errors import CheckpointError

__all__ = [
    "DEFAULT_MAX_PREFIX_FRAMES",
    "TINY_VAE_CONFIG",
    "VAE_CONFIG",
    "PrefixEncoding",
    "StreamingVAE",
    "VAEStatistics",
    "load_vae",
    "tiny_vae",
    "write_tiny_vae",
]

VAE_CONFIG = "config.json"
"""diffusers' model config, beside `diffusion_pytorch_model.safetensors` (or its sharded index) in the VAE folder."""

DEFAULT_MAX_PREFIX_FRAMES = 32
"""Latent frames of reference prefix encoded at most (random weights converge by ~21)."""

TINY_VAE_CONFIG: dict[str, Any] = {
    "base_dim": 8,
    "z_dim": 16,
    "dim_mult": [1, 2, 2, 2],
    "num_res_blocks": 1,
    "temperal_downsample": [False, True, True],
}
"""An `AutoencoderKLWan` config with the real compression (16 channels, 8x, 4x) and ~0.2 M parameters."""


@dataclass(frozen=True, slots=True)
class PrefixEncoding:
    """The normalised base latent `[16, T, h, w]` float32 and how its prefix ended."""

    latent: torch.Tensor
    converged: bool
    """True when the last latent frame equals the one before it (the rest of the video would repeat it)."""
    last_change: float
    """Largest absolute difference between the last two latent frames (0.0 when converged)."""


@dataclass(frozen=True, slots=True)
class VAEStatistics:
    open_sessions: int
    encodes: int
    decoded_chunks: int


@dataclass(slots=True)
class _DecodeSession:
    feature_cache: list[Any]
    next_frame: int = 0


class StreamingVAE:
    """An `AutoencoderKLWan` in eval mode on one device, with per-session decode caches.

    `open(session_id)` before decoding, `decode_chunk` for each chunk in order, `release(session_id)` at the end
    (idempotent). `encode_reference` needs no session: it runs the encoder with a cache of its own, once.
    """

    def __init__(
        self,
        vae: Any,
        *,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        if next(vae.parameters()).dtype != dtype:  # diffusers logs a warning on every cast, even a no-op one
            vae = vae.to(dtype=dtype)
        self._vae = vae.to(device=device).eval().requires_grad_(False)
        self._device = torch.device(device)
        self._dtype = dtype
        config = vae.config
        self._z_dim = int(config.z_dim)
        self._spatial = int(config.scale_factor_spatial or 8)
        self._temporal = int(config.scale_factor_temporal or 4)
        if config.patch_size is not None:
            raise ModelInputError("StreamingVAE: patchified VAEs (Wan2.2's) are not the LingBot-World VAE")
        self._mean = torch.tensor(config.latents_mean, dtype=torch.float32, device=self._device).view(-1, 1, 1, 1)
        self._std = torch.tensor(config.latents_std, dtype=torch.float32, device=self._device).view(-1, 1, 1, 1)
        if self._mean.shape[0] != self._z_dim or self._std.shape[0] != self._z_dim:
            raise ModelInputError(f"StreamingVAE: latents_mean/std must have {self._z_dim} entries")
        self._encoder_convs = _causal_convs(vae.encoder)
        self._decoder_convs = _causal_convs(vae.decoder)
        self._lock = threading.Lock()
        self._sessions: dict[str, _DecodeSession] = {}
        self._encodes = 0
        self._decoded = 0

    @property
    def latent_channels(self) -> int:
        return self._z_dim

    @property
    def spatial_compression(self) -> int:
        return self._spatial

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def module(self) -> Any:
        """The diffusers `AutoencoderKLWan` (Any: diffusers is not typed)."""
        return self._vae

    def normalize(self, raw: torch.Tensor) -> torch.Tensor:
        """Raw latents `[C, T, h, w]` -> the DiT's normalised latents (float32)."""
        return (raw.float().to(self._device) - self._mean) / self._std

    def denormalize(self, latent: torch.Tensor) -> torch.Tensor:
        return latent.float().to(self._device) * self._std + self._mean

    # --- encode ----------------------------------------------------------------------------------------------------

    def encode_reference(
        self, image: torch.Tensor, *, max_prefix_frames: int = DEFAULT_MAX_PREFIX_FRAMES
    ) -> PrefixEncoding:
        """The reference image `[3, H, W]` in [0, 1] followed by zero frames, encoded (posterior mode) and
        normalised: `[16, T, H/8, W/8]` float32, `1 <= T <= max_prefix_frames` (module docstring)."""
        if image.ndim != 3 or image.shape[0] != 3:
            raise ModelInputError(f"reference image must be [3, H, W], got {list(image.shape)}")
        if image.shape[1] % self._spatial or image.shape[2] % self._spatial:
            raise ModelInputError(f"reference image {list(image.shape)} is not a multiple of {self._spatial} pixels")
        if max_prefix_frames < 1:
            raise ModelInputError(f"max_prefix_frames must be >= 1, got {max_prefix_frames}")
        cache: list[Any] = [None] * self._encoder_convs
        frames = []
        with torch.inference_mode():
            video = (image.to(self._device, torch.float32).clamp(0, 1) * 2 - 1).to(self._dtype)[None, :, None]
            frames.append(self._encode_step(video, cache))
            zeros = torch.zeros(
                1, 3, self._temporal, image.shape[1], image.shape[2], device=self._device, dtype=self._dtype
            )
            change = 0.0
            while len(frames) < max_prefix_frames:
                frames.append(self._encode_step(zeros, cache))
                change = float((frames[-1] - frames[-2]).abs().max())
                if change == 0.0 and len(frames) > 2:
                    break
            latent = self.normalize(torch.cat(frames, dim=1))
        with self._lock:
            self._encodes += 1
        converged = len(frames) > 2 and change == 0.0
        return PrefixEncoding(latent.contiguous(), converged, 0.0 if converged else change)

    def _encode_step(self, video: torch.Tensor, cache: list[Any]) -> torch.Tensor:
        """One encoder call (1 frame, then 4) -> raw posterior mean `[16, 1, h, w]` float32."""
        moments = self._vae.quant_conv(self._vae.encoder(video, feat_cache=cache, feat_idx=[0]))
        mean: torch.Tensor = moments[0, : self._z_dim].float()
        return mean

    # --- decode ----------------------------------------------------------------------------------------------------

    def open(self, session_id: str) -> None:
        """A fresh decode cache for `session_id` (one session, one cache)."""
        with self._lock:
            if session_id in self._sessions:
                raise ModelSessionError(f"vae: session {session_id!r} already has a decode cache")
            self._sessions[session_id] = _DecodeSession([None] * self._decoder_convs)

    def release(self, session_id: str) -> None:
        """Drops the session's cache; an unknown id is a no-op (a failed release can be retried)."""
        with self._lock:
            self._sessions.pop(session_id, None)

    def decode_chunk(self, session_id: str, latent: torch.Tensor) -> torch.Tensor:
        """Normalised latents `[16, n, h, w]` (the session's next n) -> video `[3, T, H, W]` float32 in [-1, 1]:
        `T = 4(n - 1) + 1` for the session's first chunk, `4n` after."""
        with self._lock:
            state = self._sessions.get(session_id)
        if state is None:
            raise ModelSessionError(f"vae: no decode cache for session {session_id!r} (open it first)")
        if latent.ndim != 4 or latent.shape[0] != self._z_dim or latent.shape[1] < 1:
            raise ModelInputError(f"latent chunk must be [{self._z_dim}, n>=1, h, w], got {list(latent.shape)}")
        with torch.inference_mode():
            raw = self.denormalize(latent).to(self._dtype)[None]
            x = self._vae.post_quant_conv(raw)
            outputs = []
            for i in range(x.shape[2]):
                first = state.next_frame == 0
                outputs.append(
                    self._vae.decoder(
                        x[:, :, i : i + 1], feat_cache=state.feature_cache, feat_idx=[0], first_chunk=first
                    )
                )
                state.next_frame += 1
            video = torch.cat(outputs, dim=2).clamp(-1.0, 1.0)[0].float()
        with self._lock:
            self._decoded += 1
        return video

    def cache_bytes(self, session_id: str) -> int:
        """The bytes of the session's decode feature cache now (0 before its first chunk); the memory plan's
        `memory_parts.decoder_memory` measures the same on `meta`."""
        with self._lock:
            state = self._sessions.get(session_id)
        if state is None:
            raise ModelSessionError(f"vae: no decode cache for session {session_id!r}")
        return sum(t.numel() * t.element_size() for t in state.feature_cache if isinstance(t, torch.Tensor))

    def statistics(self) -> VAEStatistics:
        with self._lock:
            return VAEStatistics(len(self._sessions), self._encodes, self._decoded)


def load_vae(directory: Path | str, *, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> Any:
    """diffusers' `AutoencoderKLWan` from a VAE folder (`config.json` + safetensors weights, the layout of
    `save_pretrained` and of the Wan-Diffusers repositories' `vae/`), loaded strictly: a missing, unexpected, wrongly
    shaped or wrongly typed tensor is a `CheckpointError` naming it. Returns the module in eval mode."""
    from diffusers import AutoencoderKLWan

    root = Path(directory)
    config_path = root / VAE_CONFIG
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"VAE folder {root}: {config_path.name} is missing or not JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise CheckpointError(f"VAE folder {root}: {config_path.name} must hold a JSON object")
    if config.get("_class_name", "AutoencoderKLWan") != "AutoencoderKLWan":
        raise CheckpointError(
            f"VAE folder {root}: {config_path.name} is for {config['_class_name']}, not AutoencoderKLWan"
        )
    layout = locate_checkpoint(root, DIT_WEIGHTS)
    try:
        with torch.device("meta"):
            model = AutoencoderKLWan.from_config(config)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(
            f"VAE folder {root}: {config_path.name} does not describe an AutoencoderKLWan: {exc}"
        ) from exc
    return load_strict(model, layout, "the Wan VAE in its config.json", dtype=dtype, device=device)


def write_tiny_vae(directory: Path | str, *, seed: int = 0, config: dict[str, Any] | None = None) -> Path:
    """A random `tiny_vae` saved in the VAE folder layout (`config.json` + `diffusion_pytorch_model.safetensors`)."""
    root = Path(directory)
    tiny_vae(seed, config).save_pretrained(str(root), safe_serialization=True)
    return root


def tiny_vae(seed: int = 0, config: dict[str, Any] | None = None) -> Any:
    """A random-weight `AutoencoderKLWan` (default `TINY_VAE_CONFIG`) for tests and the tiny checkpoint: every
    weight random (scaled by fan-in) so its outputs are O(1) and depend on every layer."""
    from diffusers import AutoencoderKLWan

    vae = AutoencoderKLWan(**(config or TINY_VAE_CONFIG))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in vae.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith("bias"):
                param.copy_(0.05 * noise)
            elif name.endswith("gamma"):
                param.copy_(1 + 0.1 * noise)
            else:
                fan_in = max(1, param[0].numel()) if param.ndim > 1 else 1
                param.copy_(noise / fan_in**0.5)
    return vae.eval()


def _causal_convs(module: torch.nn.Module) -> int:
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    return sum(isinstance(m, WanCausalConv3d) for m in module.modules())
