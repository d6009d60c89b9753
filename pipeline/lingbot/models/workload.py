"""What one LingBot-World-Fast DiT forward asks of a GPU, counted on the `meta` device, and the per-P estimates that
follow from it.

`count_forward()` builds the DiT at full size (18.5 B parameters, bf16) on `meta` — shapes only, nothing allocated
— fills a session's KV cache window (832x480, window 18 / sink 6: the steady state, a chunk of 4 680 tokens attending
over 28 080) and runs one forward under `WorkloadCounter`, a `TorchDispatchMode` that sees every aten op after
composite ops are decomposed (SDPA is kept whole: it is one fused kernel on a GPU). It counts:

- kernels: ops that launch device work (views, `empty` and other metadata-only ops excluded; a host->device copy
  counts, it is a copy on the stream);
- bytes moved: the distinct elements of every input and output of those ops (a broadcast dimension counted once;
  an indexed write into a buffer, `index_copy_`, counts the rows it writes, not the whole buffer: source, index and
  the written rows, as the slice copy before it counted source and slice), split GEMM (`mm`, `addmm`, `bmm`,
  convolutions) / attention (SDPA) / other — eager traffic, before any fusion;
- FLOPs of the GEMMs and of attention (2 per multiply-add);
- host syncs: scalar reads (`_local_scalar_dense`, what `.item()` becomes), device->host copies, host->device copies
  of CPU tensors made inside the forward (pageable `.to(device)` blocks the host until the stream is done), and
  data-dependent shapes (`nonzero`).
- collective bytes: what the rank hands to c10d collectives (their send buffers); `count_forward(ranks=P)` counts rank
  0's share of the forward under the Ulysses layout (`parallel.py`), its collectives dispatched through torch's
  `fake` process group (nothing moves; meta tensors hold nothing).

`meta` stands in for CUDA because it keeps device rules (mixing a CPU tensor with a meta one raises as on CUDA);
`FakeTensorMode` on a CPU-only wheel cannot. A test pins these numbers
(`tests/unit/pipeline/lingbot/models/test_workload.py`), so work on speed moves them on purpose.

`estimate_table()` turns the counts into milliseconds per chunk for `DENOISE_RANKS` = P on an H100 under Ulysses
context parallelism — **estimates**, not measurements; every figure they feed is labelled so. The assumptions:

- GEMM and attention FLOPs run at an effective rate calibrated on FlashDreams' CP1 run (2 151 ms for the 4 steps
  and the clean pass of one chunk on one H100, window 15 / sink 3 at 832x464; our counter's FLOPs for that
  configuration over that time: ~540 TFLOP/s, 55% of the dense bf16 peak);
- every other op's traffic at `memory_bandwidth` x `memory_efficiency` (eager: no fusion);
- at P > 1 both from rank 0's counted share (`count_forward(ranks=P)`; without one, the 1-rank forward divided by P);
- the Ulysses collectives (q, k, v to head shards and the attention output back, 4 all-to-alls per layer, each rank
  keeping 1/P of what it sends; the velocity's all-gather) at `link_bandwidth`, not overlapped with compute;
- a chunk start's work (counted on meta too: the RoPE angles; the ring cache's eviction copies nothing) divided
  over P; the Wan VAE decode on one rank, a stated constant (`decode_ms`: 40.5 TFLOP of convolutions and 275 GB
  for 3 latent frames, counted on meta for the research note, at 350 TFLOP/s and 2.9 TB/s); kernel launches assumed
  hidden behind the device work.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pipeline.lingbot.config import SPATIAL_COMPRESSION
from pipeline.lingbot.models.cache import PUBLISHED_CACHE, CacheConfig, KVCache, TextKV
from pipeline.lingbot.models.config import LINGBOT_FAST_14B, DiTConfig
from pipeline.lingbot.models.dit import LingBotFastDiT
from pipeline.lingbot.models.parallel import Ulysses

__all__ = [
    "FLASHDREAMS_CP1_FORWARDS_MS",
    "FLASHDREAMS_MS_PER_CHUNK",
    "H100",
    "ChunkEstimate",
    "Hardware",
    "Workload",
    "WorkloadCounter",
    "all_to_all_bytes",
    "calibration_forward",
    "chunk_workload",
    "count_camera_modulation",
    "count_eviction",
    "count_forward",
    "effective_flops",
    "estimate_table",
    "fake_group",
    "meta_dit",
    "steady_state",
]

_ATEN = torch.ops.aten
_GEMM = frozenset({_ATEN.mm.default, _ATEN.addmm.default, _ATEN.bmm.default, _ATEN.baddbmm.default})
_CONVOLUTION = frozenset({_ATEN.convolution.default})
_ATTENTION = frozenset(
    {
        _ATEN.scaled_dot_product_attention.default,
        _ATEN._scaled_dot_product_flash_attention.default,
        _ATEN._scaled_dot_product_efficient_attention.default,
        _ATEN._scaled_dot_product_cudnn_attention.default,
        _ATEN._scaled_dot_product_flash_attention_for_cpu.default,
    }
)
_KEEP_WHOLE = _ATTENTION
"""Composite ops not decomposed: on a GPU each is one fused kernel."""
_NO_KERNEL = frozenset(
    {
        _ATEN.empty.memory_format,
        _ATEN.empty_strided.default,
        _ATEN.empty_like.default,
        _ATEN._unsafe_view.default,
        _ATEN.lift_fresh.default,
        _ATEN.detach.default,
        _ATEN._local_scalar_dense.default,
    }
)
"""Ops that allocate or re-describe memory without launching work (views are recognised by their schema)."""
_DATA_DEPENDENT = frozenset({_ATEN.nonzero.default, _ATEN.masked_select.default})
_INDEXED_WRITE = _ATEN.index_copy_.default
"""`buffer.index_copy_(dim, index, source)`: touches the rows it writes, not the buffer it returns."""

FLASHDREAMS_MS_PER_CHUNK = {1: 2157.0, 4: 754.0, 8: 393.0}
"""NVIDIA FlashDreams' published LingBot-World-Fast figures on H100s (ms per chunk of 12 frames, by CP ranks)."""
FLASHDREAMS_CP1_FORWARDS_MS = 2151.0
"""FlashDreams CP1: 1 726 ms for the 4 denoising steps plus 425 ms for the clean pass (their breakdown)."""
_FLASHDREAMS_WIDTH, _FLASHDREAMS_HEIGHT = 832, 464
_FLASHDREAMS_CACHE = CacheConfig(window_frames=15, sink_frames=3)
_FORWARDS_PER_CHUNK = 5
"""4 sampler steps + the clean cache pass."""


