"""LingBot-World-Fast behind the `WorldModel` seam: our DiT, diffusers' Wan VAE, the umt5 encoder, the Fast sampler
and the rolling KV cache, as the three stages the session graph places (`pipeline/lingbot/seam.py`).

    encode   LingBotFastEncoder   the reference (or the built-in scene) and its zero frames -> normalised latent y
    denoise  LingBotFastDenoiser  per chunk: condition = first-frame mask + y's frames, the camera -> 384-channel
                                  Plücker map (`camera.plucker_map`), the prompt's text K/V, 4 Fast steps + the clean
                                  cache pass
    decode   LingBotFastDecoder   latents -> uint8 frames, the session's VAE feature cache carried between chunks

Per session the denoiser keeps the base latent, its `KVCache` (window + sink, re-based past the RoPE table so a
session never ends for lack of positions), its camera rays for the Plücker map, the current prompt's `TextKV` and a
generator seeded from the session's seed (the chunk noise and the sampler's re-noising, drawn in order, so a seed
and a control trace give the same video). The umt5 states are cached per distinct prompt per worker (`text.py`).

`LingBotFastWorldModel.load(options, device)` builds all three in one process sharing one VAE (threads placement);
`LingBotFastFactory(options)` builds each inside the worker process that runs it (processes placement). There the
DiT group may have P ranks (`LINGSTREAM_DENOISE_RANKS`): every rank builds a denoiser whose DiT is rank `shard.rank`
of a Ulysses layout (`parallel.py`); only rank 0 loads the umt5 encoder and broadcasts a new prompt's states to the
others; every rank runs the same seeded sampler on the gathered velocity, so every rank's chunk is rank 0's. Start-up
checks the directory first (`bundle.check_model_dir`), so a bad checkpoint fails at start with its problem named, and
a group size that does not divide the heads is refused there too (`check_parallel`).

Concurrency: each stage object is driven by one actor thread; sessions' states are independent. The shared VAE has
no state of its own between calls (the caches are per session), so the encode and decode threads may use it at once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import torch

from pipeline.lingbot.camera import CameraChunk, CameraController, map_rays, plucker_map
from pipeline.lingbot.chunks import ChunkPlan
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import ResumePoint
from pipeline.lingbot.errors import ModelInputError, ModelSessionError
from pipeline.lingbot.history import ChunkHistory, ChunkRecord, HistorySpec
from pipeline.lingbot.models.attention import attention_capability, select_attention
from pipeline.lingbot.models.bundle import (
    DIT_DIR,
    TEXT_ENCODER_DIR,
    TOKENIZER_DIR,
    VAE_DIR,
    LingBotFastOptions,
    check_model_dir,
    read_dit_config,
)
from pipeline.lingbot.models.cache import CacheStatistics, KVCache, TextKV
from pipeline.lingbot.models.checkpoint import load_dit
from pipeline.lingbot.models.compiled import compile_blocks
from pipeline.lingbot.models.dit import LingBotFastDiT
from pipeline.lingbot.models.errors import ModelConfigError
from pipeline.lingbot.models.memory_plan import PLAN_HEIGHT, PLAN_WIDTH
from pipeline.lingbot.models.parallel import SINGLE_RANK, Ulysses, check_parallel
from pipeline.lingbot.models.sampler import denoise_chunk, prefill_chunk
from pipeline.lingbot.models.text import UMT5TextEncoder, load_text_encoder
from pipeline.lingbot.models.tiny_decoder import TINY_DECODER_DIR, StreamingTinyDecoder, load_tiny_decoder
from pipeline.lingbot.models.vae import StreamingVAE, load_vae
from pipeline.lingbot.models.warmup import WarmUp, warm_up_config, warm_up_controls, warm_up_latent
from pipeline.lingbot.reference.model import default_scene
from pipeline.lingbot.seam import (
    LATENT_CHANNELS,
    ModelShard,
    first_frame_mask,
    slice_condition,
    validate_base_latent,
    validate_control,
    validate_latent_chunk,
)
from pipeline.lingbot.stage_sessions import SessionTable, StageStatistics, check_chunk_order
from pipeline.lingbot.stage_timer import stage_timer

__all__ = [
    "MASK_CHANNELS",
    "LingBotFastDecoder",
    "LingBotFastDenoiser",
    "LingBotFastEncoder",
    "LingBotFastFactory",
    "LingBotFastWorldModel",
    "StreamingDecoder",
    "load_streaming_decoder",
    "load_streaming_vae",
]

logger = logging.getLogger(__name__)

MASK_CHANNELS = 4
"""The first-frame mask's channels: the 4 video frames a latent frame folds."""


