from __future__ import annotations

import pytest
import torch

from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import ControlError, ModelInputError
from pipeline.lingbot.hud import draw_hud

AMBER = torch.tensor([255, 196, 40], dtype=torch.uint8)


def grey_frames(t: int = 2, h: int = 240, w: int = 416) -> torch.Tensor:
    return torch.full((t, h, w, 3), 128, dtype=torch.uint8)


def amber_pixels(frame: torch.Tensor) -> torch.Tensor:
    return (frame == AMBER).all(dim=-1)


def test_held_keys_are_lit_and_free_keys_darkened() -> None:
    frames = grey_frames()
    idle = draw_hud(frames, ControlSnapshot.from_keys(0, []))
    assert not amber_pixels(idle[0]).any()
    assert (idle[0] < 128).any()  # the free boxes darken the picture
    one = draw_hud(frames, ["w"])
    two = draw_hud(frames, ["w", "l"])
    lit_one = int(amber_pixels(one[0]).sum())
    assert lit_one > 0
    assert int(amber_pixels(two[0]).sum()) > lit_one
    assert torch.equal(one[0], one[1])  # every frame gets the HUD


def test_hud_sits_in_the_bottom_left_and_leaves_the_rest_alone() -> None:
    frames = grey_frames()
    out = draw_hud(frames, ["w", "a", "s", "d", "i", "j", "k", "l"])
    changed = (out != frames).any(dim=-1)[0]
    rows, cols = torch.nonzero(changed, as_tuple=True)
    assert rows.min() > 240 // 2
    assert cols.max() < 416 // 2


def test_input_frames_are_not_modified() -> None:
    frames = grey_frames()
    before = frames.clone()
    draw_hud(frames, ["w"])
    assert torch.equal(frames, before)


def test_tiny_frames_are_returned_unchanged() -> None:
    frames = grey_frames(1, 32, 64)
    assert torch.equal(draw_hud(frames, ["w"]), frames)


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ModelInputError, match="uint8"):
        draw_hud(torch.zeros(1, 64, 64, 3), ["w"])
    with pytest.raises(ControlError, match="unknown keys"):
        draw_hud(grey_frames(), ["x"])
