"""A tiny streaming decoder for Wan latents (`LINGSTREAM_DECODER=tiny`), TAEHV-style, written here.

The Wan VAE's decoder is most of a chunk's decode time and keeps ~1.9 GB of feature cache per session at 832x480.
A TAEHV-style decoder (madebyollin/taehv, read for its architecture facts; the code is ours) turns the same
normalised latents into frames with a few 2-D convolutions per latent frame and one small memory per block:

    clamp  tanh(x / 3) * 3                                    the latents, bounded
    conv 3x3 16 -> 256, ReLU
    stage x3, widths 256, 128, 64 (each, in order):
        3 memory blocks      ReLU(convs(cat[x, x of the previous time step]) + skip(x))
        upsample x2          nearest, in space
        time grow            1x1 conv to width * s channels, split into s time steps (s = 1, 2, 2)
        conv 3x3             to the next width (64 after the last stage), no bias
    ReLU, conv 3x3 64 -> 3, then clamp to [0, 1]

So one latent frame becomes 1 x 2 x 2 = 4 video frames at 8x the size; a memory block's "previous time step" is the
previous frame at its own time resolution (zeros before the first). The first latent frame's first three frames are
dropped (the causal alignment with the Wan VAE), so the frame contract is the Wan VAE's: the session's first latent
frame decodes to 1 frame, every later one to 4 (chunk 0 of 3 latent frames: 9 frames; later chunks: 12).

Streaming: a session's state is each memory block's last input. `StreamingTinyDecoder` runs one latent frame per
call (its 1, then 2, then 4 time steps batched inside), so decoding latent frame by latent frame (progressive
decode), chunk by chunk, or all latents at once is the same sequence of operations: equal bit for bit
(`test_tiny_decoder.py`). `TinyVideoDecoder.decode` also takes many latent frames at once (every convolution batched
over them): the same frames within float rounding (1.2e-7 measured on the CPU), not bit for bit.

Weights: `<model dir>/tiny_decoder/` holds one safetensors file (`TINY_DECODER_WEIGHTS`) whose `decoder.<i>...` tensors
follow the layer order above (the names TAEHV's Wan 2.1 checkpoint uses: `taew2_1.safetensors` renamed fits;
encoder tensors in it are ignored). A time-grow layer stored for stride 2 where this decoder uses stride 1 keeps the
last time step's channels (as TAEHV does). Loading is strict otherwise: a missing, unexpected or misshapen decoder
tensor is a `CheckpointError` naming it.

Input: normalised latents, exactly what the DiT produces (TAEHV uses no latent mean/std). Output: the seam's video
`[3, T, H, W]` in [-1, 1] (`2 * rgb - 1`), like `StreamingVAE.decode_chunk`, so `LingBotFastDecoder` takes either.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from pipeline.lingbot.errors import ModelInputError, ModelSessionError
from pipeline.lingbot.models.errors import CheckpointError

__all__ = [
    "TINY_DECODER_DIR",
    "TINY_DECODER_WEIGHTS",
    "TINY_TEST_CONFIG",
    "StreamingTinyDecoder",
    "TinyDecoderConfig",
    "TinyVideoDecoder",
    "check_tiny_decoder",
    "load_tiny_decoder",
    "write_tiny_decoder",
]

TINY_DECODER_DIR = "tiny_decoder"
"""The folder of the model directory that holds the tiny decoder's weights."""
TINY_DECODER_WEIGHTS = "model.safetensors"


@dataclass(frozen=True, slots=True)
class TinyDecoderConfig:
    """The decoder's sizes: `widths` of the three stages and the last conv; `time_strides` per stage's time grow."""

    latent_channels: int = 16
    widths: tuple[int, int, int, int] = (256, 128, 64, 64)
    time_strides: tuple[int, int, int] = (1, 2, 2)
    blocks_per_stage: int = 3

    @property
    def time_upscale(self) -> int:
        scale = 1
        for stride in self.time_strides:
            scale *= stride
        return scale

    @property
    def frames_to_trim(self) -> int:
        """Frames dropped from a session's first latent frame (its first frame stands for one video frame)."""
        return self.time_upscale - 1


TINY_TEST_CONFIG = TinyDecoderConfig(widths=(16, 8, 8, 8))
"""A small decoder for tests and `write_tiny_decoder`'s default (random weights: the plumbing, not a picture)."""


