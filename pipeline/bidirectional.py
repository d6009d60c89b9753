"""The seam between the service and a model worker: a `BidirectionalService`.

A model worker runs one `BidirectionalService`: create a session from its configuration, push control into it,
pull its output chunks, close it. The LingBot service (`pipeline.lingbot.policy.service`) is one implementation; its
cross-session policy is the execution lease. The HTTP service, the transports and the offline generator talk to
model workers only through this protocol, so tests can put a scripted fake behind it.

Control messages are the decoded form of control protocol v1 (the transports own the JSON codec): `ControlState(seq,
keys)` is a snapshot of held keys (newest wins; a stale or duplicate `seq` is dropped and counted, never an error that
ends the session), `ResetPose()` and `Stop()` are discrete commands, and `SetPrompt(seq, text)` replaces the session's
text prompt (newest wins by its own `seq`, counted apart from the key snapshots'; it applies from the next chunk
submitted). `Pause()` stops generation after the chunk in progress (the session keeps its state and asks for no more
model time; controls and prompts received meanwhile are kept, newest wins) and `Resume()` lets it go on; the service
decides whether a session may pause, a model worker obeys. The protocol's key table lives here, once, for the wire codec
(`transport.protocol`) and the model's normaliser (`pipeline.lingbot.controls`): the canonical keys `w a s d i j k l`,
their aliases (arrows, upper case) and the bounds of a snapshot (`MAX_SEQ`, `MAX_KEYS_PER_SNAPSHOT`); so does the
prompt's bound (`MAX_PROMPT_BYTES`, `check_prompt`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal, Protocol, overload, runtime_checkable

import numpy as np
import numpy.typing as npt

from admission.lease import LeaseStatistics
from pipeline.core.records import CloseMode

if TYPE_CHECKING:  # only the annotation: a worker's statistics carry the orchestrator's when it runs one
    from pipeline.orchestrator import OrchestratorStatistics

__all__ = [
    "CANONICAL_KEYS",
    "KEY_ALIASES",
    "MAX_KEYS_PER_SNAPSHOT",
    "MAX_PROMPT_BYTES",
    "MAX_SEQ",
    "BidirectionalService",
    "CheckpointingService",
    "ChunkItem",
    "ChunkOutput",
    "ChunkPart",
    "CloseMode",
    "ControlMessage",
    "ControlState",
    "Pause",
    "PortableCheckpoint",
    "PreparedSession",
    "RecoveringService",
    "RecoveryListener",
    "RecoveryNotice",
    "ResetPose",
    "Resume",
    "ServiceStatistics",
    "SessionSummary",
    "SetPrompt",
    "Stop",
    "canonical_key",
    "check_prompt",
]

CANONICAL_KEYS: frozenset[str] = frozenset("wasdijkl")
"""The keys a control snapshot holds once normalised (forward/back w s, strafe a d, pitch i k, yaw j l)."""

KEY_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "ArrowUp": "w",
        "ArrowDown": "s",
        "ArrowLeft": "j",
        "ArrowRight": "l",
        **{key.upper(): key for key in "wasdijkl"},  # Shift or Caps Lock held: the same keys
    }
)
"""Accepted spellings besides the canonical keys, and what they normalise to."""

MAX_KEYS_PER_SNAPSHOT = 16
"""More entries than this in one snapshot is malformed input (8 keys have 20 spellings; a client sends each once)."""

MAX_SEQ = 2**53 - 1
"""The largest control `seq`: JavaScript's Number.MAX_SAFE_INTEGER, so a browser counts exactly over JSON."""


MAX_PROMPT_BYTES = 512
"""The longest text prompt, in UTF-8 bytes (the create request's `prompt` and the `prompt` control message)."""


def check_prompt(text: object) -> str:
    """`text` when it is a valid prompt: a string of at most `MAX_PROMPT_BYTES` UTF-8 bytes ("" means no prompt).

    Raises `ValueError` with a sentence saying why not (not a string, not encodable as UTF-8, too long).
    """
    if not isinstance(text, str):
        raise ValueError(f"a prompt must be a string, got {type(text).__name__}")
    if len(text) > MAX_PROMPT_BYTES:  # every character is at least one byte: no need to encode a long one
        raise ValueError(f"a prompt is at most {MAX_PROMPT_BYTES} UTF-8 bytes, got at least {len(text)}")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise ValueError("a prompt must be valid Unicode text (it holds a lone surrogate)") from None
    if size > MAX_PROMPT_BYTES:
        raise ValueError(f"a prompt is at most {MAX_PROMPT_BYTES} UTF-8 bytes, got {size}")
    return text


def canonical_key(name: str) -> str | None:
    """The canonical key that `name` spells (itself or an alias), or None for a name that is not a key."""
    return name if name in CANONICAL_KEYS else KEY_ALIASES.get(name)


