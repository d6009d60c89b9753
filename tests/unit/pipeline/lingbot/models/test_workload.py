"""The workload counter as a regression gate: one steady-state forward of the full-size DiT on `meta` (832x480,
window 18 / sink 6 full, camera on) is pinned — kernels, host syncs, bytes moved and FLOPs — and so is the start
of a steady-state chunk (its eviction). Speed work moves these numbers on purpose: a change that moves them fails
here with the new values to paste, so the commit that moves them says so. The estimate table built on them is
checked for its shape and its labels, not its values (it is an estimate)."""

from __future__ import annotations

import pytest
import torch

from pipeline.lingbot.models import LINGBOT_FAST_14B, TINY_DIT, LingBotFastDiT
from pipeline.lingbot.models.workload import (
    FLASHDREAMS_MS_PER_CHUNK,
    Workload,
    WorkloadCounter,
    all_to_all_bytes,
    calibration_forward,
    chunk_workload,
    count_camera_modulation,
    count_eviction,
    count_forward,
    effective_flops,
    estimate_table,
)

FORWARD_PINS = {
    "kernels": 3641,
    "syncs": 0,
    "bytes": 523183511252,
    "gemm_bytes": 86039738752,
    "attention_bytes": 31090278400,
    "other_bytes": 406053494100,
    "gemm_flops": 151720620195840,
    "attention_flops": 109617610752000,
    "scalar_reads": 0,
    "device_to_host": 0,
    "host_to_device": 0,
    "collective_bytes": 0,
}
"""One steady-state forward: no host sync (the RoPE inverse frequencies are on the device from the session's cache
on, `rope.py`; until then 3 copies and 1 KiB a forward) and no RoPE angles (the cache makes them once per chunk;
until then 11 kernels and 19 MB a forward). The chunk's cache offsets arrive as a device index (`slot.write_index`,
static offsets): each layer's K and V writes read its 4 680 int64s, 3 MB a forward, and write the same rows as the
slice copies before them."""
EVICTION_PINS = {
    "kernels": 14,
    "syncs": 0,
    "bytes": 24066960,
    "gemm_bytes": 0,
    "attention_bytes": 0,
    "other_bytes": 24066960,
    "gemm_flops": 0,
    "attention_flops": 0,
    "scalar_reads": 0,
    "device_to_host": 0,
    "host_to_device": 0,
    "collective_bytes": 0,
}
"""The start of a steady-state chunk: the chunk's RoPE angles made once for its 5 forwards and its write index (one
`add` into the index buffer, 75 kB), and nothing else — the ring cache evicts by writing over its oldest frames, so
no cached key moves (the sliding cache it replaced copied every layer's K and V down: 160 kernels, 46 GB)."""


RANK_FORWARD_8_PINS = {
    "kernels": 3963,
    "syncs": 0,
    "bytes": 97944900572,
    "gemm_bytes": 39816689152,
    "attention_bytes": 4253286400,
    "other_bytes": 53874925020,
    "gemm_flops": 18971439267840,
    "attention_flops": 13702201344000,
    "scalar_reads": 0,
    "device_to_host": 0,
    "host_to_device": 0,
    "collective_bytes": 958613760,
}
"""Rank 0's share of the same forward under Ulysses with P = 8: 160 all-to-alls (q, k, v and the output per layer)
and the velocity's all-gather; the GEMM and attention FLOPs are an eighth, the traffic more (what every rank does
whole: the patch and camera embeddings of the chunk)."""


def _moved(name: str, actual: Workload, pinned: dict[str, int]) -> str:
    return (
        f"the {name} workload moved: {actual.to_mapping()} against the pins {pinned}. If your change meant to move "
        f"it, replace {name.upper()}_PINS in tests/unit/pipeline/lingbot/models/test_workload.py with the values "
        "above and say in the commit message what moved and why (README's estimate table reads them too)."
    )


@pytest.fixture(scope="module")
def meta_dit() -> LingBotFastDiT:
    with torch.device("meta"):
        return LingBotFastDiT(LINGBOT_FAST_14B).to(torch.bfloat16)


@pytest.fixture(scope="module")
def forward(meta_dit: LingBotFastDiT) -> Workload:
    return count_forward(dit=meta_dit)


@pytest.fixture(scope="module")
def eviction(meta_dit: LingBotFastDiT) -> Workload:
    return count_eviction(dit=meta_dit)


@pytest.mark.timeout(240)
def test_a_full_size_steady_state_forward_on_meta_is_pinned(forward: Workload) -> None:
    assert forward.to_mapping() == FORWARD_PINS, _moved("forward", forward, FORWARD_PINS)


@pytest.mark.timeout(240)
def test_rank_0s_share_of_a_forward_at_8_ranks_is_pinned() -> None:
    rank = count_forward(ranks=8)
    assert rank.to_mapping() == RANK_FORWARD_8_PINS, _moved("rank_forward_8", rank, RANK_FORWARD_8_PINS)
    assert rank.kernels_by_op["alltoall_base_"] == 4 * LINGBOT_FAST_14B.num_layers
    assert rank.kernels_by_op["allgather_"] == 1
    # The counted all-to-all bytes are the analytic ones (what the estimate assumes without a count), plus the
    # velocity's all-gather.
    sent = rank.collective_bytes * 7 // 8
    assert all_to_all_bytes(LINGBOT_FAST_14B, 4680, 8) < sent < all_to_all_bytes(LINGBOT_FAST_14B, 4680, 8) * 1.001


