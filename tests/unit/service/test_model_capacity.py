"""LINGSTREAM_MODEL=lingbot-fast at start: the model directory is checked and its memory estimated on the worker's
device; a LINGSTREAM_MAX_SESSIONS_PER_WORKER that cannot fit stops the start with the figures, one that fits
passes and its estimate is what /readyz shows."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.errors import SettingsError
from service.workers import WorkerOptions, check_model

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pipeline.lingbot.models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def options(path: Path, sessions: int, window: int = 512, ranks: int = 1) -> WorkerOptions:
    return WorkerOptions(
        worker_index=0,
        num_workers=1,
        max_sessions_per_worker=sessions,
        device="cpu",
        torch_threads=1,
        max_image_bytes=1 << 20,
        max_image_pixels=1 << 20,
        model="lingbot-fast",
        model_path=str(path),
        model_window_frames=window,
        stage_placement="processes" if ranks > 1 else "threads",
        denoise_ranks=ranks,
    )


def test_sessions_that_fit_pass_and_one_more_is_refused_with_the_figures(tiny: Path) -> None:
    estimate = check_model(options(tiny, 1))
    assert estimate is not None
    fits = estimate.fits_sessions
    assert fits >= 1
    assert estimate.device == "cpu"
    assert check_model(options(tiny, fits)) is not None
    with pytest.raises(SettingsError) as refused:
        check_model(options(tiny, fits + 1))
    message = str(refused.value)
    assert f"LINGSTREAM_MAX_SESSIONS_PER_WORKER={fits + 1} does not fit on cpu" in message
    assert f"at most {fits} session(s)" in message
    assert "window 512 latent frames" in message


def test_a_broken_directory_is_refused_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"LINGSTREAM_MODEL_PATH=.*does not exist"):
        check_model(options(tmp_path / "absent", 1))


def test_the_tiny_decoder_without_its_weights_stops_the_start_naming_both_variables(tmp_path: Path) -> None:
    import dataclasses
    import shutil

    from pipeline.lingbot.models import TINY_DECODER_DIR, write_tiny_model

    root = write_tiny_model(tmp_path / "model")
    tiny = dataclasses.replace(options(root, 1), decoder="tiny")
    assert check_model(tiny) is not None
    shutil.rmtree(root / TINY_DECODER_DIR)
    assert check_model(options(root, 1)) is not None  # the Wan VAE decoder needs none
    with pytest.raises(SettingsError, match=r"LINGSTREAM_MODEL_PATH=.*LINGSTREAM_DECODER=tiny needs the tiny decoder"):
        check_model(dataclasses.replace(tiny, model_window_frames=1023))  # new options: not the cached answer


def test_a_window_whose_sessions_could_not_build_their_cache_stops_the_start(tiny: Path) -> None:
    """The estimate builds a session's cache (on meta) as a session would: a window the RoPE table cannot re-base
    under (1024 of the tiny model's 1024 positions) is a start error naming the window, not a failure per session."""
    with pytest.raises(
        SettingsError, match=r"LINGSTREAM_MODEL_WINDOW_FRAMES=1024 / _SINK_FRAMES=6: CacheConfig: a re-base"
    ):
        check_model(options(tiny, 1, window=1024))


def test_the_reference_model_has_no_estimate() -> None:
    reference = WorkerOptions(0, 1, 1, "cpu", None, 1, 1)
    assert check_model(reference) is None


def test_a_dit_group_caches_a_session_in_ranks_shares_and_one_that_breaks_the_heads_rule_is_refused(tiny: Path) -> None:
    """The tiny DiT has 2 heads: 2 ranks halve each session's self-attention cache (the text K/V stay whole on every
    rank, and /readyz says how many ranks the figures are for); 3 ranks do not divide the heads, a start error."""
    one, two = check_model(options(tiny, 1)), check_model(options(tiny, 1, ranks=2))
    assert one is not None
    assert two is not None
    assert (one.denoise_ranks, two.denoise_ranks) == (1, 2)
    assert two.to_mapping()["denoise_ranks"] == 2
    assert two.session_bytes < one.session_bytes
    with pytest.raises(SettingsError, match=r"cannot start: LINGSTREAM_DENOISE_RANKS=3 does not divide the DiT's 2"):
        check_model(options(tiny, 1, ranks=3))