@dataclass(frozen=True, slots=True)
class ControlState:
    """A snapshot of the keys the client holds now, with the client's sequence number."""

    seq: int
    keys: frozenset[str]


@dataclass(frozen=True, slots=True)
class ResetPose:
    """Put the camera back at its start pose (applies from the next chunk)."""


@dataclass(frozen=True, slots=True)
class Stop:
    """The client wants the session to end (it drains: the chunk in progress is still delivered)."""


@dataclass(frozen=True, slots=True)
class SetPrompt:
    """Replace the session's text prompt from the next chunk on (`seq`: the client's prompt counter, newest wins)."""

    seq: int
    text: str


@dataclass(frozen=True, slots=True)
class Pause:
    """Generate nothing more until `Resume` (the chunk in progress is still delivered); keep every state."""


@dataclass(frozen=True, slots=True)
class Resume:
    """Go on generating after a `Pause` (a no-op when not paused)."""


ControlMessage = ControlState | ResetPose | Stop | SetPrompt | Pause | Resume


@dataclass(frozen=True, slots=True)
class ChunkOutput:
    """One generated chunk: its frames and exactly which control snapshot they reflect.

    `frames` is uint8 `[T, H, W, 3]` (RGB). `applied_seq`/`keys` are the control snapshot the chunk was generated
    from (`applied_seq` is -1 before the client sent any). `timings` holds per-chunk figures in seconds
    (e.g. `control_to_output`, `denoise`, `decode`). `first_frame_index` is the index of the chunk's first frame in
    the session's video. `prompt` is the text prompt the chunk was generated from ("" for none) and `prompt_seq`
    the `seq` of the `SetPrompt` that set it (-1: the session's initial prompt). `reset_pose`: the chunk started
    from the camera's start pose (a `ResetPose` was applied to it); with `keys` and `prompt` it is all a replay of
    the session needs (a recording's control trace).
    """

    session_id: str
    index: int
    frames: npt.NDArray[np.uint8]
    fps: float
    first_frame_index: int
    applied_seq: int
    keys: frozenset[str]
    timings: Mapping[str, float] = field(default_factory=dict)
    prompt: str = ""
    prompt_seq: int = -1
    reset_pose: bool = False


@dataclass(frozen=True, slots=True)
class ChunkPart:
    """Frames of chunk `index` handed over as soon as they are decoded, ahead of the whole chunk (progressive decode).

    `frames` uint8 `[n, H, W, 3]` RGB are the chunk's frames `offset .. offset + n - 1`, frame `first_frame_index`
    of the session's video onwards. A chunk's parts come in order, before the chunk's `ChunkOutput`, which carries all
    its frames again (for the chunk's status, a recording, the counters): a consumer that plays the parts plays only
    the frames of that `ChunkOutput` no part brought. Parts of a chunk that fails are never followed by its
    `ChunkOutput`; the session's failure follows.
    """

    session_id: str
    index: int
    frames: npt.NDArray[np.uint8]
    fps: float
    first_frame_index: int
    offset: int


ChunkItem = ChunkOutput | ChunkPart
"""What a session's output stream carries when its reader asks for parts (`outputs(session_id, parts=True)`)."""


@dataclass(frozen=True, slots=True)
class PreparedSession:
    """A validated session request, ready to create on a model worker.

    `config` is the implementation's own validated configuration object; `width`/`height`/`fps` are what the
    transports need to know before the first frame; `frame_limit` is the session's total frame count (None: until
    closed); `resume`: where an adopted session goes on (below).
    """

    config: object
    width: int
    height: int
    fps: float
    frame_limit: int | None
    image: object | None = None
    resume: object | None = None
    """A checkpoint to go on from instead of starting (a session adopted from a lost replica, docs/continuity.md):
    the implementation's own record (`SessionCheckpoint` for LingBot); None: a new session."""
    down_s: float = 0.0
    """With `resume`: how long the session had been without a replica when it was handed to this worker (from its
    lost replica's last heartbeat, or from its hand-off); its recovery time counts from there, not from the restore."""
    resume_cause: str = "replica_lost"
    """With `resume`: why the session left its replica, the `cause` its recovery is counted under: "replica_lost"
    (the replica died) or "replica_draining" (it handed the session off while draining)."""
    paused: bool = False
    """With `resume`: the session was paused when it left its replica (handed off on a drain): it goes on paused,
    generating nothing until a `Resume`."""


@dataclass(frozen=True, slots=True)
class SessionSummary:
    """What closing a session reports."""

    session_id: str
    chunks: int
    failure: str | None
    cleanup_failures: Mapping[str, str]
    slot_leaks: int


