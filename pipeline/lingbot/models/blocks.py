"""The DiT's transformer block and output head (WanModel-style, with the LingBot camera injection).

One block, on the residual stream `x` (kept in float32; every Linear runs in the weights' dtype):

    shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = modulation + time_mod        (float32)
    x += gate_a * self_attn(norm1(x) * (1 + scale_a) + shift_a)                      (RoPE, KV cache)
    h  = cam_injector_layer2(silu(cam_injector_layer1(c))) + c                        (c: camera tokens)
    x  = (1 + cam_scale_layer(h)) * x + cam_shift_layer(h)
    x += cross_attn(norm3(x), text)                                                   (cached text K/V)
    x += gate_f * ffn(norm2(x) * (1 + scale_f) + shift_f)

The camera's `cam_scale_layer(h)` and `cam_shift_layer(h)` depend only on the chunk's camera tokens, which do not
change across a chunk's 4 sampler steps and its clean pass: `DiTBlock.camera_modulation` computes them once per
chunk (`CameraModulation`, in the weights' dtype, widened to float32 where they are used, as before), and the
block's forward reuses them, bit for bit the values it would compute itself.

`norm1`/`norm2` are LayerNorms without parameters, `norm3` has them; queries and keys get an RMSNorm over the
whole width before they are split into heads. Attention is PyTorch's SDPA (flash or memory-efficient kernels where
the device has them), or the kernel the worker chose (`attention.py`: `kernel` on each attention module, set by
`LingBotFastDiT.set_attention`). Parameter names are the checkpoint's (`blocks.N.self_attn.q.weight`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.lingbot.models.attention import attend
from pipeline.lingbot.models.cache import CacheSlot, LayerKV
from pipeline.lingbot.models.config import DiTConfig
from pipeline.lingbot.models.parallel import SINGLE_RANK, Ulysses
from pipeline.lingbot.models.rope import RopeAngles, rotate

__all__ = ["BlockCamera", "CameraModulation", "DiTBlock", "OutputHead", "RMSNorm", "linear_fp32"]

BlockCamera = tuple[torch.Tensor, torch.Tensor]
"""One block's camera (scale, shift), each `[B, S, dim]` in the weights' dtype (S: this rank's tokens)."""


@dataclass(frozen=True, slots=True)
class CameraModulation:
    """Every block's camera (scale, shift) for one chunk's camera input (`LingBotFastDiT.camera_modulation`), made
    once per chunk and reused by its 5 forwards. Memory: 2 x layers x tokens x dim in the weights' dtype (the full
    size at 832x480, 4 680 tokens, bf16: 3.8 GB per chunk in flight, divided by P under Ulysses)."""

    layers: tuple[BlockCamera, ...]

    @property
    def tokens(self) -> int:
        """Tokens per batch row (this rank's under Ulysses)."""
        return self.layers[0][0].shape[1] if self.layers else 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for pair in self.layers for t in pair)


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last axis, computed in float32, with a learned scale."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.float()
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        return normed.to(self.weight.dtype) * self.weight


def _modulation(rows: int, dim: int) -> nn.Parameter:
    """The learned modulation table `[1, rows, dim]`, N(0, 1/dim) like Wan's; left empty on the meta device (whose
    `normal_` would import torch's compiler stack, ~1 s, for a tensor that is about to be replaced)."""
    table = torch.empty(1, rows, dim)
    if not table.is_meta:
        nn.init.normal_(table, std=dim**-0.5)
    return nn.Parameter(table)


