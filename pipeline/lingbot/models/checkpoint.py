"""Strict loading of a LingBot-World-Fast DiT checkpoint, and a tiny random one in the same layout.

Layout of the DiT directory (the published one; safetensors only):

    <dir>/diffusion_pytorch_model.safetensors                  one file, or
    <dir>/diffusion_pytorch_model.safetensors.index.json       {"weight_map": {key: shard file name}, ...}
    <dir>/diffusion_pytorch_model-00001-of-0000N.safetensors   with the shards it names (any plain file names)

Strict means: before a byte of weight is read, the headers are checked against the model built from the config on
the `meta` device: every expected key present, nothing unexpected, every shape equal, every tensor of one floating
dtype (or of `checkpoint_dtype` when given), a sharded index consistent with its shards. Every problem found is
named in one `CheckpointError`. (The reference loaders use `strict=False` on a meta model, so a missing key leaves
a meta tensor behind silently.) The tensors are then read shard by shard onto the target device and cast there.

`safetensors` is imported only here and only when called: it comes with the optional `lingbot` extra.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.lingbot.models.config import TINY_DIT, DiTConfig
from pipeline.lingbot.models.dit import LingBotFastDiT
from pipeline.lingbot.models.errors import CheckpointError
from pipeline.lingbot.models.parallel import SINGLE_RANK, Ulysses

__all__ = [
    "DIT_INDEX",
    "DIT_WEIGHTS",
    "CheckpointLayout",
    "TensorSpec",
    "compare_specs",
    "expected_specs",
    "load_dit",
    "load_strict",
    "locate_checkpoint",
    "read_specs",
    "write_tiny_checkpoint",
]

DIT_WEIGHTS = "diffusion_pytorch_model.safetensors"
DIT_INDEX = DIT_WEIGHTS + ".index.json"
_SHOWN = 5
"""Names listed per kind of problem before the message says how many more."""

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


@dataclass(frozen=True, slots=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: torch.dtype


@dataclass(frozen=True, slots=True)
class CheckpointLayout:
    """The files of a DiT checkpoint and, for a sharded one, which file holds which key."""

    directory: Path
    files: tuple[Path, ...]
    weight_map: Mapping[str, Path] | None
    """None for the single-file layout."""


def locate_checkpoint(directory: Path | str, weights: str = DIT_WEIGHTS) -> CheckpointLayout:
    """Finds the single-file (`weights`) or sharded (`weights` + ".index.json") layout in `directory`; a missing or
    unreadable piece is named. The DiT and diffusers' VAE use `DIT_WEIGHTS`, transformers' encoders
    "model.safetensors"."""
    root = Path(directory)
    single, index = root / weights, root / (weights + ".index.json")
    if not root.is_dir():
        raise CheckpointError(f"checkpoint directory {root} does not exist")
    if single.is_file() and index.is_file():
        raise CheckpointError(f"checkpoint {root} has both {single.name} and {index.name}; keep one layout")
    if single.is_file():
        return CheckpointLayout(root, (single,), None)
    if not index.is_file():
        raise CheckpointError(f"checkpoint {root} has neither {single.name} nor {index.name}")
    try:
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{index} is not a safetensors index with a weight_map: {exc}") from exc
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index}: weight_map must map tensor names to shard file names")
    names = sorted(set(weight_map.values()))
    bad = [name for name in names if Path(name).name != name or name in ("", ".", "..")]
    if bad:
        raise CheckpointError(f"{index} names shards outside its directory: {', '.join(bad)}")
    missing = [name for name in names if not (root / name).is_file()]
    if missing:
        raise CheckpointError(f"{index} names missing shard files: {', '.join(missing)}")
    files = tuple(root / name for name in names)
    return CheckpointLayout(root, files, {key: root / name for key, name in weight_map.items()})


def read_specs(layout: CheckpointLayout) -> dict[str, TensorSpec]:
    """Every tensor's shape and dtype from the headers alone; an index that disagrees with its shards fails."""
    from safetensors import SafetensorError, safe_open

    specs: dict[str, TensorSpec] = {}
    problems: list[str] = []
    for path in layout.files:
        try:
            with safe_open(str(path), framework="pt") as handle:
                keys: list[str] = list(handle.keys())
                for key in keys:
                    tensor = handle.get_slice(key)
                    dtype_name = tensor.get_dtype()
                    if dtype_name not in _DTYPES:
                        problems.append(f"{key} in {path.name} has an unsupported dtype {dtype_name}")
                        continue
                    if key in specs:
                        problems.append(f"{key} appears in more than one shard")
                    specs[key] = TensorSpec(tuple(int(n) for n in tensor.get_shape()), _DTYPES[dtype_name])
                    if layout.weight_map is not None and layout.weight_map.get(key) != path:
                        problems.append(f"{key} is in {path.name} but the index does not map it there")
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"{path} is not a readable safetensors file: {exc}") from exc
    if layout.weight_map is not None:
        absent = sorted(key for key in layout.weight_map if key not in specs)
        if absent:
            problems.append(_listed("listed in the index but in no shard", absent))
    if problems:
        raise CheckpointError(f"checkpoint {layout.directory}: " + "; ".join(problems))
    return specs


