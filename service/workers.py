"""Choosing and building the model workers: the only place the service names a model implementation.

`build_workers(settings)` returns one `BidirectionalService` per model worker (`NUM_WORKERS`): the LingBot service
from `pipeline.lingbot`, imported only here and only when called; start-up fails with a clear message when it is
not importable. It is the wiring point for the model packages' constructors; the settings are converted into
`WorkerOptions` here, once. `load_factory` resolves the test-only `--worker-factory` hook. The transport is built
in `service.transports`.

Model (`LINGSTREAM_MODEL`): `reference` (`ReferenceWorldModel`) or `lingbot-fast` (`pipeline.lingbot.models`, loaded
from `LINGSTREAM_MODEL_PATH` in `LINGSTREAM_MODEL_DTYPE`, its cache window/sink from `LINGSTREAM_MODEL_WINDOW_FRAMES` /
`_SINK_FRAMES`).

Stage placement (`LINGSTREAM_STAGE_PLACEMENT`). `threads`: `LingBotService(world model(device))`, every
stage on a thread of the service process, on the worker's one device. `processes`: the worker's devices
(`Settings.worker_devices`) become three complete runtime configs, which `pipeline.lingbot.plan_placement` turns
into worker groups:

    devices of one worker          DiT (denoise) ranks          VAE decode              VAE encode
    cpu                            cpu x DENOISE_RANKS          cpu (co-located if 1)   cpu
    cuda:a..  (DENOISE_RANKS)      every listed GPU             co-located in the DiT   the first GPU
    cuda:a..  (DENOISE_RANKS + 1)  all but the last GPU         the last GPU            the last GPU

Threads per rank: `LINGSTREAM_TORCH_THREADS`, or the machine's cores divided by the DiT ranks. Worker processes
inherit `OMP_WAIT_POLICY=PASSIVE` (unless the environment sets it): OpenMP threads that spin after each parallel
region steal the cores of the other groups' ranks, which on a 2-core machine made a chunk several times slower.
At start, `check_devices` confirms every CUDA device exists (an error names the variable, the device and its role).
"""

from __future__ import annotations

import functools
import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from admission import ExecutionLease
from pipeline.bidirectional import BidirectionalService
from service.errors import SettingsError
from service.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from pipeline.lingbot.config import LingBotSessionConfig
    from pipeline.lingbot.graph.actors import ProcessPlacement
    from pipeline.lingbot.models import LingBotFastOptions, MemoryEstimate
    from pipeline.lingbot.models.attention import AttentionPlan
    from pipeline.lingbot.policy.recovery import RecoveryBudget
    from pipeline.lingbot.seam import WorldModel, WorldModelFactory

__all__ = [
    "CUDA_ALLOCATOR_ENVIRONMENT",
    "WORKER_ENVIRONMENT",
    "WorkerOptions",
    "allocator_environment",
    "attention_plan",
    "build_workers",
    "check_devices",
    "check_model",
    "lingbot_fast_options",
    "load_factory",
    "model_memory",
    "model_start",
    "process_placement",
    "recovery_budget",
    "worker_options",
]

