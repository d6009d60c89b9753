"""Control protocol v1: the JSON messages between a browser and its session, both ways (docs/control-protocol.md).

Client to service: `control_state {seq, keys}` (a snapshot of the held keys, newest wins), `prompt {seq, text}`
(the text prompt, newest wins by its own seq), `reset_pose`, `pause`, `resume`, `stop`. Service to client:
`state {state, detail}`, `chunk {index, applied_seq, keys, prompt, prompt_seq, timings}`, `warning {code, message,
ends_in_s}`, `error {code, message}`, `done {reason}`. Every message carries `"v": 1` and `"type"`.

`decode_control` never raises: it returns a decoded `ControlMessage` or a `ProtocolError` value, which the bindings
answer with an `error` status and a counter. Inbound messages are size-checked before anything parses them, and
validation is strict (exact types, no unknown or duplicated fields, keys from a fixed set). `ControlInbox` keeps a
session's sequence state: the newest snapshot (and, apart, the newest prompt) wins, stale and duplicate ones are
dropped and counted. The encoders
keep every outbound message under a byte cap (LiveKit's data packet limit), trimming a chunk's `timings` and
truncating free text rather than exceeding it.
"""

from __future__ import annotations

import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipeline.bidirectional import (
    CANONICAL_KEYS,
    KEY_ALIASES,
    MAX_KEYS_PER_SNAPSHOT,
    MAX_PROMPT_BYTES,
    MAX_SEQ,
    ControlMessage,
    ControlState,
    Pause,
    ResetPose,
    Resume,
    SetPrompt,
    Stop,
    canonical_key,
    check_prompt,
)
from transport.base import ChunkStatus, DoneStatus, ErrorStatus, StateStatus, StatusMessage, WarningStatus
from transport.protocol_schema import CONTROL_MESSAGES, PROTOCOL_VERSION, STATUS_MESSAGES

__all__ = [
    "CANONICAL_KEYS",
    "KEY_ALIASES",
    "MAX_INBOUND_BYTES",
    "MAX_KEYS_PER_SNAPSHOT",
    "MAX_PROMPT_BYTES",
    "MAX_SEQ",
    "MAX_STATUS_BYTES",
    "PROTOCOL_VERSION",
    "ControlInbox",
    "InboxStatistics",
    "ProtocolError",
    "ProtocolErrorCode",
    "control_type",
    "decode_control",
    "decode_status",
    "encode_control",
    "encode_status",
    "error_status",
]

MAX_INBOUND_BYTES = 4096
"""Inbound (client to service) messages larger than this are rejected before parsing (room for a prompt of
`MAX_PROMPT_BYTES` however its JSON escapes it: at most 6 bytes per UTF-8 byte, as `\u0001`)."""
MAX_STATUS_BYTES = 15 * 1024
"""Outbound messages never exceed this (LiveKit's reliable data packet limit is 15 KiB)."""
MIN_STATUS_BYTES = 256
"""The smallest outbound cap an encoder accepts: room for any message with its free text cut short."""
# The key table and the bounds of a snapshot (`CANONICAL_KEYS`, `KEY_ALIASES`, `MAX_KEYS_PER_SNAPSHOT`, `MAX_SEQ`)
# are defined once in `pipeline.bidirectional`, next to `ControlState`; this module re-exports them.

# The fields of every message, both ways, come from the one table of the wire shape (`transport.protocol_schema`).
_CONTROL_FIELDS: Mapping[str, frozenset[str]] = {message.type: message.names for message in CONTROL_MESSAGES}
_STATUS_FIELDS: Mapping[str, frozenset[str]] = {message.type: message.names for message in STATUS_MESSAGES}
_COMMANDS: Mapping[str, ControlMessage] = {
    "reset_pose": ResetPose(),
    "pause": Pause(),
    "resume": Resume(),
    "stop": Stop(),
}
_ECHO_LIMIT = 32  # how much of a client's offending value an error message repeats
_TIMING_NAME_LIMIT = 64
_TEXT_LIMIT = 1024  # free text (state detail, error message, done reason) is cut to this many characters first