def expected_specs(config: DiTConfig, dtype: torch.dtype) -> dict[str, TensorSpec]:
    """The key set and shapes a checkpoint for `config` must have (from a `meta` model: no memory)."""
    with torch.device("meta"):
        model = LingBotFastDiT(config)
    return {name: TensorSpec(tuple(t.shape), dtype) for name, t in model.state_dict().items()}


def check_specs(
    config: DiTConfig, found: Mapping[str, TensorSpec], where: Path, checkpoint_dtype: torch.dtype | None = None
) -> torch.dtype:
    """Raises one `CheckpointError` naming every difference; returns the checkpoint's dtype."""
    expected = expected_specs(config, checkpoint_dtype or torch.float32)
    return compare_specs(expected, found, where, _describe(config), checkpoint_dtype)


def compare_specs(
    expected: Mapping[str, TensorSpec],
    found: Mapping[str, TensorSpec],
    where: Path,
    description: str,
    checkpoint_dtype: torch.dtype | None = None,
    optional: Collection[str] = (),
) -> torch.dtype:
    """Strict comparison of a checkpoint's tensors with a model's (any model: the DiT, the VAE, the text encoder):
    raises one `CheckpointError` naming every missing, unexpected, wrongly shaped or wrongly typed tensor; returns
    the checkpoint's dtype (`checkpoint_dtype`, or the one most tensors have). `optional` keys (a tied alias such as
    umt5's `encoder.embed_tokens.weight`, which savers drop) may be absent but must fit when present."""
    problems = []
    missing = sorted(set(expected) - set(found) - set(optional))
    unexpected = sorted(set(found) - set(expected))
    if missing:
        problems.append(_listed("missing keys", missing))
    if unexpected:
        problems.append(_listed("unexpected keys", unexpected))
    shapes = [
        f"{key} is {list(found[key].shape)}, expected {list(spec.shape)}"
        for key, spec in sorted(expected.items())
        if key in found and found[key].shape != spec.shape
    ]
    if shapes:
        problems.append(_listed("wrong shapes", shapes))
    dtype = checkpoint_dtype or _majority_dtype(found)
    dtypes = [f"{key} is {spec.dtype}, expected {dtype}" for key, spec in sorted(found.items()) if spec.dtype != dtype]
    if dtypes or not dtype.is_floating_point:
        problems.append(_listed("wrong dtypes", dtypes or [f"{dtype} is not a floating dtype"]))
    if problems:
        raise CheckpointError(f"checkpoint {where} does not fit {description}: " + "; ".join(problems))
    return dtype