WORKER_ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Set (unless already set) before the first worker process spawns; the processes inherit it."""
CUDA_ALLOCATOR_ENVIRONMENT = {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
"""Set before CUDA is first used in this process (`build_workers` starts with it) when a worker's stages run on
threads on a CUDA device, unless PYTORCH_ALLOC_CONF or PYTORCH_CUDA_ALLOC_CONF is set already: segments that grow
in place instead of fixed blocks, so the sessions' caches and the chunks' transients do not fragment the device.
Not on processes: the latents cross between worker groups by CUDA IPC, which torch refuses for expandable segments
unless TORCH_CUDA_EXPANDABLE_SEGMENTS_IPC=1 (untested here: for a GPU run to show)."""
_ALLOCATOR_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """What one model worker is built from, converted once from `Settings` (the model packages never see them)."""

    worker_index: int
    num_workers: int
    max_sessions_per_worker: int
    device: str
    torch_threads: int | None
    max_image_bytes: int
    max_image_pixels: int
    session_history: int = 256
    stage_placement: str = "threads"
    denoise_ranks: int = 1
    devices: tuple[str, ...] = ("cpu",)
    """This worker's devices (its share of `LINGSTREAM_DEVICES`)."""
    stage_call_timeout: float = 60.0
    worker_start_timeout: float = 120.0
    """`LINGSTREAM_WORKER_START_TIMEOUT`: a worker process group's ranks must be ready within it."""
    progressive_decode: bool = True
    """`LINGSTREAM_PROGRESSIVE_DECODE` (either placement)."""
    model: str = "reference"
    """`LINGSTREAM_MODEL`: "reference" or "lingbot-fast"."""
    model_path: str | None = None
    model_dtype: str = "auto"
    model_window_frames: int = 18
    model_sink_frames: int = 6
    compile: str = "off"
    """`LINGSTREAM_COMPILE` (lingbot-fast)."""
    attention: str = "auto"
    """`LINGSTREAM_ATTENTION` (lingbot-fast)."""
    warmup_chunks: int | None = None
    """`LINGSTREAM_WARMUP_CHUNKS` (lingbot-fast; None: automatic)."""
    decoder: str = "wan"
    """`LINGSTREAM_DECODER` (lingbot-fast)."""
    recovery_attempts: int = 3
    """`LINGSTREAM_RECOVERY_ATTEMPTS` (0: no recovery)."""
    recovery_timeout: float = 30.0


def worker_options(settings: Settings) -> list[WorkerOptions]:
    return [
        WorkerOptions(
            worker_index=index,
            num_workers=settings.num_workers,
            max_sessions_per_worker=settings.max_sessions_per_worker,
            device=settings.device,
            torch_threads=settings.torch_threads,
            max_image_bytes=settings.max_image_bytes,
            max_image_pixels=settings.max_image_pixels,
            session_history=settings.session_history,
            stage_placement=settings.stage_placement,
            denoise_ranks=settings.denoise_ranks,
            devices=devices,
            stage_call_timeout=settings.stage_call_timeout,
            worker_start_timeout=settings.worker_start_timeout,
            progressive_decode=settings.progressive_decode,
            model=settings.model,
            model_path=str(settings.model_path) if settings.model_path is not None else None,
            model_dtype=settings.model_dtype,
            model_window_frames=settings.model_window_frames,
            model_sink_frames=settings.model_sink_frames,
            compile=settings.compile,
            attention=settings.attention,
            warmup_chunks=settings.warmup_chunks,
            decoder=settings.decoder,
            recovery_attempts=settings.recovery_attempts,
            recovery_timeout=settings.recovery_timeout,
        )
        for index, devices in enumerate(settings.worker_devices())
    ]


