"""The LingBot pipeline graph and its three stages over the `WorldModel` seam.

    condition_request ─► encode ─► condition ─► denoise ◄─ control
                                                  │
                                                latent ─► decode ─► frames (output)

The graph is the same on every placement. When decode is co-located in the DiT's worker group (`processes`
placement, `pipeline.lingbot.graph.actors`), `denoise` and `decode` are two stages of that one group, the decode's
calls on the group's second lane (beside the next chunk's DiT call), and the `latent` artifact carries no tensor:
the latent stays in the group's rank 0 (`group_stages.LocalLatent`).

Every edge is bounded (capacity 2 is the reference value) and `latency_anchor_artifact = "control"`, so a
prefetched condition never starts the control-to-output clock. The reference-image prefix is encoded once, by the
encode stage's call for chunk 0; that call's `condition` carries the base latent (and the session config) to the
denoise side, where it stays resident in the denoiser's session cache. Every later `condition` carries only the
`ChunkCondition` (chunk_index, chunk_size). The denoise stage owns the session's camera (`CameraController`):
it turns each control snapshot into the chunk's `CameraChunk` (the camera contract both models read, `camera.py`)
in chunk order, so pose and pitch persist across chunks, and hands the denoiser the chunk's prompt from the same
`control` artifact. Each stage releases its
model part's per-session cache in `release`.

Progressive decode: given a `PartSink` and a decoder that is a `ProgressiveDecoder`, the decode stage decodes a
chunk one latent frame at a time and hands each part's frames (HUD drawn) to the sink from its thread as soon as it
is decoded (in a worker process, the sink sends each part to the service process: `group_stages.py`); its `frames`
artifact still carries the whole chunk, so the graph, the scheduler and everything after the
session see whole chunks as before. A part handed over is never taken back: if the chunk fails after it, the
session fails.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

from pipeline.actor import StageCall
from pipeline.lingbot.camera import CameraController
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ModelSessionError
from pipeline.lingbot.history import ChunkHistory, ChunkRecord
from pipeline.lingbot.hud import draw_hud
from pipeline.lingbot.seam import (
    ChunkCondition,
    ChunkDecoder,
    ChunkDenoiser,
    HistoricDenoiser,
    ProgressiveDecoder,
    ReferenceEncoder,
    ReseedableDecoder,
    ReseedableDenoiser,
)
from pipeline.lingbot.stage_timer import StageTimer, timer_for
from pipeline.spec import StreamingEdgeSpec, StreamingPipelineSpec, StreamingStageSpec

__all__ = [
    "CONDITION_REQUEST",
    "CONTROL",
    "FRAMES",
    "ConditionArtifact",
    "ConditionRequest",
    "ControlArtifact",
    "DecodeStage",
    "DenoiseStage",
    "EncodeStage",
    "FramesArtifact",
    "LatentArtifact",
    "PartSink",
    "lingbot_pipeline_spec",
]

CONDITION_REQUEST = "condition_request"
CONTROL = "control"
FRAMES = "frames"
"""The one stage of a DiT worker group that also decodes (decode co-located by the placement plan)."""


@dataclass(frozen=True, slots=True)
class ConditionRequest:
    """External input of the encode stage. The session's first request (chunk 0, or the chunk a re-seeded session
    starts at: `resume`) carries the config and the reference image."""

    chunk_index: int
    chunk_size: int
    config: LingBotSessionConfig | None = None
    image: torch.Tensor | None = None
    resume: ResumePoint | None = None
    """A re-seeded session's start (docs/continuity.md): the chunk and the camera pose it goes on from."""


@dataclass(frozen=True, slots=True)
class ConditionArtifact:
    condition: ChunkCondition
    base_latent: torch.Tensor | None = None  # only for the session's first chunk: handed to the denoise side once
    config: LingBotSessionConfig | None = None  # only for the first chunk
    resume: ResumePoint | None = None  # only for the first chunk of a re-seeded session


@dataclass(frozen=True, slots=True)
class ControlArtifact:
    """External input of the denoise stage: the control snapshot and text prompt chunk `chunk_index` is generated
    from ("" for no prompt; the denoiser caches its encoding per distinct prompt, see `model.py`)."""

    chunk_index: int
    snapshot: ControlSnapshot
    reset_pose: bool = False
    prompt: str = ""


@dataclass(frozen=True, slots=True)
class LatentArtifact:
    chunk_index: int
    latent: torch.Tensor
    snapshot: ControlSnapshot
    config: LingBotSessionConfig | None = None  # only for the session's first chunk (0, or a re-seed's first)
    denoise_s: float = 0.0
    """Seconds the denoiser took for this chunk (reported in the chunk's timings as `denoise`)."""
    record: ChunkRecord | None = None
    """A model with history: what its re-seed needs of this chunk besides the latent (`HistoricDenoiser`)."""
    prime: torch.Tensor | None = None
    """A re-seed's first chunk: the latent frames before it, for the decoder's causal state (`ReseedableDecoder`)."""


