"""`RecordingStore` on its own: retention by count and by bytes (oldest first), leftovers of a crash, and the
control trace it writes, read back by `lingstream generate`'s trace parser."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from pipeline.bidirectional import ChunkOutput
from pipeline.lingbot.chunks import ChunkPlan
from service.offline.control_trace import ControlTrace, parse_trace
from service.runtime.recordings import RecordingConfig, RecordingState, RecordingStore, trace_lines
from tests.support.fakes.recording_writers import RawWriter

SIZE = (8, 8, 10)
FRAME_BYTES = 8 * 8 * 3


def _names(directory: Path, pattern: str = "*") -> list[str]:
    return sorted(path.name for path in directory.glob(pattern))


def _chunk(session_id: str, index: int) -> ChunkOutput:
    frames = np.full((2, 8, 8, 3), index, np.uint8)
    return ChunkOutput(session_id, index, frames, 10.0, 2 * index, index, frozenset({"w"}))


async def _record(store: RecordingStore, session_id: str, chunks: int, mtime: float) -> list[tuple[str, str]]:
    stops: list[tuple[str, str]] = []
    recording = store.record(session_id, "owner", SIZE, "header", lambda code, message: stops.append((code, message)))
    for index in range(chunks):
        recording.offer(_chunk(session_id, index))
    recording.finish()
    await recording.wait()
    if recording.state is RecordingState.READY:
        os.utime(recording.video, (mtime, mtime))
    return stops


async def test_retention_keeps_the_newest_recordings_by_count(tmp_path: Path) -> None:
    store = RecordingStore(RecordingConfig(tmp_path, max_bytes=1 << 30, max_count=2), writer_factory=RawWriter)
    await store.start()
    for number, name in enumerate(("old", "mid", "new")):
        assert await _record(store, name, 3, 1_000.0 + number) == []
    await store.aclose()
    assert _names(tmp_path, "*.mp4") == ["mid.mp4", "new.mp4"]
    assert "old.controls.jsonl" not in _names(tmp_path)
    removed = store.outcome("old")
    assert removed is not None
    assert removed.state is RecordingState.REMOVED
    assert "oldest first" in (removed.reason or "")
    stats = store.statistics()
    assert (stats.kept, stats.ready_total, stats.removed_total) == (2, 3, 1)


async def test_retention_keeps_the_total_under_max_bytes(tmp_path: Path) -> None:
    one = 3 * 2 * FRAME_BYTES  # three chunks of two frames, raw
    store = RecordingStore(RecordingConfig(tmp_path, max_bytes=2 * one + 1024, max_count=100), writer_factory=RawWriter)
    await store.start()
    for number, name in enumerate(("a", "b", "c", "d")):
        assert await _record(store, name, 3, 2_000.0 + number) == []
    await store.aclose()
    assert _names(tmp_path, "*.mp4") == ["c.mp4", "d.mp4"]
    assert store.statistics().kept_bytes <= 2 * one + 1024


async def test_start_removes_leftovers_and_applies_retention_to_what_is_there(tmp_path: Path) -> None:
    (tmp_path / ".crashed.mp4.part").write_bytes(b"x" * 100)
    (tmp_path / ".crashed.controls.jsonl.part").write_text("{}")
    for number, name in enumerate(("x", "y", "z")):
        (tmp_path / f"{name}.mp4").write_bytes(b"v" * 10)
        os.utime(tmp_path / f"{name}.mp4", (3_000.0 + number, 3_000.0 + number))
    store = RecordingStore(RecordingConfig(tmp_path, max_bytes=1 << 30, max_count=1), writer_factory=RawWriter)
    await store.start()
    await store.aclose()
    assert _names(tmp_path) == ["z.mp4"]


async def test_a_recording_of_no_chunks_keeps_nothing(tmp_path: Path) -> None:
    store = RecordingStore(RecordingConfig(tmp_path, max_bytes=1 << 30, max_count=5), writer_factory=RawWriter)
    await store.start()
    stops = await _record(store, "empty", 0, 1.0)
    await store.aclose()
    assert [code for code, _ in stops] == ["recording_failed"]
    assert "no frames" in stops[0][1]
    outcome = store.outcome("empty")
    assert outcome is not None
    assert outcome.state is RecordingState.FAILED
    assert _names(tmp_path) == []


def test_the_trace_is_what_lingstream_generate_replays() -> None:
    chunks: list[tuple[int, frozenset[str], bool, str]] = [
        (0, frozenset({"w"}), False, ""),
        (1, frozenset({"w", "l"}), False, ""),
        (2, frozenset(), True, ""),
        (3, frozenset({"i"}), False, ""),
    ]
    text = "\n".join(trace_lines(chunks, "session s\nreplay: ...")) + "\n"
    assert text.startswith("# session s\n# replay: ...\n")
    entries = parse_trace(text, "recording")
    assert [(entry.chunk, entry.keys, entry.reset_pose) for entry in entries] == [
        (0, frozenset({"w"}), False),
        (1, frozenset({"w", "l"}), False),
        (2, None, True),
        (2, frozenset(), False),
        (3, frozenset({"i"}), False),
    ]
    trace = ControlTrace.resolve(entries, ChunkPlan.create(9 + 3 * 12, 3), 16)  # four chunks of chunk_size 3
    assert [trace.for_chunk(index).keys for index in range(4)] == [c[1] for c in chunks]
    assert [trace.for_chunk(index).reset_pose for index in range(4)] == [False, False, True, False]


def test_the_trace_names_a_prompt_where_it_changes() -> None:
    none: frozenset[str] = frozenset()
    chunks = [(0, none, False, "dusk"), (1, none, False, "dusk"), (2, none, False, "")]
    lines = trace_lines(chunks, "h")
    assert '{"chunk": 0, "prompt": "dusk"}' in lines
    assert '{"chunk": 2, "prompt": ""}' in lines
    assert sum('"prompt"' in line for line in lines) == 2
