"""The control trace of offline generation: which keys are held during which chunk, as JSON Lines.

A trace stands in for the browser: it says, chunk by chunk, which keys the camera operator holds and which text
prompt steers the world. One JSON object per line; blank lines and lines whose first non-blank character is `#` are
ignored::

    # hold w from the start, turn right from second 2.5 on, night falls at 3 s, stop at chunk 12, back to the start
    {"chunk": 0, "keys": ["w"]}
    {"t": 2.5, "keys": ["w", "ArrowRight"]}
    {"t": 3.0, "prompt": "a snowy night"}
    {"chunk": 12, "keys": []}
    {"chunk": 12, "reset_pose": true}

Each entry has exactly one position and exactly one action:

- position: `"chunk": <int >= 0>`, or `"t": <seconds >= 0>`, which names the chunk whose media interval holds that
  instant (frame `floor(t * fps)`; chunk 0 holds `4*(chunk_size-1)+1` frames, every later chunk `4*chunk_size`);
- action: `"keys": [...]`, the keys held from that chunk on (the control protocol's names: `w a s d i j k l`, their
  upper-case forms, `ArrowUp/ArrowDown/ArrowLeft/ArrowRight`), `"reset_pose": true`, which puts the camera back
  at its start pose for that chunk, or `"prompt": "<text>"` (at most 512 UTF-8 bytes), the text prompt from that
  chunk on.

Before the first `keys` entry no key is held; before the first `prompt` entry the session's own prompt applies
(`--prompt`, or none). The last `prompt` of a chunk wins, like its keys. Positions never decrease (entries for the same
chunk are fine; the last `keys` of a chunk wins). Any other field, a wrong type, an unknown key, a decreasing position
or one beyond the clip's last chunk is a `TraceError` that names the source, the line and the reason, e.g.
`trace.jsonl:7: unknown key 'q' (allowed: ...)`. Parsing (`parse_trace`) needs nothing but the text; placing the entries
on a clip (`ControlTrace.resolve`) needs its chunk plan and fps, and happens before any generation.
"""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.bidirectional import check_prompt
from pipeline.lingbot.chunks import ChunkPlan
from pipeline.lingbot.controls import CANONICAL_KEYS, KEY_ALIASES, MAX_KEYS_PER_SNAPSHOT

__all__ = [
    "MAX_TRACE_BYTES",
    "ChunkControl",
    "ControlTrace",
    "TraceEntry",
    "TraceError",
    "load_trace",
    "parse_trace",
    "read_trace_text",
]

MAX_TRACE_BYTES = 4 * 1024 * 1024
"""A trace file larger than this is refused unread (a 10-minute clip needs a few kilobytes)."""

_FIELDS = ("chunk", "t", "keys", "reset_pose", "prompt")
_ALLOWED_KEYS = "w a s d i j k l, W A S D I J K L, ArrowUp ArrowDown ArrowLeft ArrowRight"
_SHOWN = 40  # characters of an offending value quoted in a message


class TraceError(ValueError):
    """A control trace was rejected; `str()` is `source:line: reason` (`source: reason` for the whole file)."""

    def __init__(self, source: str, line: int | None, reason: str) -> None:
        self.source = source
        self.line = line
        self.reason = reason
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {reason}")


@dataclass(frozen=True, slots=True)
class TraceEntry:
    """One parsed line: exactly one of `chunk`/`t`, and one of `keys` (canonical), `reset_pose` or `prompt`."""

    line: int
    chunk: int | None
    t: float | None
    keys: frozenset[str] | None
    reset_pose: bool = False
    prompt: str | None = None


@dataclass(frozen=True, slots=True)
class ChunkControl:
    """What the trace asks for during one chunk: the keys held, whether the pose resets at its start, and the prompt
    that takes effect at it (None: the prompt does not change at this chunk)."""

    keys: frozenset[str]
    reset_pose: bool = False
    prompt: str | None = None


