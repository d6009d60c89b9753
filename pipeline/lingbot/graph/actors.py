"""The stage actors of one LingBot model worker: from a `WorldModel` (threads) or a placement plan (processes).

`build_actors` is the one place that turns a placement into the orchestrator's graph and actors; `LingBotService`
runs whatever it returns.

Threads (`WorldModel`, the default for the reference model on a laptop): the graph of `stages.py`, each stage on its
own `LocalStageActor` thread of the service process, tensors passed by reference inside the process. Given a
`PartSink`, the decode stage decodes progressively (`stages.py`) and hands each part to it from its thread (on
processes, from the event loop: below).

Processes (`ProcessPlacement`: a `PlacementPlan` from `placement.plan_placement` and a picklable
`WorldModelFactory`). One `ParallelWorkerStageActor` per worker group of the plan, each the only owner of its
`ParallelWorker`, whose ranks build their part of the model with the factory (`group_stages.py`):

    plan group          orchestrator stage     consumes -> produces                 ranks
    vae_encode          encode                 condition_request -> condition       encode config's devices
    dit                 denoise                condition + control -> latent        dit config's devices
    -- decode co-located (the DiT and decode configs name the same devices and world size) --
    dit, lane 1         decode                 latent -> frames                     the same ranks (rank 0 decodes)
    -- otherwise --
    vae_decode          decode                 latent -> frames                     decode config's devices

Co-located, the DiT group's worker has two call lanes (`ParallelWorkerConfig.lanes`): the `denoise` actor owns it
and sends its calls on lane 0; the `decode` actor is the owner's `WorkerLaneActor`, whose calls run on lane 1, a
second thread of each rank (its own CUDA stream on a GPU). So chunk k decodes while chunk k + 1's DiT runs, the same
overlap as on threads (issue #32), and the CUDA contexts and the latent stay in the group.

How tensors cross (the service process only ever holds references and the final frames):

    service ──condition_request (config, image)──► encode rank 0
    encode rank 0 ──base latent: `base` channel (once per session)──► DiT rank 0 ──broadcast──► DiT ranks 1..N-1
    service ◄──condition: RemoteCondition(TensorRef)── encode          ──► DiT   (the scheduler moves the ref)
    DiT ranks: sharded denoise, all-gather of the chunk
    DiT rank 0 ──latent chunk: `latent` channel (every chunk)──► decode rank 0
    service ◄──latent: RemoteLatent(TensorRef)── DiT                   ──► decode
    (co-located: DiT rank 0 keeps the chunk's latent; the latent artifact is a `LocalLatent` (no tensor), the
    decode call on lane 1 takes the latent where it is; there is no latent channel)
    service ◄──frame parts (uint8, partial replies)── the decoding rank 0          (progressive decode)
    service ◄──frames (uint8, the call's reply)── the decoding rank 0
    (both in shared memory: with parts, views of one segment per chunk that the reply sends whole)

Progressive decode: given a `PartSink`, the decoding group decodes progressively too (`group_stages.py`): its rank
0 sends each part of a chunk as a partial reply of the decode call (`WorkerContext.parts`, the protocol in
`pipeline.process._protocol`), and the decode actor's part listener hands it to the sink on the event loop, in
order, before the call's whole-chunk reply. Parts of a call the orchestrator no longer waits for are dropped; a part
handed over stays handed over if the chunk then fails (the decode raised, or its rank died): the session fails.

A `WorkerTensorChannel` moves CPU tensors through shared memory and CUDA tensors as CUDA IPC handles. Keys are
`session/chunk/what`, so a group stage's `release(session)` discards what a failed or cancelled session left in
its channel. Capacity: `latent edge capacity x max_sessions + 1` tensors in flight (a producer never waits for a
consumer the scheduler would not also let run), a stash twice that; the stash drops its oldest entry when full, so
leftovers of a consumer that died with its releases cannot wedge it. The channels are created here, before the
groups spawn (their handles are inherited by every incarnation, so a restarted group reopens the same channel), and
`LingBotActors.close()` closes them after every group stopped.

Failures: a rank that exits, or that works on one call longer than `call_timeout_s` (stuck), kills its group; the
orchestrator fails the sessions whose state the group held, the worker restarts the group with back-off, and the
model worker is not ready until it runs again. A tensor that does not arrive within `channel_timeout_s` (half the
call timeout) fails only its call's session.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline.actor import StageActor, StageCall
from pipeline.errors import PipelineSpecError
from pipeline.lingbot.errors import ModelSessionError
from pipeline.lingbot.graph.group_stages import FramesPart, GroupOptions, GroupRole, build_group_stage
from pipeline.lingbot.graph.placement import DECODE_STAGE, DENOISE_STAGE, ENCODE_STAGE, PlacementPlan, WorkerGroupPlan
from pipeline.lingbot.graph.stages import (
    DecodeStage,
    DenoiseStage,
    EncodeStage,
    PartSink,
    lingbot_pipeline_spec,
)
from pipeline.lingbot.seam import WorldModel, WorldModelFactory
from pipeline.local_actor import LocalStageActor
from pipeline.process import (
    ParallelWorkerConfig,
    ParallelWorkerStageActor,
    PartListener,
    WorkerStatistics,
    WorkerTensorChannel,
)
from pipeline.spec import StreamingPipelineSpec

__all__ = ["LingBotActors", "ProcessPlacement", "build_actors"]


@dataclass(frozen=True, slots=True)
class ProcessPlacement:
    """Run a model worker's stages in worker processes, grouped as `plan` says, each part built by `factory`."""

    plan: PlacementPlan
    factory: WorldModelFactory
    """Picklable; called inside every rank (see `model.py` on what a checkpoint implements to run sharded)."""
    max_sessions: int = 1
    """Sessions the model worker holds at once: sizes the channels."""
    call_timeout_s: float = 60.0
    """A rank that works on one call longer than this is stuck: its group is killed and restarted."""
    start_timeout_s: float = 120.0
    """How long a group's ranks have to build their stages (load their weights) and report ready, at start and after
    each restart (the service's `LINGSTREAM_WORKER_START_TIMEOUT`)."""
    stop_timeout_s: float = 10.0
    """How long a stopping group may finish its calls before its ranks are terminated."""
    restart_backoff_initial_s: float = 0.5
    restart_backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.plan, PlacementPlan):
            raise PipelineSpecError(f"plan must be a PlacementPlan, got {type(self.plan).__name__}")
        if not isinstance(self.factory, WorldModelFactory):
            raise PipelineSpecError(f"factory must be a WorldModelFactory, got {type(self.factory).__name__}")
        if self.max_sessions < 1:
            raise PipelineSpecError(f"max_sessions must be at least 1, got {self.max_sessions}")
        for name in ("call_timeout_s", "start_timeout_s", "stop_timeout_s", "restart_backoff_initial_s"):
            if not getattr(self, name) > 0:
                raise PipelineSpecError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.restart_backoff_max_s < self.restart_backoff_initial_s:
            raise PipelineSpecError("restart_backoff_max_s is below restart_backoff_initial_s")

    @property
    def channel_timeout_s(self) -> float:
        """How long a rank waits for a tensor (or for channel room): half the call timeout, so a tensor that never
        comes fails its call with a message naming it before the watchdog would take the group for stuck."""
        return self.call_timeout_s / 2


