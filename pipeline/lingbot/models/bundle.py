"""A LingBot-World-Fast model directory: its layout, the options a worker loads it with, a header-only check for
start-up, and a tiny random one in the same layout.

    <LINGSTREAM_MODEL_PATH>/
        dit/            diffusion_pytorch_model.safetensors, or its .index.json and shards (checkpoint.py);
                        config.json optional: the DiT's sizes (dim, ffn_dim, num_layers, num_heads, ...; other keys
                        ignored, so the published Wan-style config.json fits); absent: the published 14B sizes
        vae/            config.json + diffusion_pytorch_model.safetensors: diffusers' AutoencoderKLWan (vae.py)
        text_encoder/   config.json + model.safetensors (or sharded): transformers' UMT5EncoderModel (text.py)
        tokenizer/      what AutoTokenizer loads offline: tokenizer.json, or umt5's spiece.model and its configs
        tiny_decoder/   model.safetensors: the TAEHV-style decoder (tiny_decoder.py); only for decoder="tiny"

The DiT is LingBot-World-Fast's own checkpoint; the VAE, the umt5 encoder and the tokenizer are Wan2.1's, the same
files the Wan2.1 / Wan2.2 image-to-video *Diffusers* repositories ship in their `vae/`, `text_encoder/` and
`tokenizer/` folders. `write_tiny_model` writes random weights in this layout (`lingstream tiny-checkpoint DIR`).

`check_model_dir` reads only headers and configs: every missing folder, file, key, wrong shape or dtype, and every
disagreement between the parts (the DiT's text width and the encoder's, the DiT's channels and the VAE's), is a
`CheckpointError` naming it, before a byte of weight is loaded, so a bad directory fails the service at start.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from pipeline.lingbot.config import SPATIAL_COMPRESSION
from pipeline.lingbot.models.attention import ATTENTION_CHOICES
from pipeline.lingbot.models.cache import CacheConfig
from pipeline.lingbot.models.checkpoint import (
    DIT_WEIGHTS,
    TensorSpec,
    check_specs,
    compare_specs,
    locate_checkpoint,
    read_specs,
    write_tiny_checkpoint,
)
from pipeline.lingbot.models.compiled import COMPILE_MODES
from pipeline.lingbot.models.config import LINGBOT_FAST_14B, TINY_DIT, DiTConfig
from pipeline.lingbot.models.errors import CheckpointError, ModelConfigError
from pipeline.lingbot.models.text import TEXT_ENCODER_WEIGHTS, write_tiny_text_encoder
from pipeline.lingbot.models.tiny_decoder import (
    TINY_DECODER_DIR,
    TinyDecoderConfig,
    check_tiny_decoder,
    write_tiny_decoder,
)
from pipeline.lingbot.models.vae import DEFAULT_MAX_PREFIX_FRAMES, VAE_CONFIG, write_tiny_vae
from pipeline.lingbot.models.warmup import WARM_UP_CHUNK_SIZE, auto_warm_up_chunks

__all__ = [
    "DECODERS",
    "DIT_DIR",
    "DTYPES",
    "TEXT_ENCODER_DIR",
    "TOKENIZER_DIR",
    "VAE_DIR",
    "LingBotFastOptions",
    "ModelDirSummary",
    "check_model_dir",
    "read_dit_config",
    "write_tiny_model",
]

DIT_DIR, VAE_DIR, TEXT_ENCODER_DIR, TOKENIZER_DIR = "dit", "vae", "text_encoder", "tokenizer"
DECODERS = ("wan", "tiny")
"""`LINGSTREAM_DECODER` values: the Wan VAE (the default, for quality) or the tiny streaming decoder."""
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""`LINGSTREAM_MODEL_DTYPE` values besides "auto"."""


