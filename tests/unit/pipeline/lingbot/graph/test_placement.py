from __future__ import annotations

import pytest

from pipeline.lingbot.errors import PlacementError
from pipeline.lingbot.graph.placement import ArtifactTransport, ModelRuntimeConfig, SharedDevice, plan_placement


def runtime(*devices: str, dtype: str = "bfloat16", threads: int = 4) -> ModelRuntimeConfig:
    return ModelRuntimeConfig(devices=devices, world_size=len(devices), dtype=dtype, torch_threads=threads)


def test_decode_joins_the_dit_group_when_devices_and_world_size_match() -> None:
    plan = plan_placement(runtime("cuda:0"), runtime("cuda:1", "cuda:2"), runtime("cuda:1", "cuda:2", dtype="float32"))
    assert plan.decode_colocated
    assert plan.latent_transport is ArtifactTransport.IN_GROUP
    assert [g.name for g in plan.groups] == ["vae_encode", "dit"]
    assert plan.group_of("decode").stages == ("denoise", "decode")
    assert plan.stage("decode").runtime.dtype == "float32"  # co-located, but its own complete config


def test_decode_gets_its_own_group_and_a_channel_otherwise() -> None:
    plan = plan_placement(runtime("cuda:0"), runtime("cuda:1", "cuda:2"), runtime("cuda:3"))
    assert not plan.decode_colocated
    assert plan.latent_transport is ArtifactTransport.WORKER_TENSOR_CHANNEL
    assert [g.name for g in plan.groups] == ["vae_encode", "dit", "vae_decode"]
    assert plan.group_of("decode").devices == ("cuda:3",)


@pytest.mark.parametrize(
    "decode_devices",
    [("cuda:2", "cuda:1"), ("cuda:1",), ("cuda:1", "cuda:2", "cuda:3")],
)
def test_any_difference_in_device_list_or_world_size_separates_decode(decode_devices: tuple[str, ...]) -> None:
    plan = plan_placement(runtime("cuda:0"), runtime("cuda:1", "cuda:2"), runtime(*decode_devices))
    assert not plan.decode_colocated


def test_encode_is_always_its_own_group_even_on_the_dit_devices() -> None:
    plan = plan_placement(runtime("cuda:0"), runtime("cuda:0"), runtime("cuda:0"))
    assert plan.group_of("encode").name == "vae_encode"
    assert plan.group_of("encode").stages == ("encode",)
    assert plan.group_of("denoise").name == "dit"
    assert plan.base_latent_transport is ArtifactTransport.WORKER_TENSOR_CHANNEL
    assert plan.condition_transport is ArtifactTransport.METADATA_ONLY


def test_shared_devices_are_reported_but_never_become_locks() -> None:
    plan = plan_placement(runtime("cuda:0"), runtime("cuda:0", "cuda:1"), runtime("cuda:1"))
    assert plan.resource_groups == ()
    assert plan.shared_devices == (
        SharedDevice("cuda:0", ("vae_encode", "dit")),
        SharedDevice("cuda:1", ("dit", "vae_decode")),
    )


def test_cpu_ranks_may_repeat() -> None:
    plan = plan_placement(runtime("cpu"), runtime("cpu", "cpu"), runtime("cpu", "cpu"))
    assert plan.decode_colocated
    assert plan.group_of("denoise").world_size == 2


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"devices": ("cuda:0",), "world_size": 2}, r"world_size 2 != len\(devices\) 1"),
        ({"devices": ("cuda:0", "cuda:0"), "world_size": 2}, "appears twice"),
        ({"devices": ("cpu", "cuda:0"), "world_size": 2}, "mix cpu and cuda"),
        ({"devices": ("gpu0",), "world_size": 1}, "'gpu0' is not 'cpu' or 'cuda:N'"),
        ({"devices": (), "world_size": 0}, "non-empty"),
        ({"devices": ["cuda:0"], "world_size": 1}, "non-empty tuple"),
        ({"devices": ("cuda:0",), "world_size": 1, "dtype": "float8"}, "dtype must be one of"),
        ({"devices": ("cuda:0",), "world_size": 1, "torch_threads": 0}, "torch_threads"),
    ],
)
def test_runtime_configs_are_validated(kwargs: dict[str, object], message: str) -> None:
    values: dict[str, object] = {"dtype": "bfloat16", "torch_threads": 1}
    values.update(kwargs)
    with pytest.raises(PlacementError, match=message):
        ModelRuntimeConfig(**values)  # type: ignore[arg-type]


def test_every_stage_needs_a_complete_config_of_its_own() -> None:
    with pytest.raises(PlacementError, match="vae_decode_config must be a ModelRuntimeConfig"):
        plan_placement(runtime("cuda:0"), runtime("cuda:1"), None)  # type: ignore[arg-type]


def test_unknown_stage_lookup_names_the_stages() -> None:
    plan = plan_placement(runtime("cpu"), runtime("cpu"), runtime("cpu"))
    with pytest.raises(PlacementError, match=r"\['encode', 'denoise', 'decode'\]"):
        plan.stage("upscale")
