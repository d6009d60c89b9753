"""Control protocol v1: strict decoding that never raises, sequence tracking, size-capped status encoding."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeline.bidirectional
import transport.protocol
from pipeline.bidirectional import MAX_PROMPT_BYTES, ControlState, Pause, ResetPose, Resume, SetPrompt, Stop
from transport.base import ChunkStatus, DoneStatus, ErrorStatus, StateStatus, WarningStatus
from transport.protocol import (
    MAX_INBOUND_BYTES,
    MAX_SEQ,
    ControlInbox,
    ProtocolError,
    ProtocolErrorCode,
    decode_control,
    decode_status,
    encode_control,
    encode_status,
    error_status,
)


def _code(data: bytes | str) -> ProtocolErrorCode:
    result = decode_control(data)
    assert isinstance(result, ProtocolError), result
    return result.code


def test_control_state_decodes_with_normalised_keys() -> None:
    message = decode_control('{"v":1,"type":"control_state","seq":7,"keys":["w","ArrowLeft","W","w","ArrowUp"]}')
    assert message == ControlState(seq=7, keys=frozenset({"w", "j"}))


@pytest.mark.parametrize(
    ("alias", "key"), [("ArrowUp", "w"), ("ArrowDown", "s"), ("ArrowLeft", "j"), ("ArrowRight", "l")]
)
def test_arrow_keys_are_aliases(alias: str, key: str) -> None:
    assert decode_control(json.dumps({"v": 1, "type": "control_state", "seq": 0, "keys": [alias]})) == ControlState(
        0, frozenset({key})
    )


def test_discrete_commands_decode() -> None:
    assert decode_control(b'{"v":1,"type":"reset_pose"}') == ResetPose()
    assert decode_control(b'{"type":"stop","v":1}') == Stop()


def test_prompt_pause_and_resume_decode_and_round_trip() -> None:
    assert decode_control('{"v":1,"type":"prompt","seq":3,"text":"a snowy night"}') == SetPrompt(3, "a snowy night")
    assert decode_control('{"v":1,"type":"prompt","seq":0,"text":""}') == SetPrompt(0, "")
    assert decode_control(b'{"v":1,"type":"pause"}') == Pause()
    assert decode_control(b'{"v":1,"type":"resume"}') == Resume()
    for message in (SetPrompt(2**53 - 1, "névé at dawn 🌄"), Pause(), Resume()):
        assert decode_control(encode_control(message)) == message


def test_the_longest_prompt_fits_in_a_message_however_it_is_escaped() -> None:
    # Control characters are the worst case: 6 bytes of JSON (\u0001) per byte of the prompt.
    worst = "\u0001" * MAX_PROMPT_BYTES
    encoded = encode_control(SetPrompt(2**53 - 1, worst))
    assert len(encoded) <= MAX_INBOUND_BYTES
    assert decode_control(encoded) == SetPrompt(2**53 - 1, worst)


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (json.dumps({"v": 1, "type": "prompt", "seq": 1, "text": "x" * (MAX_PROMPT_BYTES + 1)}), "prompt_too_large"),
        (
            json.dumps({"v": 1, "type": "prompt", "seq": 1, "text": "é" * (MAX_PROMPT_BYTES // 2 + 1)}),
            "prompt_too_large",
        ),
        ('{"v":1,"type":"prompt","seq":1,"text":"\\ud800"}', "invalid_prompt"),
        ('{"v":1,"type":"prompt","seq":1,"text":5}', "invalid_prompt"),
        ('{"v":1,"type":"prompt","seq":1,"text":null}', "invalid_prompt"),
        ('{"v":1,"type":"prompt","seq":1}', "invalid_message"),
        ('{"v":1,"type":"prompt","seq":-1,"text":"a"}', "invalid_seq"),
        ('{"v":1,"type":"prompt","seq":1,"text":"a","keys":[]}', "invalid_message"),
        ('{"v":1,"type":"pause","seq":1}', "invalid_message"),
    ],
)
def test_bad_prompts_and_commands_get_stable_codes(data: str, code: str) -> None:
    assert str(_code(data)) == code


def test_empty_key_list_is_a_valid_snapshot() -> None:
    assert decode_control('{"v":1,"type":"control_state","seq":3,"keys":[]}') == ControlState(3, frozenset())


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (b"\xff\xfe", ProtocolErrorCode.MALFORMED_JSON),
        ("not json", ProtocolErrorCode.MALFORMED_JSON),
        ('{"v":1,"type":"stop","type":"stop"}', ProtocolErrorCode.MALFORMED_JSON),
        ('{"v":1,"type":"control_state","seq":NaN,"keys":[]}', ProtocolErrorCode.MALFORMED_JSON),
        ("[1,2]", ProtocolErrorCode.INVALID_MESSAGE),
        ('"stop"', ProtocolErrorCode.INVALID_MESSAGE),
        ('{"type":"stop"}', ProtocolErrorCode.INVALID_MESSAGE),
        ('{"v":"1","type":"stop"}', ProtocolErrorCode.INVALID_MESSAGE),
        ('{"v":true,"type":"stop"}', ProtocolErrorCode.INVALID_MESSAGE),
        ('{"v":2,"type":"stop"}', ProtocolErrorCode.UNSUPPORTED_VERSION),
        ('{"v":1}', ProtocolErrorCode.INVALID_MESSAGE),
        ('{"v":1,"type":"teleport"}', ProtocolErrorCode.UNKNOWN_TYPE),
        ('{"v":1,"type":"stop","now":true}', ProtocolErrorCode.INVALID_MESSAGE),
        ('{"v":1,"type":"control_state","seq":1}', ProtocolErrorCode.INVALID_MESSAGE),
        ('{"v":1,"type":"control_state","keys":[]}', ProtocolErrorCode.INVALID_MESSAGE),
        ('{"v":1,"type":"control_state","seq":1,"keys":[],"extra":0}', ProtocolErrorCode.INVALID_MESSAGE),
        ('{"v":1,"type":"control_state","seq":-1,"keys":[]}', ProtocolErrorCode.INVALID_SEQ),
        ('{"v":1,"type":"control_state","seq":1.0,"keys":[]}', ProtocolErrorCode.INVALID_SEQ),
        ('{"v":1,"type":"control_state","seq":true,"keys":[]}', ProtocolErrorCode.INVALID_SEQ),
        ('{"v":1,"type":"control_state","seq":"1","keys":[]}', ProtocolErrorCode.INVALID_SEQ),
        (f'{{"v":1,"type":"control_state","seq":{2**53},"keys":[]}}', ProtocolErrorCode.INVALID_SEQ),
        ('{"v":1,"type":"control_state","seq":1,"keys":"w"}', ProtocolErrorCode.INVALID_KEYS),
        ('{"v":1,"type":"control_state","seq":1,"keys":["q"]}', ProtocolErrorCode.INVALID_KEYS),
        ('{"v":1,"type":"control_state","seq":1,"keys":[1]}', ProtocolErrorCode.INVALID_KEYS),
        (
            '{"v":1,"type":"control_state","seq":1,"keys":["w","w","w","w","w","w","w","w","w","w","w","w","w","w","w",'
            '"w","w"]}',
            ProtocolErrorCode.INVALID_KEYS,
        ),
    ],
)
def test_bad_messages_come_back_as_protocol_errors(data: bytes | str, code: ProtocolErrorCode) -> None:
    assert _code(data) is code


def test_largest_seq_is_accepted() -> None:
    assert decode_control(json.dumps({"v": 1, "type": "control_state", "seq": MAX_SEQ, "keys": []})) == ControlState(
        MAX_SEQ, frozenset()
    )


def test_the_codec_and_the_model_share_one_seq_bound_and_key_table() -> None:
    # The browser's Number.MAX_SAFE_INTEGER bounds every seq; the model's normaliser reads the same table.
    assert MAX_SEQ == 2**53 - 1
    assert transport.protocol.MAX_SEQ is pipeline.bidirectional.MAX_SEQ
    assert transport.protocol.KEY_ALIASES is pipeline.bidirectional.KEY_ALIASES
    assert transport.protocol.CANONICAL_KEYS is pipeline.bidirectional.CANONICAL_KEYS


def test_oversized_input_is_rejected_before_parsing() -> None:
    padding = " " * MAX_INBOUND_BYTES
    assert _code('{"v":1,"type":"stop"}' + padding) is ProtocolErrorCode.MESSAGE_TOO_LARGE
    assert _code(b"[" * (MAX_INBOUND_BYTES + 1)) is ProtocolErrorCode.MESSAGE_TOO_LARGE
    # A string of few characters but many UTF-8 bytes is measured in bytes.
    many_bytes = "é" * (MAX_INBOUND_BYTES // 2 + 10)
    assert _code('{"v":1,"type":"stop","x":"' + many_bytes + '"}') is ProtocolErrorCode.MESSAGE_TOO_LARGE


def test_error_messages_do_not_echo_much_input() -> None:
    result = decode_control('{"v":1,"type":"control_state","seq":1,"keys":["' + "x" * 500 + '"]}')
    assert isinstance(result, ProtocolError)
    assert len(result.message) < 150


def test_deep_nesting_is_an_error_not_a_crash() -> None:
    assert _code("[" * 1020) is ProtocolErrorCode.MALFORMED_JSON
    assert _code("[" * 510 + "]" * 510) is ProtocolErrorCode.INVALID_MESSAGE


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=1500), st.text(max_size=1500)))
def test_decoder_never_raises_on_arbitrary_input(data: bytes | str) -> None:
    result = decode_control(data)
    assert isinstance(result, ProtocolError | ControlState | ResetPose | Stop)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.sampled_from(["v", "type", "seq", "keys", "x"]),
        _json_values | st.sampled_from([1, "control_state", "stop", "reset_pose", ["w", "ArrowUp"]]),
    )
)
def test_decoder_never_raises_on_arbitrary_objects(body: dict[str, object]) -> None:
    result = decode_control(json.dumps(body))
    assert isinstance(result, ProtocolError | ControlState | ResetPose | Stop)


@given(st.integers(0, MAX_SEQ), st.frozensets(st.sampled_from("wasdijkl")))
def test_control_round_trips(seq: int, keys: frozenset[str]) -> None:
    assert decode_control(encode_control(ControlState(seq, keys))) == ControlState(seq, keys)


def test_inbox_keeps_the_newest_snapshot_and_counts_the_rest() -> None:
    inbox = ControlInbox()
    assert inbox.accept(ControlState(1, frozenset("w")))
    assert inbox.accept(ControlState(5, frozenset("a")))
    assert not inbox.accept(ControlState(5, frozenset("a")))  # duplicate
    assert not inbox.accept(ControlState(3, frozenset("s")))  # stale (reordered)
    assert inbox.accept(ResetPose())
    assert inbox.accept(Stop())
    assert inbox.accept(ControlState(6, frozenset()))
    stats = inbox.statistics()
    assert (stats.accepted, stats.duplicates, stats.stale, stats.commands, stats.last_seq) == (3, 1, 1, 2, 6)


def test_the_newest_prompt_wins_on_its_own_sequence() -> None:
    inbox = ControlInbox()
    assert inbox.accept(ControlState(10, frozenset("w")))
    assert inbox.accept(SetPrompt(1, "dusk"))  # a lower seq than the snapshots': prompts count apart
    assert not inbox.accept(SetPrompt(1, "dusk"))  # duplicate
    assert not inbox.accept(SetPrompt(0, "noon"))  # stale
    assert inbox.accept(SetPrompt(2, "night"))
    assert inbox.accept(ControlState(11, frozenset()))
    stats = inbox.statistics()
    assert (stats.prompts, stats.last_prompt_seq, stats.accepted, stats.last_seq) == (2, 2, 2, 11)
    assert (stats.duplicates, stats.stale) == (1, 1)


def test_first_snapshot_may_start_at_zero() -> None:
    assert ControlInbox().accept(ControlState(0, frozenset()))


@pytest.mark.parametrize(
    "message",
    [
        StateStatus("running", None),
        StateStatus("draining", "deadline in 10 s"),
        ChunkStatus(3, 41, ("j", "w"), {"control_to_output": 0.412, "denoise": 0.2}),
        ChunkStatus(0, -1, (), {}),
        ChunkStatus(4, 2, ("w",), {"denoise": 0.1}, None, "a snowy night", 3),
        ChunkStatus(5, 2, ("w",), {}, 45000, "", -1, 36000),
        WarningStatus("time_limit", "ends in 30 s: the session reaches its time limit of 600 s", 30.0),
        ErrorStatus("malformed_json", "message is not valid JSON"),
        DoneStatus("closed"),
    ],
)
def test_status_round_trips(message: object) -> None:
    encoded = encode_status(message)  # type: ignore[arg-type]
    assert decode_status(encoded) == message


def test_status_wire_format_is_documented_shape() -> None:
    encoded = encode_status(
        ChunkStatus(3, 41, ("w", "j"), {"control_to_output": 0.4123456789}, prompt="dusk", prompt_seq=7)
    )
    assert json.loads(encoded) == {
        "v": 1,
        "type": "chunk",
        "index": 3,
        "applied_seq": 41,
        "keys": ["j", "w"],
        "prompt": "dusk",
        "prompt_seq": 7,
        "timings": {"control_to_output": 0.412346},
    }
    assert json.loads(encode_status(StateStatus("running"))) == {
        "v": 1,
        "type": "state",
        "state": "running",
        "detail": None,
    }


def test_a_chunks_first_frame_id_travels_and_decodes() -> None:
    message = ChunkStatus(4, 9, ("w",), {"decode": 0.05}, first_frame_pts=8100, first_frame_id=36)
    encoded = encode_status(message)
    assert json.loads(encoded)["first_frame_id"] == 36
    assert decode_status(encoded) == message
    assert "first_frame_id" not in json.loads(encode_status(ChunkStatus(4, 9, ())))  # only when the service says
    mistyped = '{"v":1,"type":"chunk","index":1,"applied_seq":1,"keys":[],"timings":{},"first_frame_id":"3"}'
    assert isinstance(decode_status(mistyped), ProtocolError)


def test_chunk_timings_are_trimmed_to_fit_the_cap() -> None:
    timings = {f"stage_{i:04d}": i / 7 for i in range(2000)}
    encoded = encode_status(ChunkStatus(1, 2, ("w",), timings), max_bytes=1200)
    assert len(encoded) <= 1200
    body = json.loads(encoded)
    assert body["truncated"] is True
    assert 0 < len(body["timings"]) < 2000
    assert body["keys"] == ["w"]


def test_non_finite_timings_are_left_out() -> None:
    body = json.loads(encode_status(ChunkStatus(1, 2, (), {"a": float("nan"), "b": float("inf"), "c": 1.5})))
    assert body["timings"] == {"c": 1.5}


def test_long_free_text_is_cut_to_fit() -> None:
    encoded = encode_status(ErrorStatus("internal", "\u2603" * 20_000), max_bytes=512)
    assert len(encoded) <= 512
    decoded = decode_status(encoded)
    assert isinstance(decoded, ErrorStatus)
    assert decoded.message.startswith("\u2603")


def test_status_cap_below_the_minimum_is_refused() -> None:
    with pytest.raises(ValueError, match="at least"):
        encode_status(DoneStatus("closed"), max_bytes=100)


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.text(max_size=200), st.floats() | st.integers(-(2**70), 2**70), max_size=300),
    st.text(max_size=3000),
    st.integers(256, 16_000),
)
def test_encoded_status_never_exceeds_the_cap(timings: dict[str, float], text: str, cap: int) -> None:
    for message in (
        ChunkStatus(2**40, 2**52, tuple("wasdijkl"), timings),
        StateStatus("running", text),
        ErrorStatus("code", text),
        DoneStatus(text),
    ):
        encoded = encode_status(message, max_bytes=cap)
        assert len(encoded) <= cap
        assert not isinstance(decode_status(encoded), ProtocolError)


def test_error_status_carries_the_stable_code() -> None:
    status = error_status(ProtocolError(ProtocolErrorCode.INVALID_KEYS, "unknown key 'q'"))
    assert status == ErrorStatus("invalid_keys", "unknown key 'q'")


def test_decode_status_rejects_unknown_shapes() -> None:
    assert isinstance(decode_status('{"v":1,"type":"chunk"}'), ProtocolError)
    assert isinstance(decode_status('{"v":2,"type":"done","reason":"x"}'), ProtocolError)
    assert isinstance(decode_status('{"v":1,"type":"done","reason":"x","extra":1}'), ProtocolError)
