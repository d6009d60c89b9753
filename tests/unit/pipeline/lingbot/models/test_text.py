"""The umt5 text encoder: transformers' own model on the same tokens is the oracle; prompts are cached per distinct
string in a bounded LRU; the empty prompt is the documented default; loading is strict."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from pipeline.lingbot.models import CheckpointError
from pipeline.lingbot.models.text import DEFAULT_PROMPT, UMT5TextEncoder, load_text_encoder, write_tiny_text_encoder

transformers = pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="the lingbot extra (safetensors) is not installed")

TEXT_LEN, TEXT_DIM = 16, 24


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("text")
    return write_tiny_text_encoder(root / "text_encoder", root / "tokenizer", d_model=TEXT_DIM, seed=0)


@pytest.fixture
def encoder(folders: tuple[Path, Path]) -> UMT5TextEncoder:
    return load_text_encoder(*folders, text_len=TEXT_LEN, cache_size=2)


def oracle_states(folders: tuple[Path, Path], prompt: str) -> tuple[torch.Tensor, int]:
    """transformers' own loading and forward pass on the tokens (no zeroing): states and the prompt's length."""
    model = transformers.UMT5EncoderModel.from_pretrained(str(folders[0])).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folders[1]))
    tokens = tokenizer([prompt], padding="max_length", max_length=TEXT_LEN, truncation=True, return_tensors="pt")
    with torch.inference_mode():
        states = model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"]).last_hidden_state
    return states, int(tokens["attention_mask"].sum())


def test_states_equal_transformers_own_model_and_are_zero_past_the_prompt(
    encoder: UMT5TextEncoder, folders: tuple[Path, Path]
) -> None:
    states = encoder.encode("a mossy forest")
    expected, length = oracle_states(folders, "a mossy forest")
    assert length == len("a mossy forest") + 1  # bytes, then end-of-sequence
    assert states.shape == (1, TEXT_LEN, TEXT_DIM)
    assert torch.equal(states[:, :length], expected[:, :length])
    assert bool((states[:, length:] == 0).all())
    assert bool((states[:, :length].abs().sum(-1) > 0).all())


def test_a_long_prompt_is_truncated_to_text_len(encoder: UMT5TextEncoder) -> None:
    states = encoder.encode("x" * 100)
    assert states.shape == (1, TEXT_LEN, TEXT_DIM)
    assert bool((states[0].abs().sum(-1) > 0).all())


def test_no_prompt_is_the_documented_default(encoder: UMT5TextEncoder, folders: tuple[Path, Path]) -> None:
    assert DEFAULT_PROMPT == ""
    states = encoder.encode("")
    expected, length = oracle_states(folders, DEFAULT_PROMPT)
    assert length == 1  # end-of-sequence alone
    assert torch.equal(states[:, :1], expected[:, :1])
    assert bool((states[:, 1:] == 0).all())
    assert not torch.equal(states, encoder.encode("a desert"))


def test_each_distinct_prompt_is_encoded_once(encoder: UMT5TextEncoder) -> None:
    first = encoder.encode("a city at night")
    assert encoder.encode("a city at night") is first
    encoder.encode("a beach")
    encoder.encode("a city at night")
    stats = encoder.statistics()
    assert (stats.encodings, stats.hits, stats.size) == (2, 2, 2)


def test_the_cache_is_bounded_least_recently_used_out(encoder: UMT5TextEncoder) -> None:
    first = encoder.encode("one")
    encoder.encode("two")
    encoder.encode("three")  # capacity 2: "one" goes
    assert encoder.statistics().size == 2
    again = encoder.encode("one")
    assert again is not first
    assert torch.equal(again, first)
    assert encoder.statistics().encodings == 4


@pytest.fixture
def copied(folders: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    return (
        Path(shutil.copytree(folders[0], tmp_path / "text_encoder")),
        Path(shutil.copytree(folders[1], tmp_path / "tokenizer")),
    )


def edit_weights(folder: Path, edit: dict[str, torch.Tensor | None]) -> None:
    path = folder / "model.safetensors"
    tensors = safetensors_torch.load_file(str(path))
    for key, value in edit.items():
        if value is None:
            del tensors[key]
        else:
            tensors[key] = value
    safetensors_torch.save_file(tensors, str(path), metadata={"format": "pt"})


def test_a_missing_key_is_refused_naming_it(copied: tuple[Path, Path]) -> None:
    edit_weights(copied[0], {"encoder.final_layer_norm.weight": None})
    with pytest.raises(CheckpointError, match=r"1 missing keys: encoder\.final_layer_norm\.weight"):
        load_text_encoder(*copied, text_len=TEXT_LEN)


def test_a_wrong_width_is_refused_naming_the_tensor(copied: tuple[Path, Path]) -> None:
    edit_weights(copied[0], {"encoder.final_layer_norm.weight": torch.ones(7)})
    with pytest.raises(CheckpointError, match=r"encoder\.final_layer_norm\.weight is \[7\], expected \[24\]"):
        load_text_encoder(*copied, text_len=TEXT_LEN)


def test_the_tied_embedding_alias_may_be_present(copied: tuple[Path, Path], encoder: UMT5TextEncoder) -> None:
    shared = safetensors_torch.load_file(str(copied[0] / "model.safetensors"))["shared.weight"]
    edit_weights(copied[0], {"encoder.embed_tokens.weight": shared.clone()})
    loaded = load_text_encoder(*copied, text_len=TEXT_LEN)
    assert torch.equal(loaded.encode("same"), encoder.encode("same"))


def test_a_missing_tokenizer_is_refused(copied: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"tokenizer folder .* cannot be loaded"):
        load_text_encoder(copied[0], tmp_path / "absent", text_len=TEXT_LEN)


def test_a_missing_config_is_refused(copied: tuple[Path, Path]) -> None:
    (copied[0] / "config.json").unlink()
    with pytest.raises(CheckpointError, match=r"config\.json is missing or not a umt5 config"):
        load_text_encoder(*copied, text_len=TEXT_LEN)