@dataclass(frozen=True, slots=True)
class LingBotActors:
    """The graph and actors of one model worker, ready for a `StreamingPipelineOrchestrator`."""

    spec: StreamingPipelineSpec
    actors: Mapping[str, StageActor]
    denoise_stage: str
    """The stage whose results refill the session's condition prefetch (the one that runs the DiT)."""
    workers: Mapping[str, ParallelWorkerStageActor] = field(default_factory=dict)
    """The process groups' owning actors by stage (empty for threads): `encode`, `denoise` and, when decode has a
    group of its own, `decode` (co-located, the `decode` actor is the DiT group's lane view, not an owner)."""
    channels: tuple[WorkerTensorChannel, ...] = ()
    progressive_decode: bool = False
    """Whether the decode stage hands chunks over in parts: a sink was given and, on threads, the decoder is a
    `ProgressiveDecoder` (on processes the decoder lives in the worker: a decoder without `decode_parts` there sends
    no parts, and its chunks come whole; both built-in models' decoders decode in parts)."""

    def worker_statistics(self) -> dict[str, WorkerStatistics]:
        """Each process actor's worker snapshot (process ids, incarnation, ...), by stage."""
        return {stage: actor.worker_statistics() for stage, actor in self.workers.items()}

    def close(self) -> None:
        """Close the service process's ends of the channels; call it after every actor stopped."""
        for channel in self.channels:
            channel.close()


