from __future__ import annotations

import pytest

from pipeline.lingbot.controls import ControlAxes, ControlSnapshot, normalize_keys
from pipeline.lingbot.errors import ControlError


def test_aliases_normalise_to_canonical_keys() -> None:
    assert normalize_keys(["W", "ArrowUp", "ArrowLeft", "ArrowRight", "ArrowDown", "d"]) == frozenset("wjlsd")


def test_unknown_keys_are_rejected_and_named() -> None:
    with pytest.raises(ControlError, match=r"unknown keys: ' ', 'q', 'shift'"):
        ControlSnapshot.from_keys(1, ["w", "q", "shift", " "])


def test_one_string_is_not_a_key_collection() -> None:
    with pytest.raises(ControlError, match="not one string"):
        normalize_keys("wasd")


def test_too_many_keys_is_malformed() -> None:
    with pytest.raises(ControlError, match="too many keys"):
        normalize_keys(["w"] * 17)


def test_non_string_key_is_rejected() -> None:
    with pytest.raises(ControlError, match="must be a string"):
        normalize_keys([1])  # type: ignore[list-item]


@pytest.mark.parametrize("seq", [-1, True, 2**53, 2**63, 1.0])  # 2**53: over the wire's MAX_SEQ
def test_bad_sequence_numbers_are_rejected(seq: object) -> None:
    with pytest.raises(ControlError, match="seq"):
        ControlSnapshot(seq=seq, keys=frozenset())  # type: ignore[arg-type]


def test_snapshot_constructor_requires_canonical_keys() -> None:
    with pytest.raises(ControlError, match="not canonical"):
        ControlSnapshot(seq=0, keys=frozenset({"ArrowUp"}))


def test_opposite_keys_cancel() -> None:
    snapshot = ControlSnapshot.from_keys(3, ["w", "s", "d", "j", "i"])
    assert snapshot.axes == ControlAxes(forward=0, strafe=1, yaw=-1, pitch=1)
    assert not snapshot.idle
    assert ControlSnapshot.from_keys(4, []).idle


def test_snapshot_keeps_the_client_sequence_number() -> None:
    snapshot = ControlSnapshot.from_keys(41, ["ArrowUp"])
    assert snapshot.seq == 41
    assert snapshot.keys == frozenset({"w"})
