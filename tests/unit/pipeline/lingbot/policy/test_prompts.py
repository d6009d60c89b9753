"""Text prompts at the model seam: the reference model's look, the prompt cache, and the session policy's prompt."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from pipeline.bidirectional import MAX_PROMPT_BYTES, ChunkOutput, ControlState, SetPrompt, check_prompt
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.errors import SessionConfigError
from pipeline.lingbot.policy.prompts import PromptCache
from pipeline.lingbot.policy.service import LingBotService
from pipeline.lingbot.reference.looks import IDENTITY_LOOK, PromptLook, look_of, words_of
from pipeline.lingbot.reference.model import ReferenceWorldModel
from tests.support.lingbot import close_session, generate_chunk, gray, open_session, small_config

SMALL = {"width": 64, "height": 48, "chunk_size": 2, "hud": False}


def _latent() -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.rand(16, 2, 3, 4, generator=generator) * 1.2 - 0.6


def _prompted_session(prompts: list[str]) -> tuple[list[torch.Tensor], ReferenceWorldModel]:
    model = ReferenceWorldModel()
    config = small_config()
    camera = open_session(model, "s", config)
    chunks = [
        generate_chunk(model, "s", camera, index, [], config.chunk_size, prompt=prompt)
        for index, prompt in enumerate(prompts)
    ]
    close_session(model, "s")
    return chunks, model


# --- the prompt's bound ----------------------------------------------------------------------------------------------


def test_a_prompt_is_a_string_of_at_most_512_utf8_bytes() -> None:
    assert check_prompt("") == ""
    assert check_prompt("é" * (MAX_PROMPT_BYTES // 2)) == "é" * 256
    with pytest.raises(ValueError, match="at most 512 UTF-8 bytes, got 514"):
        check_prompt("é" * 257)  # 257 characters, 514 bytes
    with pytest.raises(ValueError, match="at most 512"):
        check_prompt("x" * 513)
    with pytest.raises(ValueError, match="lone surrogate"):
        check_prompt("\ud800")
    with pytest.raises(ValueError, match="must be a string"):
        check_prompt(3)


def test_the_session_config_takes_a_checked_initial_prompt() -> None:
    assert LingBotSessionConfig.from_mapping({"prompt": "a snowy night"}).prompt == "a snowy night"
    assert LingBotSessionConfig().prompt == ""
    with pytest.raises(SessionConfigError, match="prompt: a prompt is at most 512"):
        LingBotSessionConfig.from_mapping({"prompt": "x" * 600})


# --- the reference model's look ---------------------------------------------------------------------------------------


def test_the_empty_prompt_is_the_identity_look() -> None:
    latent = _latent()
    assert look_of("") is IDENTITY_LOOK
    assert look_of("  ,;  ") is IDENTITY_LOOK
    assert look_of("").apply(latent) is latent


def test_a_look_comes_from_the_words_whatever_their_case_order_or_punctuation() -> None:
    assert words_of("A Snowy, NIGHT!") == ["a", "snowy", "night"]
    assert look_of("a snowy night") == look_of("NIGHT... snowy, a")
    night = look_of("night")
    assert night.brightness < 0
    assert night.contrast < 1
    fog = look_of("fog")
    assert fog.brightness > 0
    assert fog.saturation < 1


def test_prompts_without_vocabulary_words_still_get_a_stable_look_of_their_own() -> None:
    castle, ship = look_of("a castle"), look_of("a pirate ship")
    assert castle != IDENTITY_LOOK
    assert ship != IDENTITY_LOOK
    assert castle != ship
    assert look_of("a castle") == castle  # CRC-32, not Python's salted hash: the same in every process


def test_a_look_grades_luma_and_chroma_and_leaves_the_motion_channels() -> None:
    latent = _latent()
    graded = PromptLook(contrast=0.5, brightness=-0.2, saturation=0.0, cb_shift=0.1, cr_shift=-0.1).apply(latent)
    torch.testing.assert_close(graded[:12], (latent[:12] * 0.5 - 0.2).clamp(-1, 1))
    torch.testing.assert_close(graded[12], torch.full_like(latent[12], 0.1))
    torch.testing.assert_close(graded[13], torch.full_like(latent[13], -0.1))
    assert torch.equal(graded[14:], latent[14:])


# --- the prompt cache -----------------------------------------------------------------------------------------------


def test_the_prompt_cache_encodes_each_distinct_prompt_once_and_drops_the_least_recently_used() -> None:
    cache: PromptCache[str] = PromptCache(capacity=2)
    encoded: list[str] = []

    def encode(prompt: str) -> str:
        encoded.append(prompt)
        return prompt.upper()

    for prompt in ("a", "a", "b", "a", "c", "b"):
        assert cache.get(prompt, functools.partial(encode, prompt)) == prompt.upper()
    # "c" pushed out "b" (a was used after b), so "b" is encoded again.
    assert encoded == ["a", "b", "c", "b"]
    stats = cache.statistics()
    assert (stats.encodings, stats.hits, stats.size, stats.capacity) == (4, 2, 2, 2)


def test_a_failed_encoding_is_not_cached() -> None:
    cache: PromptCache[int] = PromptCache()

    def boom() -> int:
        raise RuntimeError("encoder out of memory")

    with pytest.raises(RuntimeError):
        cache.get("p", boom)
    assert cache.get("p", lambda: 3) == 3
    assert cache.statistics().encodings == 1
    with pytest.raises(ValueError, match="capacity"):
        PromptCache(0)


# --- the reference denoiser ------------------------------------------------------------------------------------------


def test_a_prompt_changes_the_picture_from_its_chunk_on_and_not_before() -> None:
    plain, _ = _prompted_session(["", "", "", ""])
    prompted, model = _prompted_session(["", "", "night", "night"])
    for before in range(2):
        assert torch.equal(prompted[before], plain[before])
    for after in (2, 3):
        assert gray(prompted[after][0]).mean() < gray(plain[after][0]).mean() - 40
    stats = model.denoiser.prompt_statistics()
    assert (stats.encodings, stats.hits) == (2, 2)  # "" and "night" read once each


def test_prompted_frames_are_deterministic_and_differ_between_prompts() -> None:
    first, _ = _prompted_session(["dusk", "a castle"])
    again, _ = _prompted_session(["dusk", "a castle"])
    other, _ = _prompted_session(["dusk", "a pirate ship"])
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert torch.equal(first[0], other[0])
    assert not torch.equal(first[1], other[1])
    # chunk 0's first frame is the reference itself, whatever the prompt
    plain, _ = _prompted_session([""])
    assert torch.equal(first[0][0], plain[0][0])
    assert not torch.equal(first[0][1], plain[0][1])


# --- the session policy -----------------------------------------------------------------------------------------------


async def test_each_chunk_reports_the_prompt_it_was_generated_from_and_a_new_prompt_wakes_an_idle_session() -> None:
    service = LingBotService(ReferenceWorldModel("cpu"), realtime=False)
    await service.start()
    try:
        await service.create_session("s", service.prepare({**SMALL, "prompt": "sunny"}, None))
        outputs = service.outputs("s")
        first = await anext(outputs)
        assert (first.prompt, first.prompt_seq) == ("sunny", -1)
        assert not service._sessions["s"].wants_chunk()  # idle, nothing new
        service.push_control("s", SetPrompt(4, "night"))
        second = await anext(outputs)  # the new prompt alone asks for a chunk
        assert (second.index, second.prompt, second.prompt_seq) == (1, "night", 4)
        assert gray_of(second).mean() < gray_of(first).mean() - 30
        service.push_control("s", SetPrompt(4, "fog"))  # duplicate seq: dropped and counted
        service.push_control("s", SetPrompt(2, "fog"))  # stale: dropped and counted
        assert not service._sessions["s"].wants_chunk()
        assert service.statistics().stale_controls == 2
        service.push_control("s", ControlState(0, frozenset({"w"})))
        third = await anext(outputs)
        assert (third.prompt, third.prompt_seq, third.applied_seq) == ("night", 4, 0)
    finally:
        await service.aclose()


def gray_of(chunk: ChunkOutput) -> np.ndarray:
    """The luminance of the chunk's last frame."""
    return gray(torch.from_numpy(chunk.frames[-1]))
