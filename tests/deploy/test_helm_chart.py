"""The Helm chart in helm/lingstream, rendered and linted by the real Helm engine and checked against Kubernetes'
own schemas.

Rendering: helm-python-sdk binds libhelm_c, a C ABI over Helm's Go SDK (v4), shipped inside the wheel; rendering,
schema validation and lint run in-process and offline (no helm binary, no cluster, no network). Validation:
kubernetes-validate in strict mode (unknown fields are errors) against Kubernetes 1.30, the oldest minor the
chart's docs promise beyond its kubeVersion floor. It has no schemas for custom resources, so the ServiceMonitor
(monitoring.coreos.com/v1) and the KEDA ScaledObject (keda.sh/v1alpha1) are skipped there, a test proves that
skip is real, and their required fields are checked by hand below.
"""

from __future__ import annotations

import base64
import copy
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.settings import load_settings

helm = pytest.importorskip("helm_python", reason="helm-python-sdk is missing: pip install -e '.[dev]'")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is missing: pip install -e '.[dev]'"
)

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "lingstream"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
METRICS_DOC = REPO / "docs" / "metrics.md"
DASHBOARD = CHART / "grafana" / "dashboard.json"
RELEASE = "demo"
NAMESPACE = "streaming"
FULLNAME = "demo-lingstream"
KUBE_VERSION = "1.30.0"
CUSTOM_RESOURCES = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("keda.sh/v1alpha1", "ScaledObject"),
}

# Credentials that must only ever appear, base64-encoded, in the chart's Secret.
LK_KEY = "APIplaintextLivekitKey"
LK_SECRET = "plaintext-livekit-secret-value"
CLIENT_KEYS = ["plaintext-client-key-1", "plaintext-client-key-2"]
REDIS_URL = "redis://:plaintext-redis-password@redis-master.data:6379/0"
S3_KEY_ID = "PLAINTEXTS3ACCESSKEYID"
S3_SECRET = "plaintext-s3-secret-access-key"
S3 = {
    "endpoint": "http://seaweedfs-s3.storage:8333",
    "publicEndpoint": "https://media.example.com",
    "bucket": "lingstream-recordings",
    "prefix": "prod/",
    "urlTtl": 120,
    "accessKeyId": S3_KEY_ID,
    "secretAccessKey": S3_SECRET,
}
TOKEN_SECRET = "plaintext-token-secret-0123456789abcdef"
TOKEN_SECRET_PREVIOUS = "plaintext-old-token-secret-0123456789ab"

REDIS = {"backend": "redis", "redisUrl": REDIS_URL}
LIVEKIT = {"url": "wss://livekit.example.com", "apiKey": LK_KEY, "apiSecret": LK_SECRET}

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "gpu": {
        "gpu": {"count": 2},
        "livekit": LIVEKIT,
        "auth": {"apiKeys": CLIENT_KEYS, "tokenSecret": TOKEN_SECRET, "tokenSecretPrevious": [TOKEN_SECRET_PREVIOUS]},
        "config": {
            "pageTokenUrl": "https://app.example.com/lingstream-token",
            "numWorkers": 2,
            "maxSessionsPerWorker": 4,
            "torchThreads": 8,
            "videoBitrate": 4_000_000,
            "sessionHistory": 256,
            "maxConnections": 2000,
            "mallocArenas": 4,
            "maxViewers": 3,
            "idleFrameIntervalMs": 0,
            "maxSessionSeconds": 1800,
            "maxPause": 90.5,
        },
        "resources": {"requests": {"cpu": "8", "memory": "64Gi"}, "limits": {"memory": "96Gi"}},
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "nvidia.com/gpu.count", "operator": "Gt", "values": ["1"]}]}
                    ]
                }
            }
        },
        "runtimeClassName": "nvidia",
        "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
    },
    "existing_secret": {
        "replicaCount": 2,
        "admission": {"backend": "redis"},
        "livekit": {"url": "wss://project.livekit.cloud"},
        "existingSecret": "lingstream-credentials",
        "existingSecretKeys": {
            "livekitApiKey": "lk-api-key",
            "livekitApiSecret": "lk-api-secret",
            "apiKeys": "client-api-keys",
            "redisUrl": "redis-url",
        },
    },
    "ingress_hpa": {
        "admission": REDIS,
        "livekit": LIVEKIT,
        "auth": {"apiKeys": CLIENT_KEYS},
        "recordings": {"enabled": True, "s3": S3},
        "config": {"corsOrigins": ["https://app.example.com", "https://admin.example.com"], "queueTimeout": 120.5},
        "otel": {"endpoint": "http://otel-collector.observability:4318"},
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "annotations": {
                "nginx.ingress.kubernetes.io/proxy-read-timeout": "3600",
                "nginx.ingress.kubernetes.io/proxy-send-timeout": "3600",
                "nginx.ingress.kubernetes.io/proxy-buffering": "off",
            },
            "hosts": [{"host": "lingstream.example.com", "paths": [{"path": "/", "pathType": "Prefix"}]}],
            "tls": [{"secretName": "lingstream-tls", "hosts": ["lingstream.example.com"]}],
        },
        "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}}},
        "autoscaling": {
            "enabled": True,
            "kind": "hpa",
            "minReplicas": 2,
            "maxReplicas": 8,
            "targetQueueDepth": 3,
            "targetRunningSessionsPerPod": 4,
        },
    },
    "hpa_pods_metric": {
        "admission": REDIS,
        "autoscaling": {"enabled": True, "hpa": {"queueDepthMetricType": "Pods"}},
    },
    "dashboard": {
        "metrics": {"serviceMonitor": {"enabled": True}},
        "grafanaDashboard": {
            "enabled": True,
            "labels": {"team": "video"},
            "annotations": {"grafana_folder": "lingstream"},
        },
    },
    "keda": {
        "admission": REDIS,
        "livekit": LIVEKIT,
        "metrics": {"serviceMonitor": {"enabled": True}},
        "autoscaling": {
            "enabled": True,
            "kind": "keda",
            "maxReplicas": 6,
            "targetRunningSessionsPerPod": 4,
            "keda": {"authenticationRef": "prometheus-auth"},
        },
    },
}

