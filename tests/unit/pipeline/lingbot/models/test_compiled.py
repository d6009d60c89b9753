"""`LINGSTREAM_COMPILE` (`compiled.py`): the DiT's blocks compiled whole. On the CPU, with the tiny model: dynamo
captures a block in one graph over a session with eviction, a ring that wraps inside chunks and re-bases (0 graph
breaks, no new graph from the first steady-state chunk on: static cache offsets), and inductor's code equals eager
within 1e-6. Compiling costs minutes on 2 loaded cores, so the sessions are short and marked slow. On a GPU (`gpu`):
inductor within 1e-4 of eager, and `max` captures the steady-state blocks in CUDA graphs without a skip."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

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
from pipeline.lingbot.models.cache import CacheSlot, LayerKV
from tests.support.lingbot_models import LATENT_H, LATENT_W, chunk_inputs, relative_error, text_context

SHORT_TABLE = dataclasses.replace(TINY_DIT, rope_frames=14)
"""Window 7 / sink 3 over a 14-position table with a shift of 6 frames: the ring holds 4 frames, so chunks of 3 land
at each of its 4 positions in turn, 2 of them wrapping (two write pieces); the window is full from the 3rd chunk,
and the 5th re-bases (then every 2nd)."""
CACHE = CacheConfig(window_frames=7, sink_frames=3, rebase_frames=6)
FIRST_STEADY_CHUNK = 2
INDUCTOR_IMPORT_WARNING = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
"""torch's own: inductor's first import touches a deprecated torch.jit API (the suite turns warnings into errors)."""


@pytest.fixture(autouse=True)
def fresh_dynamo() -> Iterator[None]:
    """Each test starts from no compiled code and zeroed counters: `torch._dynamo.reset()` keeps dynamo's `counters`
    (graphs, graph breaks), which an earlier test in the same worker process has counted into."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
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
def test_dynamo_captures_every_block_whole_and_no_new_graph_from_the_first_steady_state_chunk_on(
    tiny_model: LingBotFastDiT,
) -> None:
    """fullgraph=True: a graph break would raise. Over 10 chunks (the window full from the 3rd; the ring's 4 positions,
    writes in one piece and wrapping in two; re-bases at the 5th, 7th, 9th) the blocks compile while the window fills
    (a fixed 4 graphs: 2 variants of the residual's strides, then `visible` made symbolic) and never again from the
    first steady-state chunk on; the captured graphs run equal to eager bit for bit; under `max` the cache's buffers
    are static addresses, unguarded (one graph serves every layer); and `torch._dynamo.explain` of a block at a
    re-base chunk counts 0 graph breaks."""
    from torch._dynamo.utils import counters

    eager, compiled = _twins(tiny_model)
    assert compile_blocks(compiled, "max", backend="eager") == SHORT_TABLE.num_layers
    assert compiled.static_cache
    assert not eager.static_cache
    captured: list[tuple[tuple[object, ...], dict[str, object]]] = []
    hook = eager.blocks[0].register_forward_pre_hook(
        lambda _, args, kwargs: captured.append((args, kwargs)), with_kwargs=True
    )
    theirs = _session(eager, 10)
    hook.remove()
    slots = [args[5] for args, _ in captured[::5]]  # one per chunk: its first forward's
    assert all(isinstance(slot, CacheSlot) for slot in slots)
    steady = [slot for slot in slots if isinstance(slot, CacheSlot) and slot.chunk_index >= FIRST_STEADY_CHUNK]
    assert {slot.writes[0][0] for slot in steady} == {(3 + ring) * 6 for ring in range(4)}  # every ring position
    assert {len(slot.writes) for slot in steady} == {1, 2}  # in one piece and wrapping
    assert {slot.visible for slot in steady} == {7 * 6}  # the whole buffer
    graphs: list[int] = []
    cache = compiled.new_cache(CACHE, LATENT_H, LATENT_W)
    assert all(
        getattr(tensor, "_dynamo_static_input_type", None) == "unguarded"
        for layer in cache.layers
        for tensor in (layer.k, layer.v)
    )
    text = compiled.encode_text(text_context(SHORT_TABLE))
    generator = torch.Generator().manual_seed(3)
    ours = []
    for chunk in chunk_inputs(SHORT_TABLE, 10):
        ours.append(denoise_chunk(compiled, cache, text, chunk.condition, chunk.noise, generator, chunk.control))
        graphs.append(counters["stats"]["unique_graphs"])
    assert cache.statistics().rebases == 3
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert graphs[FIRST_STEADY_CHUNK - 1] == graphs[-1] == 4, f"unique graphs after each chunk: {graphs}"
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
@pytest.mark.timeout(600)
@pytest.mark.filterwarnings(INDUCTOR_IMPORT_WARNING)
@pytest.mark.parametrize(("mode", "skip"), [("max", None), ("default", "skipping cudagraphs due to mutated inputs")])
def test_under_max_a_block_writes_only_into_static_inputs_as_cuda_graphs_require(
    tiny_model: LingBotFastDiT, mode: str, skip: str | None
) -> None:
    """The check inductor's CUDA graph trees make of a graph that mutates its inputs
    (`check_for_mutation_ignore_cuda_graph_managed_tensor`: every mutated input must be a static one), applied on the
    CPU to the block graphs AOT autograd hands the compiler (its metadata: which inputs are mutated, which static):
    under `max` the K/V the block writes are static inputs, so nothing is skipped; unmarked (`default`, which uses no
    CUDA graphs) the same graphs would be skipped for it."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._guards import TracingContext
    from torch._inductor import config as inductor_config
    from torch._inductor.cudagraph_utils import check_for_mutation_ignore_cuda_graph_managed_tensor
    from torch.utils._ordered_set import OrderedSet

    verdicts: list[str | None] = []

    def judge(gm: torch.fx.GraphModule, example_inputs: list[torch.Tensor]) -> torch.fx.GraphModule:
        context = TracingContext.get()
        assert context.fw_metadata is not None
        info = context.fw_metadata.input_info
        mutated = OrderedSet(index for index, one in enumerate(info) if one.mutates_data)
        assert len(mutated) == 2  # the layer's K and V
        with inductor_config.patch({"triton.cudagraph_trees": True}):
            verdicts.append(
                check_for_mutation_ignore_cuda_graph_managed_tensor(
                    gm, OrderedSet(str(index) for index in mutated), mutated, context.fw_metadata.static_input_indices
                )
            )
        return gm

    model = _twins(tiny_model)[1]
    compile_blocks(model, mode, backend=aot_autograd(fw_compiler=judge))
    cache = model.new_cache(CACHE, LATENT_H, LATENT_W)
    text = model.encode_text(text_context(SHORT_TABLE))
    generator = torch.Generator().manual_seed(3)
    for chunk in chunk_inputs(SHORT_TABLE, FIRST_STEADY_CHUNK + 1):
        denoise_chunk(model, cache, text, chunk.condition, chunk.noise, generator, chunk.control)
    assert len(verdicts) == 4  # the graphs of the window's filling; the steady state's is among them
    if skip is None:
        assert verdicts == [None] * 4
    else:
        assert all(verdict is not None and verdict.startswith(skip) for verdict in verdicts), verdicts


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


def _cuda_session(
    model: LingBotFastDiT, chunks: int = 5, after_chunk: Callable[[], None] | None = None
) -> list[torch.Tensor]:
    """The session on CUDA, `after_chunk` called after each chunk."""
    cache = model.new_cache(CACHE, LATENT_H, LATENT_W)
    text = model.encode_text(text_context(SHORT_TABLE).cuda())
    generator = torch.Generator(device="cuda").manual_seed(3)
    outputs = []
    for chunk in chunk_inputs(SHORT_TABLE, chunks):
        condition, noise, control = chunk.condition.cuda(), chunk.noise.cuda(), chunk.control.cuda()
        outputs.append(denoise_chunk(model, cache, text, condition, noise, generator, control).cpu())
        if after_chunk is not None:
            after_chunk()
    assert cache.statistics().rebases == (chunks - 3) // 2
    return outputs


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.filterwarnings(INDUCTOR_IMPORT_WARNING)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh runs it on one)")
def test_on_cuda_max_captures_the_steady_state_blocks_in_cuda_graphs(
    tiny_model: LingBotFastDiT, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`max` on CUDA, float32, 15 chunks (eviction, every ring position, wrapping writes, 6 re-bases): inductor's
    CUDA graph trees skip no graph (the K/V writes go to static addresses, `KVCache.mark_static_addresses`), record
    graphs while the window fills and during the first steady-state chunks, and none after (one graph per layer serves
    every ring position and re-base); the frames within 1e-4 of eager. Torch counts skips
    (`counters["inductor"]["cudagraph_skips"]`) but not recordings: the test counts `record_function`'s calls. Not yet
    run on a GPU."""
    from torch._dynamo.utils import counters
    from torch._inductor import config as inductor_config
    from torch._inductor import cudagraph_trees

    recorded: list[int] = []
    record = cudagraph_trees.CUDAGraphTreeManager.record_function

    def counting_record(self: cudagraph_trees.CUDAGraphTreeManager, *args: object, **kwargs: object) -> object:
        recorded.append(1)
        return record(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(cudagraph_trees.CUDAGraphTreeManager, "record_function", counting_record)
    eager, compiled = (model.to("cuda") for model in _twins(tiny_model))
    compile_blocks(compiled, "max")
    skips = counters["inductor"]["cudagraph_skips"]
    records: list[int] = []
    # ATen's GEMMs only: autotuning picks kernels, it does not change what is captured, and benchmarking Triton's
    # would spend much of gpu-check.sh's 240 s for its tests.
    with inductor_config.patch(max_autotune_gemm_backends="ATEN"):
        ours = _cuda_session(compiled, 15, lambda: records.append(len(recorded)))
    theirs = _cuda_session(eager, 15)
    assert counters["inductor"]["cudagraph_skips"] == skips, "a block was not captured (TORCH_LOGS=cudagraphs says why)"
    assert records[-1] > 0, "no CUDA graph was recorded"
    assert records[FIRST_STEADY_CHUNK + 1] == records[-1], f"CUDA graphs recorded after each chunk: {records}"
    errors = [relative_error(a, b) for a, b in zip(ours, theirs, strict=True)]
    assert max(errors) <= 1e-4, errors