def read_trace_text(path: Path) -> str:
    """The trace file's text, bounded by `MAX_TRACE_BYTES`; every failure is a `TraceError` naming the file."""
    source = path.name or str(path)
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_TRACE_BYTES + 1)
    except OSError as exc:
        raise TraceError(str(path), None, f"cannot read the trace: {exc.strerror or exc}") from None
    if len(data) > MAX_TRACE_BYTES:
        raise TraceError(source, None, f"the trace is larger than {MAX_TRACE_BYTES} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TraceError(source, None, f"not UTF-8 text (byte {exc.start})") from None


def parse_trace(text: str, source: str = "<trace>") -> tuple[TraceEntry, ...]:
    """Parse JSON Lines into entries, checking fields, types and key names (not positions against a clip)."""
    entries: list[TraceEntry] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not stripped or stripped.startswith("#"):
            continue
        entries.append(_parse_line(stripped, number, source))
    return tuple(entries)


def load_trace(path: Path, plan: ChunkPlan, fps: int) -> ControlTrace:
    """Read, parse and place a trace file on a clip (see `ControlTrace.resolve`)."""
    source = path.name or str(path)
    return ControlTrace.resolve(parse_trace(read_trace_text(path), source), plan, fps, source)


class ControlTrace:
    """A trace placed on one clip: the keys held, the pose resets and the prompt changes, chunk by chunk.

    Stored as change points (memory grows with the trace, not with the clip); `for_chunk(i)` is O(log entries).
    """

    __slots__ = ("_change_at", "_keys", "_num_chunks", "_prompts", "_resets")

    def __init__(
        self,
        num_chunks: int,
        changes: Sequence[tuple[int, frozenset[str]]] = (),
        resets: frozenset[int] = frozenset(),
        prompts: Mapping[int, str] | None = None,
    ) -> None:
        if num_chunks < 1:
            raise ValueError(f"a clip has at least one chunk, got {num_chunks}")
        self._num_chunks = num_chunks
        self._change_at = [chunk for chunk, _ in changes]
        self._keys = [keys for _, keys in changes]
        if self._change_at != sorted(self._change_at) or any(not 0 <= c < num_chunks for c in self._change_at):
            raise ValueError("change points must be sorted chunk indices inside the clip")
        if any(not 0 <= c < num_chunks for c in resets):
            raise ValueError("pose resets must be chunk indices inside the clip")
        self._resets = resets
        self._prompts = dict(prompts or {})
        if any(not 0 <= c < num_chunks for c in self._prompts):
            raise ValueError("prompt changes must be chunk indices inside the clip")

    @classmethod
    def still(cls, num_chunks: int) -> ControlTrace:
        """No key held at all: a still camera (what a missing `--controls` means)."""
        return cls(num_chunks)

    @classmethod
    def resolve(cls, entries: Sequence[TraceEntry], plan: ChunkPlan, fps: int, source: str = "<trace>") -> ControlTrace:
        """Place parsed entries on a clip: convert times to chunks, check order and range (`TraceError`)."""
        last = plan.num_chunks - 1
        clip_s = plan.frame_num / fps
        changes: list[tuple[int, frozenset[str]]] = []
        resets: set[int] = set()
        prompts: dict[int, str] = {}
        previous: tuple[int, int] | None = None  # (chunk, line) of the entry before
        for entry in entries:
            if entry.t is not None:
                frame = _frame_at(entry.t, fps)
                if frame is None or frame >= plan.frame_num:
                    raise TraceError(
                        source,
                        entry.line,
                        f"t={entry.t:g} s is beyond the end of the clip ({plan.frame_num} frames = {clip_s:g} s at "
                        f"{fps} fps, chunks 0..{last})",
                    )
                chunk = plan.chunk_of_frame(frame)
                position = f"t={entry.t:g} s (chunk {chunk})"
            else:
                chunk = entry.chunk if entry.chunk is not None else 0
                if chunk > last:
                    raise TraceError(
                        source,
                        entry.line,
                        f"chunk {chunk} is beyond the clip's last chunk {last} ({plan.num_chunks} chunks)",
                    )
                position = f"chunk {chunk}"
            if previous is not None and chunk < previous[0]:
                raise TraceError(
                    source,
                    entry.line,
                    f"{position} comes before chunk {previous[0]} of line {previous[1]}; "
                    "entries must be in non-decreasing chunk order",
                )
            previous = (chunk, entry.line)
            if entry.reset_pose:
                resets.add(chunk)
            elif entry.prompt is not None:
                prompts[chunk] = entry.prompt
            elif entry.keys is not None:
                if changes and changes[-1][0] == chunk:
                    changes[-1] = (chunk, entry.keys)
                else:
                    changes.append((chunk, entry.keys))
        return cls(plan.num_chunks, changes, frozenset(resets), prompts)

    @property
    def num_chunks(self) -> int:
        return self._num_chunks

    def for_chunk(self, index: int) -> ChunkControl:
        if not 0 <= index < self._num_chunks:
            raise IndexError(f"chunk {index} outside the clip's 0..{self._num_chunks - 1}")
        at = bisect.bisect_right(self._change_at, index) - 1
        keys = self._keys[at] if at >= 0 else frozenset()
        return ChunkControl(keys=keys, reset_pose=index in self._resets, prompt=self._prompts.get(index))


def _frame_at(t: float, fps: int) -> int | None:
    """The video frame shown at `t` seconds (None when it is too large to be a frame index)."""
    position = t * fps
    if not math.isfinite(position) or position > 2**53:
        return None
    # a time written as a frame boundary (e.g. 0.5625 at 16 fps) must land on that frame despite rounding
    return math.floor(position + 1e-9)


# --- one line ---------------------------------------------------------------------------------------------------------


def _parse_line(text: str, line: int, source: str) -> TraceEntry:
    def fail(reason: str) -> TraceError:
        return TraceError(source, line, reason)

    try:
        value = json.loads(text, object_pairs_hook=_unique_fields, parse_constant=_no_constant)
    except _DuplicateFieldError as exc:
        raise fail(f"field {exc.name!r} given twice") from None
    except ValueError as exc:  # json.JSONDecodeError, a NaN/Infinity, an integer too long to convert
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise fail(f"not valid JSON: {reason}") from None
    if not isinstance(value, dict):
        raise fail(f"an entry must be a JSON object, got {_json_type(value)}")
    unknown = [name for name in value if name not in _FIELDS]
    if unknown:
        names = ", ".join(repr(name[:_SHOWN]) for name in unknown)
        plural = "s" if len(unknown) > 1 else ""
        raise fail(f"unknown field{plural} {names} (allowed: {', '.join(_FIELDS)})")

    if ("chunk" in value) == ("t" in value):
        raise fail("give exactly one position, 'chunk' or 't'" + (", not both" if "chunk" in value else ""))
    chunk: int | None = None
    t: float | None = None
    if "chunk" in value:
        raw_chunk = value["chunk"]
        if isinstance(raw_chunk, bool) or not isinstance(raw_chunk, int) or raw_chunk < 0:
            raise fail(f"'chunk' must be an integer >= 0, got {_show(raw_chunk)}")
        chunk = raw_chunk
    else:
        raw_t = value["t"]
        if isinstance(raw_t, bool) or not isinstance(raw_t, int | float) or not math.isfinite(raw_t) or raw_t < 0:
            raise fail(f"'t' must be a number of seconds >= 0, got {_show(raw_t)}")
        t = float(raw_t)

    actions = [name for name in ("keys", "reset_pose", "prompt") if name in value]
    if len(actions) != 1:
        raise fail(
            "give exactly one action, 'keys', 'reset_pose' or 'prompt'"
            + (f", not {' and '.join(repr(a) for a in actions)}" if actions else "")
        )
    if "prompt" in value:
        raw_prompt = value["prompt"]
        if not isinstance(raw_prompt, str):
            raise fail(f"'prompt' must be a string, got {_show(raw_prompt)}")
        try:
            prompt = check_prompt(raw_prompt)
        except ValueError as exc:
            raise fail(f"'prompt': {exc}") from None
        return TraceEntry(line=line, chunk=chunk, t=t, keys=None, prompt=prompt)
    if "reset_pose" in value:
        if value["reset_pose"] is not True:
            raise fail(f"'reset_pose' must be true, got {_show(value['reset_pose'])}")
        return TraceEntry(line=line, chunk=chunk, t=t, keys=None, reset_pose=True)
    return TraceEntry(line=line, chunk=chunk, t=t, keys=_keys(value["keys"], fail))


def _keys(raw: object, fail: Callable[[str], TraceError]) -> frozenset[str]:
    if not isinstance(raw, list):
        raise fail(f"'keys' must be a list of key names, got {_show(raw)}")
    if len(raw) > MAX_KEYS_PER_SNAPSHOT:
        raise fail(f"'keys' lists {len(raw)} keys, more than {MAX_KEYS_PER_SNAPSHOT}")
    keys: set[str] = set()
    for key in raw:
        if not isinstance(key, str):
            raise fail(f"a key must be a string, got {_show(key)}")
        if key in CANONICAL_KEYS:
            keys.add(key)
        elif key in KEY_ALIASES:
            keys.add(KEY_ALIASES[key])
        else:
            raise fail(f"unknown key {key[:_SHOWN]!r} (allowed: {_ALLOWED_KEYS})")
    return frozenset(keys)


class _DuplicateFieldError(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name[:_SHOWN]


def _unique_fields(pairs: list[tuple[str, object]]) -> dict[str, object]:
    result: dict[str, object] = {}
    for name, item in pairs:
        if name in result:
            raise _DuplicateFieldError(name)
        result[name] = item
    return result


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a number JSON allows")


def _json_type(value: object) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a number"


def _show(value: object) -> str:
    shown = json.dumps(value)
    return shown if len(shown) <= _SHOWN else shown[: _SHOWN - 3] + "..."