class ProtocolErrorCode(enum.StrEnum):
    """Stable codes of the `error` status message sent back for bad input."""

    MESSAGE_TOO_LARGE = "message_too_large"  # over MAX_INBOUND_BYTES, not parsed
    MALFORMED_JSON = "malformed_json"  # not UTF-8, not JSON, or JSON with duplicate fields / NaN
    INVALID_MESSAGE = "invalid_message"  # not an object, a missing / unknown / mistyped field
    UNSUPPORTED_VERSION = "unsupported_version"  # "v" is not 1
    UNKNOWN_TYPE = "unknown_type"  # "type" is not a client message type
    INVALID_SEQ = "invalid_seq"  # seq not an int in 0 .. 2^53 - 1
    INVALID_KEYS = "invalid_keys"  # keys not a list of known key names (at most MAX_KEYS_PER_SNAPSHOT)
    PROMPT_TOO_LARGE = "prompt_too_large"  # a prompt's text over MAX_PROMPT_BYTES UTF-8 bytes
    INVALID_PROMPT = "invalid_prompt"  # a prompt's text not a string of valid Unicode (e.g. a lone surrogate)
    RATE_LIMITED = "rate_limited"  # more prompts than the session's rate limit allows; this one was dropped


@dataclass(frozen=True, slots=True)
class ProtocolError:
    """Why an inbound message was rejected; `message` is safe to send back (it never echoes much input)."""

    code: ProtocolErrorCode
    message: str


