"""The attention backend selection (`attention.py`): a pure function of a stubbed capability, and the tiny DiT run
under the chosen SDPA context on the CPU (the backend really used, and its output against the default)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pipeline.lingbot.models import TINY_DIT, CacheConfig, LingBotFastDiT, ModelConfigError
from pipeline.lingbot.models.attention import (
    AttentionCapability,
    AttentionPlan,
    attention_capability,
    select_attention,
)
from tests.support.lingbot_models import LATENT_H, LATENT_W, chunk_inputs, text_context

H100 = AttentionCapability("cuda", (9, 0))
A100 = AttentionCapability("cuda", (8, 0))
CPU = AttentionCapability("cpu")
FA3 = frozenset({"flash_attn_interface"})
SAGE = frozenset({"sageattention"})


@pytest.mark.parametrize(
    ("choice", "capability", "name", "kernel", "order"),
    [
        ("auto", H100, "cudnn", "sdpa", ("cudnn", "flash", "efficient", "math")),
        ("auto", AttentionCapability("cuda", (10, 0)), "cudnn", "sdpa", ("cudnn", "flash", "efficient", "math")),
        ("auto", AttentionCapability("cuda", (9, 0), FA3), "fa3", "fa3", ()),
        ("auto", AttentionCapability("cuda", (9, 0), SAGE), "cudnn", "sdpa", ("cudnn", "flash", "efficient", "math")),
        ("auto", AttentionCapability("cuda", (8, 0), FA3), "flash", "sdpa", ("flash", "efficient", "cudnn", "math")),
        ("auto", A100, "flash", "sdpa", ("flash", "efficient", "cudnn", "math")),
        ("auto", CPU, "sdpa", "sdpa", ()),
        ("auto", AttentionCapability("cpu", None, FA3 | SAGE), "sdpa", "sdpa", ()),
        ("cudnn", A100, "cudnn", "sdpa", ("cudnn",)),
        ("flash", H100, "flash", "sdpa", ("flash",)),
        ("efficient", H100, "efficient", "sdpa", ("efficient",)),
        ("math", H100, "math", "sdpa", ("math",)),
        ("math", CPU, "math", "sdpa", ("math",)),
        ("flash", CPU, "flash", "sdpa", ("flash",)),
        ("fa3", AttentionCapability("cuda", (9, 0), FA3), "fa3", "fa3", ()),
        ("sage", AttentionCapability("cuda", (8, 9), SAGE), "sage", "sage", ()),
    ],
)
def test_the_selection_prefers_cudnn_on_hopper_fa3_when_installed_and_honours_a_forced_choice(
    choice: str, capability: AttentionCapability, name: str, kernel: str, order: tuple[str, ...]
) -> None:
    plan = select_attention(choice, capability)
    assert (plan.name, plan.kernel, plan.sdpa_order) == (name, kernel, order)


@pytest.mark.parametrize(
    ("choice", "capability", "message"),
    [
        ("cudnn", CPU, "attention cudnn runs on CUDA devices only, not on cpu"),
        ("efficient", CPU, "attention efficient runs on CUDA devices only"),
        ("fa3", CPU, "attention fa3 runs on CUDA devices only"),
        ("fa3", H100, r"attention fa3 needs FlashAttention-3 \(flash_attn_interface\), which is not installed"),
        ("sage", H100, r"attention sage needs SageAttention \(sageattention\), which is not installed"),
        ("xformers", H100, "attention must be one of auto, cudnn, flash, efficient, math, fa3, sage, got 'xformers'"),
    ],
)
def test_a_choice_the_device_cannot_run_is_refused_with_a_sentence(
    choice: str, capability: AttentionCapability, message: str
) -> None:
    with pytest.raises(ModelConfigError, match=message):
        select_attention(choice, capability)


def test_this_machines_cpu_capability_is_read_without_importing_the_kernels() -> None:
    capability = attention_capability("cpu")
    assert capability.device_type == "cpu"
    assert capability.compute_capability is None
    assert select_attention("auto", capability) == AttentionPlan("sdpa")


class _AttentionOps(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Records the attention kernels SDPA dispatched to (SDPA itself is a composite, decomposed under the mode)."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.ops: set[str] = set()

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        name = str(func)  # "aten.<op>.<overload>"
        if "scaled_dot_product" in name:
            self.ops.add(name)
        if func is torch.ops.aten.scaled_dot_product_attention.default:  # a composite: see what it chooses under us
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        return func(*args, **kwargs)


@contextmanager
def _attention(model: LingBotFastDiT, plan: AttentionPlan) -> Iterator[None]:
    previous = model.attention
    model.set_attention(plan)
    try:
        yield
    finally:
        model.set_attention(previous)


def _chunks(model: LingBotFastDiT) -> tuple[torch.Tensor, set[str]]:
    """Three chunks' clean-pass velocities (the window fills) and the attention ops they ran."""
    cache = model.new_cache(CacheConfig(window_frames=6, sink_frames=3), LATENT_H, LATENT_W)
    text = model.encode_text(text_context(TINY_DIT))
    outs = []
    recorder = _AttentionOps()
    with torch.inference_mode(), recorder:
        for chunk in chunk_inputs(TINY_DIT, 3):
            latents = torch.cat([chunk.noise, chunk.condition], dim=1)
            outs.append(model(latents, torch.tensor([500.0]), text, cache, cache.begin_chunk(), chunk.control))
    return torch.cat(outs), recorder.ops


