"""LingBot-World-Fast behind the `WorldModel` seam, on a tiny random checkpoint in the real layout: the frame
contract, the wiring of condition / noise / camera / prompt into the DiT, determinism, independent sessions, the
horizon past the RoPE table, start-up checks that name the problem, and the processes factory."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.actor import StageCall
from pipeline.lingbot.camera import CameraChunk, CameraController, plucker_map
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ModelSessionError
from pipeline.lingbot.graph.stages import (
    CONDITION_REQUEST,
    CONTROL,
    ConditionRequest,
    ControlArtifact,
    DenoiseStage,
    EncodeStage,
)
from pipeline.lingbot.models import TINY_DIT, CheckpointError, LingBotFastDiT, ModelConfigError, denoise_chunk
from pipeline.lingbot.models.bundle import LingBotFastOptions, check_model_dir, write_tiny_model
from pipeline.lingbot.models.world import LingBotFastFactory, LingBotFastWorldModel
from pipeline.lingbot.reference.model import ReferenceWorldModel
from pipeline.lingbot.seam import ChunkDenoiser, ModelShard, ProgressiveDecoder, ReferenceEncoder

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="the lingbot extra (safetensors) is not installed")

CONFIG = LingBotSessionConfig(width=64, height=32, frame_num=4 * 12 - 3, seed=7)
"""12 latent frames: 4 chunks of 3."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("lingbot-fast"), seed=0)


@pytest.fixture(scope="module")
def world(model_dir: Path) -> LingBotFastWorldModel:
    return LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir)))


def open_session(world: LingBotFastWorldModel, session: str, config: LingBotSessionConfig) -> CameraController:
    world.encoder.create_cache(session, config)
    base = world.encoder.encode_reference(session, None)
    world.denoiser.create_cache(session, config, base)
    world.decoder.create_cache(session, config)
    return CameraController(config.pose_steps(), config.camera_intrinsics())


def close_session(world: LingBotFastWorldModel, session: str) -> None:
    world.decoder.release_cache(session)
    world.denoiser.release_cache(session)
    world.encoder.release_cache(session)


def step(
    world: LingBotFastWorldModel, session: str, camera: CameraController, index: int, keys: list[str], prompt: str = ""
) -> tuple[torch.Tensor, torch.Tensor]:
    control = camera.chunk_control(ControlSnapshot.from_keys(index, keys), index, 3).camera
    latent = world.denoiser.denoise_chunk(session, index, 3, control, prompt=prompt)
    return latent, world.decoder.decode_chunk(session, index, latent)


def run(world: LingBotFastWorldModel, session: str, config: LingBotSessionConfig, chunks: int) -> list[torch.Tensor]:
    camera = open_session(world, session, config)
    frames = [step(world, session, camera, index, ["w", "l"])[1] for index in range(chunks)]
    close_session(world, session)
    return frames


def test_a_session_streams_nine_then_twelve_rgb_frames(world: LingBotFastWorldModel) -> None:
    frames = run(world, "s", CONFIG, 4)
    assert [chunk.shape for chunk in frames] == [(9, 32, 64, 3)] + [(12, 32, 64, 3)] * 3
    assert all(chunk.dtype == torch.uint8 and chunk.device.type == "cpu" for chunk in frames)
    assert all(float(chunk.float().std()) > 1.0 for chunk in frames)  # noise, but not a flat picture


def test_the_denoiser_wires_mask_image_latent_noise_and_camera_as_the_model_expects(
    world: LingBotFastWorldModel,
) -> None:
    """Chunks 0 and 1 equal the sampler run by hand on a condition built from the research note's contract."""
    camera = open_session(world, "wired", CONFIG)
    base = world.encoder.encode_reference("wired", None)
    dit = world.denoiser.dit
    cache = dit.new_cache(LingBotFastOptions(".").cache_config(3), CONFIG.latent_height, CONFIG.latent_width)
    text = dit.encode_text(_text_states(world, ""))
    generator = torch.Generator().manual_seed(CONFIG.seed)
    for index in range(2):
        control = camera.chunk_control(ControlSnapshot.from_keys(index, ["w"]), index, 3).camera
        got = world.denoiser.denoise_chunk("wired", index, 3, control, prompt="")
        mask = torch.zeros(4, 3, CONFIG.latent_height, CONFIG.latent_width)
        if index == 0:
            mask[:, 0] = 1  # latent frame 0 of chunk 0 is the reference frame
        image_latent = base[:, min(3 * index, base.shape[1] - 1) : 3 * index + 3]
        condition = torch.cat([mask, image_latent], dim=0)[None]
        noise = torch.randn(1, 16, 3, CONFIG.latent_height, CONFIG.latent_width, generator=generator)
        expected = denoise_chunk(dit, cache, text, condition, noise, generator, plucker_map(control))[0]
        assert torch.equal(got, expected), index
    close_session(world, "wired")


