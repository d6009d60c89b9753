"""Strict checkpoint loading: the good layouts load, every bad one is refused with the problem named."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from pipeline.lingbot.errors import LingBotError
from pipeline.lingbot.models import (
    DIT_INDEX,
    TINY_DIT,
    CheckpointError,
    LingBotFastDiT,
    load_dit,
    write_tiny_checkpoint,
)
from tests.support.lingbot_models import checkpoint_file

safetensors_torch = pytest.importorskip("safetensors.torch", reason="the lingbot extra (safetensors) is not installed")


@pytest.fixture
def checkpoint(tiny_checkpoint: Path, tmp_path: Path) -> Path:
    """A private copy of the tiny checkpoint a test may damage."""
    return Path(shutil.copytree(tiny_checkpoint, tmp_path / "dit"))


def rewrite(directory: Path, edit: dict[str, torch.Tensor | None]) -> None:
    """Replaces (tensor) or removes (None) entries of the single-file checkpoint."""
    path = checkpoint_file(directory)
    tensors = safetensors_torch.load_file(str(path))
    for key, value in edit.items():
        if value is None:
            del tensors[key]
        else:
            tensors[key] = value
    safetensors_torch.save_file(tensors, str(path))


def test_single_file_layout_loads_every_tensor(tiny_checkpoint: Path, tiny_model: LingBotFastDiT) -> None:
    stored = safetensors_torch.load_file(str(checkpoint_file(tiny_checkpoint)))
    state = tiny_model.state_dict()
    assert set(stored) == set(state)
    assert all(torch.equal(stored[key], state[key]) for key in stored)
    assert not tiny_model.training
    assert not any(p.requires_grad for p in tiny_model.parameters())


def test_sharded_layout_loads_the_same_weights(tmp_path: Path, tiny_model: LingBotFastDiT) -> None:
    directory = write_tiny_checkpoint(tmp_path / "sharded", TINY_DIT, seed=1, shards=3)
    assert len(list(directory.glob("diffusion_pytorch_model-0000?-of-00003.safetensors"))) == 3
    sharded = load_dit(directory, TINY_DIT)
    reference = tiny_model.state_dict()
    assert all(torch.equal(value, reference[key]) for key, value in sharded.state_dict().items())


def test_load_casts_to_the_requested_dtype(tiny_checkpoint: Path) -> None:
    model = load_dit(tiny_checkpoint, TINY_DIT, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_missing_key_is_named(checkpoint: Path) -> None:
    rewrite(checkpoint, {"blocks.1.cam_scale_layer.weight": None})
    with pytest.raises(CheckpointError, match=r"1 missing keys: blocks\.1\.cam_scale_layer\.weight"):
        load_dit(checkpoint, TINY_DIT)


def test_unexpected_key_is_named(checkpoint: Path) -> None:
    rewrite(checkpoint, {"blocks.0.self_attn.k_img.weight": torch.zeros(64, 64)})
    with pytest.raises(CheckpointError, match=r"1 unexpected keys: blocks\.0\.self_attn\.k_img\.weight"):
        load_dit(checkpoint, TINY_DIT)


def test_wrong_shape_is_named_with_both_shapes(checkpoint: Path) -> None:
    rewrite(checkpoint, {"blocks.0.norm3.weight": torch.ones(32)})
    with pytest.raises(CheckpointError, match=r"blocks\.0\.norm3\.weight is \[32\], expected \[64\]"):
        load_dit(checkpoint, TINY_DIT)


def test_wrong_dtype_is_named(checkpoint: Path) -> None:
    rewrite(checkpoint, {"head.modulation": torch.zeros(1, 2, 64, dtype=torch.float16)})
    with pytest.raises(CheckpointError, match=r"head\.modulation is torch\.float16, expected torch\.float32"):
        load_dit(checkpoint, TINY_DIT)


def test_a_required_checkpoint_dtype_is_enforced(tiny_checkpoint: Path) -> None:
    with pytest.raises(CheckpointError, match=r"wrong dtypes: .* expected torch\.bfloat16"):
        load_dit(tiny_checkpoint, TINY_DIT, checkpoint_dtype=torch.bfloat16)


def test_a_config_that_does_not_match_is_described(tiny_checkpoint: Path) -> None:
    bigger = TINY_DIT.__class__(dim=64, ffn_dim=96, num_layers=3, num_heads=2, freq_dim=32, text_dim=24, text_len=8)
    with pytest.raises(CheckpointError, match=r"3 layers.*missing keys: blocks\.2\."):
        load_dit(tiny_checkpoint, bigger)


def test_missing_directory_and_missing_file_are_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        load_dit(tmp_path / "nowhere", TINY_DIT)
    with pytest.raises(CheckpointError, match=r"neither diffusion_pytorch_model\.safetensors nor .*index\.json"):
        load_dit(tmp_path, TINY_DIT)


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    checkpoint_file(tmp_path).write_bytes(b"not a safetensors file at all")
    with pytest.raises(CheckpointError, match="is not a readable safetensors file"):
        load_dit(tmp_path, TINY_DIT)


def test_sharded_layout_with_a_missing_shard_names_it(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path / "sharded", TINY_DIT, shards=2)
    (directory / "diffusion_pytorch_model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"missing shard files: diffusion_pytorch_model-00002-of-00002"):
        load_dit(directory, TINY_DIT)


def test_sharded_index_that_disagrees_with_its_shards_is_refused(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path / "sharded", TINY_DIT, shards=2)
    index_path = directory / DIT_INDEX
    index = json.loads(index_path.read_text())
    index["weight_map"]["blocks.9.ffn.0.weight"] = "diffusion_pytorch_model-00001-of-00002.safetensors"
    moved = next(key for key, name in index["weight_map"].items() if "-00002-of-" in name)
    index["weight_map"][moved] = "diffusion_pytorch_model-00001-of-00002.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError) as raised:
        load_dit(directory, TINY_DIT)
    message = str(raised.value)
    assert "blocks.9.ffn.0.weight" in message
    assert f"{moved} is in diffusion_pytorch_model-00002-of-00002.safetensors but the index" in message


def test_index_naming_a_path_outside_the_directory_is_refused(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path / "sharded", TINY_DIT, shards=2)
    index_path = directory / DIT_INDEX
    index = json.loads(index_path.read_text())
    index["weight_map"]["head.modulation"] = "../elsewhere.safetensors"
    index_path.write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="outside its directory"):
        load_dit(directory, TINY_DIT)


def test_both_layouts_at_once_are_ambiguous(tmp_path: Path) -> None:
    directory = write_tiny_checkpoint(tmp_path / "both", TINY_DIT, shards=2)
    write_tiny_checkpoint(directory, TINY_DIT)
    with pytest.raises(CheckpointError, match="keep one layout"):
        load_dit(directory, TINY_DIT)


def test_checkpoint_errors_are_lingbot_value_errors() -> None:
    assert issubclass(CheckpointError, LingBotError)
    assert issubclass(CheckpointError, ValueError)