def test_the_model_runs_under_the_chosen_sdpa_backend_within_bounds_of_the_default(tiny_model: LingBotFastDiT) -> None:
    default, default_ops = _chunks(tiny_model)
    with _attention(tiny_model, select_attention("math", CPU)):
        math, math_ops = _chunks(tiny_model)
    with _attention(tiny_model, select_attention("flash", CPU)):
        flash, flash_ops = _chunks(tiny_model)
    assert math_ops == {"aten.scaled_dot_product_attention.default", "aten._scaled_dot_product_attention_math.default"}
    assert flash_ops == {
        "aten.scaled_dot_product_attention.default",
        "aten._scaled_dot_product_flash_attention_for_cpu.default",
    }
    assert default_ops == flash_ops  # PyTorch's own CPU choice: its flash kernel, so "flash" is the default exactly
    assert torch.equal(flash, default)
    assert not torch.equal(math, default)  # another kernel, another summation order...
    scale = float(default.abs().max())
    assert float((math - default).abs().max()) <= 1e-5 * scale  # ...within float32 rounding
    assert tiny_model.attention == AttentionPlan("sdpa")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh runs it on one)")
def test_on_cuda_the_automatic_choice_and_each_sdpa_backend_stay_within_bf16_rounding_of_math(
    tiny_model: LingBotFastDiT,
) -> None:
    """The auto plan on this GPU, and every SDPA backend the GPU can run alone, against math, in bf16."""
    model = tiny_model.to(device="cuda:0", dtype=torch.bfloat16)
    capability = attention_capability("cuda:0")
    try:

        def run(plan: AttentionPlan) -> torch.Tensor:
            with _attention(model, plan):
                cache = model.new_cache(CacheConfig(window_frames=6, sink_frames=3), LATENT_H, LATENT_W)
                text = model.encode_text(text_context(TINY_DIT).to("cuda:0"))
                chunk = chunk_inputs(TINY_DIT, 1)[0]
                latents = torch.cat([chunk.noise, chunk.condition], dim=1).to("cuda:0")
                with torch.inference_mode():
                    out: torch.Tensor = model(
                        latents, torch.tensor([500.0]), text, cache, cache.begin_chunk(), chunk.control.to("cuda:0")
                    )
                return out.float().cpu()

        reference = run(select_attention("math", capability))
        scale = float(reference.abs().max())
        auto = run(select_attention("auto", capability))
        assert float((auto - reference).abs().max()) <= 2e-2 * scale
        for name in ("cudnn", "flash", "efficient"):
            try:
                other = run(select_attention(name, capability))
            except RuntimeError:  # this GPU or these shapes have no such kernel: forced, it fails loudly
                continue
            assert float((other - reference).abs().max()) <= 2e-2 * scale, name
    finally:
        tiny_model.to(device="cpu", dtype=torch.float32)