class _RecordingDenoiser:
    """A `ChunkDenoiser` around a real one, keeping every `control` the denoise stage hands it."""

    def __init__(self, inner: ChunkDenoiser) -> None:
        self._inner = inner
        self.controls: list[CameraChunk] = []

    def create_cache(self, session_id: str, config: LingBotSessionConfig, base_latent: torch.Tensor) -> None:
        self._inner.create_cache(session_id, config, base_latent)

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        self.controls.append(control)
        return self._inner.denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)

    def release_cache(self, session_id: str) -> None:
        self._inner.release_cache(session_id)


def _stage_controls(
    encoder: ReferenceEncoder, denoiser: ChunkDenoiser, trace: list[tuple[list[str], bool]]
) -> list[CameraChunk]:
    """The controls the denoise stage (the one both models run under) hands `denoiser` for `trace`."""
    recording = _RecordingDenoiser(denoiser)
    encode, denoise = EncodeStage(encoder), DenoiseStage(recording)
    for index, (keys, reset) in enumerate(trace):
        request = ConditionRequest(index, 3, CONFIG if index == 0 else None)
        condition = encode.process(StageCall("encode", "c", index, {CONDITION_REQUEST: request}))["condition"]
        control = ControlArtifact(index, ControlSnapshot.from_keys(index, keys), reset_pose=reset)
        denoise.process(StageCall("denoise", "c", index, {"condition": condition, CONTROL: control}))
    denoise.release("c")
    encode.release("c")
    return recording.controls


def test_both_models_receive_the_same_camera_contract_for_the_same_controls(world: LingBotFastWorldModel) -> None:
    trace = [(["w", "l"], False), (["i", "a"], False), (["s"], True), (["j", "k", "d"], False)]
    reference = ReferenceWorldModel()
    seen_by_reference = _stage_controls(reference.encoder, reference.denoiser, trace)
    seen_by_fast = _stage_controls(world.encoder, world.denoiser, trace)
    assert len(seen_by_reference) == len(seen_by_fast) == 4
    for ours, theirs in zip(seen_by_reference, seen_by_fast, strict=True):
        assert isinstance(ours, CameraChunk)
        assert isinstance(theirs, CameraChunk)
        assert torch.equal(ours.start, theirs.start)
        assert torch.equal(ours.relative, theirs.relative)
        assert (ours.translation_scale, ours.intrinsics) == (theirs.translation_scale, theirs.intrinsics)
        assert ours.intrinsics == CONFIG.camera_intrinsics()
    assert torch.equal(seen_by_fast[2].start, torch.eye(4, dtype=torch.float64))  # the reset chunk
    assert not torch.equal(seen_by_fast[1].relative, seen_by_fast[3].relative)  # and the keys do reach it


def _text_states(world: LingBotFastWorldModel, prompt: str) -> torch.Tensor:
    encoder = world.denoiser._text_encoder
    assert encoder is not None  # one rank: the encoder is here
    return encoder.encode(prompt)


def test_the_same_seed_and_controls_give_the_same_video(world: LingBotFastWorldModel) -> None:
    first = run(world, "a", CONFIG, 2)
    second = run(world, "b", CONFIG, 2)
    other_seed = run(world, "c", dataclasses.replace(CONFIG, seed=8), 2)
    assert all(torch.equal(x, y) for x, y in zip(first, second, strict=True))
    assert not torch.equal(first[1], other_seed[1])


def test_interleaved_sessions_equal_each_alone(world: LingBotFastWorldModel) -> None:
    alone = run(world, "alone", CONFIG, 3)
    cameras = {name: open_session(world, name, config) for name, config in (("x", CONFIG), ("y", CONFIG))}
    other = dataclasses.replace(CONFIG, seed=99)
    close_session(world, "y")
    cameras["y"] = open_session(world, "y", other)
    together = []
    for index in range(3):
        together.append(step(world, "x", cameras["x"], index, ["w", "l"])[1])
        step(world, "y", cameras["y"], index, ["s"])
    close_session(world, "x")
    close_session(world, "y")
    assert all(torch.equal(x, y) for x, y in zip(alone, together, strict=True))


