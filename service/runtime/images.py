"""Bounding an uploaded reference image before any model code sees it: bytes, format and pixels.

The REST body carries the image as base64. `decode_image` checks the encoded length against `max_image_bytes`
before decoding (so an oversized upload is never expanded in memory), then decodes strictly. `check_image` reads
only the image header (Pillow opens lazily) to reject formats it cannot read and images with more than
`max_image_pixels` pixels; it may touch a few kilobytes, so the caller runs it off the event loop.
"""

from __future__ import annotations

import base64
import binascii
import io

from PIL import Image, UnidentifiedImageError

from service.config_records import RequestLimits
from service.errors import ImageTooLargeError, InvalidRequestError, UnsupportedMediaTypeError

__all__ = ["check_image", "decode_image"]


def decode_image(encoded: str | None, limits: RequestLimits) -> bytes | None:
    """The image's bytes from the request's base64 field (None stays None)."""
    if encoded is None:
        return None
    compact = "".join(encoded.split())
    if (len(compact) // 4) * 3 - compact[-2:].count("=") > limits.max_image_bytes:
        raise ImageTooLargeError(f"the image is larger than {limits.max_image_bytes} bytes")
    try:
        data = base64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError("image must be base64 (RFC 4648, standard alphabet, padded)") from None
    if not data:
        raise InvalidRequestError("image is empty; send null for no image")
    if len(data) > limits.max_image_bytes:
        raise ImageTooLargeError(f"the image is larger than {limits.max_image_bytes} bytes")
    return data


def check_image(data: bytes, limits: RequestLimits) -> tuple[int, int]:
    """(width, height) from the header; blocking (a little I/O on the buffer): run it in a thread."""
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageTooLargeError(f"the image has more than {limits.max_image_pixels} pixels") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise UnsupportedMediaTypeError("image is not in a readable image format (use PNG, JPEG or WebP)") from None
    if width * height > limits.max_image_pixels:
        raise ImageTooLargeError(
            f"the image has {width}x{height} = {width * height} pixels, more than {limits.max_image_pixels}"
        )
    return width, height