# --- encode ----------------------------------------------------------------------------------------------------------


class LingBotFastEncoder:
    """`ReferenceEncoder`: the reference image (or the built-in scene for `None`) and zero frames through the VAE."""

    def __init__(self, vae: StreamingVAE, *, max_prefix_frames: int) -> None:
        self._vae = vae
        self._max_prefix_frames = max_prefix_frames
        self._sessions: SessionTable[LingBotSessionConfig] = SessionTable("encode")

    def create_cache(self, session_id: str, config: LingBotSessionConfig) -> None:
        self._sessions.add(session_id, config)

    def release_cache(self, session_id: str) -> None:
        self._sessions.remove(session_id)

    def statistics(self) -> StageStatistics:
        return self._sessions.statistics()

    def encode_reference(self, session_id: str, image: torch.Tensor | None) -> torch.Tensor:
        config = self._sessions.get(session_id)
        started = time.perf_counter()
        if image is None:
            image = default_scene(config.width, config.height)
        expected = (3, config.height, config.width)
        if tuple(image.shape) != expected:
            raise ModelInputError(f"reference image must be {list(expected)}, got {list(image.shape)}")
        if not image.is_floating_point() or not bool(torch.isfinite(image).all()):
            raise ModelInputError("reference image must be a finite floating-point tensor in [0, 1]")
        prefix = self._vae.encode_reference(image, max_prefix_frames=self._max_prefix_frames)
        if self._vae.device.type == "cuda":
            # The prefix encode's transient (2.7 GB at 832x480, bf16) is done with: hand the allocator's cached
            # blocks back, so the sessions' caches, not an encode's leftovers, decide what else fits.
            torch.cuda.empty_cache()
        self._sessions.record(time.perf_counter() - started)
        return prefix.latent


# --- denoise ---------------------------------------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class _DenoiseSession:
    config: LingBotSessionConfig
    plan: ChunkPlan
    base_latent: torch.Tensor
    cache: KVCache
    rays: torch.Tensor  # the camera rays pixel-unshuffled (`camera.map_rays`), on the DiT's device
    generator: torch.Generator
    prompt: str | None = None
    text: TextKV | None = None
    next_chunk: int = 0
    record: ChunkRecord | None = None  # the newest chunk's, for its history (`chunk_record`)


