"""LingBot-World-Fast's causal DiT: embeddings, the block stack and the output head, over a session's KV cache.

One call denoises (or, at t = 0, re-encodes) one chunk of latent frames:

    latents  [B, 36, F, h, w]   16 noisy latent + 4 first-frame mask + 16 image-latent channels (h, w = H/8, W/8)
    timestep [B] or [1]         the flow-matching timestep, 0..1000 (float)
    text     TextKV             the prompt's per-layer cross-attention K/V (`encode_text`, once per prompt)
    control  [B, 384, F, h, w]  the 6-channel Plücker map pixel-unshuffled 8x8 (channel-major, then the row and
                                column inside the 8x8 block: `F.pixel_unshuffle`'s order), or None: no camera
    -> velocity [B, 16, F, h, w] float32

Embeddings: `patch_embedding` (Conv3d 1x2x2) turns the latents into `F * h/2 * w/2` tokens; the camera map is cut
into the same 1x2x2 patches (features ordered channel, then patch offsets), embedded by
`patch_embedding_wancamctrl` and refined by a residual MLP (`c2ws_hidden_states_layer1/2`); the timestep's
sinusoidal embedding (cos half first) goes through `time_embedding` and `time_projection` into the per-block
modulation, in float32 whatever the weights' dtype; the umt5 states go through `text_embedding`. The output is
unpatchified with features ordered patch offsets, then channel.

Context parallelism (`parallel.py`): a DiT built with a `Ulysses` layout of P ranks runs on its rank's share of the
chunk's tokens after the patch embedding, caches its share of the heads, and all-gathers the velocity, so every
rank returns the whole chunk; at P = 1 nothing changes.

The camera's per-block modulation depends on the chunk's camera only, so a chunk's caller makes it once
(`camera_modulation`) and passes it to each of the chunk's forwards (`camera=`, the sampler does); a forward given
`control` instead computes it itself, the same values bit for bit.

The parameter names are exactly the checkpoint's, so `load_state_dict(strict=True)` is the loading contract
(`checkpoint.py`). Construct on the `meta` device to inspect the full size without memory.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.lingbot.errors import ModelInputError
from pipeline.lingbot.models.attention import AttentionPlan
from pipeline.lingbot.models.blocks import CameraModulation, DiTBlock, OutputHead, linear_fp32
from pipeline.lingbot.models.cache import CacheConfig, CacheSlot, KVCache, TextKV
from pipeline.lingbot.models.config import DiTConfig
from pipeline.lingbot.models.parallel import SINGLE_RANK, Ulysses, check_parallel

__all__ = ["LingBotFastDiT"]


class LingBotFastDiT(nn.Module):
    """The DiT. Stateless between calls: all session state is in the `KVCache` and `TextKV` passed in."""

    def __init__(self, config: DiTConfig, parallel: Ulysses = SINGLE_RANK) -> None:
        super().__init__()
        check_parallel(config, parallel.world_size)
        dim = config.dim
        self._config = config
        self._parallel = parallel
        self.patch_embedding = nn.Conv3d(config.in_dim, dim, kernel_size=config.patch_size, stride=config.patch_size)
        self.patch_embedding_wancamctrl = nn.Linear(config.control_patch_dim, dim)
        self.c2ws_hidden_states_layer1 = nn.Linear(dim, dim)
        self.c2ws_hidden_states_layer2 = nn.Linear(dim, dim)
        self.text_embedding = nn.Sequential(
            nn.Linear(config.text_dim, dim), nn.GELU(approximate="tanh"), nn.Linear(dim, dim)
        )
        self.time_embedding = nn.Sequential(nn.Linear(config.freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))
        self.time_projection = nn.Sequential(nn.SiLU(), nn.Linear(dim, 6 * dim))
        self.blocks = nn.ModuleList(DiTBlock(config) for _ in range(config.num_layers))
        self.head = OutputHead(config)
        self._attention = AttentionPlan("sdpa")
        self._static_cache = False

    @property
    def config(self) -> DiTConfig:
        return self._config

    @property
    def parallel(self) -> Ulysses:
        """This rank's place in the DiT group (`SINGLE_RANK` unsharded)."""
        return self._parallel

    @property
    def attention(self) -> AttentionPlan:
        """The attention the blocks run (`set_attention`; by default SDPA as PyTorch chooses)."""
        return self._attention

    def set_attention(self, plan: AttentionPlan) -> None:
        """Run every block's attention as `plan` says (`attention.select_attention`), from the next forward."""
        for block in self._blocks():
            block.self_attn.kernel = plan.kernel
            block.cross_attn.kernel = plan.kernel
        self._attention = plan

    @property
    def static_cache(self) -> bool:
        """Whether `new_cache` marks a cache's buffers as static addresses (`KVCache.mark_static_addresses`, for
        CUDA graphs: `compile_blocks` sets it for `max`)."""
        return self._static_cache

    def set_static_cache(self, static: bool) -> None:
        """Caches made from now on are marked static (`static_cache`) or not."""
        self._static_cache = static

    @property
    def dtype(self) -> torch.dtype:
        return self.patch_embedding.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.patch_embedding.weight.device

    def new_cache(self, cache: CacheConfig, latent_height: int, latent_width: int, *, batch: int = 1) -> KVCache:
        """A session's empty KV cache on this model's device and dtype (under Ulysses: this rank's heads, for every
        token), its buffers marked static where `static_cache` says so. Raises `ModelConfigError` when the group does
        not divide a latent frame's tokens."""
        frame_tokens = self._config.frame_tokens(latent_height, latent_width)
        check_parallel(self._config, self._parallel.world_size, frame_tokens)
        _, ph, pw = self._config.patch_size
        kv = KVCache(
            self._config,
            cache,
            frame_tokens=frame_tokens,
            batch=batch,
            device=self.device,
            dtype=self.dtype,
            heads=self._parallel.local_heads(self._config.num_heads),
            patch_grid=(latent_height // ph, latent_width // pw),
        )
        if self._static_cache:
            kv.mark_static_addresses()
        return kv

    def encode_text(self, context: torch.Tensor) -> TextKV:
        """The prompt's cross-attention K/V for every layer; `context` `[B, text_len, text_dim]` (umt5 states,
        zero-padded to `text_len`)."""
        if context.ndim != 3 or context.shape[-1] != self._config.text_dim:
            raise ModelInputError(f"text context must be [B, L, {self._config.text_dim}], got {list(context.shape)}")
        embedded = self.text_embedding(context.to(device=self.device, dtype=self.dtype))
        return TextKV(tuple(block.cross_attn.text_kv(embedded) for block in self._blocks()))

    def embed_control(self, control: torch.Tensor) -> torch.Tensor:
        """Camera tokens `[B, S, dim]` from the unshuffled Plücker map `[B, control_map_channels, F, h, w]` (under
        Ulysses: this rank's tokens)."""
        b, c, f, h, w = control.shape
        pt, ph, pw = self._config.patch_size
        patches = control.to(device=self.device, dtype=self.dtype).reshape(b, c, f // pt, pt, h // ph, ph, w // pw, pw)
        tokens = patches.permute(0, 2, 4, 6, 1, 3, 5, 7).reshape(b, (f // pt) * (h // ph) * (w // pw), -1)
        embedded: torch.Tensor = self.patch_embedding_wancamctrl(self._parallel.shard_tokens(tokens))
        refined: torch.Tensor = self.c2ws_hidden_states_layer2(F.silu(self.c2ws_hidden_states_layer1(embedded)))
        return embedded + refined

    def camera_modulation(self, control: torch.Tensor) -> CameraModulation:
        """Every block's camera (scale, shift) for a chunk's unshuffled Plücker map `[B, control_map_channels, F, h,
        w]`, for that chunk's forwards (`camera=`); under Ulysses, this rank's tokens."""
        camera = self.embed_control(control)
        return CameraModulation(tuple(block.camera_modulation(camera) for block in self._blocks()))

    def time_embeddings(self, timestep: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(embedding `[B, dim]`, block modulation `[B, 6, dim]`), both float32."""
        half = self._config.freq_dim // 2
        scales = torch.pow(10000, -torch.arange(half, dtype=torch.float64, device=timestep.device).div(half))
        phase = torch.outer(timestep.to(torch.float32).double(), scales)
        sinusoid = torch.cat([torch.cos(phase), torch.sin(phase)], dim=1).float()
        first, last = self.time_embedding[0], self.time_embedding[2]
        assert isinstance(first, nn.Linear)
        assert isinstance(last, nn.Linear)
        embedding = linear_fp32(last, F.silu(linear_fp32(first, sinusoid)))
        projection = self.time_projection[1]
        assert isinstance(projection, nn.Linear)
        modulation = linear_fp32(projection, F.silu(embedding)).reshape(-1, 6, self._config.dim)
        return embedding, modulation

    def forward(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        text: TextKV,
        cache: KVCache,
        slot: CacheSlot,
        control: torch.Tensor | None = None,
        *,
        camera: CameraModulation | None = None,
    ) -> torch.Tensor:
        """The chunk's velocity prediction; writes the chunk's K/V into `slot` (see the module docstring). The camera
        is `control` (the Plücker map) or `camera` (its modulation, `camera_modulation(control)`), not both."""
        cache.check_slot(slot)
        self._check_inputs(latents, timestep, text, cache, slot, control)
        if control is not None and camera is not None:
            raise ModelInputError("give the camera as control or as its modulation, not both")
        x = self.patch_embedding(latents.to(device=self.device, dtype=self.dtype))
        grid = (x.shape[2], x.shape[3], x.shape[4])
        parallel = self._parallel
        x = parallel.shard_tokens(x.flatten(2).transpose(1, 2).float())
        time_emb, time_mod = self.time_embeddings(timestep.to(self.device).reshape(-1).expand(latents.shape[0]))
        if control is not None:
            camera = self.camera_modulation(control)
        if camera is not None and (len(camera.layers) != len(self.blocks) or camera.tokens != x.shape[1]):
            raise ModelInputError(
                f"the camera modulation has {len(camera.layers)} layers of {camera.tokens} tokens, the chunk "
                f"{len(self.blocks)} layers of {x.shape[1]} tokens"
            )
        cos, sin = cache.chunk_angles(slot)  # made once for the chunk by `begin_chunk`
        start, stop = parallel.token_range(cos.shape[0])
        angles = (cos[start:stop], sin[start:stop])
        cameras = camera.layers if camera is not None else (None,) * len(cache.layers)
        with self._attention.context():
            for block, layer, text_kv, block_camera in zip(
                self._blocks(), cache.layers, text.layers, cameras, strict=True
            ):
                x = block(x, time_mod, text_kv, angles, layer, slot, block_camera, parallel)
        return self._unpatchify(parallel.gather_tokens(self.head(x, time_emb).float()), grid)

    def _unpatchify(self, x: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        f, h, w = grid
        pt, ph, pw = self._config.patch_size
        x = x.reshape(x.shape[0], f, h, w, pt, ph, pw, self._config.out_dim).permute(0, 7, 1, 4, 2, 5, 3, 6)
        return x.reshape(x.shape[0], self._config.out_dim, f * pt, h * ph, w * pw)

    def _blocks(self) -> list[DiTBlock]:
        return [block for block in self.blocks if isinstance(block, DiTBlock)]

    def _check_inputs(
        self,
        latents: torch.Tensor,
        timestep: torch.Tensor,
        text: TextKV,
        cache: KVCache,
        slot: CacheSlot,
        control: torch.Tensor | None,
    ) -> None:
        cfg = self._config
        if latents.ndim != 5 or latents.shape[1] != cfg.in_dim or latents.shape[2] != slot.frames:
            raise ModelInputError(
                f"latents must be [B, {cfg.in_dim}, {slot.frames}, h, w] for this chunk, got {list(latents.shape)}"
            )
        b, _, f, h, w = latents.shape
        _, ph, pw = cfg.patch_size
        if cfg.frame_tokens(h, w) != cache.frame_tokens or cache.patch_grid not in (None, (h // ph, w // pw)):
            raise ModelInputError(
                f"a {h}x{w} latent does not match the cache's {cache.frame_tokens} tokens per frame "
                f"(patch grid {cache.patch_grid})"
            )
        if cache.layers and cache.layers[0].k.shape[0] != b:
            raise ModelInputError(f"latents have batch {b}, the cache {cache.layers[0].k.shape[0]}")
        if timestep.numel() not in (1, b):
            raise ModelInputError(f"timestep must have 1 or {b} values, got {timestep.numel()}")
        if len(text.layers) != cfg.num_layers:
            raise ModelInputError(f"text K/V has {len(text.layers)} layers, the model {cfg.num_layers}")
        if control is not None and tuple(control.shape) != (b, cfg.control_map_channels, f, h, w):
            raise ModelInputError(
                f"control must be [{b}, {cfg.control_map_channels}, {f}, {h}, {w}], got {list(control.shape)}"
            )