@dataclass(frozen=True, slots=True)
class ServiceStatistics:
    """A model worker's figures. `sessions`: open now; `chunks`: emitted since start; `stale_controls`: control
    snapshots dropped as stale or duplicate. `orchestrator`: its streaming orchestrator's statistics (None: it runs
    on none); `lease`: its cross-session execution lease's (None: it takes no turns, or its lease reports none)."""

    ready: bool
    sessions: int
    chunks: int
    stale_controls: int
    orchestrator: OrchestratorStatistics | None = None
    lease: LeaseStatistics | None = None


@dataclass(frozen=True, slots=True)
class RecoveryNotice:
    """A session of a model worker is being rebuilt after its worker failed, or runs again (docs/continuity.md).

    `recovering` True: the session's pipeline failed (`cause`: "worker_lost" or "stage_failed") and it is being
    re-seeded from its checkpoint (attempt `attempt`), instead of failing; its outputs pause. False: the first chunk
    after the re-seed came out, `recovery_s` after the failure. A session that cannot be rebuilt gets no notice of
    that: its output stream fails as before."""

    session_id: str
    recovering: bool
    cause: str
    attempt: int
    recovery_s: float | None = None


RecoveryListener = Callable[[RecoveryNotice], None]


@runtime_checkable
class RecoveringService(Protocol):
    """A `BidirectionalService` that rebuilds sessions after a worker loss and says so (optional capability)."""

    def add_recovery_listener(self, listener: RecoveryListener) -> None:
        """Call `listener` on the event loop with each `RecoveryNotice`; it must not block or raise."""
        ...


class PortableCheckpoint(Protocol):
    """A session at its last chunk boundary, in the form a store outside the worker keeps (docs/continuity.md;
    `pipeline.lingbot.continuity.SessionCheckpoint` is one): `header_bytes` is the small record written at every
    chunk boundary, `image_data` the session's reference image, written once per session (None: no image), and
    `history_part` each chunk of a model's history (`history_indices`), written once per chunk."""

    @property
    def session_id(self) -> str: ...

    @property
    def next_chunk(self) -> int: ...

    def header_bytes(self) -> bytes: ...

    def image_data(self) -> bytes | None: ...

    def history_indices(self) -> tuple[int, ...]:
        """The chunks of model history the checkpoint holds (none for a model without history)."""
        ...

    def history_part(self, chunk_index: int) -> bytes:
        """One chunk of history serialised: what a store writes once, when the chunk first appears."""
        ...


@runtime_checkable
class CheckpointingService(Protocol):
    """A `BidirectionalService` whose sessions can be read at their last chunk boundary (optional capability): what
    another replica needs to rebuild the session when this one is gone (docs/continuity.md)."""

    @property
    def resumable(self) -> bool:
        """Whether `create_session` goes on from this worker's checkpoints (`PreparedSession.resume`, read back by
        the implementation's own reader), so another replica may adopt its sessions."""
        ...

    def checkpoint(self, session_id: str) -> PortableCheckpoint | None:
        """The session's newest checkpoint (None: an unknown session, or one that has none). On the event loop,
        never waits."""
        ...


class BidirectionalService(Protocol):
    """One model worker's session service.

    Contract:
    - `prepare(config, image)` validates a request cheaply and raises `ValueError` (a subclass) with a message
      naming the field for bad input. It may decode the image, so the caller runs it off the event loop.
    - `create_session` sets up the model-side state (caches, the encoded reference) and starts generation; it
      raises if the id is in use. Model work never runs on the event loop.
    - `push_control` never blocks and never raises for stale input: stale snapshots are dropped and counted. It
      raises `pipeline.errors.UnknownSessionError` for an unknown session, as `outputs` and `close_session` do
      (for an id it never had or has forgotten; a closed session's summary is kept a while).
    - `outputs(session_id)` yields chunks in order; it ends after the session closes (or raises the session's
      failure once the chunks it had produced were read). `outputs(session_id, parts=True)` also yields each
      chunk's `ChunkPart`s before the chunk, where the worker decodes progressively (a worker that does not yields
      only chunks).
    - `close_session` is idempotent and returns the summary.
    """

    @property
    def ready(self) -> bool: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...

    def prepare(self, config: Mapping[str, object], image: bytes | None) -> PreparedSession: ...

    async def create_session(self, session_id: str, prepared: PreparedSession) -> None: ...

    def push_control(self, session_id: str, message: ControlMessage) -> None: ...

    @overload
    def outputs(self, session_id: str, *, parts: Literal[False] = False) -> AsyncIterator[ChunkOutput]: ...

    @overload
    def outputs(self, session_id: str, *, parts: bool) -> AsyncIterator[ChunkItem]: ...

    def outputs(self, session_id: str, *, parts: bool = False) -> AsyncIterator[ChunkItem]: ...

    async def close_session(self, session_id: str, mode: CloseMode = CloseMode.DRAIN) -> SessionSummary: ...

    def statistics(self) -> ServiceStatistics: ...