@dataclass(frozen=True, slots=True)
class Workload:
    """Counts for one region of work (one forward, or one chunk). Bytes are eager traffic (see the module)."""

    kernels: int
    syncs: int
    gemm_bytes: int
    attention_bytes: int
    other_bytes: int
    gemm_flops: int
    attention_flops: int
    scalar_reads: int = 0
    device_to_host: int = 0
    host_to_device: int = 0
    collective_bytes: int = 0
    """Bytes this rank hands to collectives (its send buffers, its own share included); not in `bytes`."""
    kernels_by_op: Mapping[str, int] = field(default_factory=dict, compare=False)

    @property
    def bytes(self) -> int:
        """Device memory traffic (collectives' link traffic is `collective_bytes`)."""
        return self.gemm_bytes + self.attention_bytes + self.other_bytes

    @property
    def flops(self) -> int:
        return self.gemm_flops + self.attention_flops

    def __add__(self, other: Workload) -> Workload:
        ops = Counter(self.kernels_by_op)
        ops.update(other.kernels_by_op)
        return Workload(
            kernels=self.kernels + other.kernels,
            syncs=self.syncs + other.syncs,
            gemm_bytes=self.gemm_bytes + other.gemm_bytes,
            attention_bytes=self.attention_bytes + other.attention_bytes,
            other_bytes=self.other_bytes + other.other_bytes,
            gemm_flops=self.gemm_flops + other.gemm_flops,
            attention_flops=self.attention_flops + other.attention_flops,
            scalar_reads=self.scalar_reads + other.scalar_reads,
            device_to_host=self.device_to_host + other.device_to_host,
            host_to_device=self.host_to_device + other.host_to_device,
            collective_bytes=self.collective_bytes + other.collective_bytes,
            kernels_by_op=dict(ops),
        )

    def times(self, n: int) -> Workload:
        total = Workload(0, 0, 0, 0, 0, 0, 0)
        for _ in range(n):
            total = total + self
        return total

    def to_mapping(self) -> dict[str, int]:
        return {
            "kernels": self.kernels,
            "syncs": self.syncs,
            "bytes": self.bytes,
            "gemm_bytes": self.gemm_bytes,
            "attention_bytes": self.attention_bytes,
            "other_bytes": self.other_bytes,
            "gemm_flops": self.gemm_flops,
            "attention_flops": self.attention_flops,
            "scalar_reads": self.scalar_reads,
            "device_to_host": self.device_to_host,
            "host_to_device": self.host_to_device,
            "collective_bytes": self.collective_bytes,
        }


