"""An on-frame HUD showing which keys a chunk was generated from, drawn with plain tensor ops (no fonts).

Two key clusters sit in the bottom-left corner, laid out like the keyboard: the look keys `i` over `j k l`, and the
move keys `w` over `a s d`. A held key is a lit amber box with a dark letter; a free key is a darkened box with a
light letter. The letters are tiny 3x5 bitmaps. `draw_hud` returns a new tensor and never changes its input.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from pipeline.lingbot.controls import ControlSnapshot, normalize_keys
from pipeline.lingbot.errors import ModelInputError

__all__ = ["draw_hud"]

_GLYPHS: dict[str, tuple[str, ...]] = {
    "w": ("101", "101", "101", "111", "101"),
    "a": ("010", "101", "111", "101", "101"),
    "s": ("011", "100", "010", "001", "110"),
    "d": ("110", "101", "101", "101", "110"),
    "i": ("111", "010", "010", "010", "111"),
    "j": ("001", "001", "001", "101", "010"),
    "k": ("101", "110", "100", "110", "101"),
    "l": ("100", "100", "100", "100", "111"),
}
# (key, column, row) within a cluster of 3 columns x 2 rows.
_LOOK = (("i", 1, 0), ("j", 0, 1), ("k", 1, 1), ("l", 2, 1))
_MOVE = (("w", 1, 0), ("a", 0, 1), ("s", 1, 1), ("d", 2, 1))
_LIT = (255, 196, 40)
_LIT_INK = (30, 30, 30)
_FREE_INK = (235, 235, 235)
_BORDER = (250, 250, 250)


def draw_hud(frames: torch.Tensor, keys: ControlSnapshot | Iterable[str]) -> torch.Tensor:
    """Draw the HUD for `keys` on every frame of `frames` (uint8 `[T, H, W, 3]`); returns a new tensor.

    Frames too small to hold the HUD (under about 60x24 pixels) are returned unchanged (as a copy).
    """
    if frames.dtype != torch.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
        raise ModelInputError(f"frames must be uint8 [T, H, W, 3], got {frames.dtype} {list(frames.shape)}")
    held = keys.keys if isinstance(keys, ControlSnapshot) else normalize_keys(keys)
    out = frames.clone()
    height, width = frames.shape[1], frames.shape[2]
    box = min(height // 16, width // 14)
    if box < 7:
        return out
    gap = max(1, box // 6)
    margin = box // 2
    cluster_w = 3 * box + 2 * gap
    top = height - margin - (2 * box + gap)
    for origin, cluster in ((margin, _LOOK), (margin + cluster_w + box, _MOVE)):
        for key, column, row in cluster:
            x = origin + column * (box + gap)
            y = top + row * (box + gap)
            _draw_key(out, x, y, box, _GLYPHS[key], lit=key in held)
    return out


def _draw_key(frames: torch.Tensor, x: int, y: int, box: int, glyph: tuple[str, ...], *, lit: bool) -> None:
    region = frames[:, y : y + box, x : x + box]
    if lit:
        region[:] = torch.tensor(_LIT, dtype=torch.uint8)
    else:
        region.copy_((region.to(torch.int16) * 2 // 5).to(torch.uint8))
    border = torch.tensor(_BORDER, dtype=torch.uint8)
    region[:, 0, :] = border
    region[:, -1, :] = border
    region[:, :, 0] = border
    region[:, :, -1] = border
    scale = max(1, (box - 2) // 6)
    glyph_h, glyph_w = 5 * scale, 3 * scale
    gy = (box - glyph_h) // 2
    gx = (box - glyph_w) // 2
    bitmap = torch.tensor([[c == "1" for c in line] for line in glyph], dtype=torch.bool)
    bitmap = bitmap.repeat_interleave(scale, 0).repeat_interleave(scale, 1)
    ink = torch.tensor(_LIT_INK if lit else _FREE_INK, dtype=torch.uint8)
    patch = region[:, gy : gy + glyph_h, gx : gx + glyph_w]
    patch[:, bitmap] = ink
