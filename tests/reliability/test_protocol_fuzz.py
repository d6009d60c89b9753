"""Property-based fuzzing of the control protocol decoder (`transport/protocol.py`) and of the intake behind it:
whatever a client sends, `decode_control` returns a control message or a `ProtocolError` (it never raises), what it
accepts is valid and round-trips, its error messages never echo much input, and every call is fast, even for the
shapes that make parsers slow (deep nesting, huge numbers, megabytes of text)."""

from __future__ import annotations

import gc
import json
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.bidirectional import ControlMessage, ControlState, ResetPose, Stop
from tests.support.fakes.transport_port import FakeSessionPort
from transport.protocol import (
    CANONICAL_KEYS,
    KEY_ALIASES,
    MAX_INBOUND_BYTES,
    MAX_KEYS_PER_SNAPSHOT,
    MAX_SEQ,
    ProtocolError,
    ProtocolErrorCode,
    decode_control,
    encode_control,
)
from transport.session.control import ControlIntake

FUZZ = settings(max_examples=400, deadline=None, derandomize=True, database=None, suppress_health_check=[])
BUDGET_S = 0.05  # one decode, generously (the real figure is tens of microseconds)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=6) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=30,
)
key_names = st.sampled_from(sorted(CANONICAL_KEYS) + sorted(KEY_ALIASES) + ["q", "", "ArrowUpp", "W ", "ww", "\u0000"])
messages = st.fixed_dictionaries(
    {
        "v": st.one_of(st.just(1), st.integers(-3, 3), st.floats(), st.booleans(), st.text(max_size=3), st.none()),
        "type": st.one_of(st.sampled_from(["control_state", "reset_pose", "stop", "state", "chunk"]), st.text()),
    },
    optional={
        "seq": st.one_of(
            st.integers(-(2**70), 2**70), st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.text()
        ),
        "keys": st.one_of(st.lists(key_names, max_size=MAX_KEYS_PER_SNAPSHOT + 4), json_values),
        "extra": json_values,
    },
)


def _decode_timed(data: bytes | str) -> ControlMessage | ProtocolError:
    # The best of three, with the collector paused: a pathological input is slow every time, while a one-off
    # stall (a full collection late in a long suite, the process descheduled) once took 500 ms in a clean-clone run.
    best = float("inf")
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(3):
            started = time.perf_counter()
            result = decode_control(data)
            best = min(best, time.perf_counter() - started)
            if best < BUDGET_S:
                break
    finally:
        if was_enabled:
            gc.enable()
    assert best < BUDGET_S, f"decoding {len(data)} units took {best * 1000:.1f} ms (best of three)"
    return result


def _check(data: bytes | str, result: Any) -> None:
    assert isinstance(result, ControlState | ResetPose | Stop | ProtocolError), type(result)
    if isinstance(result, ProtocolError):
        assert isinstance(result.code, ProtocolErrorCode)
        assert len(result.message) <= 160, result.message  # it never echoes much of the input
        return
    size = len(data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data)
    assert size <= MAX_INBOUND_BYTES
    if isinstance(result, ControlState):
        assert 0 <= result.seq <= MAX_SEQ
        assert result.keys <= CANONICAL_KEYS
    assert decode_control(encode_control(result)) == result  # what is accepted round-trips


@FUZZ
@given(st.binary(max_size=2 * MAX_INBOUND_BYTES))
def test_arbitrary_bytes_never_raise(data: bytes) -> None:
    _check(data, _decode_timed(data))


@FUZZ
@given(st.text(alphabet=st.characters(codec=None), max_size=2 * MAX_INBOUND_BYTES))
def test_arbitrary_text_never_raises_even_with_lone_surrogates(data: str) -> None:
    _check(data, _decode_timed(data))


@FUZZ
@given(json_values)
def test_arbitrary_json_never_raises(value: object) -> None:
    data = json.dumps(value, allow_nan=True)
    _check(data, _decode_timed(data))


@FUZZ
@given(messages, st.booleans())
def test_near_valid_messages_are_accepted_only_when_valid(message: dict[str, Any], as_bytes: bool) -> None:
    text = json.dumps(message, allow_nan=True)
    data: bytes | str = text.encode() if as_bytes else text
    result = _decode_timed(data)
    _check(data, result)
    valid_shape = (
        type(message["v"]) is int
        and message["v"] == 1
        and message["type"] in ("control_state", "reset_pose", "stop")
        and "extra" not in message
    )
    if not valid_shape:
        assert isinstance(result, ProtocolError)
    if isinstance(result, ControlState):
        assert type(message["seq"]) is int
        assert {KEY_ALIASES.get(key, key) for key in message["keys"]} == result.keys


@FUZZ
@given(st.sampled_from(['"v"', '"type"', '"seq"', '"keys"']), st.integers(0, 3))
def test_a_field_twice_is_malformed(field: str, position: int) -> None:
    parts = ['"v": 1', '"type": "control_state"', '"seq": 1', '"keys": []']
    parts.insert(position, f"{field}: 1")
    result = _decode_timed("{" + ", ".join(parts) + "}")
    assert isinstance(result, ProtocolError)
    assert result.code is ProtocolErrorCode.MALFORMED_JSON


def test_pathological_inputs_are_answered_fast() -> None:
    depth = MAX_INBOUND_BYTES // 2
    cases: dict[str, bytes | str] = {
        "nesting": "[" * depth + "]" * depth,
        "object nesting": '{"a":' * 200 + "1" + "}" * 200,
        "huge number": "1" * (MAX_INBOUND_BYTES - 1),
        "huge exponent": '{"v": 1, "type": "control_state", "seq": 1e99999, "keys": []}',
        "a megabyte of text": "x" * (1 << 20),
        "a megabyte of bytes": b"\xff" * (1 << 20),
        "ten megabytes of JSON": json.dumps({"v": 1, "type": "stop", "pad": "y" * (10 << 20)}),
        "NaN": '{"v": 1, "type": "control_state", "seq": NaN, "keys": []}',
        "quotes": '"' * MAX_INBOUND_BYTES,
    }
    for name, data in cases.items():
        result = _decode_timed(data)
        assert isinstance(result, ProtocolError), name


@settings(max_examples=150, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(st.binary(max_size=64), messages.map(json.dumps)), max_size=40))
def test_the_intake_never_raises_and_counts_every_message(batch: list[bytes | str]) -> None:
    port = FakeSessionPort("s1", width=32, height=32, fps=10.0)
    replies: list[object] = []
    intake = ControlIntake(port, replies.append)
    for data in batch:
        intake.receive(data)
    stats = intake.statistics()
    assert stats.received == len(batch)
    assert stats.rejected + stats.forwarded + stats.inbox.stale + stats.inbox.duplicates + stats.push_failures == len(
        batch
    )
    assert stats.error_replies + stats.error_replies_suppressed == stats.rejected
    assert stats.error_replies <= 11  # the burst of the error rate limit: garbage cannot make the service flood back