@dataclass(frozen=True, slots=True)
class FramesArtifact:
    chunk_index: int
    frames: npt.NDArray[np.uint8]
    snapshot: ControlSnapshot
    timings: Mapping[str, float] = field(default_factory=dict)
    """Seconds the stages measured for this chunk (`denoise`, `decode`, and with decode in its own worker group
    `latent_channel`: moving the latent between the groups), added to the chunk's `timings`."""
    history: ChunkHistory | None = None
    """A model with history: the chunk's record and its latent on the CPU, for the session's checkpoint."""


PartSink = Callable[[str, int, int, npt.NDArray[np.uint8]], None]
"""`sink(session_id, chunk_index, offset, frames)`: frames `offset ..` of a chunk, decoded ahead of the whole chunk.
Called in order, on the decode stage's thread (threads placement) or on the event loop (processes placement, where
a worker process's decode stage sends the parts as partial replies: `pipeline.lingbot.graph.group_stages`); it must not
block."""


def lingbot_pipeline_spec(edge_capacity: int = 2, output_capacity: int = 2) -> StreamingPipelineSpec:
    """The LingBot graph (module docstring), the same on every placement."""
    return StreamingPipelineSpec(
        stages=(
            StreamingStageSpec("encode", consumes=(CONDITION_REQUEST,), produces=("condition",)),
            StreamingStageSpec("denoise", consumes=("condition", CONTROL), produces=("latent",)),
            StreamingStageSpec("decode", consumes=("latent",), produces=(FRAMES,)),
        ),
        edges=(
            StreamingEdgeSpec(CONDITION_REQUEST, target="encode", capacity=edge_capacity),
            StreamingEdgeSpec("condition", target="denoise", source="encode", capacity=edge_capacity),
            StreamingEdgeSpec(CONTROL, target="denoise", capacity=edge_capacity),
            StreamingEdgeSpec("latent", target="decode", source="denoise", capacity=edge_capacity),
        ),
        outputs=(FRAMES,),
        output_capacity=output_capacity,
        latency_anchor_artifact=CONTROL,
    )


class EncodeStage:
    """VAE encode: encodes the reference prefix once per session (chunk 0), then only names chunks."""

    def __init__(self, encoder: ReferenceEncoder) -> None:
        self._encoder = encoder

    def process(self, call: StageCall) -> Mapping[str, object]:
        request = call.inputs[CONDITION_REQUEST]
        if not isinstance(request, ConditionRequest):
            raise ModelSessionError(f"encode expects a ConditionRequest, got {type(request).__name__}")
        condition = ChunkCondition(request.chunk_index, request.chunk_size)
        if request.config is None:
            if request.chunk_index == 0:
                raise ModelSessionError("the chunk 0 condition request must carry the session config")
            return {"condition": ConditionArtifact(condition)}
        # The session's first request here: chunk 0, or the first chunk of a re-seeded session.
        self._encoder.create_cache(call.session_id, request.config)
        base = self._encoder.encode_reference(call.session_id, request.image)
        return {"condition": ConditionArtifact(condition, base, request.config, request.resume)}

    def release(self, session_id: str) -> None:
        self._encoder.release_cache(session_id)


class DenoiseStage:
    """DiT denoise: keeps the base latent resident (in the denoiser) and the session's camera (here). Its `denoise`
    timing is `timer`'s (default: CUDA events when the denoiser names a CUDA device, `stage_timer.py`)."""

    def __init__(self, denoiser: ChunkDenoiser, timer: StageTimer | None = None) -> None:
        self._denoiser = denoiser
        self._timer = timer if timer is not None else timer_for(denoiser)
        self._cameras: dict[str, CameraController] = {}
        self._configs: dict[str, LingBotSessionConfig] = {}
        self._lock = threading.Lock()  # process() and release() run on one thread; statistics may read

    def process(self, call: StageCall) -> Mapping[str, object]:
        condition = call.inputs["condition"]
        control = call.inputs[CONTROL]
        if not isinstance(condition, ConditionArtifact) or not isinstance(control, ControlArtifact):
            raise ModelSessionError("denoise expects a ConditionArtifact and a ControlArtifact")
        index = condition.condition.chunk_index
        if control.chunk_index != index:
            raise ModelSessionError(f"control for chunk {control.chunk_index} joined condition {index}")
        sid = call.session_id
        if condition.base_latent is not None:
            config = condition.config
            if config is None:
                raise ModelSessionError("the chunk 0 condition carries no config")
            fresh = CameraController(config.pose_steps(), config.camera_intrinsics())
            resume = condition.resume
            if resume is None:
                self._denoiser.create_cache(sid, config, condition.base_latent)
            elif isinstance(self._denoiser, ReseedableDenoiser):
                self._denoiser.reseed_cache(sid, config, condition.base_latent, resume)
                fresh.resume_at(resume.pose, resume.chunk_index)
            else:
                raise ModelSessionError(f"this model's denoiser cannot re-seed session {sid!r} (chunk {index})")
            with self._lock:
                self._configs[sid] = config
                self._cameras[sid] = fresh
        with self._lock:
            camera = self._cameras.get(sid)
            config_or_none = self._configs.get(sid)
        if camera is None or config_or_none is None:
            raise ModelSessionError(f"session {sid!r} has no denoise cache (chunk 0 never ran here)")
        if control.reset_pose:
            camera.reset_pose()
        chunk = camera.chunk_control(control.snapshot, index, condition.condition.chunk_size)
        span = self._timer.start()
        latent = self._denoiser.denoise_chunk(
            sid, index, condition.condition.chunk_size, chunk.camera, prompt=control.prompt
        )
        denoise_s = span.stop()
        first = condition.base_latent is not None
        record = self._denoiser.chunk_record(sid) if isinstance(self._denoiser, HistoricDenoiser) else None
        history = condition.resume.history if first and condition.resume is not None else None
        prime = history.prime(index) if history is not None else None
        config = condition.config if first else None
        return {"latent": LatentArtifact(index, latent, control.snapshot, config, denoise_s, record, prime)}

    def release(self, session_id: str) -> None:
        with self._lock:
            self._cameras.pop(session_id, None)
            self._configs.pop(session_id, None)
        self._denoiser.release_cache(session_id)


