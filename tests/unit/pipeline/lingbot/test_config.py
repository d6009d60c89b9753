from __future__ import annotations

import io
import math
import struct
import zlib

import pytest
import torch
from PIL import Image

from pipeline.lingbot.config import LingBotSessionConfig, decode_reference_image, probe_image_header
from pipeline.lingbot.errors import ImageInputError, SessionConfigError


def test_empty_config_is_a_complete_session() -> None:
    config = LingBotSessionConfig.from_mapping({})
    assert (config.width, config.height, config.fps, config.chunk_size) == (416, 240, 16, 3)
    assert config.hud is True
    assert config.seed == 0
    assert config.compute_scale == 1.0
    assert config.resolved_frame_num == 9597  # 10 minutes at 16 fps, whole chunks
    assert config.chunk_plan.num_chunks == 800
    assert (config.latent_height, config.latent_width) == (30, 52)
    assert config.chunk_media_s == pytest.approx(0.75)


def test_max_duration_rounds_down_to_whole_chunks() -> None:
    config = LingBotSessionConfig(max_duration_s=10.0)
    assert config.resolved_frame_num == 153  # 12*13-3 frames = 9.56 s


def test_frame_num_and_duration_are_exclusive() -> None:
    with pytest.raises(SessionConfigError, match="not both"):
        LingBotSessionConfig(frame_num=45, max_duration_s=3.0)


def test_frame_num_breaking_the_chunk_contract_names_field_and_neighbours() -> None:
    with pytest.raises(SessionConfigError, match=r"frame_num: .*nearest valid: 45 .* or 57"):
        LingBotSessionConfig.from_mapping({"frame_num": 53})


def test_unknown_fields_are_rejected_by_name() -> None:
    with pytest.raises(SessionConfigError, match=r"unknown session config field\(s\) \['colour', 'path'\]"):
        LingBotSessionConfig.from_mapping({"path": "/etc/passwd", "colour": 1, "fps": 16})


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("fps", 0, r"fps must be in 1\.\.60, got 0"),
        ("fps", 16.0, r"fps must be an integer in 1\.\.60"),
        ("fps", True, r"fps must be an integer"),
        ("chunk_size", 17, r"chunk_size must be in 1\.\.16"),
        ("width", 420, "width must be a multiple of 16"),
        ("width", 1296, r"width must be in 32\.\.1280"),
        ("height", 736, r"height must be in 32\.\.720"),
        ("seed", -1, r"seed must be in 0\.\."),
        ("compute_scale", 0.5, r"compute_scale must be in \[1\.0, 64\.0\]"),
        ("compute_scale", math.inf, "compute_scale must be a number"),
        ("pitch_limit_deg", 90, r"pitch_limit_deg must be in \[1\.0, 89\.0\]"),
        ("max_duration_s", 0, r"max_duration_s must be in \(0\.0, 86400\.0\]"),
        ("hud", "yes", "hud must be true or false"),
        ("move_step", "fast", "move_step must be a number"),
    ],
)
def test_invalid_values_name_the_field_and_range(field: str, value: object, message: str) -> None:
    with pytest.raises(SessionConfigError, match=message):
        LingBotSessionConfig.from_mapping({field: value})


def test_config_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="fps"):
        LingBotSessionConfig(fps=0)


def test_mapping_round_trip() -> None:
    config = LingBotSessionConfig(width=128, height=64, seed=9, frame_num=45, hud=False)
    assert LingBotSessionConfig.from_mapping(config.to_mapping()) == config


def test_pose_steps_and_intrinsics_come_from_the_config() -> None:
    config = LingBotSessionConfig(yaw_step_deg=3.0, pitch_limit_deg=80.0)
    steps = config.pose_steps()
    assert steps.yaw == pytest.approx(math.radians(3.0))
    assert steps.pitch_limit == pytest.approx(math.radians(80.0))
    intrinsics = config.camera_intrinsics()  # the frame's pixels, 90 degrees across
    assert (intrinsics.width, intrinsics.height) == (416, 240)
    assert intrinsics.fx == pytest.approx(208.0)


# --- reference images ---------------------------------------------------------------------------------------------


def encode(image: Image.Image, fmt: str, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **params)
    return buffer.getvalue()


