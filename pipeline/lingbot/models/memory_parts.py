"""What a LingBot-World-Fast worker holds on its device besides the weights and the DiT's attention cache, measured
from the real modules' shapes on `meta` (nothing allocated, no weights read): the memory plan's other parts.

    decoder cache       per session: the Wan VAE decoder's feature cache (the last 2 input frames of every causal
                        convolution) after a steady-state latent frame; 1.89 GB at 832x480 in bf16 (with
                        `LINGSTREAM_DECODER=tiny`, the tiny decoder's memory blocks' last inputs instead)
    camera modulation   per chunk in flight: every block's camera (scale, shift), `CameraModulation` (3.8 GB at
                        full size, 832x480, bf16; divided by P under Ulysses); the denoise stage runs one chunk at
                        a time, so once per worker
    DiT transient       the peak of a steady-state forward's own tensors (activations, attention output, the
                        velocity), beyond its inputs, with fused attention (no score matrix)
    decode transient    the peak of one steady-state decoder step's own tensors (the new cache included)
    encode transient    the peak of the prefix encode's steps (the reference frame, then 4 zero frames)
    contexts            the CUDA context and the libraries' workspaces: a stated constant (`CUDA_CONTEXT_BYTES`),
                        an estimate until a GPU run; 0 on the CPU

`PeakMemory` measures a region as a `TorchDispatchMode`: every tensor an op returns inside it is live from then until
its last Python reference goes (a storage shared by views counted once); the peak is the most at once. On `meta` the
shapes are the real ones, so the figures are what the ops ask for; the CUDA caching allocator rounds each block up
(to 512 B, 2 MB segments) and may fragment, which `USABLE_SHARE` (`memory_plan.py`) still holds back for. The same
measure on the CPU with the tiny model gives the same bytes as on `meta` (tested), and the decoder cache measured
here equals the one a real streamed decode leaves (`test_memory_parts.py`).
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pipeline.lingbot.config import SPATIAL_COMPRESSION
from pipeline.lingbot.models.cache import PUBLISHED_CACHE, CacheConfig
from pipeline.lingbot.models.config import DiTConfig
from pipeline.lingbot.models.dit import LingBotFastDiT
from pipeline.lingbot.models.tiny_decoder import TinyDecoderConfig, TinyVideoDecoder
from pipeline.lingbot.models.workload import fake_group, meta_dit, steady_state

__all__ = [
    "CUDA_CONTEXT_BYTES",
    "PeakMemory",
    "WorkerMemory",
    "decoder_memory",
    "dit_memory",
    "encoder_peak_bytes",
    "tiny_decoder_memory",
    "worker_memory",
]

CUDA_CONTEXT_BYTES = 1_000_000_000
"""One process's CUDA context plus cuBLAS / cuDNN workspaces: an estimate (typically 0.5-1 GB on Hopper)."""
_LATENT_CHANNELS = 16
_TEMPORAL = 4