class DecodeStage:
    """VAE decode: latent chunk → uint8 RGB frames, with the optional HUD of the applied keys; progressive (one part per
    latent frame to `on_part`, the module docstring) when given a sink and a `ProgressiveDecoder`. Its `decode` timing
    is `timer`'s (default: CUDA events when the decoder names a CUDA device, `stage_timer.py`)."""

    def __init__(self, decoder: ChunkDecoder, on_part: PartSink | None = None, timer: StageTimer | None = None) -> None:
        self._decoder = decoder
        self._timer = timer if timer is not None else timer_for(decoder)
        self._on_part = on_part if isinstance(decoder, ProgressiveDecoder) else None
        self._hud: dict[str, bool] = {}

    @property
    def progressive(self) -> bool:
        """Whether chunks are decoded in parts handed to the sink."""
        return self._on_part is not None

    def process(self, call: StageCall) -> Mapping[str, object]:
        latent = call.inputs["latent"]
        if not isinstance(latent, LatentArtifact):
            raise ModelSessionError(f"decode expects a LatentArtifact, got {type(latent).__name__}")
        sid = call.session_id
        if latent.config is not None:  # the session's first chunk here: 0, or a re-seeded session's first
            if latent.chunk_index == 0:
                self._decoder.create_cache(sid, latent.config)
            elif isinstance(self._decoder, ReseedableDecoder):
                self._decoder.reseed_cache(sid, latent.config, latent.chunk_index, latent.prime)
            else:
                raise ModelSessionError(
                    f"this model's decoder cannot re-seed session {sid!r} (chunk {latent.chunk_index})"
                )
            self._hud[sid] = latent.config.hud
        span = self._timer.start()
        if self._on_part is not None and isinstance(self._decoder, ProgressiveDecoder):
            array = self._decode_parts(self._decoder, self._on_part, sid, latent)
        else:
            array = self._frames(sid, self._decoder.decode_chunk(sid, latent.chunk_index, latent.latent), latent)
        decode_s = span.stop()
        timings = {"denoise": latent.denoise_s, "decode": decode_s}
        history = None
        if latent.record is not None:  # a copy on the CPU, after the decode: off the DiT's path
            history = ChunkHistory(latent.record, latent.latent.detach().to("cpu", torch.float32, copy=True))
        return {FRAMES: FramesArtifact(latent.chunk_index, array, latent.snapshot, timings, history)}

    def _decode_parts(
        self, decoder: ProgressiveDecoder, sink: PartSink, sid: str, latent: LatentArtifact
    ) -> npt.NDArray[np.uint8]:
        parts: list[npt.NDArray[np.uint8]] = []
        offset = 0
        for frames in decoder.decode_parts(sid, latent.chunk_index, latent.latent):
            part = self._frames(sid, frames, latent)
            sink(sid, latent.chunk_index, offset, part)
            parts.append(part)
            offset += len(part)
        if not parts:
            raise ModelSessionError(f"decode: chunk {latent.chunk_index} decoded to no parts")
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _frames(self, sid: str, frames: torch.Tensor, latent: LatentArtifact) -> npt.NDArray[np.uint8]:
        if self._hud.get(sid, False):
            frames = draw_hud(frames, latent.snapshot)
        return np.ascontiguousarray(frames.cpu().numpy(), dtype=np.uint8)

    def release(self, session_id: str) -> None:
        self._hud.pop(session_id, None)
        self._decoder.release_cache(session_id)