@dataclass(frozen=True, slots=True)
class LingBotFastOptions:
    """How a worker loads and runs the model (picklable: it travels to worker processes in the factory)."""

    path: str
    dtype: str = "auto"
    """"auto" (bfloat16 on CUDA, float32 on the CPU) or one of `DTYPES`."""
    window_frames: int = 18
    sink_frames: int = 6
    history_lookback_chunks: int = 4
    """Chunks a session's history keeps before the ones its window holds (`LingBotFastDenoiser.history_spec`): a
    re-seed replays them first, so the window's oldest chunks are rebuilt against a history of their own."""
    text_cache_size: int = 16
    max_prefix_frames: int = DEFAULT_MAX_PREFIX_FRAMES
    denoise_ranks: int = 1
    """Ranks of the DiT group (Ulysses context parallelism, `parallel.py`): what the memory plan and the session
    limits plan for; each rank's denoiser takes its place in the group from its `ModelShard`."""
    compile: str = "off"
    """`torch.compile` of the DiT's blocks: one of `COMPILE_MODES` (`compiled.py`)."""
    attention: str = "auto"
    """The blocks' attention kernel: one of `ATTENTION_CHOICES` (`attention.py`)."""
    warmup_chunks: int | None = None
    """Chunks of a throwaway session run before the denoiser is ready (`warmup.py`); None: enough to fill the window
    and one chunk more when compiling, else 0."""
    decoder: str = "wan"
    """The decode stage's decoder, one of `DECODERS`: "wan" (the Wan VAE) or "tiny" (`tiny_decoder.py`, from
    `tiny_decoder/`); the reference image is always encoded by the Wan VAE."""

    def __post_init__(self) -> None:
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise ModelConfigError(f"dtype must be auto or one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.decoder not in DECODERS:
            raise ModelConfigError(f"decoder must be one of {', '.join(DECODERS)}, got {self.decoder!r}")
        if self.compile not in COMPILE_MODES:
            raise ModelConfigError(f"compile must be one of {', '.join(COMPILE_MODES)}, got {self.compile!r}")
        if self.attention not in ATTENTION_CHOICES:
            raise ModelConfigError(f"attention must be one of {', '.join(ATTENTION_CHOICES)}, got {self.attention!r}")
        if self.warmup_chunks is not None and self.warmup_chunks < 0:
            raise ModelConfigError(f"warmup_chunks must be >= 0, got {self.warmup_chunks}")
        if self.denoise_ranks < 1:
            raise ModelConfigError(f"denoise_ranks must be >= 1, got {self.denoise_ranks}")
        if self.history_lookback_chunks < 0:
            raise ModelConfigError(f"history_lookback_chunks must be >= 0, got {self.history_lookback_chunks}")
        if self.text_cache_size < 1 or self.max_prefix_frames < 1:
            raise ModelConfigError("text_cache_size and max_prefix_frames must be >= 1")
        self.cache_config(3)  # the window and sink must hold at least the published chunk

    def torch_dtype(self, device: torch.device | str) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32
        return DTYPES[self.dtype]

    def cache_config(self, chunk_frames: int) -> CacheConfig:
        """The rolling cache for sessions of `chunk_frames` latent frames per chunk (window and sink in frames)."""
        return CacheConfig(chunk_frames=chunk_frames, window_frames=self.window_frames, sink_frames=self.sink_frames)

    def warm_up_chunks(self) -> int:
        """The warm-up chunks to run: `warmup_chunks`, or the automatic count for `compile` (`warmup.py`)."""
        if self.warmup_chunks is not None:
            return self.warmup_chunks
        return auto_warm_up_chunks(self.cache_config(WARM_UP_CHUNK_SIZE), self.compile)

    @property
    def root(self) -> Path:
        return Path(self.path)


@dataclass(frozen=True, slots=True)
class ModelDirSummary:
    """What `check_model_dir` found: the DiT's sizes and every part's parameter count (the memory estimate's input)."""

    dit: DiTConfig
    dit_parameters: int
    vae_parameters: int
    text_encoder_parameters: int
    vae_config: Mapping[str, Any] | None = field(default=None, compare=False)
    """The VAE's config.json (the memory plan measures its decoder's cache from it); None: the published Wan2.1
    VAE's (diffusers' defaults)."""
    tiny_decoder: TinyDecoderConfig | None = field(default=None, compare=False)
    """The tiny decoder's sizes when it was checked (`decoder="tiny"`): the memory plan measures its memory instead."""


def read_dit_config(directory: Path | str) -> DiTConfig:
    """The DiT's sizes from `dit/config.json` (the `DiTConfig` fields it has; other keys ignored), else the
    published 14B sizes."""
    path = Path(directory) / "config.json"
    if not path.is_file():
        return LINGBOT_FAST_14B
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is not readable JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path} must hold a JSON object")
    known = {field.name for field in fields(DiTConfig)}
    values: dict[str, Any] = {key: value for key, value in raw.items() if key in known}
    if "patch_size" in values:
        values["patch_size"] = tuple(values["patch_size"])
    base = {field.name: getattr(LINGBOT_FAST_14B, field.name) for field in fields(DiTConfig)}
    try:
        return DiTConfig(**(base | values))
    except (ModelConfigError, TypeError) as exc:
        raise CheckpointError(f"{path} does not describe a DiT: {exc}") from exc


