"""A LingBot session's configuration, validated once, and the bounded decoding of its reference image.

`LingBotSessionConfig()` with no arguments is a complete, valid session: 416x240 at 16 fps, chunks of 3 latent
frames, a fixed seed, the HUD on, and a 10-minute length limit. `from_mapping` is the entry point for untrusted
input (a REST body): unknown fields and out-of-range values are rejected with a message naming the field and the
valid range.

The session length is given either as `frame_num` (must satisfy the chunk contract, see `chunks.py`) or as
`max_duration_s` (rounded down to whole chunks by `frame_num_for_duration`), not both. With neither, the session is
`DEFAULT_MAX_DURATION_S` (600 s) long: at the defaults that is `frame_num = 9597` (800 chunks); a live session
normally ends earlier, when the client leaves.

`decode_reference_image` turns uploaded bytes into the model's input image. It only ever takes bytes (never a
server path), and checks the byte count, then the container header's dimensions, before a single pixel is decoded,
so an image bomb (a tiny file claiming 50000x50000 pixels) is rejected without allocating it.
"""

from __future__ import annotations

import io
import math
import struct
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal, get_args

import numpy as np
import torch

from pipeline.bidirectional import check_prompt
from pipeline.lingbot.camera import DEFAULT_HFOV_DEG, PinholeIntrinsics, PoseSteps
from pipeline.lingbot.chunks import SPATIAL_COMPRESSION, ChunkPlan, frame_num_for_duration
from pipeline.lingbot.errors import ChunkContractError, ImageInputError, SessionConfigError

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = [
    "ATTENTION_CHOICES",
    "DEFAULT_MAX_DURATION_S",
    "DEFAULT_MAX_IMAGE_BYTES",
    "DEFAULT_MAX_IMAGE_PIXELS",
    "SCHEDULES",
    "SPATIAL_COMPRESSION",
    "AttentionChoice",
    "ImageHeader",
    "LingBotSessionConfig",
    "decode_reference_image",
    "probe_image_header",
]

AttentionChoice = Literal["auto", "cudnn", "flash", "efficient", "math", "fa3", "sage"]
"""lingbot-fast's attention kernels (`pipeline.lingbot.models.attention` runs them): here, without torch, for the
command lines that offer them."""
ATTENTION_CHOICES: tuple[str, ...] = get_args(AttentionChoice)

DEFAULT_MAX_DURATION_S = 600.0
DEFAULT_MAX_IMAGE_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_IMAGE_PIXELS = 4096 * 4096
_PIXEL_CEILING = 64 * 1024 * 1024
"""No caller may raise max_pixels above this (it stays below Pillow's own decompression-bomb threshold)."""

_MAX_FRAME_NUM = 60 * 86_400 + 1
_SIZE_MULTIPLE = 2 * SPATIAL_COMPRESSION
_INT_RANGES: dict[str, tuple[int, int]] = {
    "fps": (1, 60),
    "chunk_size": (1, 16),
    "frame_num": (1, _MAX_FRAME_NUM),
    "seed": (0, 2**63 - 1),
    "width": (32, 1280),
    "height": (32, 720),
}
_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "max_duration_s": (0.0, 86_400.0),
    "move_step": (0.0, 1.0),
    "yaw_step_deg": (0.0, 30.0),
    "pitch_step_deg": (0.0, 30.0),
    "pitch_limit_deg": (1.0, 89.0),
    "compute_scale": (1.0, 64.0),
}
SCHEDULES = ("just_in_time", "media_clock")
"""How a real-time session times its chunks: `just_in_time` (`playout.py`: each chunk ready a margin before the
previous one's playback ends) or `media_clock` (the old policy, kept to measure against: each chunk no earlier than
one chunk before its media time, counted from the first chunk, so an idle pause is made up at full speed)."""
_EXCLUSIVE_LOW = frozenset({"max_duration_s"})
_OPTIONAL = frozenset({"frame_num", "max_duration_s"})