def process_placement(options: WorkerOptions) -> ProcessPlacement:
    """The worker groups of one model worker with `processes` placement (module docstring), over the model
    `LINGSTREAM_MODEL` names (its factory builds each part inside the process that runs it)."""
    from pipeline.lingbot.graph.actors import ProcessPlacement
    from pipeline.lingbot.graph.placement import ModelRuntimeConfig, plan_placement
    from pipeline.lingbot.reference.model import ReferenceModelFactory

    ranks = options.denoise_ranks
    threads = options.torch_threads or max(1, (os.cpu_count() or 1) // ranks)

    def runtime(devices: tuple[str, ...]) -> ModelRuntimeConfig:
        return ModelRuntimeConfig(devices=devices, world_size=len(devices), dtype="float32", torch_threads=threads)

    dit: tuple[str, ...]
    decode: tuple[str, ...]
    encode: tuple[str, ...]
    if options.devices == ("cpu",):
        dit, decode, encode = ("cpu",) * ranks, ("cpu",), ("cpu",)
    else:
        dit = options.devices[:ranks]
        spare = options.devices[ranks:]
        decode = spare if spare else dit
        encode = spare if spare else dit[:1]
    plan = plan_placement(runtime(encode), runtime(dit), runtime(decode))
    factory: WorldModelFactory = ReferenceModelFactory()
    if options.model == "lingbot-fast":
        from pipeline.lingbot.models import LingBotFastFactory

        factory = LingBotFastFactory(lingbot_fast_options(options))
    return ProcessPlacement(
        plan,
        factory,
        max_sessions=options.max_sessions_per_worker,
        call_timeout_s=options.stage_call_timeout,
        start_timeout_s=options.worker_start_timeout,
    )


def lingbot_fast_options(options: WorkerOptions) -> LingBotFastOptions:
    from pipeline.lingbot.models import LingBotFastOptions

    assert options.model_path is not None  # Settings requires it with LINGSTREAM_MODEL=lingbot-fast
    return LingBotFastOptions(
        options.model_path,
        dtype=options.model_dtype,
        window_frames=options.model_window_frames,
        sink_frames=options.model_sink_frames,
        compile=options.compile,
        attention=options.attention,
        warmup_chunks=options.warmup_chunks,
        decoder=options.decoder,
        denoise_ranks=options.denoise_ranks if options.stage_placement == "processes" else 1,
    )


def check_model(options: WorkerOptions) -> MemoryEstimate | None:
    """For `LINGSTREAM_MODEL=lingbot-fast`: check the model directory from its headers (no weights loaded), estimate
    its memory on the worker's device and refuse a `LINGSTREAM_MAX_SESSIONS_PER_WORKER` that cannot fit; returns the
    estimate (what `/readyz` shows). Raises `SettingsError` naming the problem: the lingbot extra missing, the
    directory incomplete or inconsistent, too many sessions. None for the reference model. Cached per options."""
    if options.model != "lingbot-fast":
        return None
    return _checked_estimate(options)


@functools.lru_cache(maxsize=8)
def _checked_estimate(options: WorkerOptions) -> MemoryEstimate:
    device = options.devices[0]
    try:
        from pipeline.lingbot.models import (
            PLAN_HEIGHT,
            PLAN_WIDTH,
            ModelConfigError,
            check_model_dir,
            check_parallel,
            estimate_memory,
        )

        fast = lingbot_fast_options(options)
        summary = check_model_dir(fast.root, decoder=fast.decoder)
    except ImportError as exc:
        raise SettingsError(
            f"cannot start: LINGSTREAM_MODEL=lingbot-fast needs the lingbot extra (pip install 'lingstream[lingbot]'): "
            f"{exc}"
        ) from None
    except ValueError as exc:  # CheckpointError, ModelConfigError
        raise SettingsError(f"cannot start: LINGSTREAM_MODEL_PATH={options.model_path}: {exc}") from None
    try:  # the DiT group against the heads and the planning resolution's tokens (Ulysses: whole heads, even tokens)
        check_parallel(summary.dit, fast.denoise_ranks, summary.dit.frame_tokens(PLAN_HEIGHT // 8, PLAN_WIDTH // 8))
    except ModelConfigError as exc:
        raise SettingsError(f"cannot start: {exc}") from None
    try:
        estimate = estimate_memory(summary, fast, device)
    except ValueError as exc:  # ModelConfigError: the model's sizes, or a cache its sessions could not build
        raise SettingsError(
            f"cannot start: LINGSTREAM_MODEL_PATH={options.model_path} with LINGSTREAM_MODEL_WINDOW_FRAMES="
            f"{options.model_window_frames} / _SINK_FRAMES={options.model_sink_frames}: {exc}"
        ) from None
    wanted = options.max_sessions_per_worker
    if estimate.fits_sessions < wanted:
        raise SettingsError(
            f"cannot start: LINGSTREAM_MAX_SESSIONS_PER_WORKER={wanted} does not fit on {device}: the model takes "
            f"{_gb(estimate.model_bytes)} and each session {_gb(estimate.session_bytes)} of attention cache "
            f"({estimate.dtype}, {estimate.width}x{estimate.height}, window {options.model_window_frames} latent "
            f"frames), {_gb(estimate.total_bytes(wanted))} in all, but {_gb(estimate.usable_bytes)} of the device's "
            f"{_gb(estimate.device_bytes)} is usable: at most {estimate.fits_sessions} session(s). Lower it, shrink "
            "LINGSTREAM_MODEL_WINDOW_FRAMES, or use a device with more memory."
        )
    return estimate


def attention_plan(options: WorkerOptions) -> AttentionPlan | None:
    """lingbot-fast: the attention the DiT will run on the worker's first device (`LINGSTREAM_ATTENTION`, selected
    as each DiT rank selects it at load, on the same machine); None for the reference model. Raises
    `SettingsError` for a kernel the device cannot run or that is not installed."""
    if options.model != "lingbot-fast":
        return None
    from pipeline.lingbot.models.attention import attention_capability, select_attention

    try:
        return select_attention(options.attention, attention_capability(options.devices[0]))
    except ValueError as exc:  # ModelConfigError
        raise SettingsError(f"cannot start: LINGSTREAM_ATTENTION={options.attention}: {exc}") from None


def model_start(settings: Settings, workers: Sequence[BidirectionalService]) -> Callable[[], dict[str, object]] | None:
    """What `/readyz` shows of the first lingbot-fast worker's start, as a function it calls: the compile mode, the
    attention (`attention_plan`), the decoder (`LINGSTREAM_DECODER`) and the warm-up (`LINGSTREAM_WARMUP_CHUNKS`):
    the chunks run, their resolution and seconds — on threads measured while the worker was built, on processes
    reported by the DiT group's rank 0 when it became ready (`pipeline.process.ReportsReady`), so null until then.
    None for the reference model."""
    options = worker_options(settings)[0]
    plan = attention_plan(options)
    if plan is None:
        return None
    from pipeline.lingbot.models.warmup import WarmUp
    from pipeline.lingbot.policy.service import LingBotService

    chunks = lingbot_fast_options(options).warm_up_chunks()
    first = workers[0] if workers else None

    def current() -> dict[str, object]:
        warmup: dict[str, object] = {"chunks": chunks, "seconds": None, "resolution": None}
        if isinstance(first, LingBotService):
            report = first.warmed_up
            if report is None:
                reports = (stats.ready_report for stats in first.worker_statistics().values())
                report = next((item for item in reports if isinstance(item, WarmUp)), None)
            if report is not None:
                warmup = report.to_mapping()
        return {
            "compile": options.compile,
            "attention": plan.to_mapping(),
            "decoder": options.decoder,
            "warmup": warmup,
        }

    return current


def model_memory(settings: Settings) -> MemoryEstimate | None:
    """The first model worker's memory estimate (`check_model`); None for the reference model."""
    return check_model(worker_options(settings)[0])


def _gb(size: int) -> str:
    return f"{size / 1e9:.2f} GB"


def _session_limits(options: WorkerOptions) -> Callable[[LingBotSessionConfig], None] | None:
    """What the model refuses at create (lingbot-fast: more pixels than it planned memory for, a chunk its window
    cannot hold); None for the reference model."""
    if options.model != "lingbot-fast":
        return None
    from pipeline.lingbot.models import session_limits

    return session_limits(lingbot_fast_options(options))


def _world_model(options: WorkerOptions) -> WorldModel:
    """The threads placement's model on the worker's one device."""
    if options.model != "lingbot-fast":
        from pipeline.lingbot.reference.model import ReferenceWorldModel

        return ReferenceWorldModel(options.devices[0])
    from pipeline.lingbot.models import LingBotFastWorldModel

    try:
        return LingBotFastWorldModel.load(lingbot_fast_options(options), options.devices[0])
    except ValueError as exc:  # CheckpointError, ModelConfigError: a file changed since check_model
        raise SettingsError(f"cannot start: LINGSTREAM_MODEL_PATH={options.model_path}: {exc}") from None


def recovery_budget(options: WorkerOptions) -> RecoveryBudget | None:
    """How hard the worker rebuilds a session whose worker group failed (docs/continuity.md): with `processes`
    placement, `LINGSTREAM_RECOVERY_ATTEMPTS` re-seeds within `LINGSTREAM_RECOVERY_TIMEOUT`; None (a failure fails
    the session) on threads and with 0 attempts. The reference model re-seeds exactly; LingBot-World-Fast without its
    history (an empty KV cache whose positions continue the session's: the picture goes on from the reference image
    and the pose, a visible jump rather than an error)."""
    if options.stage_placement != "processes" or options.recovery_attempts < 1:
        return None
    from pipeline.lingbot.policy.recovery import RecoveryBudget

    return RecoveryBudget(attempts=options.recovery_attempts, timeout_s=options.recovery_timeout)


def allocator_environment(options: list[WorkerOptions], environ: Mapping[str, str]) -> dict[str, str]:
    """What `build_workers` sets before CUDA starts (`CUDA_ALLOCATOR_ENVIRONMENT`): the expandable segments when
    every worker runs its stages on threads and one of them on a CUDA device, and the environment does not choose
    the allocator's settings itself; else nothing."""
    cuda = any(device != "cpu" for option in options for device in option.devices)
    threads = all(option.stage_placement == "threads" for option in options)
    if not cuda or not threads or any(name in environ for name in _ALLOCATOR_VARIABLES):
        return {}
    return dict(CUDA_ALLOCATOR_ENVIRONMENT)


def check_devices(options: list[WorkerOptions]) -> None:
    """Raise `SettingsError` when a model worker names a CUDA device this machine does not have."""
    wanted = [(option, device) for option in options for device in option.devices if device != "cpu"]
    if not wanted:
        return
    import torch

    available = torch.cuda.device_count() if torch.cuda.is_available() else 0
    for option, device in wanted:
        if int(device.partition(":")[2]) >= available:
            role = _role(option, device)
            raise SettingsError(
                f"invalid configuration: LINGSTREAM_DEVICES (or LINGSTREAM_DEVICE=cuda) names {device}, the {role} "
                f"of model worker {option.worker_index}, but torch sees {available} CUDA device(s) here: "
                "that device is missing. Fix the value and start again."
            )


def _role(option: WorkerOptions, device: str) -> str:
    if option.stage_placement == "threads":
        return "device"
    index = option.devices.index(device)
    if index < option.denoise_ranks:
        return f"DiT rank {index} device"
    return "VAE decode and encode device"


def build_workers(settings: Settings) -> list[BidirectionalService]:
    """One LingBot model worker per `NUM_WORKERS`, each with its own execution lease, placed as
    `LINGSTREAM_STAGE_PLACEMENT` says (module docstring). Raises `SettingsError` when the implementation cannot be
    imported or a device is missing.

    Wiring point: `LingBotService(world model | process_placement(options), lease=ExecutionLease(),
    max_image_bytes=..., max_image_pixels=..., torch_threads=..., progressive_decode=..., recovery=...)`; the world
    model is `LINGSTREAM_MODEL`'s: the reference one, or LingBot-World-Fast loaded from `LINGSTREAM_MODEL_PATH` (checked
    first, so a bad directory fails the start with its problem named).
    """
    try:
        from pipeline.lingbot.models.world import LingBotFastWorldModel
        from pipeline.lingbot.policy.service import LingBotService
    except ImportError as exc:
        raise SettingsError(
            f"cannot start: the LingBot model worker (pipeline.lingbot.LingBotService) is not importable: {exc}"
        ) from None
    options_list = worker_options(settings)
    os.environ.update(allocator_environment(options_list, os.environ))  # before CUDA is first used
    check_devices(options_list)
    for options in options_list:
        check_model(options)  # refuses a directory that does not load or sessions that do not fit
        attention_plan(options)  # refuses a kernel the device cannot run
    if any(options.stage_placement == "processes" for options in options_list):
        for name, value in WORKER_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
    workers: list[BidirectionalService] = []
    for options in options_list:
        if options.stage_placement == "processes":
            model: WorldModel | ProcessPlacement = process_placement(options)
            threads = None  # each rank sets its own; the service process only schedules
            warmed_up = None  # each DiT rank warms up in its process before it reports ready, and logs it
        else:
            world = _world_model(options)
            model = world
            warmed_up = world.denoiser.warmed_up if isinstance(world, LingBotFastWorldModel) else None
            threads = options.torch_threads
        workers.append(
            LingBotService(
                model,
                lease=ExecutionLease(),
                max_image_bytes=options.max_image_bytes,
                max_image_pixels=options.max_image_pixels,
                torch_threads=threads,
                history=options.session_history,
                check_config=_session_limits(options),
                progressive_decode=options.progressive_decode,
                recovery=recovery_budget(options),
                warmed_up=warmed_up,
            )
        )
    return workers


def load_factory(spec: str) -> object:
    """Resolve `module:attribute` (the test-only `--worker-factory` hook of `lingstream serve`)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SettingsError(f"invalid worker factory {spec!r}: expected module:callable")
    try:
        module = importlib.import_module(module_name)
        factory: object = getattr(module, attribute)
    except (ImportError, AttributeError) as exc:
        raise SettingsError(f"invalid worker factory {spec!r}: {exc}") from None
    return factory