def linear_fp32(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """`layer(x)` in float32 whatever the weights' dtype (the time embedding and modulation path)."""
    bias = layer.bias.float() if layer.bias is not None else None
    return F.linear(x.float(), layer.weight.float(), bias)


class _Attention(nn.Module):
    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        dim = config.dim
        self.heads = config.num_heads
        self.kernel = "sdpa"
        """The attention kernel (`AttentionPlan.kernel`); SDPA's backend is chosen around the forward."""
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.o = nn.Linear(dim, dim)
        self.norm_q = RMSNorm(dim, config.eps)
        self.norm_k = RMSNorm(dim, config.eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(*x.shape[:-1], self.heads, -1)


class SelfAttention(_Attention):
    """Attention of a chunk's tokens over the session's cache, the chunk itself included. Under Ulysses (`parallel`,
    `parallel.py`) `x` and `angles` are this rank's tokens and `layer` holds this rank's heads: q, k, v go to head
    shards over all tokens for the cache and SDPA, and the output comes back to this rank's tokens before `o`."""

    def forward(
        self, x: torch.Tensor, angles: RopeAngles, layer: LayerKV, slot: CacheSlot, parallel: Ulysses = SINGLE_RANK
    ) -> torch.Tensor:
        q = parallel.to_heads(rotate(self._heads(self.norm_q(self.q(x))), angles))
        k = parallel.to_heads(rotate(self._heads(self.norm_k(self.k(x))), angles))
        v = parallel.to_heads(self._heads(self.v(x)))
        # Where the chunk goes is a device tensor (`cache.py`, static offsets): no Python int of the ring's position
        # reaches a compiled graph. The same values as slice copies, bit for bit.
        layer.k.index_copy_(1, slot.write_index, k.to(layer.k.dtype))
        layer.v.index_copy_(1, slot.write_index, v.to(layer.v.dtype))
        # Unmasked attention does not depend on the keys' order: the ring's is fine as it lies.
        keys = layer.k[:, : slot.visible].transpose(1, 2).to(q.dtype)
        values = layer.v[:, : slot.visible].transpose(1, 2).to(q.dtype)
        out = attend(q.transpose(1, 2), keys, values, self.kernel)
        result: torch.Tensor = self.o(parallel.to_tokens(out.transpose(1, 2)).flatten(2))
        return result


class CrossAttention(_Attention):
    """Attention of the video tokens over the prompt; the prompt's K/V are computed once per session."""

    def text_kv(self, context: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        k = self._heads(self.norm_k(self.k(context))).transpose(1, 2)
        v = self._heads(self.v(context)).transpose(1, 2)
        return k, v

    def forward(self, x: torch.Tensor, text: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        q = self._heads(self.norm_q(self.q(x))).transpose(1, 2)
        out = attend(q, text[0], text[1], self.kernel)
        result: torch.Tensor = self.o(out.transpose(1, 2).flatten(2))
        return result


class DiTBlock(nn.Module):
    """One transformer block; see the module docstring for the order of operations."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        dim = config.dim
        self.eps = config.eps
        self.self_attn = SelfAttention(config)
        self.cross_attn = CrossAttention(config)
        self.norm3 = nn.LayerNorm(dim, eps=config.eps)
        self.ffn = nn.Sequential(
            nn.Linear(dim, config.ffn_dim), nn.GELU(approximate="tanh"), nn.Linear(config.ffn_dim, dim)
        )
        self.modulation = _modulation(6, dim)
        self.cam_injector_layer1 = nn.Linear(dim, dim)
        self.cam_injector_layer2 = nn.Linear(dim, dim)
        self.cam_scale_layer = nn.Linear(dim, dim)
        self.cam_shift_layer = nn.Linear(dim, dim)

    def forward(
        self,
        x: torch.Tensor,
        time_mod: torch.Tensor,
        text: tuple[torch.Tensor, torch.Tensor],
        angles: RopeAngles,
        layer: LayerKV,
        slot: CacheSlot,
        camera: BlockCamera | None,
        parallel: Ulysses = SINGLE_RANK,
    ) -> torch.Tensor:
        """`x` float32 `[B, S, dim]`, `time_mod` float32 `[B, 6, dim]`, `camera` this block's (scale, shift) from
        `camera_modulation` or None (under Ulysses, S is this rank's tokens)."""
        dtype = self.modulation.dtype
        mod = (self.modulation.float() + time_mod).unsqueeze(2).unbind(1)
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = mod
        attn_in = self._norm(x) * (1 + scale_a) + shift_a
        x = x + gate_a * self.self_attn(attn_in.to(dtype), angles, layer, slot, parallel).float()
        if camera is not None:
            cam_scale, cam_shift = camera
            x = (1 + cam_scale.float()) * x + cam_shift.float()
        cross_in = F.layer_norm(x, x.shape[-1:], self.norm3.weight.float(), self.norm3.bias.float(), self.eps)
        x = x + self.cross_attn(cross_in.to(dtype), text).float()
        ffn_in = self._norm(x) * (1 + scale_f) + shift_f
        ffn_out: torch.Tensor = self.ffn(ffn_in.to(dtype))
        return x + gate_f * ffn_out.float()

    def camera_modulation(self, camera: torch.Tensor) -> BlockCamera:
        """This block's camera (scale, shift) from the chunk's camera tokens `[B, S, dim]` (the module docstring)."""
        hidden = self.cam_injector_layer2(F.silu(self.cam_injector_layer1(camera))) + camera
        scale: torch.Tensor = self.cam_scale_layer(hidden)
        shift: torch.Tensor = self.cam_shift_layer(hidden)
        return scale, shift

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, x.shape[-1:], eps=self.eps)


class OutputHead(nn.Module):
    """Norm, time modulation (shift, scale) and the projection to `out_dim x patch volume` per token."""

    def __init__(self, config: DiTConfig) -> None:
        super().__init__()
        self.eps = config.eps
        self.head = nn.Linear(config.dim, config.out_dim * config.patch_volume)
        self.modulation = _modulation(2, config.dim)

    def forward(self, x: torch.Tensor, time_emb: torch.Tensor) -> torch.Tensor:
        """`x` float32 `[B, S, dim]`, `time_emb` float32 `[B, dim]` -> `[B, S, out_dim x patch volume]`."""
        shift, scale = (self.modulation.float() + time_emb.unsqueeze(1)).unsqueeze(2).unbind(1)
        normed = F.layer_norm(x, x.shape[-1:], eps=self.eps) * (1 + scale) + shift
        result: torch.Tensor = self.head(normed.to(self.head.weight.dtype))
        return result
