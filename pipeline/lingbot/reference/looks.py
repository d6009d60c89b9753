"""How the reference world model reads a text prompt: a look (time of day, weather, palette) derived from its words.

The reference model has no text encoder; it stands in for one with a small, deterministic reading of the words so
a prompt visibly changes the picture and tests can check exactly when it does. `look_of(prompt)` folds the words
(lower-cased, split on anything that is not a letter or a digit) through a fixed vocabulary:

    time of day   night midnight dark | dusk sunset evening | dawn sunrise morning | noon day sunny bright
    weather       fog foggy mist misty haze | snow snowy winter ice | rain rainy storm stormy cloudy
    palette       red orange gold golden yellow green forest blue ocean purple violet pink grey gray sepia

Each word found scales the luma contrast and the chroma saturation and shifts the brightness and the chroma (Cb,
Cr); effects combine by multiplying the scales and adding the shifts, so word order does not matter. A prompt with
words but none from the vocabulary still gets a look of its own: a tint whose hue comes from a CRC-32 of its words
(stable across processes and runs, unlike Python's `hash`). The empty prompt is the identity look, so a session
without a prompt renders exactly as before prompts existed.

`PromptLook.apply` works on the reference latent layout (`model.py`): channels 0..11 luma in [-1, 1],
12..13 chroma (Cb, Cr) times 2; the motion channels are left alone.
"""

from __future__ import annotations

import math
import re
import zlib
from dataclasses import dataclass

import torch

__all__ = ["IDENTITY_LOOK", "PromptLook", "look_of", "words_of"]

_LUMA = slice(0, 12)
_CHROMA_B = 12
_CHROMA_R = 13
_WORD = re.compile(r"[^\W_]+")
_HASH_TINT = 0.22
"""Chroma shift (latent units) of the tint given to a prompt with no vocabulary word."""


@dataclass(frozen=True, slots=True)
class PromptLook:
    """A colour grade in latent units: `luma * contrast + brightness` and `chroma * saturation + shift`."""

    contrast: float = 1.0
    brightness: float = 0.0
    saturation: float = 1.0
    cb_shift: float = 0.0
    cr_shift: float = 0.0

    @property
    def is_identity(self) -> bool:
        return self == IDENTITY_LOOK

    def combine(self, other: PromptLook) -> PromptLook:
        return PromptLook(
            contrast=self.contrast * other.contrast,
            brightness=self.brightness + other.brightness,
            saturation=self.saturation * other.saturation,
            cb_shift=self.cb_shift + other.cb_shift,
            cr_shift=self.cr_shift + other.cr_shift,
        )

    def apply(self, latent: torch.Tensor) -> torch.Tensor:
        """`latent` `[16, ...]` in the reference layout -> a graded copy (the identity look returns it unchanged)."""
        if self.is_identity:
            return latent
        out = latent.clone()
        out[_LUMA] = (latent[_LUMA] * self.contrast + self.brightness).clamp(-1.0, 1.0)
        out[_CHROMA_B] = (latent[_CHROMA_B] * self.saturation + self.cb_shift).clamp(-1.0, 1.0)
        out[_CHROMA_R] = (latent[_CHROMA_R] * self.saturation + self.cr_shift).clamp(-1.0, 1.0)
        return out


IDENTITY_LOOK = PromptLook()

_NIGHT = PromptLook(contrast=0.5, brightness=-0.55, saturation=0.5, cb_shift=0.12)
_DUSK = PromptLook(contrast=0.85, brightness=-0.15, saturation=1.1, cb_shift=-0.14, cr_shift=0.18)
_DAWN = PromptLook(brightness=0.05, saturation=0.9, cb_shift=0.02, cr_shift=0.1)
_NOON = PromptLook(contrast=1.1, brightness=0.12, saturation=1.25)
_FOG = PromptLook(contrast=0.45, brightness=0.35, saturation=0.35)
_SNOW = PromptLook(contrast=0.6, brightness=0.4, saturation=0.25, cb_shift=0.04)
_RAIN = PromptLook(contrast=0.8, brightness=-0.2, saturation=0.6, cb_shift=0.06)


def _hue(degrees: float, strength: float = 0.2) -> PromptLook:
    """A chroma shift towards `degrees` on the Cb/Cr plane (0 = red-ish +Cr, 90 = blue-ish +Cb)."""
    radians = math.radians(degrees)
    return PromptLook(cr_shift=strength * math.cos(radians), cb_shift=strength * math.sin(radians))


_VOCABULARY: dict[str, PromptLook] = {
    **dict.fromkeys(("night", "midnight", "dark", "moonlight", "moonlit"), _NIGHT),
    **dict.fromkeys(("dusk", "sunset", "evening", "twilight"), _DUSK),
    **dict.fromkeys(("dawn", "sunrise", "morning"), _DAWN),
    **dict.fromkeys(("noon", "day", "daylight", "sunny", "bright"), _NOON),
    **dict.fromkeys(("fog", "foggy", "mist", "misty", "haze", "hazy"), _FOG),
    **dict.fromkeys(("snow", "snowy", "winter", "ice", "icy"), _SNOW),
    **dict.fromkeys(("rain", "rainy", "storm", "stormy", "cloudy", "overcast"), _RAIN),
    "red": _hue(0),
    "orange": _hue(-35),
    **dict.fromkeys(("gold", "golden", "yellow"), _hue(-70)),
    **dict.fromkeys(("green", "forest", "jungle"), _hue(-140)),
    **dict.fromkeys(("blue", "ocean", "sea"), _hue(105)),
    **dict.fromkeys(("purple", "violet"), _hue(50)),
    "pink": _hue(20, 0.12),
    **dict.fromkeys(("grey", "gray", "sepia", "monochrome"), PromptLook(saturation=0.15)),
}


def words_of(prompt: str) -> list[str]:
    """The prompt's words, lower-cased, in order (letters and digits; everything else separates)."""
    return _WORD.findall(prompt.lower())


def look_of(prompt: str) -> PromptLook:
    """The reference model's look for `prompt` (module docstring); pure and deterministic."""
    words = words_of(prompt)
    look = IDENTITY_LOOK
    matched = False
    for word in words:
        effect = _VOCABULARY.get(word)
        if effect is not None:
            look = look.combine(effect)
            matched = True
    if words and not matched:
        degrees = zlib.crc32(" ".join(words).encode("utf-8")) % 360
        look = _hue(float(degrees), _HASH_TINT)
    return look