def png_claiming(width: int, height: int) -> bytes:
    """A tiny, well-formed PNG whose header claims `width x height` (an image bomb's header)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    idat = zlib.compress(b"\x00" * 64)
    idat_chunk = struct.pack(">I", len(idat)) + b"IDAT" + idat + struct.pack(">I", zlib.crc32(b"IDAT" + idat))
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return b"\x89PNG\r\n\x1a\n" + chunk + idat_chunk + end


def test_png_is_decoded_to_float_rgb_at_the_session_size() -> None:
    image = Image.new("RGB", (64, 32), (255, 0, 0))
    tensor = decode_reference_image(encode(image, "PNG"), size=(32, 16))
    assert tensor.shape == (3, 16, 32)
    assert tensor.dtype == torch.float32
    assert torch.allclose(tensor[:, 8, 16], torch.tensor([1.0, 0.0, 0.0]))


@pytest.mark.parametrize("fmt", ["JPEG", "WEBP"])
def test_jpeg_and_webp_are_supported(fmt: str) -> None:
    image = Image.new("RGB", (80, 40), (20, 200, 40))
    tensor = decode_reference_image(encode(image, fmt, quality=95), size=(32, 16))
    assert tensor.shape == (3, 16, 32)
    assert torch.allclose(tensor[:, 8, 16], torch.tensor([20, 200, 40]) / 255, atol=0.05)


def test_lossless_webp_header_is_read() -> None:
    data = encode(Image.new("RGB", (321, 123)), "WEBP", lossless=True)
    header = probe_image_header(data)
    assert (header.format, header.width, header.height) == ("WEBP", 321, 123)


def test_wider_image_is_centre_cropped_not_stretched() -> None:
    image = Image.new("RGB", (300, 100))
    image.paste((255, 0, 0), (0, 0, 100, 100))
    image.paste((0, 255, 0), (100, 0, 200, 100))
    image.paste((0, 0, 255), (200, 0, 300, 100))
    tensor = decode_reference_image(encode(image, "PNG"), size=(16, 16))
    assert torch.allclose(tensor, torch.tensor([0.0, 1.0, 0.0])[:, None, None].expand(3, 16, 16), atol=0.02)


def test_transparency_is_composited_over_grey() -> None:
    image = Image.new("RGBA", (16, 16), (255, 0, 0, 0))
    tensor = decode_reference_image(encode(image, "PNG"), size=(16, 16))
    assert torch.allclose(tensor, torch.full((3, 16, 16), 128 / 255))


def test_image_bomb_is_rejected_from_its_header() -> None:
    data = png_claiming(50_000, 50_000)
    assert len(data) < 200
    with pytest.raises(ImageInputError, match=r"50000x50000 = 2500000000 pixels, more than the limit"):
        decode_reference_image(data)


def test_jpeg_bomb_header_is_rejected() -> None:
    data = encode(Image.new("RGB", (8, 8)), "JPEG")
    sof = data.index(b"\xff\xc0")
    bomb = data[: sof + 5] + struct.pack(">HH", 60_000, 60_000) + data[sof + 9 :]
    with pytest.raises(ImageInputError, match="60000x60000"):
        decode_reference_image(bomb)


def test_pixel_limit_is_configurable() -> None:
    data = encode(Image.new("RGB", (100, 100)), "PNG")
    with pytest.raises(ImageInputError, match="more than the limit of 9999"):
        decode_reference_image(data, max_pixels=9_999)


def test_byte_limit_is_checked_first() -> None:
    with pytest.raises(ImageInputError, match="more than the limit of 100"):
        decode_reference_image(b"\x00" * 101, max_bytes=100)


@pytest.mark.parametrize("data", [b"", b"hello world", b"GIF89a\x01\x00\x01\x00", b"RIFF\x00\x00\x00\x00WEBPVP8 "])
def test_non_images_and_unsupported_formats_are_rejected(data: bytes) -> None:
    with pytest.raises(ImageInputError):
        decode_reference_image(data)


def test_truncated_image_is_rejected() -> None:
    data = encode(Image.effect_noise((64, 64), 50).convert("RGB"), "PNG")
    with pytest.raises(ImageInputError, match="could not decode"):
        decode_reference_image(data[: len(data) // 2])


def test_paths_are_never_accepted() -> None:
    with pytest.raises(ImageInputError, match="paths are never accepted"):
        decode_reference_image("/etc/hosts")  # type: ignore[arg-type]