class LingBotFastDenoiser:
    """`ChunkDenoiser`: one chunk of latent frames per call over the session's KV cache (module docstring). Under
    Ulysses (`dit.parallel`), `text_encoder` is rank 0's only (None on the other ranks)."""

    def __init__(self, dit: LingBotFastDiT, text_encoder: UMT5TextEncoder | None, options: LingBotFastOptions) -> None:
        if (text_encoder is None) != (dit.parallel.rank > 0):
            raise ModelConfigError("the umt5 encoder runs on rank 0 of the DiT group, and only there")
        if text_encoder is not None and text_encoder.text_dim != dit.config.text_dim:
            raise ModelConfigError(
                f"the text encoder's width {text_encoder.text_dim} is not the DiT's text_dim {dit.config.text_dim}"
            )
        self._dit = dit
        self._text_encoder = text_encoder
        self._options = options
        self._sessions: SessionTable[_DenoiseSession] = SessionTable("denoise")
        self._timer = stage_timer(dit.device)  # CUDA events on a GPU: the call's time is its kernels' time
        self._warmed_up: WarmUp | None = None

    @property
    def dit(self) -> LingBotFastDiT:
        return self._dit

    @property
    def device(self) -> torch.device:
        return self._dit.device

    @property
    def warmed_up(self) -> WarmUp | None:
        """The last `warm_up` (None: none ran)."""
        return self._warmed_up

    def ready_report(self) -> WarmUp | None:
        """`pipeline.process.ReportsReady`: on the processes placement, the warm-up reaches the service this way."""
        return self._warmed_up

    def statistics(self) -> StageStatistics:
        return self._sessions.statistics()

    def cache_statistics(self, session_id: str) -> CacheStatistics:
        """The session's `CacheStatistics` (eviction, re-bases, bytes)."""
        return self._sessions.get(session_id).cache.statistics()

    def create_cache(self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor) -> None:
        self._sessions.add(session_id, self._new_state(config, base_latent))

    def _new_state(self, config: LingBotSessionConfig, base_latent: torch.Tensor) -> _DenoiseSession:
        validate_base_latent(base_latent, config)
        device = self._dit.device
        cache_config = self._options.cache_config(config.chunk_size)
        cache = self._dit.new_cache(cache_config, config.latent_height, config.latent_width)
        generator = torch.Generator(device=device).manual_seed(config.seed)
        return _DenoiseSession(
            config=config,
            plan=config.chunk_plan,
            base_latent=base_latent.detach().to(device, torch.float32).clone(),
            cache=cache,
            rays=map_rays(config.camera_intrinsics(), device),
            generator=generator,
        )

    def history_spec(self, config: LingBotSessionConfig) -> HistorySpec:
        """`HistoricDenoiser`: the chunks a session's history keeps: the sink's chunks and the window's, plus
        `options.history_lookback_chunks` before them (without a window: every chunk the cache can hold)."""
        cache = self._options.cache_config(config.chunk_size)
        return HistorySpec.for_cache(
            cache.chunk_frames,
            cache.window_frames,
            cache.sink,
            cache.capacity_frames,
            self._options.history_lookback_chunks,
        )

    def chunk_record(self, session_id: str) -> ChunkRecord | None:
        """`HistoricDenoiser`: the newest chunk's record (its camera, prompt and the generator's state after it)."""
        return self._sessions.get(session_id).record

    def reseed_cache(
        self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor, resume: ResumePoint
    ) -> None:
        """`ReseedableDenoiser`: go on at `resume.chunk_index`. With a history (`resume.history`) the KV cache is
        rebuilt by a prefill: each chunk's clean pass replayed in order over its latent, camera and prompt, at its
        own positions (`sampler.prefill_chunk`), skipping the chunks the history lacks (`KVCache.skip_to`); the
        generator takes its state after the newest chunk. A history holding every chunk since 0 rebuilds the cache
        and the generator exactly, so the session goes on with the frames it would have made; after the ring turned,
        close (docs/continuity.md). Without one, an empty cache whose positions continue the session's
        (`KVCache.continue_at`) and a generator seeded for the chunk: the chunk attends to itself only, and the
        picture goes on from the reference and the camera's pose. Under Ulysses every rank replays alike."""
        state = self._new_state(config, base_latent)
        start = resume.chunk_index
        check_chunk_order("denoise", state.plan, start, state.plan.chunk_size, start)
        history = [] if resume.history is None else [c for c in resume.history.chunks if c.chunk_index < start]
        started = time.perf_counter()
        for chunk in history:
            self._prefill(state, chunk)
        if state.cache.statistics().chunks < start:
            state.cache.skip_to(start, start * state.plan.chunk_size)
        newest = history[-1] if history else None
        if newest is None or newest.chunk_index != start - 1 or not self._restore_generator(state, newest.record):
            state.generator.manual_seed((config.seed * 1_000_003 + start) % (2**63))
        state.next_chunk = start
        self._sessions.add(session_id, state)
        if history:
            logger.info(
                "re-seeded at chunk %d with %d chunk(s) of history (%s) in %.3f s",
                start,
                len(history),
                "complete" if resume.history is not None and resume.history.complete else "incomplete",
                time.perf_counter() - started,
            )

    def _prefill(self, state: _DenoiseSession, chunk: ChunkHistory) -> None:
        index = chunk.chunk_index
        frames = int(chunk.latent.shape[1])
        validate_latent_chunk(chunk.latent, state.config, frames)
        first_frame = index * state.plan.chunk_size
        if state.cache.statistics().chunks < index:
            state.cache.skip_to(index, first_frame)
        text = self._text(state, chunk.record.prompt)
        device = self._dit.device
        with torch.inference_mode():
            condition = self._condition(state, index, frames)
            camera = plucker_map(chunk.record.camera, state.rays)
            x0 = chunk.latent.to(device, torch.float32)[None]
        prefill_chunk(self._dit, state.cache, text, condition, x0, camera)

    def _restore_generator(self, state: _DenoiseSession, record: ChunkRecord) -> bool:
        """The generator at its state after `record`'s chunk; False where that state is not this device's kind (a
        checkpoint written on another device type)."""
        try:
            state.generator.set_state(torch.frombuffer(bytearray(record.generator_state), dtype=torch.uint8))
        except (RuntimeError, ValueError) as exc:
            logger.warning("the checkpoint's generator state does not fit this device (%s): seeded for the chunk", exc)
            return False
        return True

    def release_cache(self, session_id: str) -> None:
        self._sessions.remove(session_id)

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        state = self._sessions.get(session_id)
        span = self._timer.start()
        result = self._denoise(state, chunk_index, chunk_size, control, prompt)
        self._sessions.record(span.stop())
        return result

    def warm_up(self, config: LingBotSessionConfig, chunks: int) -> WarmUp:
        """Runs `chunks` chunks of a throwaway session of `config` (the camera walking and turning, the session's
        prompt), so that compiled code and kernels for its shapes exist before the worker reports ready
        (`warmup.py`). Leaves nothing behind: the session is no table's, its cache and generator are dropped, the
        statistics do not count it; only the prompt's umt5 states stay in the per-worker text cache. Under Ulysses
        every rank must call it alike (the forwards' collectives). Returns what it did."""
        started = time.perf_counter()
        state = self._new_state(config, warm_up_latent(config, self._dit.device))
        camera = CameraController(config.pose_steps(), config.camera_intrinsics())
        for index in range(chunks):
            control = camera.chunk_control(warm_up_controls(index), index, config.chunk_size).camera
            self._denoise(state, index, config.chunk_size, control, config.prompt)
        if self._dit.device.type == "cuda":
            torch.cuda.synchronize(self._dit.device)
        del state
        self._warmed_up = WarmUp(chunks, time.perf_counter() - started, f"{config.width}x{config.height}")
        return self._warmed_up

    def _denoise(
        self, state: _DenoiseSession, chunk_index: int, chunk_size: int, control: CameraChunk, prompt: str
    ) -> torch.Tensor:
        check_chunk_order("denoise", state.plan, chunk_index, chunk_size, state.next_chunk)
        validate_control(control, state.config, chunk_size)
        device = self._dit.device
        text = self._text(state, prompt)
        with torch.inference_mode():
            condition = self._condition(state, chunk_index, chunk_size)
            camera = plucker_map(control, state.rays)
            h, w = state.config.latent_height, state.config.latent_width
            noise = torch.randn(
                (1, self._dit.config.out_dim, chunk_size, h, w),
                generator=state.generator,
                device=device,
                dtype=torch.float32,
            )
        x0 = denoise_chunk(self._dit, state.cache, text, condition, noise, state.generator, camera)
        result = x0[0].contiguous()
        state.next_chunk += 1
        state.record = ChunkRecord(
            chunk_index, control, prompt, bytes(state.generator.get_state().numpy()), self.history_spec(state.config)
        )
        return result

    def _text(self, state: _DenoiseSession, prompt: str) -> TextKV:
        if state.text is None or prompt != state.prompt:
            state.text = self._dit.encode_text(self._prompt_states(prompt))
            state.prompt = prompt
        return state.text

    def _condition(self, state: _DenoiseSession, chunk_index: int, chunk_size: int) -> torch.Tensor:
        """The chunk's condition `[1, 20, F, h, w]`: the first-frame mask, then the base latent's frames."""
        latent_image = slice_condition(state.base_latent, chunk_index, chunk_size)
        mask = first_frame_mask(chunk_index, chunk_size, self._dit.device).to(torch.float32)
        mask = mask[None, :, None, None].expand(MASK_CHANNELS, -1, *latent_image.shape[2:])
        return torch.cat([mask, latent_image], dim=0)[None]

    def _prompt_states(self, prompt: str) -> torch.Tensor:
        """The umt5 states of `prompt`: encoded on rank 0 and broadcast to the DiT group's other ranks (every rank
        asks for the same prompt in the same call). A failure on rank 0 fails the call on every rank."""
        parallel = self._dit.parallel
        if not parallel.parallel:
            assert self._text_encoder is not None
            return self._text_encoder.encode(prompt)
        states: torch.Tensor | None = None
        failure: Exception | None = None
        if self._text_encoder is not None:
            try:
                states = self._text_encoder.encode(prompt)
            except Exception as exc:  # re-raised below, after telling the other ranks
                failure = exc
        if not parallel.rank0_succeeded(failure is None, self._dit.device):
            if failure is not None:
                raise failure
            raise ModelSessionError("rank 0 of the DiT group could not encode the prompt")
        config = self._dit.config
        return parallel.broadcast(states, (1, config.text_len, config.text_dim), self._dit.dtype, self._dit.device)


