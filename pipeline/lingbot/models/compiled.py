"""Opt-in `torch.compile` of the DiT's transformer blocks (`LINGSTREAM_COMPILE=off|default|max`).

A block is where a forward spends its time (40 of them, each ~90 unfused kernels eager), and its inputs are the
same kinds of objects every call: the residual stream, the time modulation, the prompt's K/V, the chunk's RoPE angles
(made once per chunk by the cache, `cache.py`), the layer's KV buffers and the chunk's `CacheSlot`. So each block is
compiled whole (`fullgraph=True`: a graph break is an error, not a silent fallback to eager), and every block
shares the one compiled code (the blocks are one class; their parameters are inputs to the graph).

Modes: `off` (eager, the default), `default` (inductor's default: fused element-wise kernels), `max` (inductor's
`max-autotune`: GEMM autotuning, and on CUDA its CUDA graphs, recorded per layer — each layer's parameters and K/V
buffers are its own addresses). A block writes the chunk's K/V into the cache, and inductor's CUDA graph trees skip a
graph that writes into an input that is neither a parameter nor a static address; so under `max` the DiT marks every
cache it makes (`LingBotFastDiT.set_static_cache`, `KVCache.mark_static_addresses`: K, V, the chunk's RoPE angles
and write index, unguarded, so dynamo does not recompile per layer or per session). Whether the block is then
captured, 0 skips, is for the GPU to show (`test_compiled.py`'s `gpu` test, scripts/gpu-check.sh; not run yet); on
the CPU, torch's own mutation check of the trees passes the block graphs under `max` and skips them unmarked.

Shapes (static offsets, `cache.py`): where a chunk writes in the cache reaches the block as a device tensor
(`slot.write_index`), not as Python ints, and once the window is full the chunk attends to the whole buffer
(`slot.visible` is its length). So the only int a block's graph depends on is `visible`, which grows while the window
fills: dynamo specialises on the first chunk's and makes it symbolic at its first change (automatic dynamic shapes),
and from the first steady-state chunk on nothing changes — every ring position, a ring that wraps inside a chunk and a
re-base run the same graph (tested on the CPU: `test_compiled.py`, 0 graph breaks and no new graph from the first
steady-state chunk on; inductor within 1e-6 of eager). CUDA graph trees record one graph per distinct `visible` (per
layer): the window's filling values, then one for the steady state.

Compilation happens at the first forward of each new shape, which is slow (seconds on a GPU, minutes on a loaded
CPU): a worker should warm up before it reports ready (`warmup.py`; `LINGSTREAM_WORKER_START_TIMEOUT` bounds it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, get_args

from pipeline.lingbot.models.blocks import DiTBlock
from pipeline.lingbot.models.dit import LingBotFastDiT
from pipeline.lingbot.models.errors import ModelConfigError

__all__ = ["COMPILE_MODES", "CompileMode", "compile_blocks"]

CompileMode = Literal["off", "default", "max"]
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
_INDUCTOR_MODES = {"default": "default", "max": "max-autotune"}


def compile_blocks(dit: LingBotFastDiT, mode: str, *, backend: str | Callable[..., Any] = "inductor") -> int:
    """Compiles every transformer block of `dit` in place (`nn.Module.compile`) for `mode`; returns how many. `off`
    compiles nothing; `max` also makes the DiT mark the caches it makes from now on as static addresses (module
    docstring). A `backend` other than inductor (a dynamo backend's name or callable; tests: "eager", dynamo's graph
    capture alone) ignores the mode's inductor options. Raises `ModelConfigError` for a mode not in `COMPILE_MODES`."""
    if mode not in COMPILE_MODES:
        raise ModelConfigError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    if mode == "off":
        return 0
    dit.set_static_cache(mode == "max")
    blocks = [block for block in dit.blocks if isinstance(block, DiTBlock)]
    for block in blocks:
        if backend == "inductor":
            block.compile(backend=backend, mode=_INDUCTOR_MODES[mode], fullgraph=True)
        else:
            block.compile(backend=backend, fullgraph=True)
    return len(blocks)
