"""The control trace format of offline generation: parsing, placing on a clip, and errors that name the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.lingbot.chunks import ChunkPlan
from service.offline.control_trace import (
    MAX_TRACE_BYTES,
    ChunkControl,
    ControlTrace,
    TraceEntry,
    TraceError,
    load_trace,
    parse_trace,
    read_trace_text,
)

# 16 fps, chunk_size 3: chunk 0 = frames 0..8 (0 s .. 0.5625 s), chunk k >= 1 = 12 frames (0.75 s) each.
PLAN = ChunkPlan.create(4 * (3 * 8 - 1) + 1, 3)  # 93 frames, 8 chunks
FPS = 16


def resolve(text: str) -> ControlTrace:
    return ControlTrace.resolve(parse_trace(text, "trace.jsonl"), PLAN, FPS, "trace.jsonl")


def error_of(text: str) -> TraceError:
    with pytest.raises(TraceError) as caught:
        resolve(text)
    return caught.value


def test_chunk_entries_hold_keys_from_their_chunk_on() -> None:
    trace = resolve('{"chunk": 0, "keys": ["w"]}\n{"chunk": 3, "keys": ["l", "w"]}\n{"chunk": 5, "keys": []}\n')
    assert [trace.for_chunk(i).keys for i in range(8)] == [
        frozenset("w"),
        frozenset("w"),
        frozenset("w"),
        frozenset("lw"),
        frozenset("lw"),
        frozenset(),
        frozenset(),
        frozenset(),
    ]


def test_no_key_is_held_before_the_first_keys_entry() -> None:
    trace = resolve('{"chunk": 2, "keys": ["d"]}')
    assert trace.for_chunk(0) == ChunkControl(frozenset())
    assert trace.for_chunk(1) == ChunkControl(frozenset())
    assert trace.for_chunk(2) == ChunkControl(frozenset("d"))


def test_an_empty_trace_and_still_are_a_still_camera() -> None:
    for trace in (resolve(""), ControlTrace.still(PLAN.num_chunks)):
        assert trace.num_chunks == 8
        assert all(trace.for_chunk(i) == ChunkControl(frozenset()) for i in range(8))


@pytest.mark.parametrize(
    ("t", "chunk"),
    [
        (0, 0),
        (0.5, 0),  # frame 8, the last frame of chunk 0
        (0.5625, 1),  # frame 9, exactly the first frame of chunk 1
        (1.3, 1),  # frame 20, the last of chunk 1 (frames 9..20)
        (1.3125, 2),  # frame 21
        (5.7, 7),  # frame 91
        (5.75, 7),  # frame 92, the clip's last frame
    ],
)
def test_a_time_names_the_chunk_whose_media_interval_holds_it(t: float, chunk: int) -> None:
    trace = resolve(f'{{"t": {t}, "keys": ["l"]}}')
    assert trace.for_chunk(chunk).keys == frozenset("l")
    if chunk > 0:
        assert trace.for_chunk(chunk - 1).keys == frozenset()


def test_aliases_and_upper_case_keys_normalise_to_the_protocol_keys() -> None:
    trace = resolve('{"chunk": 0, "keys": ["ArrowUp", "ArrowLeft", "D", "ArrowDown", "ArrowRight", "i"]}')
    assert trace.for_chunk(0).keys == frozenset({"w", "j", "d", "s", "l", "i"})


def test_reset_pose_applies_to_its_chunk_only_and_keeps_the_keys() -> None:
    trace = resolve('{"chunk": 0, "keys": ["l"]}\n{"t": 2.0, "reset_pose": true}\n')
    reset_chunk = PLAN.chunk_of_frame(32)
    assert trace.for_chunk(reset_chunk) == ChunkControl(frozenset("l"), reset_pose=True)
    assert not trace.for_chunk(reset_chunk - 1).reset_pose
    assert not trace.for_chunk(reset_chunk + 1).reset_pose
    assert trace.for_chunk(reset_chunk + 1).keys == frozenset("l")


def test_comments_blank_lines_and_mixed_forms_parse_with_their_line_numbers() -> None:
    text = '# a comment\n\n   \n  # indented comment\n{"t": 0.25, "keys": ["w"]}\n{"chunk": 4, "reset_pose": true}\n'
    assert parse_trace(text) == (
        TraceEntry(line=5, chunk=None, t=0.25, keys=frozenset("w")),
        TraceEntry(line=6, chunk=4, t=None, keys=None, reset_pose=True),
    )


def test_entries_for_the_same_chunk_are_allowed_and_the_last_keys_win() -> None:
    trace = resolve('{"chunk": 2, "keys": ["w"]}\n{"t": 1.4, "keys": ["s"]}\n{"chunk": 2, "reset_pose": true}\n')
    assert trace.for_chunk(2) == ChunkControl(frozenset("s"), reset_pose=True)


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ('{"chunk": 0, "keys": ["q"]}', 1, "unknown key 'q' (allowed: w a s d"),
        ('{"chunk": 0, "keys": ["w", 3]}', 1, "a key must be a string, got 3"),
        ('{"chunk": 0, "keys": "w"}', 1, "'keys' must be a list of key names, got \"w\""),
        (
            '{"chunk": 0, "keys": ["w"], "speed": 2}',
            1,
            "unknown field 'speed' (allowed: chunk, t, keys, reset_pose, prompt)",
        ),
        ('{"chunk": 0, "keys": ["w"]', 1, "not valid JSON"),
        ('["w"]', 1, "an entry must be a JSON object, got an array"),
        ('{"keys": ["w"]}', 1, "give exactly one position, 'chunk' or 't'"),
        ('{"chunk": 1, "t": 1.0, "keys": ["w"]}', 1, "'chunk' or 't', not both"),
        ('{"chunk": 1}', 1, "give exactly one action, 'keys', 'reset_pose' or 'prompt'"),
        ('{"chunk": 1, "keys": [], "reset_pose": true}', 1, "'prompt', not 'keys' and 'reset_pose'"),
        ('{"chunk": 1, "keys": [], "prompt": "dusk"}', 1, "'prompt', not 'keys' and 'prompt'"),
        ('{"chunk": 1, "prompt": 3}', 1, "'prompt' must be a string, got 3"),
        ('{"chunk": 1, "prompt": "' + "x" * 513 + '"}', 1, "'prompt': a prompt is at most 512 UTF-8 bytes"),
        ('{"chunk": -1, "keys": []}', 1, "'chunk' must be an integer >= 0, got -1"),
        ('{"chunk": 1.5, "keys": []}', 1, "'chunk' must be an integer >= 0, got 1.5"),
        ('{"chunk": true, "keys": []}', 1, "'chunk' must be an integer >= 0, got true"),
        ('{"t": -0.5, "keys": []}', 1, "'t' must be a number of seconds >= 0, got -0.5"),
        ('{"t": "1s", "keys": []}', 1, "'t' must be a number of seconds >= 0"),
        ('{"t": NaN, "keys": []}', 1, "not valid JSON: NaN is not a number JSON allows"),
        ('{"chunk": 1, "reset_pose": false}', 1, "'reset_pose' must be true, got false"),
        ('{"chunk": 1, "keys": [], "keys": ["w"]}', 1, "field 'keys' given twice"),
        ("# ok\n\n" + '{"chunk": 0, "keys": []}\n' * 4 + '{"chunk": 0, "keys": ["x"]}', 7, "unknown key 'x'"),
        ('{"chunk": 3, "keys": []}\n{"chunk": 2, "keys": ["w"]}', 2, "chunk 2 comes before chunk 3 of line 1"),
        ('{"chunk": 3, "keys": []}\n{"t": 0.1, "keys": []}', 2, "t=0.1 s (chunk 0) comes before chunk 3 of line 1"),
        ('{"chunk": 8, "keys": []}', 1, "chunk 8 is beyond the clip's last chunk 7 (8 chunks)"),
        ('{"t": 5.8125, "keys": []}', 1, "t=5.8125 s is beyond the end of the clip (93 frames = 5.8125 s"),
        ('{"t": 1e300, "keys": []}', 1, "is beyond the end of the clip"),
    ],
)
def test_every_error_names_the_file_the_line_and_the_reason(text: str, line: int, reason: str) -> None:
    error = error_of(text)
    assert error.line == line
    assert str(error).startswith(f"trace.jsonl:{line}: ")
    assert reason in str(error)


def test_the_unknown_key_message_lists_every_allowed_spelling() -> None:
    message = str(error_of('{"chunk": 0, "keys": ["space"]}'))
    assert message.startswith("trace.jsonl:1: unknown key 'space' (allowed: ")
    for spelling in ("w a s d i j k l", "ArrowUp", "ArrowDown", "ArrowLeft", "ArrowRight"):
        assert spelling in message


def test_errors_are_value_errors_and_a_long_value_is_shortened() -> None:
    error = error_of('{"chunk": 0, "keys": ["' + "z" * 500 + '"]}')
    assert isinstance(error, ValueError)
    assert len(str(error)) < 200


def test_load_trace_reads_a_file_and_names_it_in_errors(tmp_path: Path) -> None:
    good = tmp_path / "moves.jsonl"
    good.write_text('\ufeff{"chunk": 1, "keys": ["w"]}\n', encoding="utf-8")  # a BOM is tolerated
    assert load_trace(good, PLAN, FPS).for_chunk(1).keys == frozenset("w")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"chunk": 0, "keys": []}\n{"chunk": 0, "keys": ["?"]}\n', encoding="utf-8")
    with pytest.raises(TraceError, match=r"^bad\.jsonl:2: unknown key '\?'"):
        load_trace(bad, PLAN, FPS)


def test_unreadable_oversized_and_binary_files_are_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_trace_text(tmp_path / "missing.jsonl")
    with pytest.raises(TraceError, match="cannot read the trace"):
        read_trace_text(tmp_path)
    big = tmp_path / "big.jsonl"
    big.write_bytes(b"#" * (MAX_TRACE_BYTES + 1))
    with pytest.raises(TraceError, match=r"^big\.jsonl: the trace is larger than"):
        read_trace_text(big)
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"chunk": 0}\xff\xfe')
    with pytest.raises(TraceError, match=r"^binary\.jsonl: not UTF-8 text"):
        read_trace_text(binary)


def test_a_prompt_takes_effect_at_its_chunk_and_the_last_one_of_a_chunk_wins() -> None:
    trace = resolve(
        '{"chunk": 0, "keys": ["w"]}\n{"t": 1.0, "prompt": "dusk"}\n{"t": 1.1, "prompt": "night"}\n'
        '{"chunk": 5, "prompt": ""}\n'
    )
    # t = 1.0 s and 1.1 s are both in chunk 1 (0.5625 s .. 1.3125 s): the later entry wins.
    assert [trace.for_chunk(i).prompt for i in range(8)] == [None, "night", None, None, None, "", None, None]
    assert trace.for_chunk(1) == ChunkControl(frozenset("w"), prompt="night")


def test_for_chunk_outside_the_clip_is_an_index_error() -> None:
    trace = ControlTrace.still(3)
    with pytest.raises(IndexError):
        trace.for_chunk(3)