class PeakMemory(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """The bytes of the tensors made inside the region: `live` now, `peak` the most at once (module docstring).

    The meter holds a reference to each output's storage and, before every op, drops those only it still holds: a
    storage is live while anything references it, C++ included (the intermediates of a composite op such as SDPA's
    math fallback are held by C++ only, and a Python weak reference would see them die at once)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._live = 0
        self.peak = 0
        self._storages: dict[int, torch.UntypedStorage] = {}

    @property
    def live(self) -> int:
        self._collect()
        return self._live

    def _collect(self) -> None:
        dead = [key for key in self._storages if torch._C._storage_Use_Count(key) <= 1]
        for key in dead:
            self._live -= int(self._storages.pop(key).nbytes())

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        self._collect()
        out = func(*args, **(kwargs or {}))
        inputs = {
            int(t.untyped_storage()._cdata) for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)
        }
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                key = int(storage._cdata)
                if key not in self._storages and key not in inputs:  # a view or an in-place op allocates nothing
                    self._storages[key] = storage
                    self._live += int(storage.nbytes())
        self.peak = max(self.peak, self._live)
        return out

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)  # type: ignore[no-untyped-call]
        self._collect()


class _FusedAttention(TorchFunctionMode):
    """On `meta`, SDPA falls back to its math composite, which makes the whole score matrix (21 GB in float32 at full
    size); a GPU runs a fused kernel that writes the output and its log-sum-exp only. This stands in for that kernel:
    it allocates what the fused kernel allocates (the CPU's flash kernel allocates the same: tested)."""

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        if func is F.scaled_dot_product_attention:
            q, _, v = args[:3]
            out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
            lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
            del lse
            return out
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True, slots=True)
class WorkerMemory:
    """The memory plan's parts besides the weights and the attention cache (module docstring), in bytes."""

    decoder_cache_bytes: int
    """Per session."""
    camera_modulation_bytes: int
    dit_transient_bytes: int
    decode_transient_bytes: int
    encode_transient_bytes: int
    context_bytes: int

    @property
    def once_bytes(self) -> int:
        """What the worker needs once, whatever its sessions: one chunk's camera modulation, the transients (the
        stages run one call each at a time; the three may coincide), the contexts."""
        return (
            self.camera_modulation_bytes
            + self.dit_transient_bytes
            + self.decode_transient_bytes
            + self.encode_transient_bytes
            + self.context_bytes
        )


def _meta_vae(vae_config: Mapping[str, Any], dtype: torch.dtype) -> Any:
    from diffusers import AutoencoderKLWan

    config = {key: value for key, value in vae_config.items() if not key.startswith("_")}
    with torch.device("meta"):
        return AutoencoderKLWan.from_config(config).to(dtype)


def _causal_convs(module: torch.nn.Module) -> int:
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d

    return sum(isinstance(m, WanCausalConv3d) for m in module.modules())


def _cache_bytes(cache: list[Any]) -> int:
    return sum(t.numel() * t.element_size() for t in cache if isinstance(t, torch.Tensor))


def decoder_memory(
    vae_config: Mapping[str, Any], width: int, height: int, dtype: torch.dtype, *, vae: Any = None
) -> tuple[int, int]:
    """(the decoder's per-session feature cache, the peak of one decoder step) after three latent frames of a
    `width`x`height` session, the steady state (the first frame's step differs), streamed as `StreamingVAE` does;
    on `meta` unless `vae` (an `AutoencoderKLWan`) is given."""
    model = vae if vae is not None else _meta_vae(vae_config, dtype)
    device = next(model.parameters()).device
    h, w = height // SPATIAL_COMPRESSION, width // SPATIAL_COMPRESSION
    cache: list[Any] = [None] * _causal_convs(model.decoder)
    peak = 0
    with torch.inference_mode():
        x = model.post_quant_conv(torch.zeros(1, _LATENT_CHANNELS, 3, h, w, device=device, dtype=dtype))
        for index in range(3):
            meter = PeakMemory()
            with meter:
                model.decoder(x[:, :, index : index + 1], feat_cache=cache, feat_idx=[0], first_chunk=index == 0)
            peak = meter.peak
    return _cache_bytes(cache), peak


def tiny_decoder_memory(
    config: TinyDecoderConfig, width: int, height: int, dtype: torch.dtype, *, module: TinyVideoDecoder | None = None
) -> tuple[int, int]:
    """`decoder_memory` for the tiny decoder (`LINGSTREAM_DECODER=tiny`): (its per-session memory, the peak of one
    latent frame's call) in the steady state, streamed as `StreamingTinyDecoder` does; on `meta` unless `module`."""
    if module is None:
        with torch.device("meta"):
            module = TinyVideoDecoder(config).to(dtype)
    device = next(module.parameters()).device
    memory = module.new_memory()
    peak = 0
    with torch.inference_mode():
        for _ in range(3):
            latent = torch.zeros(
                1, config.latent_channels, height // SPATIAL_COMPRESSION, width // SPATIAL_COMPRESSION,
                device=device, dtype=dtype,
            )  # fmt: skip
            meter = PeakMemory()
            with meter:
                module.decode(latent, memory)
            peak = meter.peak
    return _cache_bytes(list(memory)), peak


def encoder_peak_bytes(vae_config: Mapping[str, Any], width: int, height: int, dtype: torch.dtype) -> int:
    """The peak of the prefix encode's first two steps (the reference frame, then 4 zero frames: every later step
    is the second's shape), its cache included, on `meta`."""
    model = _meta_vae(vae_config, dtype)
    cache: list[Any] = [None] * _causal_convs(model.encoder)
    meter = PeakMemory()
    with torch.inference_mode(), meter:
        for frames in (1, _TEMPORAL):
            video = torch.zeros(1, 3, frames, height, width, device="meta", dtype=dtype)
            model.quant_conv(model.encoder(video, feat_cache=cache, feat_idx=[0]))
    return meter.peak


def dit_memory(
    config: DiTConfig,
    width: int,
    height: int,
    dtype: torch.dtype,
    cache: CacheConfig = PUBLISHED_CACHE,
    *,
    ranks: int = 1,
    dit: LingBotFastDiT | None = None,
) -> tuple[int, int]:
    """(one chunk's camera modulation, the peak of a steady-state forward given it) for rank 0 of `ranks`, on
    `meta` at `width`x`height` with the window full; on `dit`'s device when given (`config`, `dtype` and `ranks`
    are then its own)."""
    model = dit if dit is not None else meta_dit(config, dtype, ranks)
    with fake_group(model.parallel.world_size):
        kv, text, latents, control = steady_state(model, width, height, cache)
        slot = kv.begin_chunk()
        fused = _FusedAttention() if model.device.type == "meta" else contextlib.nullcontext()
        with torch.inference_mode():
            camera = model.camera_modulation(control)
            meter = PeakMemory()
            with fused, meter:
                model(latents, torch.full((1,), 999.0, device=model.device), text, kv, slot, camera=camera)
    return camera.nbytes, meter.peak


def worker_memory(
    config: DiTConfig,
    vae_config: Mapping[str, Any],
    width: int,
    height: int,
    dtype: torch.dtype,
    cache: CacheConfig = PUBLISHED_CACHE,
    *,
    ranks: int = 1,
    cuda: bool = True,
    tiny_decoder: TinyDecoderConfig | None = None,
) -> WorkerMemory:
    """Every part (module docstring) for the model's DiT `config` and VAE `vae_config` at `width`x`height`; with
    `tiny_decoder`, the decoder parts are the tiny decoder's (the Wan VAE still encodes). Seconds at full size on
    `meta`: remembered per arguments."""
    vae_json = json.dumps(dict(vae_config), sort_keys=True, default=str)
    return _worker_memory(config, vae_json, width, height, dtype, cache, ranks, cuda, tiny_decoder)


@functools.lru_cache(maxsize=16)
def _worker_memory(
    config: DiTConfig,
    vae_json: str,
    width: int,
    height: int,
    dtype: torch.dtype,
    cache: CacheConfig,
    ranks: int,
    cuda: bool,
    tiny_decoder: TinyDecoderConfig | None,
) -> WorkerMemory:
    vae_config = json.loads(vae_json)
    if tiny_decoder is not None:
        decoder_cache, decode_peak = tiny_decoder_memory(tiny_decoder, width, height, dtype)
    else:
        decoder_cache, decode_peak = decoder_memory(vae_config, width, height, dtype)
    camera, forward_peak = dit_memory(config, width, height, dtype, cache, ranks=ranks)
    return WorkerMemory(
        decoder_cache_bytes=decoder_cache,
        camera_modulation_bytes=camera,
        dit_transient_bytes=forward_peak,
        decode_transient_bytes=decode_peak,
        encode_transient_bytes=encoder_peak_bytes(vae_config, width, height, dtype),
        context_bytes=CUDA_CONTEXT_BYTES if cuda else 0,
    )
