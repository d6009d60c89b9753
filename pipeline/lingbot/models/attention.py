"""Which attention kernel the DiT's blocks run (`LINGSTREAM_ATTENTION=auto|cudnn|flash|efficient|math|fa3|sage`).

Deciding is a pure function of what the device is and what is installed (`AttentionCapability`), so it is tested on
the CPU with a stubbed capability; doing is `AttentionPlan.context()` around the block stack (`dit.py`) plus, for
the kernels outside PyTorch, `attend` inside the blocks.

    auto on CUDA SM90+      FA3 when `flash_attn_interface` is installed, else PyTorch SDPA with the priority
                            cuDNN > FlashAttention-2 > memory-efficient > math (`sdpa_kernel(..., set_priority=True)`:
                            the first whose constraints the call meets runs)
    auto on older CUDA      SDPA, FlashAttention-2 > memory-efficient > cuDNN > math (PyTorch's own order)
    auto on the CPU         SDPA unrestricted (PyTorch picks its CPU flash kernel, else math)
    cudnn|flash|efficient|math   that SDPA backend only (a call it cannot run fails loudly, no silent fallback);
                                 the GPU-only ones are refused on a CPU device at start
    fa3                     FlashAttention-3's `flash_attn_func` (Hopper), refused when the package is absent
    sage                    SageAttention's `sageattn` (8-bit QK: an approximation, so `auto` never picks it)

All of these compute softmax(q k^T / sqrt(d)) v without a mask: the exact kernels differ from each other by
floating-point order only (bounded, tested on the CPU for math vs the default). The choice is per worker, made once
at load; `/readyz` and `bench/lingbot.py` name it.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from pipeline.lingbot.config import ATTENTION_CHOICES, AttentionChoice
from pipeline.lingbot.models.errors import ModelConfigError

__all__ = [
    "ATTENTION_CHOICES",
    "AttentionCapability",
    "AttentionChoice",
    "AttentionPlan",
    "attend",
    "attention_capability",
    "select_attention",
]


_FA3_MODULE = "flash_attn_interface"
_SAGE_MODULE = "sageattention"
_SDPA = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
_GPU_ONLY = frozenset({"cudnn", "efficient", "fa3", "sage"})
_HOPPER_ORDER = ("cudnn", "flash", "efficient", "math")
_AMPERE_ORDER = ("flash", "efficient", "cudnn", "math")


@dataclass(frozen=True, slots=True)
class AttentionCapability:
    """What the selection looks at: the device kind, its compute capability (CUDA) and the optional kernels
    installed (module names: `flash_attn_interface`, `sageattention`)."""

    device_type: str
    compute_capability: tuple[int, int] | None = None
    installed: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """The chosen attention: `kernel` "sdpa" (PyTorch's, limited to `sdpa_order` in that priority; empty: PyTorch's
    own choice) or "fa3" / "sage"; `name` is what /readyz and the bench line show."""

    name: str
    kernel: Literal["sdpa", "fa3", "sage"] = "sdpa"
    sdpa_order: tuple[str, ...] = ()

    def context(self) -> contextlib.AbstractContextManager[None]:
        """Where the forward runs its blocks: SDPA limited to `sdpa_order`, in that priority."""
        if self.kernel != "sdpa" or not self.sdpa_order:
            return contextlib.nullcontext()
        return _sdpa_context([_SDPA[name] for name in self.sdpa_order])

    def to_mapping(self) -> dict[str, object]:
        return {"backend": self.name, "kernel": self.kernel, "sdpa_order": list(self.sdpa_order)}


@contextlib.contextmanager
def _sdpa_context(backends: list[SDPBackend]) -> Iterator[None]:
    with sdpa_kernel(backends, set_priority=True):
        yield


def attention_capability(device: torch.device | str) -> AttentionCapability:
    """The capability of `device` on this machine (the installed kernels are looked up, not imported)."""
    kind = torch.device(device).type
    capability = torch.cuda.get_device_capability(torch.device(device)) if kind == "cuda" else None
    installed = frozenset(name for name in (_FA3_MODULE, _SAGE_MODULE) if importlib.util.find_spec(name) is not None)
    return AttentionCapability(kind, capability, installed)


def select_attention(choice: str, capability: AttentionCapability) -> AttentionPlan:
    """The plan for `choice` on `capability` (module docstring). Raises `ModelConfigError` for an unknown choice, a
    GPU-only kernel on a CPU device, or fa3 / sage when not installed."""
    if choice not in ATTENTION_CHOICES:
        raise ModelConfigError(f"attention must be one of {', '.join(ATTENTION_CHOICES)}, got {choice!r}")
    cuda = capability.device_type == "cuda"
    if choice in _GPU_ONLY and not cuda:
        raise ModelConfigError(f"attention {choice} runs on CUDA devices only, not on {capability.device_type}")
    if choice == "fa3":
        if _FA3_MODULE not in capability.installed:
            raise ModelConfigError(f"attention fa3 needs FlashAttention-3 ({_FA3_MODULE}), which is not installed")
        return AttentionPlan("fa3", "fa3")
    if choice == "sage":
        if _SAGE_MODULE not in capability.installed:
            raise ModelConfigError(f"attention sage needs SageAttention ({_SAGE_MODULE}), which is not installed")
        return AttentionPlan("sage", "sage")
    if choice != "auto":
        return AttentionPlan(choice, "sdpa", (choice,))
    if not cuda:
        return AttentionPlan("sdpa", "sdpa", ())
    hopper = capability.compute_capability is not None and capability.compute_capability[0] >= 9
    if hopper and _FA3_MODULE in capability.installed:
        return AttentionPlan("fa3", "fa3")
    order = _HOPPER_ORDER if hopper else _AMPERE_ORDER
    return AttentionPlan(order[0], "sdpa", order)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: str = "sdpa") -> torch.Tensor:
    """Unmasked attention of `q` over `k`, `v`, each `[B, heads, S, head_dim]` -> `[B, heads, S_q, head_dim]`, with
    `kernel` (an `AttentionPlan.kernel`)."""
    if kernel == "sdpa":
        return F.scaled_dot_product_attention(q, k, v)
    return _external(kernel)(q, k, v)


def _external(kernel: str) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    if kernel == "fa3":
        module = importlib.import_module(_FA3_MODULE)

        def fa3(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            # FlashAttention-3 takes [B, S, heads, head_dim]; some versions return (out, lse).
            out = module.flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            result: torch.Tensor = (out[0] if isinstance(out, tuple) else out).transpose(1, 2)
            return result

        return fa3
    if kernel == "sage":
        module = importlib.import_module(_SAGE_MODULE)

        def sage(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            result: torch.Tensor = module.sageattn(q, k, v, tensor_layout="HND", is_causal=False)
            return result

        return sage
    raise ModelConfigError(f"unknown attention kernel {kernel!r}")