def load_strict(
    model: torch.nn.Module,
    layout: CheckpointLayout,
    description: str,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    checkpoint_dtype: torch.dtype | None = None,
    optional: Collection[str] = (),
) -> torch.nn.Module:
    """Loads `layout` into `model` (built on the `meta` device) strictly: headers compared first
    (`compare_specs`), then shard by shard onto `device`, cast to `dtype` (default: the checkpoint's). Buffers the
    model computes itself (not in its `state_dict`) are left as they are; `optional` keys absent from the checkpoint
    stay on `meta` for the caller to tie. Returns the model in eval mode without gradients."""
    from safetensors.torch import load_file

    expected = {name: TensorSpec(tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}
    stored = compare_specs(expected, read_specs(layout), layout.directory, description, checkpoint_dtype, optional)
    target = dtype or stored
    for path in layout.files:
        part = {key: value.to(target) for key, value in load_file(str(path), device=str(device)).items()}
        model.load_state_dict(part, strict=False, assign=True)
    left = [name for name, param in model.state_dict().items() if param.is_meta and name not in optional]
    if left:
        raise CheckpointError(_listed(f"checkpoint {layout.directory} left parameters unloaded", left))
    return model.eval().requires_grad_(False)


def load_dit(
    directory: Path | str,
    config: DiTConfig,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    checkpoint_dtype: torch.dtype | None = None,
    parallel: Ulysses = SINGLE_RANK,
) -> LingBotFastDiT:
    """The DiT with the checkpoint's weights, on `device` in `dtype` (default: the checkpoint's), in eval mode
    and without gradients, as rank `parallel.rank` of a Ulysses DiT group (every rank loads every weight). Raises
    `CheckpointError` before reading weights if anything does not fit."""
    layout = locate_checkpoint(directory)
    with torch.device("meta"):
        model = LingBotFastDiT(config, parallel)
    load_strict(model, layout, _describe(config), dtype=dtype, device=device, checkpoint_dtype=checkpoint_dtype)
    return model


def write_tiny_checkpoint(
    directory: Path | str,
    config: DiTConfig = TINY_DIT,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    shards: int = 1,
) -> Path:
    """Writes random weights for `config` in the real layout (one file, or `shards` files and an index) and
    returns the directory. Every tensor is random, the output head too, so outputs are O(1) and comparable."""
    from safetensors.torch import save_file

    if shards < 1:
        raise CheckpointError(f"shards must be >= 1, got {shards}")
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    specs = expected_specs(config, dtype)
    tensors = {name: _random(name, spec.shape, config, generator).to(dtype) for name, spec in sorted(specs.items())}
    metadata = {"format": "pt"}
    if shards == 1:
        save_file(tensors, str(root / DIT_WEIGHTS), metadata=metadata)
        return root
    names = list(tensors)
    weight_map: dict[str, str] = {}
    per_shard = math.ceil(len(names) / shards)
    for index in range(shards):
        file_name = f"diffusion_pytorch_model-{index + 1:05d}-of-{shards:05d}.safetensors"
        chunk = names[index * per_shard : (index + 1) * per_shard]
        save_file({name: tensors[name] for name in chunk}, str(root / file_name), metadata=metadata)
        weight_map.update(dict.fromkeys(chunk, file_name))
    total = sum(t.nbytes for t in tensors.values())
    index_body = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / DIT_INDEX).write_text(json.dumps(index_body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return root


def _random(name: str, shape: tuple[int, ...], config: DiTConfig, generator: torch.Generator) -> torch.Tensor:
    noise = torch.randn(shape, generator=generator)
    if name.endswith("modulation"):
        return noise / math.sqrt(config.dim)
    if name.endswith(("norm_q.weight", "norm_k.weight", "norm3.weight")):
        return 1 + 0.1 * noise
    if name.endswith("bias"):
        return 0.1 * noise
    return noise / math.sqrt(math.prod(shape[1:]))


def _majority_dtype(found: Mapping[str, TensorSpec]) -> torch.dtype:
    counts: dict[torch.dtype, int] = {}
    for spec in found.values():
        counts[spec.dtype] = counts.get(spec.dtype, 0) + 1
    return max(counts, key=lambda d: counts[d]) if counts else torch.float32


def _listed(what: str, items: list[str]) -> str:
    shown = ", ".join(items[:_SHOWN])
    more = f" and {len(items) - _SHOWN} more" if len(items) > _SHOWN else ""
    return f"{len(items)} {what}: {shown}{more}"


def _describe(config: DiTConfig) -> str:
    return f"dim {config.dim}, {config.num_layers} layers, in_dim {config.in_dim}, text_dim {config.text_dim}"