class _MemoryBlock(nn.Module):
    """ReLU(convs(cat[x, past]) + x): past is the block's input one time step earlier."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(width * 2, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
        )
        self.skip = nn.Identity()
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        return self.act(self.conv(torch.cat([x, past], 1)) + self.skip(x))  # type: ignore[no-any-return]


class _TimeGrow(nn.Module):
    """One time step -> `stride` time steps: a 1x1 conv to width * stride channels, split in order."""

    def __init__(self, width: int, stride: int) -> None:
        super().__init__()
        self.stride = stride
        self.conv = nn.Conv2d(width, width * stride, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps, channels, height, width = x.shape
        return self.conv(x).reshape(steps * self.stride, channels, height, width)  # type: ignore[no-any-return]


class _Clamp(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / 3) * 3


class TinyVideoDecoder(nn.Module):
    """The layers (module docstring); `decoder` is an `nn.Sequential` in checkpoint order. `decode(latents,
    memory)` runs time steps `[T, C, h, w]` through it with the per-block memory `memory` (updated in place)."""

    def __init__(self, config: TinyDecoderConfig = TinyDecoderConfig()) -> None:
        super().__init__()
        self.config = config
        widths = config.widths
        layers: list[nn.Module] = [_Clamp(), nn.Conv2d(config.latent_channels, widths[0], 3, padding=1), nn.ReLU()]
        for stage, stride in enumerate(config.time_strides):
            width = widths[stage]
            layers += [_MemoryBlock(width) for _ in range(config.blocks_per_stage)]
            layers += [
                nn.Upsample(scale_factor=2),
                _TimeGrow(width, stride),
                nn.Conv2d(width, widths[stage + 1], 3, padding=1, bias=False),
            ]
        layers += [nn.ReLU(), nn.Conv2d(widths[3], 3, 3, padding=1)]
        self.decoder = nn.Sequential(*layers)
        self.memory_layers = tuple(i for i, layer in enumerate(layers) if isinstance(layer, _MemoryBlock))

    def new_memory(self) -> list[torch.Tensor | None]:
        """A session's memory before its first frame: one slot per memory block (None: zeros)."""
        return [None] * len(self.memory_layers)

    def decode(self, latents: torch.Tensor, memory: list[torch.Tensor | None]) -> torch.Tensor:
        """Latent time steps `[T, C, h, w]` -> RGB time steps `[T * time_upscale, 3, 8h, 8w]` in [0, 1], untrimmed.

        Each memory block takes, for every time step, its own input one step earlier: the previous step in this
        call, or `memory` (the session's last one) for the first; `memory` then holds this call's last input."""
        x = latents
        slot = 0
        for layer in self.decoder:
            if isinstance(layer, _MemoryBlock):
                last = memory[slot]
                first = torch.zeros_like(x[:1]) if last is None else last
                past = torch.cat([first, x[:-1]], 0)
                memory[slot] = x[-1:].clone()
                x = layer(x, past)
                slot += 1
            else:
                x = layer(x)
        return x.clamp(0, 1)


@dataclass(slots=True)
class _Session:
    memory: list[torch.Tensor | None]
    frames_decoded: int = 0  # raw frames out of the decoder so far (the first `frames_to_trim` are dropped)


class StreamingTinyDecoder:
    """`TinyVideoDecoder` on one device with per-session memories: the `StreamingVAE` decode interface.

    `open(session_id)`, `decode_chunk(session_id, latent)` in order, `release(session_id)` (idempotent). Concurrency:
    one stage thread decodes at a time; sessions are independent."""

    def __init__(self, module: TinyVideoDecoder, *, device: torch.device | str, dtype: torch.dtype) -> None:
        self._module = module.to(device=device, dtype=dtype).eval()
        self._device = torch.device(device)
        self._dtype = dtype
        self._sessions: dict[str, _Session] = {}
        self._lock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def module(self) -> TinyVideoDecoder:
        return self._module

    def open(self, session_id: str) -> None:
        with self._lock:
            if session_id in self._sessions:
                raise ModelSessionError(f"tiny decoder: session {session_id!r} is already open")
            self._sessions[session_id] = _Session(self._module.new_memory())

    def release(self, session_id: str) -> None:
        with self._lock:
            self._sessions.pop(session_id, None)

    def decode_chunk(self, session_id: str, latent: torch.Tensor) -> torch.Tensor:
        """Normalised latents `[C, n, h, w]` (the session's next n) -> video `[3, T, 8h, 8w]` float32 in [-1, 1]:
        `T = 4(n - 1) + 1` for the session's first chunk, `4n` after (the Wan VAE's contract)."""
        with self._lock:
            state = self._sessions.get(session_id)
        if state is None:
            raise ModelSessionError(f"tiny decoder: session {session_id!r} is not open (open it first)")
        channels = self._module.config.latent_channels
        if latent.dim() != 4 or latent.shape[0] != channels or latent.shape[1] < 1:
            raise ModelInputError(
                f"tiny decoder: latents must be [{channels}, n >= 1, h, w], got {tuple(latent.shape)}"
            )
        with torch.inference_mode():
            steps = latent.to(device=self._device, dtype=self._dtype).permute(1, 0, 2, 3)
            # One latent frame per call, as progressive decode hands them over: a chunk decoded whole, in parts or
            # in other chunkings is then the same operations, equal bit for bit (batching over more time steps
            # changes a convolution's rounding by ~1e-7).
            rgb = torch.cat([self._module.decode(steps[i : i + 1], state.memory) for i in range(steps.shape[0])])
            trim = max(0, self._module.config.frames_to_trim - state.frames_decoded)
            state.frames_decoded += rgb.shape[0]
            return rgb[trim:].permute(1, 0, 2, 3).float() * 2 - 1