class WorkloadCounter(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts kernels, bytes, FLOPs and host syncs of the aten ops run under it (the module docstring).

        with torch.inference_mode(), WorkloadCounter() as counter:
            model(...)
        counter.workload()

    Works on any device; on `meta` it costs only Python time. Not thread-safe: one region at a time.
    """

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self._ops: Counter[str] = Counter()
        self._bytes = {"gemm": 0, "attention": 0, "other": 0}
        self._flops = {"gemm": 0, "attention": 0}
        self._scalar_reads = 0
        self._device_to_host = 0
        self._host_to_device = 0
        self._data_dependent = 0
        self._collective_bytes = 0

    def workload(self) -> Workload:
        return Workload(
            kernels=sum(self._ops.values()),
            syncs=self._scalar_reads + self._device_to_host + self._host_to_device + self._data_dependent,
            gemm_bytes=self._bytes["gemm"],
            attention_bytes=self._bytes["attention"],
            other_bytes=self._bytes["other"],
            gemm_flops=self._flops["gemm"],
            attention_flops=self._flops["attention"],
            scalar_reads=self._scalar_reads,
            device_to_host=self._device_to_host,
            host_to_device=self._host_to_device,
            collective_bytes=self._collective_bytes,
            kernels_by_op=dict(self._ops),
        )

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        if func not in _KEEP_WHOLE and torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(),  # type: ignore[no-untyped-call]
            torch._C.DispatchKey.CompositeImplicitAutograd,
        ):
            with self:
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        out = func(*args, **kwargs)
        if func in _ATTENTION and isinstance(out, torch.Tensor) and out.is_meta:
            # The fused kernels (flash, cuDNN, efficient; the CPU's too) write [B, L, H, D] memory under the
            # [B, H, L, D] shape, so the heads' merge after them is a view; meta's math fallback would add a copy.
            out = out.transpose(1, 2).contiguous().transpose(1, 2)
        self._record(func, args, kwargs, out)
        return out

    def _record(self, func: torch._ops.OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any], out: Any) -> None:
        if func is _ATEN._local_scalar_dense.default:
            self._scalar_reads += 1
            return
        if func in _DATA_DEPENDENT:
            self._data_dependent += 1
        if func in _NO_KERNEL or _is_view(func):
            return
        inputs = [value for value in tree_flatten((args, kwargs))[0] if isinstance(value, torch.Tensor)]
        outputs = [value for value in tree_flatten(out)[0] if isinstance(value, torch.Tensor)]
        self._count_copy(func, inputs, outputs)
        self._ops[str(func.overloadpacket.__name__)] += 1
        seen: set[int] = set()
        moved = 0
        if func is _INDEXED_WRITE:  # [buffer, index, source] -> buffer: count the source twice (read, written)
            seen.update(id(tensor) for tensor in (*inputs[:1], *outputs))
            moved = _touched_bytes(inputs[2])
        for tensor in (*inputs, *outputs):
            if id(tensor) not in seen:
                seen.add(id(tensor))
                moved += _touched_bytes(tensor)
        if func.namespace == "c10d":
            self._collective_bytes += _sent_bytes(func, args)
        elif func in _ATTENTION:
            self._bytes["attention"] += moved
            self._flops["attention"] += _attention_flops(inputs)
        elif func in _GEMM or func in _CONVOLUTION:
            self._bytes["gemm"] += moved
            self._flops["gemm"] += _gemm_flops(func, inputs, outputs)
        else:
            self._bytes["other"] += moved

    def _count_copy(self, func: torch._ops.OpOverload, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        if func not in (_ATEN._to_copy.default, _ATEN.copy_.default) or not inputs or not outputs:
            return
        source = inputs[1] if func is _ATEN.copy_.default and len(inputs) > 1 else inputs[0]
        target = outputs[0]
        if source.device.type == "cpu" and target.device.type != "cpu" and source.dim() > 0:
            self._host_to_device += 1
        elif source.device.type != "cpu" and target.device.type == "cpu":
            self._device_to_host += 1


def _sent_bytes(func: torch._ops.OpOverload, args: Sequence[Any]) -> int:
    """The send buffers of a c10d collective: the input of an all-to-all or all-gather (`op(outputs, inputs, ...)`),
    the tensors of a broadcast or reduction (`op(tensors, ...)`)."""
    position = 1 if func.overloadpacket.__name__.startswith(("alltoall", "allgather")) else 0
    tensors = [value for value in tree_flatten(args[position])[0] if isinstance(value, torch.Tensor)]
    return sum(_touched_bytes(tensor) for tensor in tensors)


def _is_view(func: torch._ops.OpOverload) -> bool:
    """An op whose outputs alias its inputs without writing them (`view`, `transpose`, `slice`, ...)."""
    aliases = [ret.alias_info for ret in func._schema.returns if ret.alias_info is not None]
    return bool(aliases) and not any(alias.is_write for alias in aliases)


def _touched_bytes(tensor: torch.Tensor) -> int:
    """Distinct elements a kernel reads or writes: a broadcast (stride 0) dimension counts once."""
    elements = math.prod(size for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if stride != 0)
    return elements * tensor.element_size()


def _gemm_flops(func: torch._ops.OpOverload, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> int:
    out = outputs[0]
    if func in _CONVOLUTION:
        weight = inputs[1]
        return 2 * out.numel() * math.prod(weight.shape[1:])
    if func is _ATEN.mm.default:
        return 2 * out.numel() * inputs[0].shape[-1]
    if func is _ATEN.addmm.default:
        return 2 * out.numel() * inputs[1].shape[-1]
    if func is _ATEN.bmm.default:
        return 2 * out.numel() * inputs[0].shape[-1]
    return 2 * out.numel() * inputs[1].shape[-1]  # baddbmm(input, batch1, batch2)


def _attention_flops(inputs: list[torch.Tensor]) -> int:
    query, key = inputs[0], inputs[1]
    *batch, queries, head_dim = query.shape
    keys = key.shape[-2]
    value_dim = inputs[2].shape[-1]
    return 2 * math.prod(batch) * queries * keys * (head_dim + value_dim)


# --- the full-size DiT on meta ----------------------------------------------------------------------------------


def steady_state(
    dit: LingBotFastDiT, width: int, height: int, cache: CacheConfig
) -> tuple[KVCache, TextKV, torch.Tensor, torch.Tensor]:
    """A cache with its window full, the prompt's K/V, and the next chunk's latents and camera map, on the model's
    device (meta for the full size)."""
    config, device = dit.config, dit.device
    h, w = height // SPATIAL_COMPRESSION, width // SPATIAL_COMPRESSION
    kv = dit.new_cache(cache, h, w)
    with torch.inference_mode():
        text = dit.encode_text(torch.zeros(1, config.text_len, config.text_dim, device=device))
        for _ in range(cache.capacity_frames // cache.chunk_frames):
            kv.begin_chunk()
    frames = cache.chunk_frames
    latents = torch.zeros(1, config.in_dim, frames, h, w, device=device)
    control = torch.zeros(1, config.control_map_channels, frames, h, w, device=device)
    return kv, text, latents, control


def meta_dit(config: DiTConfig, dtype: torch.dtype, ranks: int = 1) -> LingBotFastDiT:
    """The DiT of `config` on `meta` in `dtype` (rank 0 of `ranks` under Ulysses): shapes only."""
    with torch.device("meta"):
        return LingBotFastDiT(config, Ulysses(0, ranks)).to(dtype)


@contextmanager
def fake_group(world_size: int) -> Iterator[None]:
    """A process group of `world_size` for rank 0's collectives to dispatch through: torch's `fake` backend (it
    moves nothing; meta tensors have nothing to move), unless a group is already initialised."""
    if world_size == 1 or dist.is_initialized():
        yield
        return
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def count_forward(
    config: DiTConfig = LINGBOT_FAST_14B,
    *,
    width: int = 832,
    height: int = 480,
    cache: CacheConfig = PUBLISHED_CACHE,
    dtype: torch.dtype = torch.bfloat16,
    dit: LingBotFastDiT | None = None,
    ranks: int = 1,
    camera_cached: bool = False,
) -> Workload:
    """One steady-state forward (window full, camera input, t = 999) of the DiT, built on `meta` unless `dit` is
    given (then on its device), as the module docstring says. With `ranks` > 1: rank 0's share of it under the
    Ulysses layout (`parallel.py`), its collectives dispatched through a fake group. `camera_cached`: the forward
    given the chunk's camera modulation, made before counting (`count_camera_modulation` counts it), as the
    sampler's forwards are; otherwise given the Plücker map, computing the modulation itself."""
    model = dit if dit is not None else meta_dit(config, dtype, ranks)
    with fake_group(model.parallel.world_size):
        kv, text, latents, control = steady_state(model, width, height, cache)
        slot = kv.begin_chunk()
        timestep = torch.full((1,), 999.0, device=model.device)
        counter = WorkloadCounter()
        if camera_cached:
            with torch.inference_mode():
                camera = model.camera_modulation(control)
            with torch.inference_mode(), counter:
                model(latents, timestep, text, kv, slot, camera=camera)
        else:
            with torch.inference_mode(), counter:
                model(latents, timestep, text, kv, slot, control)
    return counter.workload()


def count_camera_modulation(
    config: DiTConfig = LINGBOT_FAST_14B,
    *,
    width: int = 832,
    height: int = 480,
    cache: CacheConfig = PUBLISHED_CACHE,
    dtype: torch.dtype = torch.bfloat16,
    dit: LingBotFastDiT | None = None,
) -> Workload:
    """A chunk's camera modulation (`LingBotFastDiT.camera_modulation`: the camera embedding and every block's
    injector, scale and shift), made once per chunk since the camera cache; on `meta` unless `dit` is given."""
    model = dit if dit is not None else meta_dit(config, dtype)
    control = steady_state(model, width, height, cache)[3]
    counter = WorkloadCounter()
    with torch.inference_mode(), counter:
        model.camera_modulation(control)
    return counter.workload()


def count_eviction(
    config: DiTConfig = LINGBOT_FAST_14B,
    *,
    width: int = 832,
    height: int = 480,
    cache: CacheConfig = PUBLISHED_CACHE,
    dtype: torch.dtype = torch.bfloat16,
    dit: LingBotFastDiT | None = None,
) -> Workload:
    """The steady-state `begin_chunk`, on `meta`: the chunk's RoPE angles, made once for its forwards; the ring
    cache's eviction moves no key (the sliding cache before it copied every layer's K and V down: 46 GB)."""
    model = dit if dit is not None else meta_dit(config, dtype)
    kv = steady_state(model, width, height, cache)[0]
    counter = WorkloadCounter()
    with torch.inference_mode(), counter:
        kv.begin_chunk()
    return counter.workload()


def chunk_workload(forward: Workload, eviction: Workload) -> Workload:
    """One chunk's DiT work: the 5 forwards and the eviction (the sampler's few element-wise ops left out)."""
    return forward.times(_FORWARDS_PER_CHUNK) + eviction


# --- estimates per P ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hardware:
    """A GPU as the estimate sees it (the module docstring's assumptions)."""

    name: str
    memory_bandwidth: float
    """Bytes per second."""
    memory_efficiency: float
    link_bandwidth: float
    """All-to-all bytes per second per GPU (NVLink), achieved."""
    decode_ms: float
    """The Wan VAE decode of one chunk (3 latent frames) on one GPU."""


H100 = Hardware("H100 SXM", memory_bandwidth=3.35e12, memory_efficiency=0.85, link_bandwidth=3.0e11, decode_ms=210.0)


@dataclass(frozen=True, slots=True)
class ChunkEstimate:
    """An **estimate** of one chunk (12 video frames at 832x480) on P GPUs; never a measurement."""

    ranks: int
    ms_per_chunk: float
    fps: float
    forward_ms: float
    all_to_all_bytes_per_forward: int
    """Bytes each rank sends in one forward's Ulysses all-to-alls (0 on one rank)."""
    flashdreams_ms_per_chunk: float | None

    def to_mapping(self) -> dict[str, float | int | None]:
        return {
            "ranks": self.ranks,
            "estimated_ms_per_chunk": round(self.ms_per_chunk, 1),
            "estimated_fps": round(self.fps, 2),
            "estimated_forward_ms": round(self.forward_ms, 1),
            "all_to_all_bytes_per_forward": self.all_to_all_bytes_per_forward,
            "flashdreams_ms_per_chunk": self.flashdreams_ms_per_chunk,
        }


def effective_flops(calibration: Workload) -> float:
    """FLOP/s that FlashDreams' CP1 forwards reach on our counted work for their configuration."""
    return calibration.flops * _FORWARDS_PER_CHUNK / (FLASHDREAMS_CP1_FORWARDS_MS / 1000)


def calibration_forward(config: DiTConfig = LINGBOT_FAST_14B, dit: LingBotFastDiT | None = None) -> Workload:
    """One forward in FlashDreams' CP1 configuration (832x464, window 15 / sink 3), counted on meta."""
    return count_forward(
        config, width=_FLASHDREAMS_WIDTH, height=_FLASHDREAMS_HEIGHT, cache=_FLASHDREAMS_CACHE, dit=dit
    )


def all_to_all_bytes(config: DiTConfig, tokens: int, ranks: int, itemsize: int = 2) -> int:
    """Bytes one rank sends per forward under Ulysses: 4 all-to-alls per layer (q, k, v out, attention back) of its
    `tokens / ranks` x `dim` shard, keeping 1/P of each."""
    if ranks == 1:
        return 0
    shard = tokens // ranks * config.dim * itemsize
    return 4 * config.num_layers * shard * (ranks - 1) // ranks


def estimate_table(
    forward: Workload,
    eviction: Workload,
    calibration: Workload,
    *,
    config: DiTConfig = LINGBOT_FAST_14B,
    tokens: int = 4680,
    ranks: Sequence[int] = (1, 2, 4, 8),
    hardware: Hardware = H100,
    rank_forwards: Mapping[int, Workload] | None = None,
) -> list[ChunkEstimate]:
    """Per-P **estimates** of a chunk's time (the module docstring's assumptions); `tokens`: one chunk's tokens.
    Where `rank_forwards` has rank 0's counted forward at P (`count_forward(ranks=P)`), its own FLOPs, traffic and
    collective bytes are used (what every rank still does whole included); otherwise the 1-rank forward divided by P
    and the analytic all-to-all bytes."""
    rate = effective_flops(calibration)
    memory = hardware.memory_bandwidth * hardware.memory_efficiency
    table = []
    for p in ranks:
        counted = (rank_forwards or {}).get(p) if p > 1 else None
        if counted is not None:
            exchanged = counted.collective_bytes * (p - 1) // p
            compute_s = counted.flops / rate + counted.other_bytes / memory
        else:
            exchanged = all_to_all_bytes(config, tokens, p)
            compute_s = (forward.flops / rate + forward.other_bytes / memory) / p
        forward_s = compute_s + exchanged / hardware.link_bandwidth
        chunk_s = _FORWARDS_PER_CHUNK * forward_s + eviction.bytes / memory / p + hardware.decode_ms / 1000
        table.append(
            ChunkEstimate(
                ranks=p,
                ms_per_chunk=chunk_s * 1000,
                fps=12 / chunk_s,
                forward_ms=forward_s * 1000,
                all_to_all_bytes_per_forward=exchanged,
                flashdreams_ms_per_chunk=FLASHDREAMS_MS_PER_CHUNK.get(p),
            )
        )
    return table
