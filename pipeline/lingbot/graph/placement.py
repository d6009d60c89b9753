"""Where the three LingBot model stages run: a pure planner from three independent runtime configs to a plan.

Rules (DESIGN.md section 4):
- VAE encode is always its own actor and worker group.
- VAE decode joins the DiT's worker group exactly when both name the same device list (same order) and the same
  world size, so it reuses the DiT ranks' CUDA contexts and the latent never leaves the group. Otherwise decode is
  a separate group and the latent edge crosses groups through a `WorkerTensorChannel`.
- The base latent goes from encode to the DiT group once per session, always through a `WorkerTensorChannel`; the
  `condition` artifact itself carries no tensor.
- Device overlap between groups never creates a lock or a resource group (`PlacementPlan.resource_groups` is always
  empty). Overlaps are reported in `shared_devices` so a deployment can size memory; overcommit is its problem.

Each `ModelRuntimeConfig` is complete on its own: there is no fallback from one stage's config to another's.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from pipeline.lingbot.errors import PlacementError

__all__ = [
    "DECODE_STAGE",
    "DENOISE_STAGE",
    "ENCODE_STAGE",
    "ArtifactTransport",
    "ModelRuntimeConfig",
    "PlacementPlan",
    "SharedDevice",
    "StagePlacement",
    "WorkerGroupPlan",
    "plan_placement",
]

ENCODE_STAGE = "encode"
DENOISE_STAGE = "denoise"
DECODE_STAGE = "decode"

_DTYPES = frozenset({"float32", "bfloat16", "float16"})
_DEVICE = re.compile(r"^(cpu|cuda:\d{1,3})$")
_MAX_THREADS = 1024


@dataclass(frozen=True, slots=True)
class ModelRuntimeConfig:
    """How one model stage runs. Every field is required; nothing falls back to another stage's config."""

    devices: tuple[str, ...]
    """One device per rank: "cpu" or "cuda:N". CUDA devices are distinct; "cpu" may repeat (gloo ranks)."""
    world_size: int
    """Number of ranks; must equal len(devices)."""
    dtype: str
    """Weights/compute dtype: "float32", "bfloat16" or "float16"."""
    torch_threads: int
    """Intra-op CPU threads per rank (set by the worker process, never by library code)."""

    def __post_init__(self) -> None:
        if not isinstance(self.devices, tuple) or not self.devices:
            raise PlacementError(f"devices must be a non-empty tuple, got {self.devices!r}")
        for device in self.devices:
            if not isinstance(device, str) or not _DEVICE.match(device):
                raise PlacementError(f"device {device!r} is not 'cpu' or 'cuda:N'")
        cuda = [d for d in self.devices if d != "cpu"]
        if len(set(cuda)) != len(cuda):
            raise PlacementError(f"a CUDA device appears twice in {self.devices} (one rank per device)")
        if cuda and len(cuda) != len(self.devices):
            raise PlacementError(f"devices mix cpu and cuda ranks: {self.devices}")
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise PlacementError(f"world_size must be an int >= 1, got {self.world_size!r}")
        if self.world_size != len(self.devices):
            raise PlacementError(f"world_size {self.world_size} != len(devices) {len(self.devices)} ({self.devices})")
        if self.dtype not in _DTYPES:
            raise PlacementError(f"dtype must be one of {sorted(_DTYPES)}, got {self.dtype!r}")
        threads = self.torch_threads
        if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= _MAX_THREADS:
            raise PlacementError(f"torch_threads must be an int in 1..{_MAX_THREADS}, got {threads!r}")


class ArtifactTransport(enum.Enum):
    """How a tensor crosses one edge of the LingBot graph."""

    IN_GROUP = "in_group"
    """Producer and consumer run in the same worker group; the tensor never leaves it."""
    WORKER_TENSOR_CHANNEL = "worker_tensor_channel"
    """Different worker groups: shared memory (CPU) or CUDA IPC, the scheduler sees only metadata."""
    METADATA_ONLY = "metadata_only"
    """The artifact carries no tensor (e.g. `condition`: chunk index and size), a plain scheduler item."""


@dataclass(frozen=True, slots=True)
class StagePlacement:
    """One stage: the worker group that runs it and its own runtime config."""

    stage: str
    group: str
    runtime: ModelRuntimeConfig


