"""Warm-up chunks before the worker is ready (`warmup.py`): how many, that loading runs them, and that they leave
nothing behind (a session after the warm-up makes the frames of a worker that did not warm up, bit for bit)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from pipeline.lingbot.camera import CameraController
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.models import CacheConfig, ModelConfigError
from pipeline.lingbot.models.bundle import LingBotFastOptions, write_tiny_model
from pipeline.lingbot.models.warmup import auto_warm_up_chunks, warm_up_config
from pipeline.lingbot.models.world import LingBotFastWorldModel

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")

CONFIG = LingBotSessionConfig(width=64, height=32, frame_num=4 * 21 - 3, seed=3, prompt="a quiet street")
"""7 chunks of 3: the window (18, sink 6) fills and the ring turns."""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("lingbot-fast-warmup"), seed=0)


def frames(world: LingBotFastWorldModel, session: str, chunks: int) -> list[torch.Tensor]:
    world.encoder.create_cache(session, CONFIG)
    base = world.encoder.encode_reference(session, None)
    world.denoiser.create_cache(session, CONFIG, base)
    world.decoder.create_cache(session, CONFIG)
    camera = CameraController(CONFIG.pose_steps(), CONFIG.camera_intrinsics())
    out = []
    for index in range(chunks):
        control = camera.chunk_control(ControlSnapshot.from_keys(index, ["w", "j"]), index, 3).camera
        latent = world.denoiser.denoise_chunk(session, index, 3, control, prompt=CONFIG.prompt)
        out.append(world.decoder.decode_chunk(session, index, latent))
    world.decoder.release_cache(session)
    world.denoiser.release_cache(session)
    world.encoder.release_cache(session)
    return out


@pytest.mark.parametrize(
    ("cache", "compile_mode", "chunks"),
    [
        (CacheConfig(chunk_frames=3, window_frames=18, sink_frames=6), "default", 7),
        (CacheConfig(chunk_frames=3, window_frames=18, sink_frames=6), "max", 7),
        (CacheConfig(chunk_frames=3, window_frames=18, sink_frames=6), "off", 0),
        (CacheConfig(chunk_frames=3, window_frames=6, sink_frames=3), "default", 3),
        (CacheConfig(chunk_frames=3, window_frames=None, max_frames=12), "default", 4),
    ],
)
def test_by_default_a_compiling_worker_warms_up_until_the_window_is_full_and_one_chunk_more(
    cache: CacheConfig, compile_mode: str, chunks: int
) -> None:
    assert auto_warm_up_chunks(cache, compile_mode) == chunks


def test_the_options_take_an_explicit_count_or_the_automatic_one_and_refuse_a_negative() -> None:
    assert LingBotFastOptions("m", compile="max").warm_up_chunks() == 7
    assert LingBotFastOptions("m", compile="max", window_frames=9, sink_frames=3).warm_up_chunks() == 4
    assert LingBotFastOptions("m").warm_up_chunks() == 0
    assert LingBotFastOptions("m", warmup_chunks=2).warm_up_chunks() == 2
    assert LingBotFastOptions("m", compile="default", warmup_chunks=0).warm_up_chunks() == 0
    with pytest.raises(ModelConfigError, match="warmup_chunks must be >= 0, got -1"):
        LingBotFastOptions("m", warmup_chunks=-1)
    with pytest.raises(ModelConfigError, match="attention must be one of auto"):
        LingBotFastOptions("m", attention="fast")


def test_a_session_after_the_warm_up_makes_the_frames_of_a_worker_that_did_not_warm_up(model_dir: Path) -> None:
    cold = LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir)))
    expected = frames(cold, "cold", 7)
    warm = LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir)))
    report = warm.denoiser.warm_up(dataclasses.replace(CONFIG, prompt=""), 7)
    assert (report.chunks, report.resolution) == (7, "64x32")
    assert warm.denoiser.warmed_up == report
    assert warm.denoiser.statistics().open_sessions == 0
    assert warm.denoiser.statistics().calls == 0  # the throwaway session is not counted
    actual = frames(warm, "warm", 7)
    assert all(torch.equal(a, e) for a, e in zip(actual, expected, strict=True))
    assert cold.denoiser.warmed_up is None


def test_loading_with_warm_up_chunks_runs_them_at_the_planning_resolution_before_returning(model_dir: Path) -> None:
    world = LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir), warmup_chunks=1))
    report = world.denoiser.warmed_up
    assert report is not None
    assert (report.chunks, report.resolution) == (1, "832x480")
    assert report.seconds > 0
    assert report.to_mapping() == {"chunks": 1, "seconds": round(report.seconds, 3), "resolution": "832x480"}
    assert warm_up_config(832, 480, 2).chunk_plan.num_chunks == 2


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_after_the_automatic_warm_up_a_compiled_session_compiles_nothing_new(model_dir: Path) -> None:
    """compile on (dynamo's capture, the "eager" backend: the guards and recompiles are dynamo's, whatever the
    backend): the automatic warm-up (7 chunks at window 18 / sink 6: the window filled, then one steady-state chunk)
    leaves every shape of a session's steady state compiled, so a session at the same size after it, through the
    window's filling, the ring's positions (4 at 18 / 6) and its turn, captures no new graph. Without the warm-up the
    same session does. (With the cache's offsets static one graph serves every ring position: `compiled.py`.)"""
    from torch._dynamo.utils import counters

    from pipeline.lingbot.models import compile_blocks

    options = LingBotFastOptions(str(model_dir), compile="default")
    chunks = options.warm_up_chunks()
    assert chunks == 7
    torch._dynamo.reset()
    counters.clear()  # reset() keeps the counters an earlier test in this worker counted into
    cold = LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir)))
    compile_blocks(cold.denoiser.dit, "default", backend="eager")
    before = counters["stats"]["unique_graphs"]
    frames(cold, "cold", 7)
    assert counters["stats"]["unique_graphs"] > before  # a cold session compiles while its window fills

    torch._dynamo.reset()
    warm = LingBotFastWorldModel.load(LingBotFastOptions(str(model_dir)))
    compile_blocks(warm.denoiser.dit, "default", backend="eager")
    warm.denoiser.warm_up(dataclasses.replace(CONFIG, prompt="", frame_num=4 * 3 * chunks - 3), chunks)
    before = counters["stats"]["unique_graphs"]
    frames(warm, "warm", 7)
    assert counters["stats"]["unique_graphs"] == before
    assert not counters["graph_break"], dict(counters["graph_break"])
    torch._dynamo.reset()
