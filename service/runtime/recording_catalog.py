"""The recordings catalog: what every replica knows of a recording (its owner, state, objects), by session id.

A recording is made on the replica that ran its session, but with an object store (`LINGSTREAM_RECORDINGS_S3_*`)
any replica answers `GET .../recording` (a redirect to a presigned URL) and `GET /v1/recordings` (the caller's
list). The catalog is what they read: one `RecordingEntry` per recorded session, written by the recording replica at
each change (recording, finishing, uploading, ready or failed, removed by retention). Like admission it comes in two
kinds behind one seam, `RecordingCatalog`: in process (`MemoryRecordingCatalog`, one instance) and in Redis
(`service.scaleout.recording_catalog.RedisRecordingCatalog`, shared by the replicas of a deployment).

A list is ordered by `(started_at, session_id)`; a page ends with the cursor of its last entry (`cursor_of`), from
which the next page starts. Entries removed by retention stay readable (GET answers 404 naming retention) but are
no longer listed. Calls run on the event loop; cancelling one loses nothing.
"""

from __future__ import annotations

import enum
import json
from collections import OrderedDict
from dataclasses import asdict, dataclass, replace
from typing import Protocol

__all__ = [
    "MemoryRecordingCatalog",
    "RecordingCatalog",
    "RecordingEntry",
    "RecordingState",
    "cursor_of",
    "decode_entry",
    "encode_entry",
    "parse_cursor",
    "recording_event_data",
]

_MEMORY_ENTRIES = 4096  # a memory catalog forgets its oldest entries beyond these


class RecordingState(enum.Enum):
    """A recording's lifecycle (`service.runtime.recordings` moves it; `RecordingStore` names who does what)."""

    RECORDING = "recording"  # the session runs; chunks are being written
    FINISHING = "finishing"  # the session ended; the encoder is flushing and the files are being renamed
    UPLOADING = "uploading"  # complete on disk, going up to the object store (only with one configured)
    READY = "ready"  # complete: served by GET (from disk, or a redirect to the object store)
    FAILED = "failed"  # stopped by a write error, an overrun or a refused upload; nothing kept
    REMOVED = "removed"  # complete once, removed since by retention


@dataclass(frozen=True, slots=True)
class RecordingEntry:
    """One recording as the catalog keeps it: the session and its owner, when recording started (Unix seconds), the
    state and, once stopped, the stable code and reason; frames and bytes; the objects once uploaded (None: kept on
    the recording replica's disk, or not yet uploaded); `updated_at`: the last change; `webhook_url`: the session's
    own webhook endpoint (where a replica that finds the recording lost with its replica sends `recording.failed`)."""

    session_id: str
    owner: str
    state: RecordingState
    started_at: float
    updated_at: float
    code: str | None = None
    reason: str | None = None
    frames: int = 0
    bytes: int = 0
    video_key: str | None = None
    trace_key: str | None = None
    webhook_url: str | None = None

    def moved(self, state: RecordingState, now: float, **changes: object) -> RecordingEntry:
        """This entry in `state` as of `now`, with `changes` (code, reason, frames, bytes, keys)."""
        return replace(self, state=state, updated_at=now, **changes)  # type: ignore[arg-type]


def recording_event_data(entry: RecordingEntry) -> dict[str, object]:
    """The `recording` object of a `recording.ready|failed` webhook event."""
    return {
        "state": entry.state.value,
        "code": entry.code,
        "reason": entry.reason,
        "frames": entry.frames,
        "bytes": entry.bytes,
        "video_url": f"/v1/sessions/{entry.session_id}/recording",
        "controls_url": f"/v1/sessions/{entry.session_id}/recording/controls",
    }


def encode_entry(entry: RecordingEntry) -> str:
    fields = asdict(entry)
    fields["state"] = entry.state.value
    return json.dumps(fields, separators=(",", ":"))


def decode_entry(raw: str | bytes) -> RecordingEntry:
    """`encode_entry` reversed; `ValueError` for anything else."""
    fields = json.loads(raw)
    if not isinstance(fields, dict):
        raise ValueError("not a recording entry")
    try:
        fields["state"] = RecordingState(fields.get("state"))
        return RecordingEntry(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"not a recording entry: {exc}") from None


def cursor_of(entry: RecordingEntry) -> str:
    """The cursor after `entry` in a list (opaque to clients)."""
    return f"{entry.started_at!r}:{entry.session_id}"


def parse_cursor(cursor: str) -> tuple[float, str]:
    """`cursor_of` reversed; `ValueError` for anything else."""
    started, separator, session_id = cursor.partition(":")
    if not separator or not session_id:
        raise ValueError("not a recordings cursor")
    return float(started), session_id


class RecordingCatalog(Protocol):
    """Where recordings are known by every replica; see the module docstring."""

    async def put(self, entry: RecordingEntry) -> None:
        """Write the entry (replacing the session's previous one)."""
        ...

    async def get(self, session_id: str) -> RecordingEntry | None:
        """The session's entry (None: never recorded, or forgotten)."""
        ...

    async def of_owner(self, owner: str, since: float, after: str | None, limit: int) -> list[RecordingEntry]:
        """Up to `limit` of `owner`'s entries not removed, started at `since` or later, after the cursor `after`,
        oldest first."""
        ...

    async def fail_replica(self, replica_id: str, code: str, reason: str, now: float) -> list[RecordingEntry]:
        """Every recording replica `replica_id` was making (recording, finishing or uploading) moves to FAILED with
        `code` and `reason` as of `now`, at most once each (one atomic step: of several callers, one gets each);
        returns those it moved. Called for a replica that was lost: its local files went with it."""
        ...

    async def aclose(self) -> None: ...


class MemoryRecordingCatalog:
    """`RecordingCatalog` in process (one instance), bounded: the oldest entries beyond 4096 are forgotten."""

    def __init__(self, capacity: int = _MEMORY_ENTRIES) -> None:
        self._entries: OrderedDict[str, RecordingEntry] = OrderedDict()
        self._capacity = capacity

    async def put(self, entry: RecordingEntry) -> None:
        self._entries[entry.session_id] = entry
        while len(self._entries) > self._capacity:
            self._entries.popitem(last=False)

    async def get(self, session_id: str) -> RecordingEntry | None:
        return self._entries.get(session_id)

    async def fail_replica(self, replica_id: str, code: str, reason: str, now: float) -> list[RecordingEntry]:
        return []  # one instance: its recordings are never another replica's

    async def of_owner(self, owner: str, since: float, after: str | None, limit: int) -> list[RecordingEntry]:
        start = parse_cursor(after) if after is not None else None
        found = sorted(
            (
                entry
                for entry in self._entries.values()
                if entry.owner == owner and entry.state is not RecordingState.REMOVED and entry.started_at >= since
            ),
            key=lambda entry: (entry.started_at, entry.session_id),
        )
        if start is not None:
            found = [entry for entry in found if (entry.started_at, entry.session_id) > start]
        return found[:limit]

    async def aclose(self) -> None:
        self._entries.clear()