# --- decode ----------------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _DecodeSession:
    config: LingBotSessionConfig
    plan: ChunkPlan
    next_chunk: int = 0


class StreamingDecoder(Protocol):
    """What `LingBotFastDecoder` decodes with: the Wan VAE (`StreamingVAE`) or the tiny decoder
    (`StreamingTinyDecoder`), each with per-session state and the same frame contract (`decode_chunk`: normalised
    latents `[16, n, h, w]` -> video `[3, T, H, W]` in [-1, 1], T = 4(n - 1) + 1 for a session's first chunk, 4n
    after)."""

    @property
    def device(self) -> torch.device: ...

    def open(self, session_id: str) -> None: ...

    def release(self, session_id: str) -> None: ...

    def decode_chunk(self, session_id: str, latent: torch.Tensor) -> torch.Tensor: ...


class LingBotFastDecoder:
    """`ChunkDecoder`: the session's latents through a streamed decoder (the Wan VAE's, or the tiny one), to uint8
    RGB frames on the CPU."""

    def __init__(self, vae: StreamingDecoder) -> None:
        self._vae = vae
        self._sessions: SessionTable[_DecodeSession] = SessionTable("decode")
        self._timer = stage_timer(vae.device)

    @property
    def device(self) -> torch.device:
        return self._vae.device

    def create_cache(self, session_id: str, config: LingBotSessionConfig) -> None:
        self._sessions.add(session_id, _DecodeSession(config, config.chunk_plan))
        try:
            self._vae.open(session_id)
        except ModelSessionError:
            self._sessions.remove(session_id)
            raise

    def reseed_cache(
        self, session_id: str, config: LingBotSessionConfig, chunk_index: int, prime: torch.Tensor | None = None
    ) -> None:
        """`ReseedableDecoder`: the next chunk is `chunk_index`. The streamed VAE decodes a session's very first
        latent frame to one video frame and every frame after to four, so it is primed first (its frames dropped):
        with `prime`, the latent frames before the chunk (`[16, n, h, w]`, a re-seed's history: all of the session's
        since frame 0 make its causal feature cache exactly the uninterrupted one's), else with one zero latent
        frame. Either way the re-seeded session keeps the chunk contract (`4 * chunk_size` frames)."""
        self.create_cache(session_id, config)
        state = self._sessions.get(session_id)
        check_chunk_order("decode", state.plan, chunk_index, state.plan.chunk_size, chunk_index)
        if chunk_index > 0:
            shape = (LATENT_CHANNELS, 1, config.latent_height, config.latent_width)
            if prime is None or prime.shape[1] == 0:
                prime = torch.zeros(shape, device=self._vae.device)
            elif (prime.shape[0], *prime.shape[2:]) != (shape[0], *shape[2:]):
                raise ModelInputError(
                    f"the decoder's prime must be [16, n, {shape[2]}, {shape[3]}]: {list(prime.shape)}"
                )
            with torch.inference_mode():
                for index in range(prime.shape[1]):  # one latent frame per call, as a chunk decodes
                    frame = prime[:, index : index + 1].to(self._vae.device, torch.float32)
                    self._vae.decode_chunk(session_id, frame)
        state.next_chunk = chunk_index

    def release_cache(self, session_id: str) -> None:
        self._sessions.remove(session_id)
        self._vae.release(session_id)

    def statistics(self) -> StageStatistics:
        return self._sessions.statistics()

    def decode_chunk(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> torch.Tensor:
        state = self._begin(session_id, chunk_index, latent)
        span = self._timer.start()
        frames = _to_frames(self._vae.decode_chunk(session_id, latent))
        state.next_chunk += 1
        self._sessions.record(span.stop())
        return frames

    def decode_parts(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> Iterator[torch.Tensor]:
        """`decode_chunk` one latent frame at a time (`ProgressiveDecoder`): the streamed VAE decodes one latent frame
        per decoder call either way, with the session's feature cache, so the frames are the same bit for bit."""
        state = self._begin(session_id, chunk_index, latent)
        busy = 0.0
        for index in range(latent.shape[1]):
            span = self._timer.start()
            part = _to_frames(self._vae.decode_chunk(session_id, latent[:, index : index + 1]))
            busy += span.stop()
            yield part
        state.next_chunk += 1
        self._sessions.record(busy)

    def _begin(self, session_id: str, chunk_index: int, latent: torch.Tensor) -> _DecodeSession:
        state = self._sessions.get(session_id)
        validate_latent_chunk(latent, state.config, state.plan.chunk_size)
        check_chunk_order("decode", state.plan, chunk_index, state.plan.chunk_size, state.next_chunk)
        return state


def _to_frames(video: torch.Tensor) -> torch.Tensor:
    """Video `[3, T, H, W]` in [-1, 1] -> uint8 RGB frames `[T, H, W, 3]` on the CPU."""
    with torch.inference_mode():
        frames = ((video + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 3, 0).contiguous()
    return frames.cpu()


# --- assembly --------------------------------------------------------------------------------------------------------


def load_streaming_vae(options: LingBotFastOptions, device: str) -> StreamingVAE:
    dtype = options.torch_dtype(device)
    return StreamingVAE(load_vae(options.root / VAE_DIR, device=device, dtype=dtype), device=device, dtype=dtype)


def load_streaming_decoder(
    options: LingBotFastOptions, device: str, vae: StreamingVAE | None = None
) -> StreamingDecoder:
    """The decode stage's decoder as `options.decoder` says: the Wan VAE (`vae` when one is loaded already) or the
    tiny decoder from `tiny_decoder/`."""
    if options.decoder == "tiny":
        dtype = options.torch_dtype(device)
        return StreamingTinyDecoder(load_tiny_decoder(options.root / TINY_DECODER_DIR), device=device, dtype=dtype)
    return vae if vae is not None else load_streaming_vae(options, device)


def load_denoiser(options: LingBotFastOptions, device: str, parallel: Ulysses = SINGLE_RANK) -> LingBotFastDenoiser:
    """The denoiser of rank `parallel.rank` (the umt5 encoder on rank 0 only)."""
    dtype = options.torch_dtype(device)
    config = read_dit_config(options.root / DIT_DIR)
    check_parallel(config, parallel.world_size)
    dit = load_dit(options.root / DIT_DIR, config, dtype=dtype, device=device, parallel=parallel)
    compile_blocks(dit, options.compile)  # LINGSTREAM_COMPILE; compiles at the first forward of each shape
    dit.set_attention(select_attention(options.attention, attention_capability(device)))
    text_encoder = None
    if parallel.rank == 0:
        text_encoder = load_text_encoder(
            options.root / TEXT_ENCODER_DIR,
            options.root / TOKENIZER_DIR,
            text_len=config.text_len,
            device=device,
            dtype=dtype,
            cache_size=options.text_cache_size,
        )
    denoiser = LingBotFastDenoiser(dit, text_encoder, options)
    chunks = options.warm_up_chunks()
    if chunks > 0:  # before the stage exists, so before the worker reports ready (warmup.py)
        report = denoiser.warm_up(warm_up_config(PLAN_WIDTH, PLAN_HEIGHT, chunks), chunks)
        logger.info(
            "lingbot-fast warm-up: %d chunks at %s in %.1f s (compile %s, attention %s)",
            report.chunks,
            report.resolution,
            report.seconds,
            options.compile,
            dit.attention.name,
        )
    return denoiser


class LingBotFastWorldModel:
    """The three stages in one process on one device, sharing one VAE (threads placement)."""

    def __init__(self, encoder: LingBotFastEncoder, denoiser: LingBotFastDenoiser, decoder: LingBotFastDecoder) -> None:
        self._encoder = encoder
        self._denoiser = denoiser
        self._decoder = decoder

    @classmethod
    def load(cls, options: LingBotFastOptions, device: str = "cpu") -> LingBotFastWorldModel:
        """Checks the directory (headers), then loads every part strictly onto `device`."""
        check_model_dir(options.root, decoder=options.decoder)
        vae = load_streaming_vae(options, device)
        return cls(
            LingBotFastEncoder(vae, max_prefix_frames=options.max_prefix_frames),
            load_denoiser(options, device),
            LingBotFastDecoder(load_streaming_decoder(options, device, vae)),
        )

    @property
    def encoder(self) -> LingBotFastEncoder:
        return self._encoder

    @property
    def denoiser(self) -> LingBotFastDenoiser:
        return self._denoiser

    @property
    def decoder(self) -> LingBotFastDecoder:
        return self._decoder


@dataclass(frozen=True, slots=True)
class LingBotFastFactory:
    """The model as a `WorldModelFactory` (processes placement): each part loads its weights in the process that
    runs it, on `shard.device` (`shard.dtype` is ignored: `options.dtype` decides). Picklable."""

    options: LingBotFastOptions

    def encoder(self, shard: ModelShard) -> LingBotFastEncoder:
        vae = load_streaming_vae(self.options, shard.device)
        return LingBotFastEncoder(vae, max_prefix_frames=self.options.max_prefix_frames)

    def denoiser(self, shard: ModelShard) -> LingBotFastDenoiser:
        """Rank `shard.rank` of the DiT group (Ulysses over `shard.world_size` ranks; the worker has joined them
        into torch.distributed's default group). Raises `ModelConfigError` when the group does not divide the
        heads."""
        return load_denoiser(self.options, shard.device, Ulysses(shard.rank, shard.world_size))

    def decoder(self, shard: ModelShard) -> LingBotFastDecoder:
        return LingBotFastDecoder(load_streaming_decoder(self.options, shard.device))
