"""Stage placement settings (LINGSTREAM_STAGE_PLACEMENT, _DENOISE_RANKS, _DEVICES): validated at start with a message
that names the variable and the rule, and converted once into each model worker's placement plan."""

from __future__ import annotations

from typing import Any

import pytest

from pipeline.lingbot.graph.placement import ArtifactTransport
from service.errors import SettingsError
from service.settings import load_settings
from service.workers import check_devices, process_placement, worker_options


def test_threads_on_the_cpu_is_the_default() -> None:
    settings = load_settings()
    assert (settings.stage_placement, settings.denoise_ranks, settings.devices) == ("threads", 1, ())
    assert settings.stage_call_timeout == 60.0
    assert settings.worker_start_timeout == 120.0
    assert process_placement(worker_options(settings)[0]).start_timeout_s == 120.0
    assert settings.worker_devices() == [("cpu",)]
    assert settings.progressive_decode
    assert worker_options(settings)[0].progressive_decode


def test_the_variables_are_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LINGSTREAM_STAGE_PLACEMENT", "Processes")
    monkeypatch.setenv("LINGSTREAM_DENOISE_RANKS", "2")
    monkeypatch.setenv("LINGSTREAM_DEVICES", " cuda:0, cuda:1 ,cuda:2")
    monkeypatch.setenv("LINGSTREAM_STAGE_CALL_TIMEOUT", "12.5")
    monkeypatch.setenv("LINGSTREAM_WORKER_START_TIMEOUT", "900")
    monkeypatch.setenv("LINGSTREAM_PROGRESSIVE_DECODE", "false")
    settings = load_settings()
    assert not worker_options(settings)[0].progressive_decode
    assert (settings.stage_placement, settings.denoise_ranks) == ("processes", 2)
    assert settings.devices == ("cuda:0", "cuda:1", "cuda:2")
    assert settings.device == "cuda"  # follows LINGSTREAM_DEVICES
    assert settings.stage_call_timeout == 12.5
    assert settings.worker_start_timeout == 900.0


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"denoise_ranks": 2}, "LINGSTREAM_DENOISE_RANKS=2 needs LINGSTREAM_STAGE_PLACEMENT=processes"),
        ({"stage_placement": "fibers"}, "LINGSTREAM_STAGE_PLACEMENT: Input should be 'threads' or 'processes'"),
        ({"devices": "gpu0"}, "LINGSTREAM_DEVICES: 'gpu0' is not a device: use cpu or cuda:N"),
        ({"devices": "cuda:0,cpu"}, "LINGSTREAM_DEVICES: cpu and cuda devices cannot be mixed"),
        ({"devices": "cuda:1,cuda:1"}, "LINGSTREAM_DEVICES: a CUDA device is listed twice"),
        ({"devices": "cuda:0", "device": "cpu"}, "LINGSTREAM_DEVICE=cpu contradicts LINGSTREAM_DEVICES=cuda:0"),
        (
            {"devices": "cuda:0,cuda:1,cuda:2", "num_workers": 2},
            "LINGSTREAM_DEVICES lists 3 CUDA devices for LINGSTREAM_NUM_WORKERS=2: every model worker needs the same",
        ),
        (
            {"devices": "cuda:0,cuda:1"},
            "gives each model worker 2 CUDA devices, but the threads placement runs a worker on one",
        ),
        (
            {"devices": "cuda:0", "stage_placement": "processes", "denoise_ranks": 2},
            r"LINGSTREAM_DENOISE_RANKS=2 is more than the 1 CUDA device\(s\) .*\(ranks > devices",
        ),
        (
            {"devices": "cuda:0,cuda:1,cuda:2,cuda:3", "stage_placement": "processes"},
            "LINGSTREAM_DENOISE_RANKS=1 for the DiT and at most one more for the VAE: 2 would stay unused",
        ),
        ({"denoise_ranks": 0, "stage_placement": "processes"}, "LINGSTREAM_DENOISE_RANKS: Input should be greater"),
        ({"stage_call_timeout": 0}, "LINGSTREAM_STAGE_CALL_TIMEOUT: Input should be greater than 0"),
        ({"worker_start_timeout": 0}, "LINGSTREAM_WORKER_START_TIMEOUT: Input should be greater than 0"),
        ({"worker_start_timeout": 7201}, "LINGSTREAM_WORKER_START_TIMEOUT: Input should be less than or equal to 7200"),
        ({"worker_start_timeout": "soon"}, "LINGSTREAM_WORKER_START_TIMEOUT: Input should be a valid number"),
    ],
)
def test_invalid_placements_name_the_variable_and_the_rule(values: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        load_settings(**values)


def test_cpu_processes_put_the_dit_on_n_cpu_ranks_and_co_locate_decode_only_for_one() -> None:
    one = process_placement(worker_options(load_settings(stage_placement="processes"))[0])
    assert one.plan.decode_colocated
    assert one.plan.group_of("denoise").devices == ("cpu",)

    settings = load_settings(
        stage_placement="processes", denoise_ranks=2, torch_threads=3, stage_call_timeout=9, worker_start_timeout=600
    )
    two = process_placement(worker_options(settings)[0])
    assert not two.plan.decode_colocated
    assert two.plan.latent_transport is ArtifactTransport.WORKER_TENSOR_CHANNEL
    assert [(group.name, group.devices) for group in two.plan.groups] == [
        ("vae_encode", ("cpu",)),
        ("dit", ("cpu", "cpu")),
        ("vae_decode", ("cpu",)),
    ]
    assert {placed.runtime.torch_threads for placed in two.plan.stages} == {3}
    assert two.call_timeout_s == 9.0
    assert two.start_timeout_s == 600.0  # every group's ranks: ParallelWorkerConfig.start_timeout_s


def test_cuda_devices_are_split_per_worker_and_a_spare_gpu_takes_the_vae() -> None:
    settings = load_settings(
        devices="cuda:0,cuda:1,cuda:2,cuda:3,cuda:4,cuda:5", num_workers=2, stage_placement="processes", denoise_ranks=2
    )
    assert settings.worker_devices() == [("cuda:0", "cuda:1", "cuda:2"), ("cuda:3", "cuda:4", "cuda:5")]
    second = process_placement(worker_options(settings)[1])
    assert second.plan.group_of("denoise").devices == ("cuda:3", "cuda:4")
    assert second.plan.group_of("decode").devices == ("cuda:5",)
    assert second.plan.group_of("encode").devices == ("cuda:5",)

    colocated = process_placement(
        worker_options(load_settings(devices="cuda:0,cuda:1", stage_placement="processes", denoise_ranks=2))[0]
    )
    assert colocated.plan.decode_colocated
    assert colocated.plan.group_of("decode").devices == ("cuda:0", "cuda:1")
    assert colocated.plan.group_of("encode").devices == ("cuda:0",)


def test_device_cuda_alone_gives_each_worker_its_own_gpus() -> None:
    threads = load_settings(device="cuda", num_workers=2)
    assert threads.worker_devices() == [("cuda:0",), ("cuda:1",)]
    processes = load_settings(device="cuda", num_workers=2, stage_placement="processes", denoise_ranks=2)
    assert processes.worker_devices() == [("cuda:0", "cuda:1"), ("cuda:2", "cuda:3")]


def test_a_missing_cuda_device_is_named_with_its_role_at_start() -> None:
    import torch

    present = torch.cuda.device_count() if torch.cuda.is_available() else 0
    settings = load_settings(devices=f"cuda:0,cuda:{max(present, 1)}", stage_placement="processes")
    role = "DiT rank 0 device" if present == 0 else "VAE decode and encode device"
    with pytest.raises(SettingsError, match=rf"LINGSTREAM_DEVICES .* names cuda:\d+, the {role} of model worker 0"):
        check_devices(worker_options(settings))
    check_devices(worker_options(load_settings(stage_placement="processes")))  # CPU ranks need no check
