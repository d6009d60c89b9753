"""Opt-in `torch.compile` of the DiT's transformer blocks (`LINGSTREAM_COMPILE=off|default|max`).

A block is where a forward spends its time (40 of them, each ~90 unfused kernels eager), and its inputs are the
same kinds of objects every call: the residual stream, the time modulation, the prompt's K/V, the chunk's RoPE angles
(made once per chunk by the cache, `cache.py`), the layer's KV buffers and the chunk's `CacheSlot`. So each block is
compiled whole (`fullgraph=True`: a graph break is an error, not a silent fallback to eager), and every block
shares the one compiled code (the blocks are one class; their parameters are inputs to the graph).

Modes: `off` (eager, the default), `default` (inductor's default: fused element-wise kernels), `max` (inductor's
`max-autotune`: GEMM autotuning, and on CUDA its CUDA graphs — which it skips for a graph that writes into an input it
does not own, as a block writes the chunk's K/V into the cache: whether the steady-state block is captured is for the
GPU check to show, scripts/gpu-check.sh). Shapes: the chunk's slot offsets (`slot.visible`, `slot.writes`) change
while the window fills and as the ring turns; dynamo specialises on the first and makes them symbolic at the first
change (automatic dynamic shapes), so a session compiles twice and then runs without recompiling (tested on the CPU:
`test_compiled.py`, 0 graph breaks over chunks with eviction and re-base, inductor within 1e-6 of eager).

Compilation happens at the first forward of each new shape, which is slow (seconds on a GPU, minutes on a loaded
CPU): a worker should warm up before it reports ready (`LINGSTREAM_WORKER_START_TIMEOUT` bounds it).
"""

from __future__ import annotations

from typing import Literal, get_args

from pipeline.lingbot.models.blocks import DiTBlock
from pipeline.lingbot.models.dit import LingBotFastDiT
from pipeline.lingbot.models.errors import ModelConfigError

__all__ = ["COMPILE_MODES", "CompileMode", "compile_blocks"]

CompileMode = Literal["off", "default", "max"]
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
_INDUCTOR_MODES = {"default": "default", "max": "max-autotune"}


def compile_blocks(dit: LingBotFastDiT, mode: str, *, backend: str = "inductor") -> int:
    """Compiles every transformer block of `dit` in place (`nn.Module.compile`) for `mode`; returns how many. `off`
    compiles nothing. `backend` other than inductor (tests: "eager", dynamo's graph capture alone) ignores the
    mode's inductor options. Raises `ModelConfigError` for a mode not in `COMPILE_MODES`."""
    if mode not in COMPILE_MODES:
        raise ModelConfigError(f"compile mode must be one of {', '.join(COMPILE_MODES)}, got {mode!r}")
    if mode == "off":
        return 0
    blocks = [block for block in dit.blocks if isinstance(block, DiTBlock)]
    for block in blocks:
        if backend == "inductor":
            block.compile(backend=backend, mode=_INDUCTOR_MODES[mode], fullgraph=True)
        else:
            block.compile(backend=backend, fullgraph=True)
    return len(blocks)