def test_a_new_prompt_changes_the_chunk_and_each_prompt_is_encoded_once(world: LingBotFastWorldModel) -> None:
    encoder = world.denoiser._text_encoder
    assert encoder is not None  # one rank: the encoder is here
    before = encoder.statistics().encodings
    latents: dict[str, list[torch.Tensor]] = {}
    for prompt in ("a red canyon", "a snowy pass", "a red canyon"):
        camera = open_session(world, "p", CONFIG)
        latents.setdefault(prompt, []).append(step(world, "p", camera, 0, [], prompt=prompt)[0])
        close_session(world, "p")
    assert torch.equal(latents["a red canyon"][0], latents["a red canyon"][1])
    assert not torch.equal(latents["a red canyon"][0], latents["a snowy pass"][0])
    assert encoder.statistics().encodings - before == 2


def test_chunks_out_of_order_are_refused_and_release_is_idempotent(world: LingBotFastWorldModel) -> None:
    camera = open_session(world, "o", CONFIG)
    control = camera.chunk_control(ControlSnapshot.from_keys(0, []), 0, 3).camera
    with pytest.raises(ModelSessionError, match="out of order"):
        world.denoiser.denoise_chunk("o", 1, 3, control, prompt="")
    close_session(world, "o")
    close_session(world, "o")
    with pytest.raises(ModelSessionError, match="no cache for session 'o'"):
        world.denoiser.denoise_chunk("o", 0, 3, control, prompt="")


def test_a_session_runs_past_the_rope_table_with_finite_frames_and_a_bounded_cache(tmp_path: Path) -> None:
    """Horizon: positions re-base (they do not end the session). A 12-position table, window 6, sink 3: 8 chunks
    (24 latent frames) cross it twice."""
    folder = write_tiny_model(tmp_path / "short-rope", seed=0, dit=dataclasses.replace(TINY_DIT, rope_frames=12))
    short = LingBotFastWorldModel.load(LingBotFastOptions(str(folder), window_frames=6, sink_frames=3))
    config = dataclasses.replace(CONFIG, frame_num=4 * 24 - 3)
    camera = open_session(short, "long", config)
    sizes = set()
    for index in range(8):
        latent, frames = step(short, "long", camera, index, ["w"])
        assert bool(torch.isfinite(latent).all())
        assert frames.shape[0] == (9 if index == 0 else 12)
        stats = short.denoiser.cache_statistics("long")
        sizes.add(stats.nbytes)
    assert stats.rebases >= 2
    assert stats.stored_frames <= 6
    assert len(sizes) == 1


def test_a_complete_directory_passes_the_start_check(model_dir: Path) -> None:
    summary = check_model_dir(model_dir)
    assert summary.dit == TINY_DIT
    with torch.device("meta"):
        dit = LingBotFastDiT(TINY_DIT)
    assert summary.dit_parameters == sum(p.numel() for p in dit.parameters())
    assert min(summary.vae_parameters, summary.text_encoder_parameters) > 0


@pytest.fixture
def damaged(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


def test_a_missing_part_is_named_at_start(damaged: Path) -> None:
    shutil.rmtree(damaged / "tokenizer")
    with pytest.raises(CheckpointError, match=r"lacks the folder.*tokenizer"):
        LingBotFastWorldModel.load(LingBotFastOptions(str(damaged)))


def test_a_missing_dit_key_is_named_at_start(damaged: Path) -> None:
    path = damaged / "dit" / "diffusion_pytorch_model.safetensors"
    tensors = safetensors_torch.load_file(str(path))
    del tensors["blocks.1.cam_scale_layer.weight"]
    safetensors_torch.save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"missing keys: blocks\.1\.cam_scale_layer\.weight"):
        check_model_dir(damaged)


def test_a_dit_of_another_width_than_the_text_encoder_is_refused(damaged: Path) -> None:
    config_path = damaged / "dit" / "config.json"
    config = json.loads(config_path.read_text())
    config["text_dim"] = 32
    config_path.write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"text_embedding\.0\.weight is \[64, 24\], expected \[64, 32\]"):
        check_model_dir(damaged)


def test_a_checkpoint_of_mixed_dtypes_is_refused_naming_the_tensor(damaged: Path) -> None:
    path = damaged / "vae" / "diffusion_pytorch_model.safetensors"
    tensors = safetensors_torch.load_file(str(path))
    tensors["quant_conv.bias"] = tensors["quant_conv.bias"].to(torch.float16)
    safetensors_torch.save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"wrong dtypes: quant_conv\.bias is torch\.float16"):
        check_model_dir(damaged)