EXPECTED_KINDS = {
    "defaults": {"ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"},
    "gpu": {"ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service", "ServiceAccount"},
    "existing_secret": {"ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount"},
    "ingress_hpa": {
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "Ingress",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    },
    "hpa_pods_metric": {
        "ConfigMap",
        "Deployment",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
    },
    "dashboard": {"ConfigMap", "Deployment", "PodDisruptionBudget", "Service", "ServiceAccount", "ServiceMonitor"},
    "keda": {
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "ScaledObject",
        "Secret",
        "Service",
        "ServiceAccount",
        "ServiceMonitor",
    },
}


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(CHART) as loaded:
        yield loaded


def render_files(chart: Any, values: dict[str, Any]) -> dict[str, str]:
    return dict(chart.render(copy.deepcopy(values), name=RELEASE, namespace=NAMESPACE))


def render(chart: Any, values: dict[str, Any]) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path, text in sorted(render_files(chart, values).items()):
        if path.endswith("NOTES.txt"):
            continue
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return docs


def only(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [doc for doc in docs if doc["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = only(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def main_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    containers = pod_spec(docs)["containers"]
    assert [c["name"] for c in containers] == ["lingstream"]
    container: dict[str, Any] = containers[0]
    return container


def env_of(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["name"]: entry for entry in main_container(docs)["env"]}


def secret_refs(docs: list[dict[str, Any]]) -> dict[str, tuple[str, str, bool]]:
    refs = {}
    for name, entry in env_of(docs).items():
        ref = entry.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            refs[name] = (ref["name"], ref["key"], ref.get("optional", False))
    return refs


# --- Helm's own checks ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_helm_lint_is_clean_in_strict_mode(name: str) -> None:
    report = helm.lint(CHART, copy.deepcopy(VALUE_SETS[name]), strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    # Severity 1 is INFO (e.g. "icon is recommended"); warnings and errors fail.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("name", VALUE_SETS)
def test_value_set_renders_the_expected_objects(chart: Any, name: str) -> None:
    docs = render(chart, VALUE_SETS[name])
    assert {doc["kind"] for doc in docs} == EXPECTED_KINDS[name]
    for doc in docs:
        assert doc["metadata"]["namespace"] == NAMESPACE
        assert doc["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE


# --- Kubernetes schemas --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_manifest_validates_strictly_against_kubernetes(chart: Any, name: str) -> None:
    for doc in render(chart, VALUE_SETS[name]):
        if (doc["apiVersion"], doc["kind"]) in CUSTOM_RESOURCES:
            continue  # no schema in kubernetes-validate; see the hand checks below
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("name", ["defaults", "ingress_hpa"])
def test_kubernetes_validate_cli_accepts_the_rendered_release(chart: Any, name: str, tmp_path: Path) -> None:
    # The same check through the command line a person would run: kubernetes-validate --strict.
    cli = Path(sys.executable).with_name("kubernetes-validate")
    binary = str(cli) if cli.exists() else shutil.which("kubernetes-validate")
    if binary is None:
        pytest.skip("the kubernetes-validate command is missing: pip install -e '.[dev]'")
    manifest = tmp_path / "release.yaml"
    manifest.write_text(yaml.safe_dump_all(render(chart, VALUE_SETS[name])))
    result = subprocess.run(
        [binary, "--strict", "--kubernetes-version", KUBE_VERSION, "--quiet", str(manifest)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Only custom resources may be left unvalidated, and the tool says so.
    for line in result.stdout.splitlines():
        assert line.startswith("WARN"), line
        assert "ServiceMonitor" in line or "ScaledObject" in line, line


def test_strict_validation_would_catch_an_unknown_field(chart: Any) -> None:
    deployment = only(render(chart, {}), "Deployment")
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


@pytest.mark.parametrize(("api_version", "kind"), sorted(CUSTOM_RESOURCES))
def test_custom_resources_have_no_schema_in_the_validator(api_version: str, kind: str) -> None:
    # The reason they are skipped above; if a later kubernetes-validate learns them, validate them there instead.
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(
            {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}}, KUBE_VERSION, strict=True
        )


@pytest.mark.parametrize("name", ["ingress_hpa", "keda"])
def test_service_monitor_scrapes_metrics_of_this_release(chart: Any, name: str) -> None:
    docs = render(chart, VALUE_SETS[name])
    monitor = only(docs, "ServiceMonitor")
    service = only(docs, "Service")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["name"] == FULLNAME
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert endpoint["interval"].endswith("s")
    if name == "ingress_hpa":
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_keda_scaled_object_scales_the_deployment_on_queue_depth(chart: Any) -> None:
    docs = render(chart, VALUE_SETS["keda"])
    scaled = only(docs, "ScaledObject")
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert spec["minReplicaCount"] == 1
    assert spec["maxReplicaCount"] == 6
    assert isinstance(spec["pollingInterval"], int)
    assert isinstance(spec["cooldownPeriod"], int)
    queue, running = spec["triggers"]
    for trigger in (queue, running):
        assert trigger["type"] == "prometheus"
        assert trigger["metricType"] == "AverageValue"
        assert trigger["metadata"]["serverAddress"].startswith("http")
        assert isinstance(trigger["metadata"]["threshold"], str)  # KEDA wants strings in metadata
        assert trigger["authenticationRef"] == {"name": "prometheus-auth"}
    assert queue["metadata"]["query"] == (
        f'max(lingstream_admission_queue_depth{{namespace="{NAMESPACE}",service="{FULLNAME}"}})'
    )
    assert queue["metadata"]["threshold"] == "2"
    assert running["metadata"]["query"] == (
        f'sum(lingstream_sessions{{state="running",namespace="{NAMESPACE}",service="{FULLNAME}"}})'
    )
    assert running["metadata"]["threshold"] == "4"
    assert spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]["stabilizationWindowSeconds"]
    # KEDA owns the replica count.
    assert "replicas" not in only(docs, "Deployment")["spec"]


# --- what the pods run ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", VALUE_SETS)
def test_probes_use_the_service_health_endpoints(chart: Any, name: str) -> None:
    container = main_container(render(chart, VALUE_SETS[name]))
    assert {"name": "http", "containerPort": 8080, "protocol": "TCP"} in container["ports"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    startup = container["startupProbe"]
    assert startup["httpGet"] == {"path": "/healthz", "port": "http"}
    # Slow model loads: the startup probe allows minutes before liveness takes over.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300


@pytest.mark.parametrize("drain_timeout", [0, 60, 600])
def test_prestop_drains_and_grace_period_covers_the_drain(chart: Any, drain_timeout: int) -> None:
    docs = render(chart, {"config": {"drainTimeout": drain_timeout}})
    container = main_container(docs)
    assert container["lifecycle"]["preStop"]["exec"]["command"] == [
        "lingstream",
        "drain",
        "--wait",
        "--timeout",
        str(drain_timeout),
    ]
    grace = pod_spec(docs)["terminationGracePeriodSeconds"]
    assert grace >= drain_timeout + 5
    assert grace == drain_timeout + 15
    assert only(docs, "ConfigMap")["data"]["LINGSTREAM_DRAIN_TIMEOUT"] == str(drain_timeout)


def test_the_drain_hands_sessions_off_by_default_on_redis_and_is_today_s_wait_otherwise(chart: Any) -> None:
    """The chart's default (`config.drainMode: hand_off`) reaches the pods only with the redis backend: one pod has
    nowhere to hand a session to. `wait` is the value to keep today's drain."""
    redis = {"admission": {"backend": "redis", "redisUrl": "redis://r:6379/0"}, "replicaCount": 2}
    assert only(render(chart, redis), "ConfigMap")["data"]["LINGSTREAM_DRAIN_MODE"] == "hand_off"
    waiting = render(chart, {**redis, "config": {"drainMode": "wait"}})
    assert only(waiting, "ConfigMap")["data"]["LINGSTREAM_DRAIN_MODE"] == "wait"
    assert "LINGSTREAM_DRAIN_MODE" not in only(render(chart, {}), "ConfigMap")["data"]
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"config": {"drainMode": "handoff"}})


def test_grace_margin_is_configurable(chart: Any) -> None:
    docs = render(chart, {"config": {"drainTimeout": 120}, "terminationGraceMarginSeconds": 30})
    assert pod_spec(docs)["terminationGracePeriodSeconds"] == 150


def test_gpu_count_becomes_an_nvidia_gpu_request_and_limit(chart: Any) -> None:
    docs = render(chart, VALUE_SETS["gpu"])
    container = main_container(docs)
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 2
    assert resources["requests"]["nvidia.com/gpu"] == 2
    assert resources["requests"]["cpu"] == "8"
    assert resources["limits"]["memory"] == "96Gi"
    assert container["image"] == "lingstream:0.1.0-cuda"
    assert only(docs, "ConfigMap")["data"]["LINGSTREAM_DEVICE"] == "cuda"
    spec = pod_spec(docs)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert spec["tolerations"] == VALUE_SETS["gpu"]["tolerations"]
    assert spec["affinity"] == VALUE_SETS["gpu"]["affinity"]
    assert spec["runtimeClassName"] == "nvidia"
    assert only(docs, "Deployment")["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_cpu_pod_requests_no_gpu(chart: Any) -> None:
    docs = render(chart, {})
    resources = main_container(docs)["resources"]
    assert "nvidia.com/gpu" not in resources.get("limits", {})
    assert "nvidia.com/gpu" not in resources.get("requests", {})
    assert main_container(docs)["image"] == "lingstream:0.1.0"
    assert only(docs, "ConfigMap")["data"]["LINGSTREAM_DEVICE"] == "cpu"


def test_other_gpu_resource_names_are_honoured(chart: Any) -> None:
    docs = render(chart, {"gpu": {"count": 1, "resourceName": "nvidia.com/mig-3g.40gb"}})
    assert main_container(docs)["resources"]["limits"]["nvidia.com/mig-3g.40gb"] == 1


def test_image_digest_wins_over_tag(chart: Any) -> None:
    digest = "sha256:" + "ab" * 32
    docs = render(chart, {"image": {"repository": "registry.example.com/lingstream", "tag": "9.9", "digest": digest}})
    assert main_container(docs)["image"] == f"registry.example.com/lingstream@{digest}"


def test_pods_run_non_root_on_a_read_only_root_with_writable_tmp(chart: Any) -> None:
    docs = render(chart, {})
    spec = pod_spec(docs)
    container = main_container(docs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == 10001  # the UID fixed in docker/Dockerfile*
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert spec["automountServiceAccountToken"] is False
    # A Service named "lingstream" would otherwise inject LINGSTREAM_PORT=tcp://... into the pod.
    assert spec["enableServiceLinks"] is False


def test_recordings_get_a_volume_and_their_settings_only_when_enabled(chart: Any) -> None:
    plain = render(chart, {})
    assert "LINGSTREAM_RECORDINGS_DIR" not in only(plain, "ConfigMap")["data"]
    assert "recordings" not in {v["name"] for v in pod_spec(plain)["volumes"]}

    docs = render(chart, {"recordings": {"enabled": True, "maxBytes": 5 * 2**30, "maxCount": 20, "sizeLimit": "8Gi"}})
    data = only(docs, "ConfigMap")["data"]
    assert data["LINGSTREAM_RECORDINGS_DIR"] == "/recordings"
    assert (data["LINGSTREAM_RECORDINGS_MAX_BYTES"], data["LINGSTREAM_RECORDINGS_MAX_COUNT"]) == ("5368709120", "20")
    mounts = {m["mountPath"]: m["name"] for m in main_container(docs)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(docs)["volumes"]}
    assert volumes[mounts["/recordings"]]["emptyDir"] == {"sizeLimit": "8Gi"}

    claimed = render(chart, {"recordings": {"enabled": True, "existingClaim": "lingstream-recordings"}})
    volume = {v["name"]: v for v in pod_spec(claimed)["volumes"]}["recordings"]
    assert volume["persistentVolumeClaim"] == {"claimName": "lingstream-recordings"}
    assert "LINGSTREAM_RECORDINGS_MAX_BYTES" not in only(claimed, "ConfigMap")["data"]


def test_recordings_in_a_bucket_get_their_settings_and_credentials_from_the_secret(chart: Any) -> None:
    docs = render(chart, {"recordings": {"enabled": True, "s3": S3}})
    data = only(docs, "ConfigMap")["data"]
    assert {key: value for key, value in data.items() if key.startswith("LINGSTREAM_RECORDINGS_S3_")} == {
        "LINGSTREAM_RECORDINGS_S3_ENDPOINT": "http://seaweedfs-s3.storage:8333",
        "LINGSTREAM_RECORDINGS_S3_PUBLIC_ENDPOINT": "https://media.example.com",
        "LINGSTREAM_RECORDINGS_S3_BUCKET": "lingstream-recordings",
        "LINGSTREAM_RECORDINGS_S3_PREFIX": "prod/",
        "LINGSTREAM_RECORDINGS_S3_URL_TTL": "120",
    }
    assert secret_refs(docs) == {
        "LINGSTREAM_RECORDINGS_S3_ACCESS_KEY_ID": (FULLNAME, "LINGSTREAM_RECORDINGS_S3_ACCESS_KEY_ID", False),
        "LINGSTREAM_RECORDINGS_S3_SECRET_ACCESS_KEY": (FULLNAME, "LINGSTREAM_RECORDINGS_S3_SECRET_ACCESS_KEY", False),
    }
    with pytest.raises(helm.HelmRenderError, match=r"recordings\.s3\.bucket"):
        render(chart, {"recordings": {"enabled": True, "s3": {**S3, "bucket": ""}}})
    with pytest.raises(helm.HelmRenderError, match=r"accessKeyId"):
        render(chart, {"recordings": {"enabled": True, "s3": {**S3, "secretAccessKey": ""}}})
    with pytest.raises(helm.HelmRenderError, match=r"recordings\.enabled"):
        render(chart, {"recordings": {"s3": S3}})


def test_settings_reach_the_pod_through_the_configmap(chart: Any) -> None:
    docs = render(chart, VALUE_SETS["gpu"])
    config_map = only(docs, "ConfigMap")
    assert main_container(docs)["envFrom"] == [{"configMapRef": {"name": config_map["metadata"]["name"]}}]
    data = config_map["data"]
    assert all(isinstance(value, str) for value in data.values())
    assert data["LINGSTREAM_HOST"] == "0.0.0.0"
    assert data["LINGSTREAM_PORT"] == "8080"
    assert data["LINGSTREAM_NUM_WORKERS"] == "2"
    assert data["LINGSTREAM_MAX_SESSIONS_PER_WORKER"] == "4"
    assert data["LINGSTREAM_TORCH_THREADS"] == "8"
    assert data["LINGSTREAM_VIDEO_BITRATE"] == "4000000"  # not 4e+06
    assert (data["LINGSTREAM_SESSION_HISTORY"], data["LINGSTREAM_MAX_CONNECTIONS"]) == ("256", "2000")
    assert data["LINGSTREAM_MALLOC_ARENAS"] == "4"
    assert data["LINGSTREAM_MAX_VIEWERS"] == "3"
    assert data["LINGSTREAM_IDLE_FRAME_INTERVAL_MS"] == "0"  # keep-warm off: 0 is a value, not "unset"
    assert (data["LINGSTREAM_MAX_SESSION_SECONDS"], data["LINGSTREAM_MAX_PAUSE"]) == ("1800", "90.5")
    assert data["LINGSTREAM_ADMISSION_BACKEND"] == "memory"
    assert data["LIVEKIT_URL"] == "wss://livekit.example.com"
    assert data["LINGSTREAM_PAGE_TOKEN_URL"] == "https://app.example.com/lingstream-token"
    # Unset settings are left to the service's defaults.
    assert "LINGSTREAM_QUEUE_SIZE" not in data
    assert "LINGSTREAM_CORS_ORIGINS" not in data


def test_worker_loss_recovery_settings_reach_the_service_and_stay_unset_by_default(
    chart: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {"config": {"stagePlacement": "processes", "recoveryAttempts": 0, "recoveryTimeout": 12.5}}
    data = only(render(chart, values), "ConfigMap")["data"]
    assert (data["LINGSTREAM_RECOVERY_ATTEMPTS"], data["LINGSTREAM_RECOVERY_TIMEOUT"]) == ("0", "12.5")  # 0 is off
    for name in ("LINGSTREAM_RECOVERY_ATTEMPTS", "LINGSTREAM_RECOVERY_TIMEOUT"):
        monkeypatch.setenv(name, data[name])
    settings = load_settings()  # as the pod reads them
    assert (settings.recovery_attempts, settings.recovery_timeout) == (0, 12.5)
    defaults = only(render(chart, {}), "ConfigMap")["data"]
    assert "LINGSTREAM_RECOVERY_ATTEMPTS" not in defaults
    assert "LINGSTREAM_RECOVERY_TIMEOUT" not in defaults
    for wrong in ({"recoveryAttempts": 21}, {"recoveryAttempts": 1.5}, {"recoveryTimeout": 0}):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema({"config": wrong})


def test_key_quotas_are_rendered_as_the_service_reads_them(chart: Any) -> None:
    key = "key-1a2b3c4d5e6f"
    quotas = {key: {"maxRunning": 5}, "anonymous": {"maxQueued": None, "maxRunning": 1}}
    values = {"config": {"keyMaxRunning": 2, "keyMaxQueued": 0, "keyQuotas": quotas}}
    data = only(render(chart, values), "ConfigMap")["data"]
    assert (data["LINGSTREAM_KEY_MAX_RUNNING"], data["LINGSTREAM_KEY_MAX_QUEUED"]) == ("2", "0")
    assert json.loads(data["LINGSTREAM_KEY_QUOTAS"]) == {
        key: {"max_running": 5},
        "anonymous": {"max_queued": None, "max_running": 1},
    }
    assert "LINGSTREAM_KEY_QUOTAS" not in only(render(chart, {}), "ConfigMap")["data"]


def test_lists_and_fractional_seconds_are_rendered_as_the_service_reads_them(chart: Any) -> None:
    data = only(render(chart, VALUE_SETS["ingress_hpa"]), "ConfigMap")["data"]
    assert data["LINGSTREAM_CORS_ORIGINS"] == "https://app.example.com,https://admin.example.com"
    assert data["LINGSTREAM_QUEUE_TIMEOUT"] == "120.5"
    assert data["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318"
    assert data["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf"  # the only protocol the service exports
    assert data["OTEL_SERVICE_NAME"] == FULLNAME


def test_config_change_rolls_the_pods(chart: Any) -> None:
    def checksum(values: dict[str, Any]) -> str:
        annotations = only(render(chart, values), "Deployment")["spec"]["template"]["metadata"]["annotations"]
        return str(annotations["checksum/config"])

    assert checksum({}) == checksum({})
    assert checksum({}) != checksum({"config": {"queueSize": 32}})


# --- credentials ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["gpu", "ingress_hpa", "keda"])
def test_credentials_live_only_in_the_secret(chart: Any, name: str) -> None:
    values = VALUE_SETS[name]
    files = render_files(chart, values)
    docs = render(chart, values)
    plaintexts = [LK_KEY, LK_SECRET, REDIS_URL, S3_KEY_ID, S3_SECRET, TOKEN_SECRET, TOKEN_SECRET_PREVIOUS, *CLIENT_KEYS]
    # Not in plain text anywhere: Secret data is base64 and nothing else carries them.
    for path, text in files.items():
        for plaintext in plaintexts:
            assert plaintext not in text, f"{plaintext!r} in plain text in {path}"
    for config_map in (doc for doc in docs if doc["kind"] == "ConfigMap"):
        for key in config_map["data"]:
            if key == "LINGSTREAM_PAGE_TOKEN_URL":  # where the page asks for tokens: a URL, not a credential
                continue
            assert not any(word in key for word in ("KEY", "SECRET", "PASSWORD", "TOKEN", "REDIS_URL")), key

    secret = only(docs, "Secret")
    assert secret["metadata"]["name"] == FULLNAME
    stored = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    refs = secret_refs(docs)
    env = env_of(docs)
    for env_name, (secret_name, key, _optional) in refs.items():
        assert secret_name == FULLNAME
        assert key in stored, f"{env_name} refers to {key!r}, which the Secret does not hold"
        assert "value" not in env[env_name]
    if values.get("livekit"):
        assert stored[refs["LIVEKIT_API_KEY"][1]] == LK_KEY
        assert stored[refs["LIVEKIT_API_SECRET"][1]] == LK_SECRET
    if values.get("auth"):
        assert stored[refs["LINGSTREAM_API_KEYS"][1]] == ",".join(CLIENT_KEYS)
    if values.get("auth", {}).get("tokenSecret"):
        assert stored[refs["LINGSTREAM_TOKEN_SECRET"][1]] == TOKEN_SECRET
        assert stored[refs["LINGSTREAM_TOKEN_SECRET_PREVIOUS"][1]] == TOKEN_SECRET_PREVIOUS
    if values.get("admission", {}).get("backend") == "redis":
        assert stored[refs["LINGSTREAM_REDIS_URL"][1]] == REDIS_URL
    if values.get("recordings", {}).get("s3"):
        assert stored[refs["LINGSTREAM_RECORDINGS_S3_ACCESS_KEY_ID"][1]] == S3_KEY_ID
        assert stored[refs["LINGSTREAM_RECORDINGS_S3_SECRET_ACCESS_KEY"][1]] == S3_SECRET
    annotations = only(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/secret" in annotations


def test_existing_secret_is_referenced_by_the_configured_key_names(chart: Any) -> None:
    docs = render(chart, VALUE_SETS["existing_secret"])
    assert "Secret" not in {doc["kind"] for doc in docs}
    assert secret_refs(docs) == {
        "LIVEKIT_API_KEY": ("lingstream-credentials", "lk-api-key", False),
        "LIVEKIT_API_SECRET": ("lingstream-credentials", "lk-api-secret", False),
        "LINGSTREAM_API_KEYS": ("lingstream-credentials", "client-api-keys", True),
        "LINGSTREAM_TOKEN_SECRET": ("lingstream-credentials", "LINGSTREAM_TOKEN_SECRET", True),
        "LINGSTREAM_TOKEN_SECRET_PREVIOUS": ("lingstream-credentials", "LINGSTREAM_TOKEN_SECRET_PREVIOUS", True),
        "LINGSTREAM_REDIS_URL": ("lingstream-credentials", "redis-url", False),
        "LINGSTREAM_WEBHOOK_SECRET": ("lingstream-credentials", "LINGSTREAM_WEBHOOK_SECRET", True),
    }
    annotations = only(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/secret" not in annotations
    assert only(docs, "Deployment")["spec"]["replicas"] == 2


def test_webhooks_render_their_settings_and_keep_the_signing_secret_in_the_secret(chart: Any) -> None:
    secret = "whsec-chart-0123456789"
    values = {
        "webhooks": {
            "urls": ["https://app.example.com/hooks", "https://audit.example.com/in"],
            "secret": secret,
            "allowedPrefixes": ["https://hooks.example.com/"],
            "timeout": 2.5,
            "maxAttempts": 5,
        },
        "config": {"keyQuotas": {"key-1a2b3c4d5e6f": {"webhookUrls": ["https://tenant.example.com/h"]}}},
    }
    files = render_files(chart, values)
    assert not any(secret in text for text in files.values())
    docs = render(chart, values)
    data = only(docs, "ConfigMap")["data"]
    assert data["LINGSTREAM_WEBHOOK_URLS"] == "https://app.example.com/hooks,https://audit.example.com/in"
    assert data["LINGSTREAM_WEBHOOK_ALLOWED_PREFIXES"] == "https://hooks.example.com/"
    assert (data["LINGSTREAM_WEBHOOK_TIMEOUT"], data["LINGSTREAM_WEBHOOK_MAX_ATTEMPTS"]) == ("2.5", "5")
    assert "LINGSTREAM_WEBHOOK_ALLOW_PRIVATE" not in data
    assert json.loads(data["LINGSTREAM_KEY_QUOTAS"]) == {
        "key-1a2b3c4d5e6f": {"webhook_urls": ["https://tenant.example.com/h"]}
    }
    stored = {k: base64.b64decode(v).decode() for k, v in only(docs, "Secret")["data"].items()}
    name, key, optional = secret_refs(docs)["LINGSTREAM_WEBHOOK_SECRET"]
    assert (name, stored[key], optional) == (FULLNAME, secret, False)
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"webhooks": {"urls": ["ftp://x"]}})
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"config": {"extra": {"LINGSTREAM_WEBHOOK_SECRET": "x"}}})


def test_no_secret_and_no_livekit_credentials_without_livekit(chart: Any) -> None:
    docs = render(chart, {})
    assert "Secret" not in {doc["kind"] for doc in docs}
    assert secret_refs(docs) == {}
    assert "LIVEKIT_URL" not in only(docs, "ConfigMap")["data"]


def test_browsers_get_livekit_client_url_when_it_is_set(chart: Any) -> None:
    livekit = {"url": "ws://livekit.livekit.svc:7880", "apiKey": "k", "apiSecret": "s"}
    plain = only(render(chart, {"livekit": livekit}), "ConfigMap")["data"]
    assert plain["LIVEKIT_URL"] == "ws://livekit.livekit.svc:7880"
    assert "LINGSTREAM_LIVEKIT_CLIENT_URL" not in plain  # browsers get LIVEKIT_URL
    both = render(chart, {"livekit": {**livekit, "clientUrl": "wss://livekit.example.com"}})
    assert only(both, "ConfigMap")["data"]["LINGSTREAM_LIVEKIT_CLIENT_URL"] == "wss://livekit.example.com"
    with pytest.raises(helm.HelmValuesError, match="clientUrl"):  # the schema: a ws:// or wss:// URL
        render(chart, {"livekit": {**livekit, "clientUrl": "https://livekit.example.com"}})


def test_callers_livekit_servers_are_allowed_by_name_with_or_without_livekit_credentials(chart: Any) -> None:
    urls = ["wss://*.livekit.cloud", "wss://livekit.example.com:7880"]
    alone = only(render(chart, {"livekit": {"callerUrls": urls}}), "ConfigMap")["data"]
    assert alone["LINGSTREAM_LIVEKIT_CALLER_URLS"] == "wss://*.livekit.cloud,wss://livekit.example.com:7880"
    assert "LIVEKIT_URL" not in alone  # callers' tokens only: no credentials of the pods' own
    assert "LINGSTREAM_LIVEKIT_CALLER_URLS" not in only(render(chart, {}), "ConfigMap")["data"]
    with pytest.raises(helm.HelmValuesError, match="callerUrls"):  # one server an item, a ws:// or wss:// URL or *
        render(chart, {"livekit": {"callerUrls": ["wss://a.example.com,wss://b.example.com"]}})


def test_livekit_url_without_credentials_refuses_to_render(chart: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"livekit\.apiKey"):
        render(chart, {"livekit": {"url": "wss://livekit.example.com"}})


def test_redis_backend_without_url_refuses_to_render(chart: Any) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"admission\.redisUrl"):
        render(chart, {"admission": {"backend": "redis"}})


def test_redis_backend_sets_the_replica_ttl_and_leaves_each_process_its_own_replica_id(chart: Any) -> None:
    docs = render(chart, {"replicaCount": 3, "admission": {**REDIS, "replicaTtl": 4.5}})
    data = only(docs, "ConfigMap")["data"]
    assert data["LINGSTREAM_ADMISSION_BACKEND"] == "redis"
    assert data["LINGSTREAM_REPLICA_TTL"] == "4.5"
    # The default id (pod name + a random suffix) is unique per process: a restarted container is a new replica.
    assert "LINGSTREAM_REPLICA_ID" not in data
    assert "LINGSTREAM_REPLICA_ID" not in env_of(docs)
    assert only(docs, "Deployment")["spec"]["replicas"] == 3
    assert "LINGSTREAM_REPLICA_TTL" not in only(render(chart, {"admission": REDIS}), "ConfigMap")["data"]
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"admission": {**REDIS, "replicaTtl": 0}})


def test_redis_pods_advertise_their_address_so_the_others_forward_transport_routes(chart: Any) -> None:
    docs = render(chart, {"replicaCount": 3, "admission": REDIS})
    env = env_of(docs)
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    port = main_container(docs)["ports"][0]["containerPort"]
    assert env["LINGSTREAM_REPLICA_URL"]["value"] == f"http://$(POD_IP):{port}"
    names = [entry["name"] for entry in main_container(docs)["env"]]
    assert names.index("POD_IP") < names.index("LINGSTREAM_REPLICA_URL")  # $(POD_IP) expands only from earlier ones
    assert "LINGSTREAM_REPLICA_URL" not in only(docs, "ConfigMap")["data"]
    # Off on request (then transport routes of sessions run elsewhere answer 409), and without redis.
    off = env_of(render(chart, {"admission": {**REDIS, "forwardTransportRoutes": False}}))
    assert "LINGSTREAM_REPLICA_URL" not in off
    assert "POD_IP" not in off
    assert "LINGSTREAM_REPLICA_URL" not in env_of(render(chart, {}))
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"admission": {**REDIS, "forwardTransportRoutes": "yes"}})


# --- the values schema ---------------------------------------------------------------------------------------------


def test_replica_count_above_one_without_redis_fails_schema_validation(chart: Any) -> None:
    values = {"replicaCount": 2}
    with pytest.raises(helm.HelmValuesError, match="redis"):
        chart.validate_schema(values)
    with pytest.raises(helm.HelmValuesError):
        render(chart, values)
    report = helm.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"]
    # With redis the same count is fine.
    chart.validate_schema({"replicaCount": 2, "admission": REDIS})


def test_autoscaling_without_redis_fails_schema_validation(chart: Any) -> None:
    with pytest.raises(helm.HelmValuesError, match="redis"):
        chart.validate_schema({"autoscaling": {"enabled": True}})


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"replicaCont": 1}, id="top-level"),
        pytest.param({"config": {"drainTimout": 30}}, id="config"),
        pytest.param({"gpu": {"cout": 1}}, id="gpu"),
        pytest.param({"livekit": {"apiSecrets": "x"}}, id="livekit"),
        pytest.param({"autoscaling": {"kind": "vpa"}}, id="autoscaling-kind"),
        pytest.param({"probes": {"readiness": {"path": "/other"}}}, id="probe-path-is-not-a-value"),
        pytest.param({"config": {"videoCodec": "av1"}}, id="codec"),
        pytest.param({"config": {"drainTimeout": "60"}}, id="drain-timeout-type"),
        pytest.param({"livekit": {"url": "https://livekit.example.com"}}, id="livekit-url-scheme"),
        pytest.param({"otel": {"protocol": "grpc"}}, id="otel-protocol"),
        pytest.param({"grafanaDashboard": {"enable": True}}, id="dashboard"),
        pytest.param({"grafanaDashboard": {"labels": {"team": 1}}}, id="dashboard-label-type"),
        pytest.param({"model": {"name": "lingbot"}}, id="model-name"),
        pytest.param({"model": {"dtype": "int8"}}, id="model-dtype"),
        pytest.param({"model": {"pvc": "x"}}, id="model-typo"),
    ],
)
def test_schema_rejects_typos_and_wrong_types(chart: Any, values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(values)


def test_schema_keeps_credentials_out_of_config_extra(chart: Any) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"config": {"extra": {"LINGSTREAM_API_KEYS": "k"}}})
    chart.validate_schema({"config": {"extra": {"LINGSTREAM_FUTURE_KNOB": "1"}}})
    data = only(render(chart, {"config": {"extra": {"LINGSTREAM_FUTURE_KNOB": "1"}}}), "ConfigMap")["data"]
    assert data["LINGSTREAM_FUTURE_KNOB"] == "1"