def build_actors(
    model: WorldModel | ProcessPlacement, edge_capacity: int = 2, *, on_part: PartSink | None = None
) -> LingBotActors:
    """Threads for a `WorldModel`, worker processes for a `ProcessPlacement` (module docstring); `on_part`: decode
    progressively into it (called on the decode thread for threads, on the event loop for processes)."""
    if isinstance(model, ProcessPlacement):
        return _process_actors(model, edge_capacity, on_part)
    decode = DecodeStage(model.decoder, on_part)
    actors: dict[str, StageActor] = {
        ENCODE_STAGE: LocalStageActor(ENCODE_STAGE, EncodeStage(model.encoder)),
        DENOISE_STAGE: LocalStageActor(DENOISE_STAGE, DenoiseStage(model.denoiser)),
        DECODE_STAGE: LocalStageActor(DECODE_STAGE, decode),
    }
    spec = lingbot_pipeline_spec(edge_capacity)
    return LingBotActors(spec, actors, DENOISE_STAGE, progressive_decode=decode.progressive)


def _process_actors(placement: ProcessPlacement, edge_capacity: int, on_part: PartSink | None) -> LingBotActors:
    plan = placement.plan
    in_flight = edge_capacity * placement.max_sessions + 1
    timeout = placement.channel_timeout_s
    base = WorkerTensorChannel(
        "base_latent",
        capacity=placement.max_sessions + 1,
        stash_size=2 * (placement.max_sessions + 1),
        send_timeout_s=timeout,
        receive_timeout_s=timeout,
    )
    latent = None
    if not plan.decode_colocated:
        latent = WorkerTensorChannel(
            "latent", capacity=in_flight, stash_size=2 * in_flight, send_timeout_s=timeout, receive_timeout_s=timeout
        )
    colocated = plan.decode_colocated
    dit_role = GroupRole.DENOISE_DECODE if colocated else GroupRole.DENOISE
    decoding_group = DENOISE_STAGE if colocated else DECODE_STAGE  # the worker whose rank 0 decodes
    roles = [
        (plan.group_of(ENCODE_STAGE), ENCODE_STAGE, GroupRole.ENCODE),
        (plan.group_of(DENOISE_STAGE), DENOISE_STAGE, dit_role),
    ]
    if not colocated:
        roles.append((plan.group_of(DECODE_STAGE), DECODE_STAGE, GroupRole.DECODE))
    workers: dict[str, ParallelWorkerStageActor] = {}
    for group, stage, role in roles:
        runtime = plan.stage(group.stages[0]).runtime
        progressive = on_part is not None and stage == decoding_group
        options = GroupOptions(role, placement.factory, runtime.dtype, base, latent, timeout, progressive)
        lanes = 2 if role is GroupRole.DENOISE_DECODE else 1
        config = _worker_config(placement, group, runtime.torch_threads, options, lanes)
        workers[stage] = ParallelWorkerStageActor(config)
    if on_part is not None:
        workers[decoding_group].add_part_listener(_forward_parts(on_part))
    actors: dict[str, StageActor] = dict(workers)
    if colocated:
        actors[DECODE_STAGE] = workers[DENOISE_STAGE].lane_actor(DECODE_STAGE)
    channels = (base,) if latent is None else (base, latent)
    spec = lingbot_pipeline_spec(edge_capacity)
    return LingBotActors(spec, actors, DENOISE_STAGE, workers, channels, progressive_decode=on_part is not None)


def _forward_parts(sink: PartSink) -> PartListener:
    """The decode actor's part listener: each `FramesPart` of a call to the sink, on the loop."""

    def listener(call: StageCall, part: object) -> None:
        if not isinstance(part, FramesPart):
            raise ModelSessionError(f"the decode group sent a {type(part).__name__}, not a FramesPart")
        sink(call.session_id, part.chunk_index, part.offset, part.frames)

    return listener


def _worker_config(
    placement: ProcessPlacement, group: WorkerGroupPlan, torch_threads: int, options: GroupOptions, lanes: int
) -> ParallelWorkerConfig:
    return ParallelWorkerConfig(
        name=group.name,
        lanes=lanes,
        stage_factory=build_group_stage,
        devices=group.devices,
        torch_threads=torch_threads,
        options={"group": options},
        # The model code the factory builds the parts with, imported once by the forkserver, not by every rank.
        preload=(type(placement.factory).__module__,),
        start_timeout_s=placement.start_timeout_s,
        stop_timeout_s=placement.stop_timeout_s,
        call_timeout_s=placement.call_timeout_s,
        restart_backoff_initial_s=placement.restart_backoff_initial_s,
        restart_backoff_max_s=placement.restart_backoff_max_s,
    )