@dataclass(frozen=True, slots=True)
class WorkerGroupPlan:
    """One group of worker processes (one `ParallelWorker`), owned by exactly one actor."""

    name: str
    devices: tuple[str, ...]
    world_size: int
    stages: tuple[str, ...]
    """Stages this group runs, in graph order."""


@dataclass(frozen=True, slots=True)
class SharedDevice:
    """A device used by more than one worker group (informational: memory sizing, never a lock)."""

    device: str
    groups: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PlacementPlan:
    """Where encode, denoise and decode run and how tensors cross between them."""

    groups: tuple[WorkerGroupPlan, ...]
    stages: tuple[StagePlacement, ...]
    base_latent_transport: ArtifactTransport
    """encode -> denoise side, once per session."""
    condition_transport: ArtifactTransport
    """The per-chunk `condition` artifact (no tensor)."""
    latent_transport: ArtifactTransport
    """denoise -> decode, every chunk."""
    shared_devices: tuple[SharedDevice, ...]
    resource_groups: tuple[str, ...] = ()
    """Always empty: placement never implies a mutex or a shared-concurrency group."""

    @property
    def decode_colocated(self) -> bool:
        return self.latent_transport is ArtifactTransport.IN_GROUP

    def stage(self, stage: str) -> StagePlacement:
        for placement in self.stages:
            if placement.stage == stage:
                return placement
        raise PlacementError(f"no stage {stage!r} in the plan; stages: {[p.stage for p in self.stages]}")

    def group_of(self, stage: str) -> WorkerGroupPlan:
        name = self.stage(stage).group
        return next(group for group in self.groups if group.name == name)


def plan_placement(
    vae_encode_config: ModelRuntimeConfig,
    dit_config: ModelRuntimeConfig,
    vae_decode_config: ModelRuntimeConfig,
) -> PlacementPlan:
    """Plan the worker groups of one model worker from the three stages' complete runtime configs."""
    for name, config in (
        ("vae_encode_config", vae_encode_config),
        ("dit_config", dit_config),
        ("vae_decode_config", vae_decode_config),
    ):
        if not isinstance(config, ModelRuntimeConfig):
            raise PlacementError(f"{name} must be a ModelRuntimeConfig, got {type(config).__name__}")

    colocate = dit_config.devices == vae_decode_config.devices and dit_config.world_size == vae_decode_config.world_size
    encode_group = WorkerGroupPlan(
        "vae_encode", vae_encode_config.devices, vae_encode_config.world_size, (ENCODE_STAGE,)
    )
    groups: tuple[WorkerGroupPlan, ...]
    if colocate:
        dit_group = WorkerGroupPlan("dit", dit_config.devices, dit_config.world_size, (DENOISE_STAGE, DECODE_STAGE))
        groups = (encode_group, dit_group)
        decode_group_name = dit_group.name
    else:
        dit_group = WorkerGroupPlan("dit", dit_config.devices, dit_config.world_size, (DENOISE_STAGE,))
        decode_group = WorkerGroupPlan(
            "vae_decode", vae_decode_config.devices, vae_decode_config.world_size, (DECODE_STAGE,)
        )
        groups = (encode_group, dit_group, decode_group)
        decode_group_name = decode_group.name
    stages = (
        StagePlacement(ENCODE_STAGE, encode_group.name, vae_encode_config),
        StagePlacement(DENOISE_STAGE, dit_group.name, dit_config),
        StagePlacement(DECODE_STAGE, decode_group_name, vae_decode_config),
    )
    return PlacementPlan(
        groups=groups,
        stages=stages,
        base_latent_transport=ArtifactTransport.WORKER_TENSOR_CHANNEL,
        condition_transport=ArtifactTransport.METADATA_ONLY,
        latent_transport=ArtifactTransport.IN_GROUP if colocate else ArtifactTransport.WORKER_TENSOR_CHANNEL,
        shared_devices=_shared_devices(groups),
    )


def _shared_devices(groups: tuple[WorkerGroupPlan, ...]) -> tuple[SharedDevice, ...]:
    users: dict[str, list[str]] = {}
    for group in groups:
        for device in dict.fromkeys(group.devices):
            users.setdefault(device, []).append(group.name)
    return tuple(SharedDevice(device, tuple(names)) for device, names in sorted(users.items()) if len(names) > 1)