# --- exposure and scaling ------------------------------------------------------------------------------------------


def test_ingress_routes_to_the_service_with_tls_and_stream_timeouts(chart: Any) -> None:
    docs = render(chart, VALUE_SETS["ingress_hpa"])
    ingress = only(docs, "Ingress")
    service = only(docs, "Service")
    assert ingress["spec"]["ingressClassName"] == "nginx"
    assert ingress["spec"]["tls"] == [{"secretName": "lingstream-tls", "hosts": ["lingstream.example.com"]}]
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "lingstream.example.com"
    [path] = rule["http"]["paths"]
    assert path["backend"]["service"] == {"name": service["metadata"]["name"], "port": {"number": 8080}}
    assert ingress["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-read-timeout"] == "3600"
    assert service["spec"]["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]


def test_hpa_scales_on_the_global_queue_depth_and_running_sessions(chart: Any) -> None:
    docs = render(chart, VALUE_SETS["ingress_hpa"])
    hpa = only(docs, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    spec = hpa["spec"]
    assert spec["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": FULLNAME}
    assert (spec["minReplicas"], spec["maxReplicas"]) == (2, 8)
    queue, running = spec["metrics"]
    assert queue["type"] == "External"
    assert queue["external"]["metric"]["name"] == "lingstream_admission_queue_depth"
    assert queue["external"]["metric"]["selector"] == {"matchLabels": {"service": FULLNAME}}
    assert queue["external"]["target"] == {"type": "AverageValue", "averageValue": "3"}
    assert running["type"] == "Pods"
    assert running["pods"]["metric"] == {
        "name": "lingstream_sessions",
        "selector": {"matchLabels": {"state": "running"}},
    }
    assert running["pods"]["target"] == {"type": "AverageValue", "averageValue": "4"}
    assert spec["behavior"]["scaleDown"]["stabilizationWindowSeconds"] >= 300
    assert "replicas" not in only(docs, "Deployment")["spec"]


def test_hpa_can_use_a_pods_metric_for_queue_depth(chart: Any) -> None:
    hpa = only(render(chart, VALUE_SETS["hpa_pods_metric"]), "HorizontalPodAutoscaler")
    [queue] = hpa["spec"]["metrics"]
    assert queue["type"] == "Pods"
    assert queue["pods"]["metric"]["name"] == "lingstream_admission_queue_depth"
    assert queue["pods"]["target"] == {"type": "AverageValue", "averageValue": "2"}


def test_disruption_budget_selects_the_pods(chart: Any) -> None:
    docs = render(chart, {})
    pdb = only(docs, "PodDisruptionBudget")
    pod_labels = only(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    with pytest.raises(helm.HelmRenderError, match="exactly one"):
        render(chart, {"podDisruptionBudget": {"maxUnavailable": 1, "minAvailable": 1}})


def test_notes_explain_how_to_reach_the_service_and_livekit(chart: Any) -> None:
    notes = render_files(chart, {})["lingstream/templates/NOTES.txt"]
    assert f"port-forward service/{FULLNAME} 8080:8080" in notes
    assert "embedded WebRTC" in notes
    notes = render_files(chart, VALUE_SETS["ingress_hpa"])["lingstream/templates/NOTES.txt"]
    assert "https://lingstream.example.com/" in notes
    assert "wss://livekit.example.com" in notes
    assert "reachable from them" in notes


def test_the_documented_production_values_render_and_validate(chart: Any) -> None:
    match = re.search(r"`values-prod\.yaml`:\n\n```yaml\n(.*?)```", DEPLOY_DOC.read_text(), re.DOTALL)
    assert match, "docs/deploy.md lost its values-prod.yaml example"
    values = yaml.safe_load(match.group(1))
    chart.validate_schema(values)
    docs = render(chart, values)
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) not in CUSTOM_RESOURCES:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
    assert main_container(docs)["image"] == "registry.example.com/lingstream:0.1.0-cuda"
    assert pod_spec(docs)["terminationGracePeriodSeconds"] == 135
    assert secret_refs(docs)["LIVEKIT_API_KEY"] == ("lingstream-credentials", "LIVEKIT_API_KEY", False)


# --- Grafana dashboard ---------------------------------------------------------------------------------------------


def dashboard_config_maps(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == "ConfigMap" and doc["metadata"]["name"].endswith("-dashboard")]


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", ())]


def test_no_dashboard_config_map_unless_enabled(chart: Any) -> None:
    assert dashboard_config_maps(render(chart, {})) == []


def test_dashboard_config_map_carries_the_chart_dashboard_for_the_grafana_sidecar(chart: Any) -> None:
    [config_map] = dashboard_config_maps(render(chart, VALUE_SETS["dashboard"]))
    metadata = config_map["metadata"]
    assert metadata["name"] == f"{FULLNAME}-dashboard"
    assert metadata["namespace"] == NAMESPACE
    assert metadata["labels"]["grafana_dashboard"] == "1"
    assert metadata["labels"]["team"] == "video"
    assert metadata["labels"]["app.kubernetes.io/instance"] == RELEASE
    assert metadata["annotations"] == {"grafana_folder": "lingstream"}
    assert list(config_map["data"]) == ["lingstream.json"]
    assert json.loads(config_map["data"]["lingstream.json"]) == json.loads(DASHBOARD.read_text())


def test_dashboard_label_and_namespace_follow_the_sidecar_settings(chart: Any) -> None:
    values = {
        "grafanaDashboard": {"enabled": True, "namespace": "monitoring", "label": "dashboards", "labelValue": "yes"}
    }
    [config_map] = dashboard_config_maps(render(chart, values))
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["dashboards"] == "yes"
    assert "grafana_dashboard" not in config_map["metadata"]["labels"]
    kubernetes_validate.validate(config_map, KUBE_VERSION, strict=True)


def test_dashboard_has_the_operator_panels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    titles = {panel["title"] for panel in dashboard["panels"]}
    for wanted in (
        "Queue depth",
        "Lease wait",
        "Real-time factor",
        "Chunk period",
        "Control-to-output latency",
        "Sessions by state",
        "Requests by route and status",
    ):
        assert wanted in titles
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24, panel["title"]
        for target in panel.get("targets", ()):
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    exprs = dashboard_exprs(dashboard)
    assert any("lingstream_admission_queue_depth" in expr for expr in exprs)
    assert all("session_id=" not in expr for expr in exprs)


def test_dashboard_panels_tile_the_grid_without_overlapping() -> None:
    # Grafana lays panels out by gridPos alone: a non-integer height (a panel once had its threshold steps there)
    # or two panels on the same cells make the dashboard render wrongly or not at all.
    dashboard = json.loads(DASHBOARD.read_text())
    taken: dict[tuple[int, int], str] = {}
    for panel in dashboard["panels"]:
        position = panel["gridPos"]
        assert set(position) == {"h", "w", "x", "y"}, panel["title"]
        assert all(type(position[key]) is int for key in position), panel["title"]
        assert min(position["h"], position["w"]) >= 1, panel["title"]
        assert min(position["x"], position["y"]) >= 0, panel["title"]
        for row in range(position["y"], position["y"] + position["h"]):
            for column in range(position["x"], position["x"] + position["w"]):
                assert (row, column) not in taken, f"{panel['title']} overlaps {taken[(row, column)]}"
                taken[(row, column)] = panel["title"]


@pytest.mark.parametrize(
    "family",
    [
        "lingstream_chunk_control_to_first_frame_seconds",
        "lingstream_chunk_playout_lead_seconds",
        "lingstream_playout_underruns_total",
        "lingstream_sessions_ended_limit_total",
        "lingstream_viewers",
        "lingstream_viewers_frames_dropped_total",
        "lingstream_recordings_active",
        "lingstream_recordings_stopped_total",
        "lingstream_recordings_kept_size_bytes",
        "lingstream_usage_running_seconds_total",
        "lingstream_usage_queued_seconds_total",
        "lingstream_usage_frames_total",
    ],
)
def test_dashboard_shows_playout_limits_viewers_recordings_and_usage(family: str) -> None:
    used = {
        name
        for expr in dashboard_exprs(json.loads(DASHBOARD.read_text()))
        for name in re.findall(r"\b(lingstream_[a-z0-9_]+?)(?:_bucket)?\b", expr)
    }
    assert family in used


def test_dashboard_queries_only_series_the_service_documents() -> None:
    documented = set(re.findall(r"^\| `((?:lingstream|http)_[a-z0-9_]+)` \|", METRICS_DOC.read_text(), re.MULTILINE))
    assert "lingstream_admission_queue_depth" in documented
    used: set[str] = set()
    for expr in dashboard_exprs(json.loads(DASHBOARD.read_text())):
        used.update(re.findall(r"\b((?:lingstream|http_server)_[a-z0-9_]+)\b", expr))
    assert used
    for name in sorted(used):
        base = re.sub(r"_(bucket|count|sum)$", "", name)
        assert name in documented or base in documented, f"{name} is not in docs/metrics.md"


def test_lingbot_fast_mounts_its_weights_read_only_and_sets_the_variables(chart: Any) -> None:
    values = {
        "model": {
            "name": "lingbot-fast",
            "persistentVolumeClaim": "lingbot-weights",
            "dtype": "bfloat16",
            "compile": "max",
            "decoder": "tiny",
            "attention": "cudnn",
            "warmupChunks": 0,
        },
        "gpu": {"count": 1},
    }
    docs = render(chart, values)
    data = only(docs, "ConfigMap")["data"]
    assert data["LINGSTREAM_MODEL"] == "lingbot-fast"
    assert data["LINGSTREAM_MODEL_PATH"] == "/models/lingbot-fast"
    assert data["LINGSTREAM_MODEL_DTYPE"] == "bfloat16"
    assert data["LINGSTREAM_COMPILE"] == "max"
    assert data["LINGSTREAM_DECODER"] == "tiny"
    assert (data["LINGSTREAM_ATTENTION"], data["LINGSTREAM_WARMUP_CHUNKS"]) == ("cudnn", "0")
    assert "LINGSTREAM_MODEL_WINDOW_FRAMES" not in data
    mount = next(m for m in main_container(docs)["volumeMounts"] if m["name"] == "model")
    assert mount == {"name": "model", "mountPath": "/models/lingbot-fast", "readOnly": True}
    volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "model")
    assert volume["persistentVolumeClaim"] == {"claimName": "lingbot-weights", "readOnly": True}
    for doc in docs:
        kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)