@dataclass(frozen=True, slots=True)
class LingBotSessionConfig:
    """Everything one LingBot session needs; every field has a working default. Immutable and validated."""

    fps: int = 16
    """Video frames per second of generated media, 1..60."""
    chunk_size: int = 3
    """Latent frames per chunk, 1..16 (chunk 0 decodes to 4*(chunk_size-1)+1 frames, later ones to 4*chunk_size)."""
    frame_num: int | None = None
    """Session length in video frames (4n+1, whole chunks); exclusive with max_duration_s."""
    max_duration_s: float | None = None
    """Session length in seconds, rounded down to whole chunks; default DEFAULT_MAX_DURATION_S when both unset."""
    seed: int = 0
    """Seed of the model's noise: same seed and same controls give bit-identical frames."""
    move_step: float = 0.08
    """World units walked per video frame while w/s/a/d is held (the camera stands 1 unit above the ground)."""
    yaw_step_deg: float = 2.0
    """Degrees turned per video frame while j/l is held."""
    pitch_step_deg: float = 1.5
    """Degrees tilted per video frame while i/k is held."""
    pitch_limit_deg: float = 85.0
    """Pitch is clamped to +-pitch_limit_deg."""
    hud: bool = True
    """Draw the applied keys on the frames."""
    width: int = 416
    """Frame width in pixels: a multiple of 16 in 32..1280."""
    height: int = 240
    """Frame height in pixels: a multiple of 16 in 32..720."""
    compute_scale: float = 1.0
    """Emulated model cost: the reference denoiser does about compute_scale times its own work (1.0 = cheap)."""
    schedule: str = "just_in_time"
    """How a real-time session times its chunks, one of SCHEDULES (offline generation ignores it)."""
    prompt: str = ""
    """The text prompt the session starts from ("" for none; at most 512 UTF-8 bytes). `SetPrompt` replaces it."""

    def __post_init__(self) -> None:
        for name, (low, high) in _INT_RANGES.items():
            _check_int(name, getattr(self, name), low, high, optional=name in _OPTIONAL)
        for name, (flow, fhigh) in _FLOAT_RANGES.items():
            _check_float(name, getattr(self, name), flow, fhigh, optional=name in _OPTIONAL)
        if not isinstance(self.hud, bool):
            raise SessionConfigError(f"hud must be true or false, got {self.hud!r}")
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise SessionConfigError(f"schedule must be one of {list(SCHEDULES)}, got {str(self.schedule)[:64]!r}")
        try:
            check_prompt(self.prompt)
        except ValueError as exc:
            raise SessionConfigError(f"prompt: {exc}") from None
        for name in ("width", "height"):
            if getattr(self, name) % _SIZE_MULTIPLE != 0:
                raise SessionConfigError(f"{name} must be a multiple of {_SIZE_MULTIPLE}, got {getattr(self, name)}")
        if self.frame_num is not None and self.max_duration_s is not None:
            raise SessionConfigError("give frame_num or max_duration_s, not both")
        if self.frame_num is not None:
            try:
                ChunkPlan.create(self.frame_num, self.chunk_size)
            except ChunkContractError as exc:
                raise SessionConfigError(f"frame_num: {exc}") from None

    @classmethod
    def from_mapping(cls, mapping: Mapping[str, object]) -> LingBotSessionConfig:
        """Build from untrusted key/value input (e.g. a JSON body); unknown fields are rejected."""
        if not isinstance(mapping, Mapping):
            raise SessionConfigError(f"session config must be a mapping, got {type(mapping).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(key)[:64] for key in mapping if key not in known)
        if unknown:
            raise SessionConfigError(f"unknown session config field(s) {unknown}; known: {sorted(known)}")
        values: dict[str, Any] = dict(mapping)
        return cls(**values)

    def to_mapping(self) -> dict[str, object]:
        """The fields as a plain dict (round-trips through `from_mapping`)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @property
    def resolved_frame_num(self) -> int:
        """The session length in video frames after applying max_duration_s or the default."""
        if self.frame_num is not None:
            return self.frame_num
        seconds = self.max_duration_s if self.max_duration_s is not None else DEFAULT_MAX_DURATION_S
        return frame_num_for_duration(seconds, self.fps, self.chunk_size)

    @property
    def chunk_plan(self) -> ChunkPlan:
        return ChunkPlan.create(self.resolved_frame_num, self.chunk_size)

    @property
    def latent_height(self) -> int:
        return self.height // SPATIAL_COMPRESSION

    @property
    def latent_width(self) -> int:
        return self.width // SPATIAL_COMPRESSION

    @property
    def chunk_media_s(self) -> float:
        """Media duration of one full (non-first) chunk in seconds: 4 * chunk_size / fps."""
        return 4 * self.chunk_plan.chunk_size / self.fps

    def pose_steps(self) -> PoseSteps:
        return PoseSteps(
            move=self.move_step,
            yaw=math.radians(self.yaw_step_deg),
            pitch=math.radians(self.pitch_step_deg),
            pitch_limit=math.radians(self.pitch_limit_deg),
        )

    def camera_intrinsics(self) -> PinholeIntrinsics:
        """Pinhole intrinsics of the frame (W x H pixels) with the model's 90 degree horizontal field of view: the
        camera contract's (`camera.CameraChunk`)."""
        return PinholeIntrinsics.from_fov(self.width, self.height, DEFAULT_HFOV_DEG)


def _check_int(name: str, value: object, low: int, high: int, *, optional: bool) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise SessionConfigError(f"{name} must be an integer in {low}..{high}, got {value!r}")
    if not low <= value <= high:
        raise SessionConfigError(f"{name} must be in {low}..{high}, got {value}")


def _check_float(name: str, value: object, low: float, high: float, *, optional: bool) -> None:
    if value is None and optional:
        return
    left = "(" if name in _EXCLUSIVE_LOW else "["
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise SessionConfigError(f"{name} must be a number in {left}{low}, {high}], got {value!r}")
    too_low = value <= low if name in _EXCLUSIVE_LOW else value < low
    if too_low or value > high:
        raise SessionConfigError(f"{name} must be in {left}{low}, {high}], got {value}")


# --- reference image ------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ImageHeader:
    """What a container header claims, read without decoding pixels."""

    format: str
    """Pillow's format name: "PNG", "JPEG" or "WEBP"."""
    width: int
    height: int


_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_JPEG_STANDALONE = frozenset(range(0xD0, 0xDA)) | {0x01}


def probe_image_header(data: bytes) -> ImageHeader:
    """Read format and dimensions from the first bytes of a PNG, JPEG or WebP file; anything else is rejected."""
    if data.startswith(_PNG_SIGNATURE):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise ImageInputError("PNG without a valid IHDR header")
        width, height = struct.unpack(">II", data[16:24])
        return _header("PNG", width, height)
    if data.startswith(b"\xff\xd8"):
        return _probe_jpeg(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _probe_webp(data)
    raise ImageInputError("not a supported image: expected PNG, JPEG or WebP")


def _header(fmt: str, width: int, height: int) -> ImageHeader:
    if width < 1 or height < 1:
        raise ImageInputError(f"{fmt} header declares an empty image ({width}x{height})")
    return ImageHeader(format=fmt, width=width, height=height)


def _probe_jpeg(data: bytes) -> ImageHeader:
    pos = 2
    end = len(data)
    while pos < end:
        if data[pos] != 0xFF:
            raise ImageInputError("JPEG header is corrupt (expected a marker)")
        while pos < end and data[pos] == 0xFF:  # fill bytes
            pos += 1
        if pos >= end:
            break
        marker = data[pos]
        pos += 1
        if marker in _JPEG_STANDALONE:
            continue
        if marker in (0xD9, 0xDA):  # end of image / start of scan before any frame header
            break
        if pos + 2 > end:
            break
        (length,) = struct.unpack(">H", data[pos : pos + 2])
        if length < 2:
            raise ImageInputError("JPEG header is corrupt (segment length < 2)")
        if marker in _JPEG_SOF:
            if pos + 7 > end:
                break
            height, width = struct.unpack(">HH", data[pos + 3 : pos + 7])
            return _header("JPEG", width, height)
        pos += length
    raise ImageInputError("JPEG without a frame header (SOF) before its image data")


def _probe_webp(data: bytes) -> ImageHeader:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return _header("WEBP", width & 0x3FFF, height & 0x3FFF)
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        (bits,) = struct.unpack("<I", data[21:25])
        return _header("WEBP", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return _header("WEBP", width, height)
    raise ImageInputError("WebP without a recognisable VP8/VP8L/VP8X header")


def decode_reference_image(
    data: bytes,
    *,
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES,
    max_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    size: tuple[int, int] = (416, 240),
) -> torch.Tensor:
    """Decode an uploaded PNG/JPEG/WebP into the model's input: float32 `[3, H, W]` in [0, 1], `(W, H) = size`.

    Order of checks: the argument is bytes (a path is refused), then `len(data) <= max_bytes`, then the header's
    `width * height <= max_pixels`, and only then are pixels decoded (JPEGs at a reduced scale when they are much
    larger than `size`). The image is centre-cropped to the target aspect ratio, then resized; transparency is
    composited over mid grey. Every failure is an `ImageInputError`.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ImageInputError(f"reference image must be bytes, got {type(data).__name__} (paths are never accepted)")
    if not 1 <= max_pixels <= _PIXEL_CEILING:
        raise ImageInputError(f"max_pixels must be in 1..{_PIXEL_CEILING}, got {max_pixels}")
    target_w, target_h = size
    if not (1 <= target_w <= 8192 and 1 <= target_h <= 8192):
        raise ImageInputError(f"target size must be within 1..8192 per side, got {size}")
    if len(data) > max_bytes:
        raise ImageInputError(f"reference image is {len(data)} bytes, more than the limit of {max_bytes}")
    raw = bytes(data)
    header = probe_image_header(raw)
    if header.width * header.height > max_pixels:
        raise ImageInputError(
            f"reference image is {header.width}x{header.height} = {header.width * header.height} pixels, "
            f"more than the limit of {max_pixels}"
        )
    return _decode_pixels(raw, header, target_w, target_h)


def _decode_pixels(raw: bytes, header: ImageHeader, target_w: int, target_h: int) -> torch.Tensor:
    from PIL import Image  # lazy: only this function needs Pillow

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(raw), formats=[header.format]) as opened:
                if opened.size != (header.width, header.height):
                    raise ImageInputError(
                        f"image size {opened.size} does not match its header ({header.width}x{header.height})"
                    )
                if header.format == "JPEG":
                    opened.draft("RGB", (target_w, target_h))
                opened.load()
                image = _to_rgb(opened)
    except ImageInputError:
        raise
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError, Warning) as exc:
        raise ImageInputError(f"could not decode the {header.format} image: {exc}") from exc
    width, height = image.size
    target_aspect = target_w / target_h
    if width / height > target_aspect:
        crop_w = max(1, round(height * target_aspect))
        left = (width - crop_w) // 2
        box = (left, 0, left + crop_w, height)
    else:
        crop_h = max(1, round(width / target_aspect))
        top = (height - crop_h) // 2
        box = (0, top, width, top + crop_h)
    resized = image.crop(box).resize((target_w, target_h), Image.Resampling.LANCZOS)
    array = np.array(resized, dtype=np.uint8)  # a writable copy (torch warns on read-only arrays)
    return torch.from_numpy(array).permute(2, 0, 1).to(torch.float32).div_(255.0).contiguous()


def _to_rgb(image: PILImage) -> PILImage:
    from PIL import Image

    if "A" in image.getbands() or "transparency" in image.info:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (128, 128, 128, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