def check_model_dir(root: Path | str, *, decoder: str = "wan") -> ModelDirSummary:
    """Checks the whole directory from headers and configs (module docstring); raises one `CheckpointError` per
    part naming what is wrong. Loads no weights (the tokenizer is loaded: it is small). With `decoder="tiny"` the
    `tiny_decoder/` weights too (their latent channels the VAE's)."""
    base = Path(root)
    if not base.is_dir():
        raise CheckpointError(f"model directory {base} does not exist")
    absent = [name for name in (DIT_DIR, VAE_DIR, TEXT_ENCODER_DIR, TOKENIZER_DIR) if not (base / name).is_dir()]
    if absent:
        raise CheckpointError(f"model directory {base} lacks the folder(s) {', '.join(absent)} (see the layout)")
    dit = read_dit_config(base / DIT_DIR)
    dit_layout = locate_checkpoint(base / DIT_DIR, DIT_WEIGHTS)
    dit_specs = read_specs(dit_layout)
    check_specs(dit, dit_specs, dit_layout.directory)
    vae_count, z_dim, vae_config = _check_vae(base / VAE_DIR)
    if dit.out_dim != z_dim or dit.in_dim != 2 * z_dim + 4:
        raise CheckpointError(
            f"the DiT (in_dim {dit.in_dim}, out_dim {dit.out_dim}) does not fit the VAE's {z_dim} latent channels "
            f"(needs in_dim {2 * z_dim + 4}, out_dim {z_dim})"
        )
    text_count, d_model = _check_text_encoder(base / TEXT_ENCODER_DIR)
    if d_model != dit.text_dim:
        raise CheckpointError(f"the text encoder's width {d_model} is not the DiT's text_dim {dit.text_dim}")
    _check_tokenizer(base / TOKENIZER_DIR)
    tiny: TinyDecoderConfig | None = None
    if decoder == "tiny":
        tiny, _ = check_tiny_decoder(base / TINY_DECODER_DIR)
        if tiny.latent_channels != z_dim:
            raise CheckpointError(
                f"the tiny decoder takes {tiny.latent_channels} latent channels, the VAE makes {z_dim} "
                f"({base / TINY_DECODER_DIR})"
            )
    return ModelDirSummary(dit, _count(dit_specs), vae_count, text_count, vae_config, tiny)


def _check_vae(folder: Path) -> tuple[int, int, dict[str, Any]]:
    from diffusers import AutoencoderKLWan

    try:
        config = json.loads((folder / VAE_CONFIG).read_text(encoding="utf-8"))
        with torch.device("meta"):
            model = AutoencoderKLWan.from_config(config)
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(
            f"VAE folder {folder}: {VAE_CONFIG} is missing or not an AutoencoderKLWan: {exc}"
        ) from exc
    if int(model.config.scale_factor_spatial or SPATIAL_COMPRESSION) != SPATIAL_COMPRESSION:
        raise CheckpointError(f"VAE folder {folder}: the VAE does not compress {SPATIAL_COMPRESSION}x spatially")
    layout = locate_checkpoint(folder, DIT_WEIGHTS)
    specs = read_specs(layout)
    expected = {name: TensorSpec(tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}
    compare_specs(expected, specs, folder, "the Wan VAE in its config.json")
    return _count(specs), int(model.config.z_dim), config


def _check_text_encoder(folder: Path) -> tuple[int, int]:
    from transformers import UMT5Config, UMT5EncoderModel

    try:
        raw = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        config = UMT5Config(**{key: value for key, value in raw.items() if not key.startswith("_")})
    except (OSError, ValueError, TypeError) as exc:
        message = f"text encoder folder {folder}: config.json is missing or not a umt5 config: {exc}"
        raise CheckpointError(message) from exc
    with torch.device("meta"):
        model = UMT5EncoderModel(config)
    layout = locate_checkpoint(folder, TEXT_ENCODER_WEIGHTS)
    specs = read_specs(layout)
    expected = {name: TensorSpec(tuple(t.shape), t.dtype) for name, t in model.state_dict().items()}
    compare_specs(
        expected, specs, folder, "the umt5 encoder in its config.json", optional={"encoder.embed_tokens.weight"}
    )
    return _count(specs), int(config.d_model)


def _check_tokenizer(folder: Path) -> None:
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"tokenizer folder {folder} cannot be loaded: {exc}") from exc


def _count(specs: dict[str, TensorSpec]) -> int:
    return sum(math.prod(spec.shape) for spec in specs.values())


def write_tiny_model(
    directory: Path | str, *, seed: int = 0, dit: DiTConfig = TINY_DIT, vae_config: dict[str, Any] | None = None
) -> Path:
    """Random weights for every part in the layout above (`TINY_DIT`, `tiny_vae`, a 2-layer umt5, a byte-level
    tokenizer, a small tiny decoder): what `lingstream tiny-checkpoint DIR` writes. Returns the directory."""
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    write_tiny_checkpoint(root / DIT_DIR, dit, seed=seed)
    config = {field.name: getattr(dit, field.name) for field in fields(DiTConfig)}
    (root / DIT_DIR / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    write_tiny_vae(root / VAE_DIR, seed=seed, config=vae_config)
    write_tiny_text_encoder(root / TEXT_ENCODER_DIR, root / TOKENIZER_DIR, d_model=dit.text_dim, seed=seed)
    write_tiny_decoder(root / TINY_DECODER_DIR, seed=seed)
    return root