@pytest.mark.timeout(240)
def test_the_camera_cache_takes_the_camera_linears_out_of_the_forwards(
    meta_dit: LingBotFastDiT, forward: Workload
) -> None:
    """A forward given the chunk's camera modulation plus the modulation made once is exactly the forward that made
    it itself: the chunk's other 4 forwards save its GEMMs (the camera patch embedding, its 2-layer MLP and 4 Linears
    per block: 26% of the forward's GEMM FLOPs at full size)."""
    cached = count_forward(dit=meta_dit, camera_cached=True)
    camera = count_camera_modulation(dit=meta_dit)
    config, tokens = LINGBOT_FAST_14B, 4680
    assert camera.gemm_flops == 2 * tokens * config.dim * (config.control_patch_dim + (2 + 4 * 40) * config.dim)
    assert cached.kernels + camera.kernels == forward.kernels
    assert cached.gemm_flops + camera.gemm_flops == forward.gemm_flops
    assert cached.attention_flops == forward.attention_flops
    assert cached.syncs == camera.syncs == 0
    assert 0.25 < camera.gemm_flops / forward.gemm_flops < 0.27


def test_the_start_of_a_steady_state_chunk_moves_no_cached_key(eviction: Workload) -> None:
    assert eviction.to_mapping() == EVICTION_PINS, _moved("eviction", eviction, EVICTION_PINS)


def test_the_counter_sees_kernels_views_flops_and_syncs_as_a_gpu_would() -> None:
    a = torch.ones(4, 8)
    b = torch.ones(8, 3)
    with WorkloadCounter() as counter:
        product = a @ b  # one GEMM: 2 * 4 * 3 * 8 FLOPs, reading a and b, writing the product
        product.t().reshape(-1)  # a view, then a copy (the transpose is not contiguous)
        meta = torch.ones(2, device="meta")
        meta + torch.arange(2.0).to("meta")  # a host->device copy of a CPU tensor, then an add
        product.sum().item()  # a reduction, then a scalar read
    workload = counter.workload()
    assert workload.gemm_flops == 2 * 4 * 3 * 8
    assert workload.gemm_bytes == (32 + 24 + 12) * 4
    assert workload.host_to_device == 1
    assert workload.scalar_reads == 1
    assert workload.syncs == 2
    kernels = dict(workload.kernels_by_op)
    assert kernels.pop("mm") == 1
    assert not {"t", "view", "_local_scalar_dense"} & kernels.keys()
    assert workload.kernels == 1 + sum(kernels.values())


def test_a_tiny_model_counts_the_same_ops_on_meta_as_on_the_cpu() -> None:
    # meta stands in for CUDA: the op stream (hence kernels) does not depend on the device the shapes live on ...
    torch.manual_seed(0)
    cpu_model = LingBotFastDiT(TINY_DIT)
    with torch.device("meta"):
        meta_model = LingBotFastDiT(TINY_DIT)
    on_cpu = count_forward(TINY_DIT, width=128, height=64, dit=cpu_model)
    on_meta = count_forward(TINY_DIT, width=128, height=64, dit=meta_model)
    # ... except the RoPE tables kept on the host: a copy to the device on meta (as on CUDA), none on the CPU.
    assert on_cpu.host_to_device == 0
    assert on_meta.kernels == on_cpu.kernels + on_meta.host_to_device
    assert on_cpu.flops == on_meta.flops
    assert on_cpu.gemm_bytes == on_meta.gemm_bytes


@pytest.mark.timeout(240)
def test_the_estimate_table_is_labelled_calibrated_and_shrinks_with_ranks(
    meta_dit: LingBotFastDiT, forward: Workload, eviction: Workload
) -> None:
    calibration = calibration_forward(dit=meta_dit)
    rate = effective_flops(calibration)
    assert 500e12 < rate < 600e12  # FlashDreams CP1 on their configuration: ~55% of an H100's dense bf16 peak
    table = estimate_table(forward, eviction, calibration)
    assert [row.ranks for row in table] == [1, 2, 4, 8]
    times = [row.ms_per_chunk for row in table]
    assert times == sorted(times, reverse=True)
    assert table[0].all_to_all_bytes_per_forward == 0
    assert table[1].all_to_all_bytes_per_forward == all_to_all_bytes(LINGBOT_FAST_14B, 4680, 2) > 0
    for row in table:
        mapping = row.to_mapping()
        assert {key for key in mapping if "ms" in key or "fps" in key} == {
            "estimated_ms_per_chunk",
            "estimated_fps",
            "estimated_forward_ms",
            "flashdreams_ms_per_chunk",
        }
        assert mapping["flashdreams_ms_per_chunk"] == FLASHDREAMS_MS_PER_CHUNK.get(row.ranks)
    chunk = chunk_workload(forward, eviction)
    assert chunk.kernels == 5 * forward.kernels + eviction.kernels
