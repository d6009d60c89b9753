"""The chart's stage placement values (config.stagePlacement, denoiseRanks, devices, stageCallTimeout,
workerStartTimeout, progressiveDecode): rendered by
the real Helm engine into the service's variables, the pod asks for the GPUs they imply, contradictions refuse to
render, and what the chart renders is what the service accepts."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from service.settings import load_settings
from tests.deploy.test_helm_chart import (
    CHART,
    CUSTOM_RESOURCES,
    KUBE_VERSION,
    chart,
    helm,
    kubernetes_validate,
    main_container,
    only,
    render,
)

__all__ = ["chart"]  # the module fixture, shared with the chart's main tests

SHARDED = {
    "config": {
        "numWorkers": 2,
        "stagePlacement": "processes",
        "denoiseRanks": 2,
        "devices": [f"cuda:{index}" for index in range(6)],
        "stageCallTimeout": 45.5,
        "workerStartTimeout": 1800,
    }
}


def _gpus(docs: list[dict[str, Any]]) -> tuple[object, object]:
    resources = main_container(docs)["resources"]
    return resources.get("requests", {}).get("nvidia.com/gpu"), resources.get("limits", {}).get("nvidia.com/gpu")


def _settings_from(docs: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch) -> Any:
    for name, value in only(docs, "ConfigMap")["data"].items():
        monkeypatch.setenv(name, value)
    return load_settings()


def test_processes_on_listed_gpus_render_the_variables_and_request_every_gpu(
    chart: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = render(chart, SHARDED)
    data = only(docs, "ConfigMap")["data"]
    assert data["LINGSTREAM_STAGE_PLACEMENT"] == "processes"
    assert data["LINGSTREAM_DENOISE_RANKS"] == "2"
    assert data["LINGSTREAM_DEVICES"] == "cuda:0,cuda:1,cuda:2,cuda:3,cuda:4,cuda:5"
    assert data["LINGSTREAM_STAGE_CALL_TIMEOUT"] == "45.5"
    assert data["LINGSTREAM_WORKER_START_TIMEOUT"] == "1800"
    assert data["LINGSTREAM_DEVICE"] == "cuda"
    assert _gpus(docs) == (6, 6)
    assert main_container(docs)["image"].endswith("-cuda")
    settings = _settings_from(docs, monkeypatch)  # the service accepts what the chart renders
    assert settings.worker_devices() == [("cuda:0", "cuda:1", "cuda:2"), ("cuda:3", "cuda:4", "cuda:5")]
    assert settings.worker_start_timeout == 1800.0
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) not in CUSTOM_RESOURCES:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    report = helm.lint(CHART, copy.deepcopy(SHARDED), strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []


def test_device_cuda_with_processes_asks_for_workers_times_ranks_gpus(chart: Any) -> None:
    values = {"config": {"device": "cuda", "numWorkers": 2, "stagePlacement": "processes", "denoiseRanks": 4}}
    assert _gpus(render(chart, values)) == (8, 8)
    assert _gpus(render(chart, {"config": {"device": "cuda", "numWorkers": 3}})) == (3, 3)  # threads: one each


def test_an_explicit_gpu_count_wins_when_it_covers_the_need(chart: Any) -> None:
    assert _gpus(render(chart, {**SHARDED, "gpu": {"count": 8, "resourceName": "nvidia.com/gpu"}})) == (8, 8)
    with pytest.raises(helm.HelmRenderError, match=r"gpu\.count is 4, but .* need 6 GPUs"):
        render(chart, {**SHARDED, "gpu": {"count": 4, "resourceName": "nvidia.com/gpu"}})


def test_cpu_processes_ask_for_no_gpu(chart: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render(chart, {"config": {"stagePlacement": "processes", "denoiseRanks": 2}})
    assert _gpus(docs) == (None, None)
    data = only(docs, "ConfigMap")["data"]
    assert (data["LINGSTREAM_DEVICE"], data["LINGSTREAM_DENOISE_RANKS"]) == ("cpu", "2")
    assert "LINGSTREAM_DEVICES" not in data
    assert _settings_from(docs, monkeypatch).stage_placement == "processes"


def test_progressive_decode_renders_only_when_set_and_the_service_accepts_it(
    chart: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "LINGSTREAM_PROGRESSIVE_DECODE" not in only(render(chart, {}), "ConfigMap")["data"]
    docs = render(chart, {"config": {"progressiveDecode": False}})
    assert only(docs, "ConfigMap")["data"]["LINGSTREAM_PROGRESSIVE_DECODE"] == "false"
    assert _settings_from(docs, monkeypatch).progressive_decode is False
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"config": {"progressiveDecode": "sometimes"}})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"config": {"denoiseRanks": 2}}, r"denoiseRanks > 1 needs config\.stagePlacement=processes"),
        ({"config": {"device": "cpu", "devices": ["cuda:0"]}}, r"config\.device=cpu contradicts"),
    ],
)
def test_contradictions_refuse_to_render(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError, match=message):
        render(chart, values)


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"config": {"stagePlacement": "fibers"}}, id="placement"),
        pytest.param({"config": {"denoiseRanks": 0}}, id="ranks"),
        pytest.param({"config": {"devices": ["gpu0"]}}, id="device-name"),
        pytest.param({"config": {"devices": ["cuda:0", "cuda:0"]}}, id="device-twice"),
        pytest.param({"config": {"stageCallTimeout": 0}}, id="timeout"),
        pytest.param({"config": {"workerStartTimeout": 0}}, id="start-timeout"),
        pytest.param({"config": {"workerStartTimeout": 7201}}, id="start-timeout-too-long"),
    ],
)
def test_schema_rejects_bad_placement_values(chart: Any, values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)