def test_lingbot_fast_from_a_host_path_with_its_cache_sizes(chart: Any) -> None:
    values = {
        "model": {
            "name": "lingbot-fast",
            "hostPath": "/data/lingbot",
            "subPath": "fast",
            "windowFrames": 24,
            "sinkFrames": 3,
        },
    }
    docs = render(chart, values)
    data = only(docs, "ConfigMap")["data"]
    assert (data["LINGSTREAM_MODEL_WINDOW_FRAMES"], data["LINGSTREAM_MODEL_SINK_FRAMES"]) == ("24", "3")
    assert "LINGSTREAM_COMPILE" not in data  # null: the service's default, off
    assert "LINGSTREAM_DECODER" not in data  # null: the service's default, the Wan VAE
    assert "LINGSTREAM_ATTENTION" not in data
    assert "LINGSTREAM_WARMUP_CHUNKS" not in data  # null: automatic
    volume = next(v for v in pod_spec(docs)["volumes"] if v["name"] == "model")
    assert volume["hostPath"] == {"path": "/data/lingbot", "type": "Directory"}
    mount = next(m for m in main_container(docs)["volumeMounts"] if m["name"] == "model")
    assert mount["subPath"] == "fast"


def test_the_schema_refuses_a_compile_mode_the_service_does_not_know(chart: Any) -> None:
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"model": {"name": "lingbot-fast", "hostPath": "/data/lingbot", "compile": "fast"}})
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"model": {"name": "lingbot-fast", "hostPath": "/data/lingbot", "decoder": "taehv"}})
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"model": {"name": "lingbot-fast", "hostPath": "/data/lingbot", "attention": "xformers"}})
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"model": {"name": "lingbot-fast", "hostPath": "/data/lingbot", "warmupChunks": -1}})


def test_the_reference_model_mounts_nothing_and_sets_no_model_variables(chart: Any) -> None:
    docs = render(chart, {})
    assert not any(key.startswith("LINGSTREAM_MODEL") for key in only(docs, "ConfigMap")["data"])
    assert "model" not in {v["name"] for v in pod_spec(docs)["volumes"]}


@pytest.mark.parametrize(
    "model",
    [{"name": "lingbot-fast"}, {"name": "lingbot-fast", "persistentVolumeClaim": "a", "hostPath": "/b"}],
    ids=["no-weights", "two-sources"],
)
def test_lingbot_fast_needs_exactly_one_weights_source(chart: Any, model: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmRenderError, match=r"exactly one of model\.persistentVolumeClaim and model\.hostPath"):
        render(chart, {"model": model})