def _weights_path(folder: Path | str) -> Path:
    path = Path(folder) / TINY_DECODER_WEIGHTS
    if not path.is_file():
        raise CheckpointError(
            f"LINGSTREAM_DECODER=tiny needs the tiny decoder's weights at {path} (a TAEHV-style Wan 2.1 decoder: "
            "safetensors with decoder.* tensors, docs/lingbot-fast.md), or LINGSTREAM_DECODER=wan"
        )
    return path


def _decoder_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The `decoder.*` tensors' shapes from the file's header (no weights read), names without the prefix."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as handle:
            return {
                key.removeprefix("decoder."): tuple(handle.get_slice(key).get_shape())
                for key in handle.keys()  # noqa: SIM118 (a safetensors handle is not iterable)
                if key.startswith("decoder.")
            }
    except Exception as exc:  # a truncated or foreign file: the reader's own message, with the path
        raise CheckpointError(f"tiny decoder: cannot read {path}: {exc}") from exc


def check_tiny_decoder(folder: Path | str) -> tuple[TinyDecoderConfig, int]:
    """The decoder's sizes and parameter count from the weights' header (no weights read); `CheckpointError` naming
    every missing, unexpected or misshapen tensor (module docstring)."""
    path = _weights_path(folder)
    shapes = _decoder_shapes(path)
    config = _config_from(shapes, path)
    with torch.device("meta"):
        module = TinyVideoDecoder(config)
    expected = {key: tuple(value.shape) for key, value in module.decoder.state_dict().items()}
    shapes = {key: _grown_shape(module, key, shape, expected) for key, shape in shapes.items()}
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    misshapen = sorted(k for k in set(expected) & set(shapes) if shapes[k] != expected[k])
    problems = [
        f"{what}: {', '.join(f'decoder.{key}' for key in keys)}"
        for what, keys in (("missing", missing), ("unexpected", unexpected), ("wrong shape", misshapen))
        if keys
    ]
    if problems:
        raise CheckpointError(f"tiny decoder {path}: " + "; ".join(problems))
    return config, sum(math.prod(shape) for shape in expected.values())


def _grown_shape(
    module: TinyVideoDecoder, key: str, shape: tuple[int, ...], expected: Mapping[str, tuple[int, ...]]
) -> tuple[int, ...]:
    """A time grow stored for a larger stride than this decoder's keeps the last time step's channels."""
    index, _, rest = key.partition(".")
    want = expected.get(key)
    grow = rest == "conv.weight" and want is not None and isinstance(module.decoder[int(index)], _TimeGrow)
    if grow and want is not None and len(shape) == 4 and shape[0] > want[0] and shape[0] % want[0] == 0:
        return want if shape[1:] == want[1:] else shape
    return shape


def load_tiny_decoder(folder: Path | str) -> TinyVideoDecoder:
    """The decoder from `folder/TINY_DECODER_WEIGHTS` (module docstring), strictly, on the CPU in float32; its sizes
    are read from the weights' shapes (the published size, or a test's small one)."""
    from safetensors.torch import load_file

    config, _ = check_tiny_decoder(folder)
    path = _weights_path(folder)
    tensors = {k.removeprefix("decoder."): v for k, v in load_file(str(path)).items() if k.startswith("decoder.")}
    module = TinyVideoDecoder(config)
    for key, value in module.decoder.state_dict().items():
        if tensors[key].shape[0] > value.shape[0]:  # a time grow stored for a larger stride (`_grown_shape`)
            tensors[key] = tensors[key][-value.shape[0] :]
    module.decoder.load_state_dict({key: value.float() for key, value in tensors.items()})
    return module


def _config_from(shapes: Mapping[str, tuple[int, ...]], path: Path) -> TinyDecoderConfig:
    first = shapes.get("1.weight")
    if first is None or len(first) != 4:
        raise CheckpointError(f"tiny decoder {path}: no decoder.1.weight (the first conv) to read the sizes from")
    default = TinyDecoderConfig()
    widths = [first[0]]
    index = 3
    for _ in default.time_strides:
        index += default.blocks_per_stage + 2  # the memory blocks, the upsample, the time grow
        conv = shapes.get(f"{index}.weight")
        if conv is None or len(conv) != 4:
            raise CheckpointError(f"tiny decoder {path}: no decoder.{index}.weight (a stage's last conv)")
        widths.append(conv[0])
        index += 1
    return TinyDecoderConfig(latent_channels=first[1], widths=(widths[0], widths[1], widths[2], widths[3]))


def write_tiny_decoder(folder: Path | str, *, config: TinyDecoderConfig = TINY_TEST_CONFIG, seed: int = 0) -> Path:
    """Random weights in the layout `load_tiny_decoder` reads (tests, `lingstream tiny-checkpoint`)."""
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    module = TinyVideoDecoder(config)
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    path = out / TINY_DECODER_WEIGHTS
    save_file({f"decoder.{k}": v.contiguous() for k, v in module.decoder.state_dict().items()}, str(path))
    return path