class _DuplicateFieldError(ValueError):
    pass


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateFieldError(key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _echo(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _ECHO_LIMIT else text[: _ECHO_LIMIT - 3] + "..."


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _parse_json(data: bytes | str, max_bytes: int) -> Any | ProtocolError:
    if isinstance(data, str):
        # A character is at least one byte: a long string is rejected before paying for its encoding.
        if len(data) > max_bytes:
            return ProtocolError(ProtocolErrorCode.MESSAGE_TOO_LARGE, f"message over {max_bytes} bytes")
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError:
            return ProtocolError(ProtocolErrorCode.MALFORMED_JSON, "message is not valid UTF-8")
    else:
        raw = bytes(data)
    if len(raw) > max_bytes:
        return ProtocolError(ProtocolErrorCode.MESSAGE_TOO_LARGE, f"message over {max_bytes} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return ProtocolError(ProtocolErrorCode.MALFORMED_JSON, "message is not valid UTF-8")
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicates, parse_constant=_reject_constant)
    except _DuplicateFieldError as exc:
        return ProtocolError(ProtocolErrorCode.MALFORMED_JSON, f"duplicate field {_echo(exc.args[0])}")
    except (ValueError, RecursionError):
        return ProtocolError(ProtocolErrorCode.MALFORMED_JSON, "message is not valid JSON")


def _normalise_keys(value: object) -> frozenset[str] | ProtocolError:
    if not isinstance(value, list):
        return ProtocolError(ProtocolErrorCode.INVALID_KEYS, "keys must be a list of key names")
    if len(value) > MAX_KEYS_PER_SNAPSHOT:
        return ProtocolError(ProtocolErrorCode.INVALID_KEYS, f"at most {MAX_KEYS_PER_SNAPSHOT} keys per snapshot")
    keys: set[str] = set()
    for key in value:
        if not isinstance(key, str):
            return ProtocolError(ProtocolErrorCode.INVALID_KEYS, f"a key must be a string, got {_echo(key)}")
        canonical = canonical_key(key)
        if canonical is None:
            return ProtocolError(
                ProtocolErrorCode.INVALID_KEYS,
                f"unknown key {_echo(key)}; valid: w a s d i j k l, ArrowUp/Down/Left/Right",
            )
        keys.add(canonical)
    return frozenset(keys)


def _decode_prompt(seq: int, text: object) -> SetPrompt | ProtocolError:
    if not isinstance(text, str):
        return ProtocolError(ProtocolErrorCode.INVALID_PROMPT, "text must be a string")
    try:
        return SetPrompt(seq=seq, text=check_prompt(text))
    except ValueError as exc:
        code = ProtocolErrorCode.INVALID_PROMPT if "Unicode" in str(exc) else ProtocolErrorCode.PROMPT_TOO_LARGE
        return ProtocolError(code, str(exc))


def decode_control(data: bytes | str, *, max_bytes: int = MAX_INBOUND_BYTES) -> ControlMessage | ProtocolError:
    """Decode one client message. Never raises: bad input comes back as a `ProtocolError`."""
    parsed = _parse_json(data, max_bytes)
    if isinstance(parsed, ProtocolError):
        return parsed
    if not isinstance(parsed, dict):
        return ProtocolError(ProtocolErrorCode.INVALID_MESSAGE, "a message must be a JSON object")
    if "v" not in parsed:
        return ProtocolError(ProtocolErrorCode.INVALID_MESSAGE, 'missing field "v"')
    version = parsed["v"]
    if not _is_int(version):
        return ProtocolError(ProtocolErrorCode.INVALID_MESSAGE, '"v" must be an integer')
    if version != PROTOCOL_VERSION:
        return ProtocolError(
            ProtocolErrorCode.UNSUPPORTED_VERSION,
            f"protocol version {_echo(version)} is not supported; this service speaks v{PROTOCOL_VERSION}",
        )
    kind = parsed.get("type")
    if not isinstance(kind, str):
        return ProtocolError(ProtocolErrorCode.INVALID_MESSAGE, '"type" must be a string')
    allowed = _CONTROL_FIELDS.get(kind)
    if allowed is None:
        return ProtocolError(
            ProtocolErrorCode.UNKNOWN_TYPE,
            f"unknown message type {_echo(kind)}; expected one of {sorted(_CONTROL_FIELDS)}",
        )
    unknown = sorted(set(parsed) - allowed)
    if unknown:
        return ProtocolError(ProtocolErrorCode.INVALID_MESSAGE, f"unknown field {_echo(unknown[0])} in {kind}")
    command = _COMMANDS.get(kind)
    if command is not None:
        return command
    missing = sorted(allowed - set(parsed))
    if missing:
        return ProtocolError(ProtocolErrorCode.INVALID_MESSAGE, f"missing field {missing[0]!r} in {kind}")
    seq = parsed["seq"]
    if not _is_int(seq) or not 0 <= seq <= MAX_SEQ:
        return ProtocolError(ProtocolErrorCode.INVALID_SEQ, f"seq must be an integer in 0..{MAX_SEQ}")
    if kind == "prompt":
        return _decode_prompt(seq, parsed["text"])
    keys = _normalise_keys(parsed["keys"])
    if isinstance(keys, ProtocolError):
        return keys
    return ControlState(seq=seq, keys=keys)


def encode_control(message: ControlMessage) -> bytes:
    """The client side of the codec (tests, benchmarks, and any Python client)."""
    body: dict[str, object]
    match message:
        case ControlState(seq=seq, keys=keys):
            body = {"v": PROTOCOL_VERSION, "type": "control_state", "seq": seq, "keys": sorted(keys)}
        case SetPrompt(seq=seq, text=text):
            body = {"v": PROTOCOL_VERSION, "type": "prompt", "seq": seq, "text": text}
        case ResetPose():
            body = {"v": PROTOCOL_VERSION, "type": "reset_pose"}
        case Pause():
            body = {"v": PROTOCOL_VERSION, "type": "pause"}
        case Resume():
            body = {"v": PROTOCOL_VERSION, "type": "resume"}
        case Stop():
            body = {"v": PROTOCOL_VERSION, "type": "stop"}
    return _dumps(body)


def control_type(message: ControlMessage) -> str:
    """The wire `type` of a client message (`control_state`, `prompt`, `reset_pose`, `pause`, `resume`, `stop`)."""
    match message:
        case ControlState():
            return "control_state"
        case SetPrompt():
            return "prompt"
        case ResetPose():
            return "reset_pose"
        case Pause():
            return "pause"
        case Resume():
            return "resume"
        case Stop():
            return "stop"


def error_status(error: ProtocolError) -> ErrorStatus:
    """The `error` status message that answers a rejected inbound message."""
    return ErrorStatus(code=str(error.code), message=error.message)


def _dumps(body: Mapping[str, object]) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


def _clean_timings(timings: Mapping[str, float]) -> list[tuple[str, float]]:
    cleaned: list[tuple[str, float]] = []
    for name, value in sorted(timings.items(), key=lambda item: str(item[0])):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            continue
        # Six significant digits: microseconds for figures in seconds, and a bounded width per entry.
        cleaned.append((str(name)[:_TIMING_NAME_LIMIT], float(f"{float(value):.6g}")))
    return cleaned


def _encode_chunk(message: ChunkStatus, max_bytes: int) -> bytes:
    body: dict[str, object] = {
        "v": PROTOCOL_VERSION,
        "type": "chunk",
        "index": message.index,
        "applied_seq": message.applied_seq,
        "keys": sorted(message.keys),
        "prompt": message.prompt,
        "prompt_seq": message.prompt_seq,
        "timings": {},
    }
    if message.first_frame_pts is not None:
        body["first_frame_pts"] = message.first_frame_pts
    if message.stream_base_pts is not None:
        body["stream_base_pts"] = message.stream_base_pts
    if message.first_frame_id is not None:
        body["first_frame_id"] = message.first_frame_id
    base = _dumps(body)
    timings = _clean_timings(message.timings)
    encoded = _dumps({**body, "timings": dict(timings)})
    if len(encoded) <= max_bytes:
        return encoded
    # Too big: keep the shortest entries that fit (most timings are short figures; a runaway name goes first) and
    # tell the client the dict was trimmed.
    budget = max_bytes - len(base) - len(',"truncated":true')
    kept: dict[str, float] = {}
    for name, value in sorted(timings, key=lambda item: len(_dumps({item[0]: item[1]}))):
        cost = len(_dumps({name: value})) - 2 + (1 if kept else 0)  # "name":value plus a comma
        if cost > budget:
            break
        kept[name] = value
        budget -= cost
    return _dumps({**body, "timings": dict(sorted(kept.items())), "truncated": True})


def _fit_text(body: dict[str, object], field: str, max_bytes: int) -> bytes:
    text = body[field]
    if isinstance(text, str) and len(text) > _TEXT_LIMIT:
        body[field] = text[:_TEXT_LIMIT]
    encoded = _dumps(body)
    while len(encoded) > max_bytes:
        text = body[field]
        if not isinstance(text, str) or not text:
            raise ValueError(f"a {body['type']} message does not fit in {max_bytes} bytes")
        excess = len(encoded) - max_bytes
        # An escaped character costs up to 6 bytes (\uXXXX), so cut at least excess / 6 characters, at least one.
        body[field] = text[: max(0, len(text) - max(1, excess // 6))]
        encoded = _dumps(body)
    return encoded


def encode_status(message: StatusMessage, *, max_bytes: int = MAX_STATUS_BYTES) -> bytes:
    """Encode a status message as compact ASCII JSON of at most `max_bytes` bytes.

    A chunk's `timings` are rounded to six significant digits, non-finite figures are left out, and when the
    message would be too big the dict is trimmed (`"truncated": true` says so). Free text (state detail, error
    message, done reason) is cut to fit.
    """
    if max_bytes < MIN_STATUS_BYTES:
        raise ValueError(f"max_bytes must be at least {MIN_STATUS_BYTES}, got {max_bytes}")
    match message:
        case ChunkStatus():
            return _encode_chunk(message, max_bytes)
        case StateStatus(state=state, detail=detail):
            body: dict[str, object] = {"v": PROTOCOL_VERSION, "type": "state", "state": state[:64], "detail": detail}
            return _fit_text(body, "detail", max_bytes) if detail is not None else _dumps(body)
        case WarningStatus(code=code, message=text, ends_in_s=ends_in):
            seconds = float(f"{ends_in:.6g}") if math.isfinite(ends_in) else 0.0
            body = {"v": PROTOCOL_VERSION, "type": "warning", "code": code[:64], "message": text, "ends_in_s": seconds}
            return _fit_text(body, "message", max_bytes)
        case ErrorStatus(code=code, message=text):
            body = {"v": PROTOCOL_VERSION, "type": "error", "code": code[:64], "message": text}
            return _fit_text(body, "message", max_bytes)
        case DoneStatus(reason=reason):
            return _fit_text({"v": PROTOCOL_VERSION, "type": "done", "reason": reason}, "reason", max_bytes)


_CHUNK_FIELDS = _STATUS_FIELDS["chunk"]
# A service from before prompts sent chunks without `prompt`/`prompt_seq`: they decode with the defaults ("" and -1).
_CHUNK_REQUIRED = next(message.required for message in STATUS_MESSAGES if message.type == "chunk") - {
    "prompt",
    "prompt_seq",
}


def _status_from(parsed: dict[str, Any]) -> StatusMessage | None:
    kind = parsed.get("type")
    try:
        if kind == "state" and set(parsed) == _STATUS_FIELDS["state"]:
            detail = parsed["detail"]
            if isinstance(parsed["state"], str) and (detail is None or isinstance(detail, str)):
                return StateStatus(parsed["state"], detail)
        elif kind == "chunk" and _CHUNK_REQUIRED <= set(parsed) <= _CHUNK_FIELDS:
            timings = parsed["timings"]
            pts = parsed.get("first_frame_pts")
            prompt = parsed.get("prompt", "")
            prompt_seq = parsed.get("prompt_seq", -1)
            base_pts = parsed.get("stream_base_pts")
            frame_id = parsed.get("first_frame_id")
            if (
                (pts is None or _is_int(pts))
                and (base_pts is None or _is_int(base_pts))
                and (frame_id is None or _is_int(frame_id))
                and isinstance(prompt, str)
                and _is_int(prompt_seq)
                and _is_int(parsed["index"])
                and _is_int(parsed["applied_seq"])
                and isinstance(parsed["keys"], list)
                and all(isinstance(key, str) for key in parsed["keys"])
                and isinstance(timings, dict)
                and all(isinstance(value, int | float) and not isinstance(value, bool) for value in timings.values())
            ):
                return ChunkStatus(
                    parsed["index"],
                    parsed["applied_seq"],
                    tuple(parsed["keys"]),
                    {name: float(value) for name, value in timings.items()},
                    pts,
                    prompt,
                    prompt_seq,
                    base_pts,
                    frame_id,
                )
        elif kind == "warning" and set(parsed) == _STATUS_FIELDS["warning"]:
            ends_in = parsed["ends_in_s"]
            if (
                isinstance(parsed["code"], str)
                and isinstance(parsed["message"], str)
                and isinstance(ends_in, int | float)
                and not isinstance(ends_in, bool)
            ):
                return WarningStatus(parsed["code"], parsed["message"], float(ends_in))
        elif kind == "error" and set(parsed) == _STATUS_FIELDS["error"]:
            if isinstance(parsed["code"], str) and isinstance(parsed["message"], str):
                return ErrorStatus(parsed["code"], parsed["message"])
        elif kind == "done" and set(parsed) == _STATUS_FIELDS["done"] and isinstance(parsed["reason"], str):
            return DoneStatus(parsed["reason"])
    except (TypeError, ValueError):
        return None
    return None


def decode_status(data: bytes | str, *, max_bytes: int = MAX_STATUS_BYTES) -> StatusMessage | ProtocolError:
    """The client side of the codec: decode a status message strictly. Never raises."""
    parsed = _parse_json(data, max_bytes)
    if isinstance(parsed, ProtocolError):
        return parsed
    if not isinstance(parsed, dict) or not _is_int(parsed.get("v")):
        return ProtocolError(ProtocolErrorCode.INVALID_MESSAGE, 'a status message is an object with an integer "v"')
    if parsed["v"] != PROTOCOL_VERSION:
        return ProtocolError(ProtocolErrorCode.UNSUPPORTED_VERSION, f"status version {_echo(parsed['v'])}")
    status = _status_from(parsed)
    if status is None:
        return ProtocolError(
            ProtocolErrorCode.INVALID_MESSAGE, f"not a valid status message: {_echo(parsed.get('type'))}"
        )
    return status


@dataclass(frozen=True, slots=True)
class InboxStatistics:
    """A session's control intake: snapshots forwarded, stale (older seq) and duplicate (same seq) ones dropped,
    discrete commands forwarded, the newest accepted `seq` (-1 before the first); prompts forwarded and the newest
    accepted prompt `seq` (stale and duplicate prompts count with the snapshots')."""

    accepted: int
    stale: int
    duplicates: int
    commands: int
    last_seq: int
    prompts: int = 0
    last_prompt_seq: int = -1


class ControlInbox:
    """Per-session sequence tracking for control snapshots: newest wins.

    `accept(message)` says whether to hand a decoded message to the session. A `ControlState` is accepted only when its
    `seq` is greater than every one accepted before (lossy data channels reorder and repeat); the rest are dropped and
    counted. A `SetPrompt` is held to the same rule against the prompts' own sequence. Discrete commands (`ResetPose`,
    `Pause`, `Resume`, `Stop`) are always accepted: they travel on reliable, ordered channels. The inbox belongs to the
    session's binding and outlives rebinds, so a reconnected client must keep counting from where it was
    (docs/control-protocol.md says how).
    """

    __slots__ = ("_accepted", "_commands", "_duplicates", "_last_prompt_seq", "_last_seq", "_prompts", "_stale")

    def __init__(self) -> None:
        self._last_seq = -1
        self._last_prompt_seq = -1
        self._accepted = 0
        self._prompts = 0
        self._stale = 0
        self._duplicates = 0
        self._commands = 0

    @property
    def last_seq(self) -> int:
        return self._last_seq

    def accept(self, message: ControlMessage) -> bool:
        if isinstance(message, SetPrompt):
            if not self._newer(message.seq, self._last_prompt_seq):
                return False
            self._last_prompt_seq = message.seq
            self._prompts += 1
            return True
        if not isinstance(message, ControlState):
            self._commands += 1
            return True
        if not self._newer(message.seq, self._last_seq):
            return False
        self._last_seq = message.seq
        self._accepted += 1
        return True

    def _newer(self, seq: int, last: int) -> bool:
        if seq == last:
            self._duplicates += 1
            return False
        if seq < last:
            self._stale += 1
            return False
        return True

    def statistics(self) -> InboxStatistics:
        return InboxStatistics(
            accepted=self._accepted,
            stale=self._stale,
            duplicates=self._duplicates,
            commands=self._commands,
            last_seq=self._last_seq,
            prompts=self._prompts,
            last_prompt_seq=self._last_prompt_seq,
        )
