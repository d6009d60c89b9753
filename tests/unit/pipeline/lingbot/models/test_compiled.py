"""`LINGSTREAM_COMPILE` (`compiled.py`): the DiT's blocks compiled whole. On the CPU, with the tiny model: dynamo
captures a block in one graph over a session with eviction and re-bases (0 graph breaks, no recompile once the
window is full), and inductor's code equals eager within 1e-6. Compiling costs minutes on 2 loaded cores, so the
two sessions are short and marked slow."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch

from pipeline.lingbot.models import (
    COMPILE_MODES,
    TINY_DIT,
    CacheConfig,
    LingBotFastDiT,
    LingBotFastOptions,
    ModelConfigError,
    compile_blocks,
    denoise_chunk,
)
from pipeline.lingbot.models.cache import LayerKV
from tests.support.lingbot_models import LATENT_H, LATENT_W, chunk_inputs, relative_error, text_context

SHORT_TABLE = dataclasses.replace(TINY_DIT, rope_frames=12)
"""Window 6 / sink 3 over a 12-position table with a shift of 6 frames: a chunk evicts from the 3rd on and the 5th
re-bases (then every 2nd)."""
CACHE = CacheConfig(window_frames=6, sink_frames=3, rebase_frames=6)
INDUCTOR_IMPORT_WARNING = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
"""torch's own: inductor's first import touches a deprecated torch.jit API (the suite turns warnings into errors)."""


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _twins(tiny_model: LingBotFastDiT) -> tuple[LingBotFastDiT, LingBotFastDiT]:
    eager, compiled = LingBotFastDiT(SHORT_TABLE), LingBotFastDiT(SHORT_TABLE)
    for model in (eager, compiled):
        model.load_state_dict(tiny_model.state_dict())
        model.eval().requires_grad_(False)  # as load_dit leaves it
    return eager, compiled


def _session(model: LingBotFastDiT, chunks: int) -> list[torch.Tensor]:
    cache = model.new_cache(CACHE, LATENT_H, LATENT_W)
    text = model.encode_text(text_context(SHORT_TABLE))
    generator = torch.Generator().manual_seed(3)
    outputs = [
        denoise_chunk(model, cache, text, chunk.condition, chunk.noise, generator, chunk.control)
        for chunk in chunk_inputs(SHORT_TABLE, chunks)
    ]
    stats = cache.statistics()
    assert stats.evicted_frames > 0
    assert stats.rebases >= (chunks - 3) // 2
    return outputs


def test_the_modes_are_off_default_and_max_and_off_compiles_nothing(tiny_model: LingBotFastDiT) -> None:
    assert COMPILE_MODES == ("off", "default", "max")
    assert compile_blocks(tiny_model, "off") == 0
    with pytest.raises(ModelConfigError, match="compile mode must be one of off, default, max, got 'fast'"):
        compile_blocks(tiny_model, "fast")
    with pytest.raises(ModelConfigError, match="compile must be one of"):
        LingBotFastOptions(".", compile="fast")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_dynamo_captures_every_block_whole_over_eviction_and_rebases(tiny_model: LingBotFastDiT) -> None:
    """fullgraph=True: a graph break would raise. Over 10 chunks (eviction from the 3rd, re-bases at the 5th, 7th,
    9th) the blocks compile while the window fills and never again once it is full; the captured graphs run equal
    to eager bit for bit; and `torch._dynamo.explain` of a block at a re-base chunk counts 0 graph breaks."""
    from torch._dynamo.utils import counters

    eager, compiled = _twins(tiny_model)
    assert compile_blocks(compiled, "default", backend="eager") == SHORT_TABLE.num_layers
    captured: list[tuple[tuple[object, ...], dict[str, object]]] = []
    hook = eager.blocks[0].register_forward_pre_hook(
        lambda _, args, kwargs: captured.append((args, kwargs)), with_kwargs=True
    )
    theirs = _session(eager, 10)
    hook.remove()
    graphs: list[int] = []
    cache = compiled.new_cache(CACHE, LATENT_H, LATENT_W)
    text = compiled.encode_text(text_context(SHORT_TABLE))
    generator = torch.Generator().manual_seed(3)
    ours = []
    for chunk in chunk_inputs(SHORT_TABLE, 10):
        ours.append(denoise_chunk(compiled, cache, text, chunk.condition, chunk.noise, generator, chunk.control))
        graphs.append(counters["stats"]["unique_graphs"])
    assert cache.statistics().rebases == 3
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert graphs[-1] == graphs[2], f"recompiled after the window was full: unique graphs per chunk {graphs}"
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)
    # The last chunk re-based; explain its first block call again (eager's), on copies of the layer's buffers.
    args, kwargs = captured[-5]
    layer = args[4]
    assert isinstance(layer, LayerKV)
    args = (*args[:4], LayerKV(layer.k.clone(), layer.v.clone()), *args[5:])
    with torch.inference_mode():
        explained = torch._dynamo.explain(eager.blocks[0])(*args, **kwargs)
    assert explained.graph_break_count == 0
    assert explained.graph_count == 1


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.filterwarnings(INDUCTOR_IMPORT_WARNING)
def test_inductor_equals_eager_within_1e_6_over_eviction_and_a_rebase(tiny_model: LingBotFastDiT) -> None:
    eager, compiled = _twins(tiny_model)
    compile_blocks(compiled, "default")
    theirs = _session(eager, 5)
    ours = _session(compiled, 5)
    errors = [relative_error(a, b) for a, b in zip(ours, theirs, strict=True)]
    assert max(errors) <= 1e-6, errors


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.filterwarnings(INDUCTOR_IMPORT_WARNING)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh runs it on one)")
def test_on_cuda_inductor_equals_eager_over_eviction_and_a_rebase(tiny_model: LingBotFastDiT) -> None:
    """The same session on CUDA in float32 (inductor's Triton kernels): within 1e-4 of eager (fused reductions
    reorder sums; the CPU proof above holds 1e-6)."""
    eager, compiled = (model.to("cuda") for model in _twins(tiny_model))
    compile_blocks(compiled, "default")
    errors = [relative_error(a, b) for a, b in zip(_cuda_session(compiled), _cuda_session(eager), strict=True)]
    assert max(errors) <= 1e-4, errors


def _cuda_session(model: LingBotFastDiT) -> list[torch.Tensor]:
    cache = model.new_cache(CACHE, LATENT_H, LATENT_W)
    text = model.encode_text(text_context(SHORT_TABLE).cuda())
    generator = torch.Generator(device="cuda").manual_seed(3)
    outputs = []
    for chunk in chunk_inputs(SHORT_TABLE, 5):
        condition, noise, control = chunk.condition.cuda(), chunk.noise.cuda(), chunk.control.cuda()
        outputs.append(denoise_chunk(model, cache, text, condition, noise, generator, control).cpu())
    assert cache.statistics().rebases == 1
    return outputs