def test_the_factory_pickles_and_builds_each_part(model_dir: Path) -> None:
    factory = pickle.loads(pickle.dumps(LingBotFastFactory(LingBotFastOptions(str(model_dir)))))
    shard = ModelShard("cpu")
    assert factory.encoder(shard).statistics().open_sessions == 0
    assert factory.denoiser(shard).dit.config == TINY_DIT
    assert factory.decoder(shard).statistics().open_sessions == 0


def test_the_factory_refuses_a_dit_group_that_does_not_divide_the_heads(model_dir: Path) -> None:
    factory = LingBotFastFactory(LingBotFastOptions(str(model_dir)))
    with pytest.raises(ModelConfigError, match="LINGSTREAM_DENOISE_RANKS=3 does not divide the DiT's 2 attention"):
        factory.denoiser(ModelShard("cpu", rank=0, world_size=3))


def test_options_refuse_a_window_that_cannot_hold_the_sink_and_a_chunk() -> None:
    with pytest.raises(ModelConfigError, match="sink_frames \\+ chunk_frames <= window_frames"):
        LingBotFastOptions(".", window_frames=6, sink_frames=4)
    with pytest.raises(ModelConfigError, match="dtype must be auto or one of"):
        LingBotFastOptions(".", dtype="float8")


def test_auto_dtype_is_bfloat16_on_cuda_and_float32_on_the_cpu() -> None:
    options = LingBotFastOptions(".")
    assert options.torch_dtype("cpu") == torch.float32
    assert options.torch_dtype("cuda:0") == torch.bfloat16
    assert LingBotFastOptions(".", dtype="float16").torch_dtype("cpu") == torch.float16


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh runs it on one)")
def test_the_tiny_model_runs_in_bfloat16_on_cuda(model_dir: Path, world: LingBotFastWorldModel) -> None:
    """auto dtype on CUDA is bfloat16 (weights and KV cache); SDPA picks its CUDA kernel. The frames follow the
    float32 CPU run's contract and stay finite; bf16 rounding makes them differ from it, so they are not compared."""
    cuda = LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir)), "cuda:0")
    assert cuda.denoiser.dit.dtype == torch.bfloat16
    camera = open_session(cuda, "gpu", CONFIG)
    for index in range(3):
        latent, frames = step(cuda, "gpu", camera, index, ["w", "l"])
        assert latent.device.type == "cuda"
        assert latent.dtype == torch.float32
        assert bool(torch.isfinite(latent).all())
        assert frames.shape == ((9 if index == 0 else 12), 32, 64, 3)
        assert frames.device.type == "cpu"
    stats = cuda.denoiser.cache_statistics("gpu")
    assert stats.nbytes == 2 * TINY_DIT.num_layers * 18 * 8 * TINY_DIT.dim * 2  # K and V, window 18, 8 tokens, bf16
    close_session(cuda, "gpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu-check.sh runs it on one)")
def test_on_cuda_the_prefix_encode_hands_its_cached_blocks_back(model_dir: Path) -> None:
    """`encode_reference` empties the allocator's cache after the prefix encode: what stays reserved is what is
    still allocated (the weights, the latent), rounded to the allocator's 2 MB segments."""
    cuda = LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir)), "cuda:0")
    config = dataclasses.replace(CONFIG, width=832, height=480)
    cuda.encoder.create_cache("e", config)
    cuda.encoder.encode_reference("e", None)
    device = torch.device("cuda:0")
    assert torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device) < 4 * 2**20
    cuda.encoder.release_cache("e")


def test_decoding_per_latent_frame_gives_the_whole_chunks_frames_bit_for_bit(world: LingBotFastWorldModel) -> None:
    """The decode seam's parts (one latent frame each, the session's VAE feature cache carried between them) are the
    whole chunk's frames: a second session decodes the same latents whole."""
    camera = open_session(world, "parts", CONFIG)
    world.decoder.create_cache("whole", CONFIG)
    assert isinstance(world.decoder, ProgressiveDecoder)
    try:
        for index in range(3):
            control = camera.chunk_control(ControlSnapshot.from_keys(index, ["w", "l"]), index, 3).camera
            latent = world.denoiser.denoise_chunk("parts", index, 3, control, prompt="")
            parts = list(world.decoder.decode_parts("parts", index, latent))
            whole = world.decoder.decode_chunk("whole", index, latent)
            assert [part.shape[0] for part in parts] == ([1, 4, 4] if index == 0 else [4, 4, 4])
            assert torch.equal(torch.cat(parts), whole)
    finally:
        world.decoder.release_cache("whole")
        close_session(world, "parts")
