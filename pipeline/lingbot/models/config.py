"""The shape of a LingBot-World-Fast DiT: one frozen record, the full-size values and a tiny one for tests.

Everything the checkpoint cannot tell (head count, RoPE table length, eps) lives here; everything it can tell
(dim, ffn, layers, channels) must agree with it, and strict loading checks that it does.

The full-size model is Wan2.2-I2V-A14B's expert shape: dim 5120, ffn 13824, 40 layers of 40 heads (head_dim 128,
RoPE split 44/42/42 for frame/height/width), 36 input channels (16 noise + 4 first-frame mask + 16 image latent),
16 output channels, patches of 1x2x2, umt5-xxl text (4096 wide, 512 tokens) and a 6-channel Plücker camera map
pixel-unshuffled 8x8 (384 channels per latent pixel, 1536 features per patch).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.lingbot.models.errors import ModelConfigError

__all__ = ["LINGBOT_FAST_14B", "TINY_DIT", "DiTConfig"]


@dataclass(frozen=True, slots=True)
class DiTConfig:
    """Sizes of the DiT. `num_heads`, `rope_frames`, `rope_theta` and `eps` are not stored in a checkpoint."""

    dim: int
    ffn_dim: int
    num_layers: int
    num_heads: int
    in_dim: int = 36
    out_dim: int = 16
    freq_dim: int = 256
    text_dim: int = 4096
    text_len: int = 512
    patch_size: tuple[int, int, int] = (1, 2, 2)
    control_channels: int = 6
    """Plücker channels per video pixel: 6 in camera mode (origins, directions), 7 in action mode."""
    control_unshuffle: int = 8
    """The camera map is pixel-unshuffled by this factor (the VAE's spatial compression) onto channels."""
    eps: float = 1e-6
    rope_frames: int = 1024
    """Entries of the RoPE table: latent frame positions 0 .. rope_frames - 1 exist (the reference's 1024)."""
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("dim", "ffn_dim", "num_layers", "num_heads", "in_dim", "out_dim", "freq_dim", "text_dim"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("text_len", "control_channels", "control_unshuffle", "rope_frames"):
            _require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        _require(len(self.patch_size) == 3 and min(self.patch_size) >= 1, f"bad patch_size {self.patch_size}")
        _require(self.patch_size[0] == 1, f"the causal cache needs a temporal patch of 1, got {self.patch_size}")
        _require(self.freq_dim % 2 == 0, f"freq_dim must be even, got {self.freq_dim}")
        _require(self.dim % self.num_heads == 0, f"dim {self.dim} is not divisible by num_heads {self.num_heads}")
        frame, height, width = self.rope_split
        _require(
            frame % 2 == 0 and height % 2 == 0 and width % 2 == 0,
            f"head_dim {self.head_dim} splits into RoPE parts {frame}/{height}/{width}; each must be even "
            "(head_dim // 3 even: 24, 32, 128 work, 16 does not)",
        )
        _require(height >= 2, f"head_dim {self.head_dim} is too small for 3-D RoPE (need head_dim >= 6)")
        _require(self.eps > 0 and self.rope_theta > 1, "eps must be > 0 and rope_theta > 1")

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def rope_split(self) -> tuple[int, int, int]:
        """Channels of each head given to the frame, height and width rotations (44/42/42 for 128)."""
        third = self.head_dim // 3
        return self.head_dim - 2 * third, third, third

    @property
    def patch_volume(self) -> int:
        return math.prod(self.patch_size)

    @property
    def control_map_channels(self) -> int:
        """Channels of the pixel-unshuffled camera map per latent pixel (384 in camera mode)."""
        return self.control_channels * self.control_unshuffle**2

    @property
    def control_patch_dim(self) -> int:
        """Input features of `patch_embedding_wancamctrl` (1536 in camera mode)."""
        return self.control_map_channels * self.patch_volume

    def frame_tokens(self, latent_height: int, latent_width: int) -> int:
        """Tokens per latent frame (1560 at 832x480: a 60x104 latent in 2x2 patches)."""
        _, ph, pw = self.patch_size
        if latent_height % ph or latent_width % pw:
            raise ModelConfigError(f"latent {latent_height}x{latent_width} is not a whole number of {ph}x{pw} patches")
        return (latent_height // ph) * (latent_width // pw)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ModelConfigError(f"DiTConfig: {message}")


LINGBOT_FAST_14B = DiTConfig(dim=5120, ffn_dim=13824, num_layers=40, num_heads=40)
"""The published LingBot-World-Fast DiT (one Wan2.2-A14B expert)."""

TINY_DIT = DiTConfig(dim=64, ffn_dim=96, num_layers=2, num_heads=2, freq_dim=32, text_dim=24, text_len=8)
"""Same architecture, random-weight size for CPU tests and the tiny checkpoint (head_dim 32: RoPE 12/10/10)."""
