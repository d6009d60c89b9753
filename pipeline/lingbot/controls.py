"""Keyboard control snapshots: the browser's held keys, normalised and validated.

The client sends a *snapshot* of the keys it holds, with its own increasing sequence number; the newest snapshot
wins. Canonical keys (lower case):

    w / s   move forward / back            i / k   pitch up / down
    a / d   strafe left / right            j / l   yaw (turn) left / right

Aliases: upper-case letters map to their lower-case key (Shift or Caps Lock held), `ArrowUp`/`ArrowDown` map to
`w`/`s` (walk) and `ArrowLeft`/`ArrowRight` map to `j`/`l` (turn, as in most first-person games; strafing stays on
`a`/`d`). Anything else is rejected with a `ControlError` that names the offending keys. Opposite keys held together
cancel out (`ControlSnapshot.axes`). The key table and the bounds are control protocol v1's, defined once in
`pipeline.bidirectional` and re-exported here.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pipeline.bidirectional import CANONICAL_KEYS, KEY_ALIASES, MAX_KEYS_PER_SNAPSHOT, MAX_SEQ, canonical_key
from pipeline.lingbot.errors import ControlError

__all__ = [
    "CANONICAL_KEYS",
    "KEY_ALIASES",
    "MAX_KEYS_PER_SNAPSHOT",
    "MAX_SEQ",
    "ControlAxes",
    "ControlSnapshot",
    "normalize_keys",
]

_MAX_KEY_LENGTH = 32


def normalize_keys(keys: Iterable[str]) -> frozenset[str]:
    """Map every spelling to its canonical key; reject unknown keys, naming them all."""
    if isinstance(keys, str | bytes):
        raise ControlError("keys must be a collection of key names, not one string")
    entries = list(keys)
    if len(entries) > MAX_KEYS_PER_SNAPSHOT:
        raise ControlError(f"too many keys in one snapshot: {len(entries)} > {MAX_KEYS_PER_SNAPSHOT}")
    normalised: set[str] = set()
    unknown: set[str] = set()
    for key in entries:
        if not isinstance(key, str):
            raise ControlError(f"a key must be a string, got {type(key).__name__}")
        canonical = canonical_key(key)
        if canonical is not None:
            normalised.add(canonical)
        else:
            unknown.add(key[:_MAX_KEY_LENGTH])
    if unknown:
        names = ", ".join(repr(key) for key in sorted(unknown))
        raise ControlError(f"unknown keys: {names}; valid: w a s d i j k l and ArrowUp/Down/Left/Right")
    return frozenset(normalised)


@dataclass(frozen=True, slots=True)
class ControlAxes:
    """The net intent of a snapshot, each axis in {-1, 0, +1} (opposite keys cancel)."""

    forward: int
    """+1 forward (w), -1 back (s)."""
    strafe: int
    """+1 right (d), -1 left (a)."""
    yaw: int
    """+1 turn right (l), -1 turn left (j)."""
    pitch: int
    """+1 look up (i), -1 look down (k)."""


@dataclass(frozen=True, slots=True)
class ControlSnapshot:
    """The keys a client holds at its sequence number `seq`. `keys` is always canonical (see `from_keys`)."""

    seq: int
    keys: frozenset[str]

    def __post_init__(self) -> None:
        if isinstance(self.seq, bool) or not isinstance(self.seq, int):
            raise ControlError(f"seq must be an int, got {type(self.seq).__name__}")
        if not 0 <= self.seq <= MAX_SEQ:
            raise ControlError(f"seq must be in 0..{MAX_SEQ}, got {self.seq}")
        if not isinstance(self.keys, frozenset):
            raise ControlError("keys must be a frozenset of canonical keys; use ControlSnapshot.from_keys")
        extra = self.keys - CANONICAL_KEYS
        if extra:
            names = ", ".join(repr(key) for key in sorted(map(str, extra)))
            raise ControlError(f"not canonical keys: {names}; use ControlSnapshot.from_keys to normalise")

    @classmethod
    def from_keys(cls, seq: int, keys: Iterable[str]) -> ControlSnapshot:
        """Build a snapshot from client spellings (aliases allowed); unknown keys raise `ControlError`."""
        return cls(seq=seq, keys=normalize_keys(keys))

    @property
    def idle(self) -> bool:
        """True when no key is held: the snapshot asks for no camera motion."""
        return not self.keys

    @property
    def axes(self) -> ControlAxes:
        held = self.keys
        return ControlAxes(
            forward=("w" in held) - ("s" in held),
            strafe=("d" in held) - ("a" in held),
            yaw=("l" in held) - ("j" in held),
            pitch=("i" in held) - ("k" in held),
        )
