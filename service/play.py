"""`lingstream play`: drive a live session of a running service from a control trace, record what came back.

    lingstream play --url URL [--api-key K] --controls TRACE --out OUT.mp4 [--config JSON] [--image PATH]
                    [--tail S] [--livekit-room ROOM [--livekit-identity ID --livekit-token TOKEN]] [--report R.json]
                    [--record]

It is a headless client (`transport.client`): it creates a session, follows its queue position (printed), joins
over the session's transport (embedded WebRTC or LiveKit), plays the trace as `control_state` snapshots, `prompt`
messages and `reset_pose` commands, writes every received frame to an H.264 MP4 (`service.offline.mp4`), sends
`stop` after the trace (and `--tail` seconds more), and prints what it measured as one JSON line on stdout (a human
summary goes to stderr).

The trace has `lingstream generate`'s format (`service.offline.control_trace`); live, a position says *when* to
send, since which chunk applies a control is up to the service:

- `{"t": S, ...}`: S seconds after the client joined;
- `{"chunk": N, ...}`: as soon as the `chunk` status of chunk N-1 has arrived (N = 0: at once on joining), so the
  control can apply to chunk N at the earliest; after `--wait` seconds (10) without it it is sent anyway, with a
  warning (LiveKit may drop a chunk status, and a model may rest while no key is held: the reference model
  generates nothing then).

Entries are played in file order, each after the one before.

`--record` creates the session recorded (the service needs LINGSTREAM_RECORDINGS_DIR) and, once it ended, saves the
service's recording beside what the client received: `OUT.service.mp4` (what the service generated) and
`OUT.service.controls.jsonl` (its control trace, which `lingstream generate --controls` replays), waiting up to
`--wait` seconds while the service finishes the files (409 `recording_in_progress`).

Figures (`PlayReport`): `frames`, `fps` (frames received over the span between the first and the last),
`chunks`, `frames_dropped` (by the client's bounded frame buffer), `frames_repeated` (keep-warm repeats the service
sent while it had nothing new, told apart on the embedded transport and neither counted in `frames` nor written),
and **control-to-photon latency**: for every
snapshot that changed the held keys, the time from sending it to receiving the first frame generated from it or a
newer snapshot, i.e. the first frame of a chunk whose status says `applied_seq >= seq` (the chunk status tells which
control a chunk applied; on the embedded transport a frame is matched to its chunk by its RTP timestamp, on LiveKit
by its frame id (frame metadata), both exact (`labels`), see `transport.client.stream`). On LiveKit the discrete
commands (`reset_pose`, `prompt`, the final `stop`) are RPC calls; a refused one is a warning and an entry of
`errors`. Reported as count, p50, p95 and max in milliseconds; a change no
frame showed before the end is counted in `controls_unseen`.

Exit status: 0 when the session streamed and ended; 2 for bad options or a bad trace (nothing is created); 1 when
the service refused or failed the session (the stable error code is printed), or nothing could be received.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from pipeline.metrics import percentile
from service.offline.clip import GenerationError, UsageError
from service.offline.control_trace import TraceEntry, TraceError, parse_trace, read_trace_text
from service.offline.mp4 import Mp4Writer, h264_encoder
from transport.base import ChunkStatus, DoneStatus, StatusMessage
from transport.client import (
    ClientError,
    ControlRefusedError,
    LiveStream,
    ReceivedFrame,
    RecordingError,
    ServiceClient,
    SessionInfo,
    connect,
)

__all__ = ["PhotonMeter", "PlayReport", "add_arguments", "main", "play", "wait_for_chunk"]

_STOP_WAIT_S = 30.0
_FIRST_FRAME_S = 60.0


@dataclass(slots=True)
class PhotonMeter:
    """Control-to-photon latency (see the module docstring). Pure: times are given, nothing is read.

    `sent(seq, at)` records a snapshot that changed the keys; `frame(frame)` resolves every recorded snapshot the
    frame's chunk applied (`applied_seq >= seq`) with the frame's arrival time."""

    pending: list[tuple[int, float]] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)

    def sent(self, seq: int, at: float) -> None:
        self.pending.append((seq, at))

    def frame(self, frame: ReceivedFrame) -> None:
        chunk = frame.chunk
        if chunk is None or not self.pending:
            return
        still: list[tuple[int, float]] = []
        for seq, at in self.pending:
            if seq <= chunk.applied_seq:
                self.latencies_s.append(frame.received_at - at)
            else:
                still.append((seq, at))
        self.pending = still


@dataclass(frozen=True, slots=True)
class PlayReport:
    session_id: str
    transport: str
    out: str
    frames: int
    frames_written: int
    frames_dropped: int
    frames_repeated: int
    width: int
    height: int
    seconds: float
    fps: float | None
    chunks: int
    controls_sent: int
    control_to_photon_count: int
    control_to_photon_p50_ms: float | None
    control_to_photon_p95_ms: float | None
    control_to_photon_max_ms: float | None
    controls_unseen: int
    done_reason: str | None
    errors: list[str]
    recording: str | None = None  # --record: where the service's recording was saved
    recording_controls: str | None = None
    reconnects: int = 0
    """Connections the stream took again by itself after losing its replica (docs/client.md)."""
    labels: str = "exact"
    """How frames were matched to their chunks: `exact` (by RTP timestamp on the embedded transport, by LiveKit frame
    id) or `arrival` (some frame by arrival order: a LiveKit service that stamps no frames)."""

    def summary(self) -> str:
        fps = "-" if self.fps is None else f"{self.fps:.1f}"
        p50 = "-" if self.control_to_photon_p50_ms is None else f"{self.control_to_photon_p50_ms:.0f}"
        p95 = "-" if self.control_to_photon_p95_ms is None else f"{self.control_to_photon_p95_ms:.0f}"
        return (
            f"session {self.session_id} ({self.transport}): {self.frames} frames in {self.seconds:.1f} s, {fps} fps, "
            f"{self.chunks} chunks; control-to-photon p50 {p50} ms, p95 {p95} ms over {self.control_to_photon_count} "
            f"changes; wrote {self.frames_written} frames to {self.out}"
        )


class _Recorder:
    """Reads the stream's frames into the MP4 (opened at the first frame's size) and the photon meter."""

    def __init__(self, stream: LiveStream, out: Path, fps: float, meter: PhotonMeter) -> None:
        self.stream = stream
        self.out = out
        self.fps = max(1, round(fps))
        self.meter = meter
        self.writer: Mp4Writer | None = None
        self.frames = 0
        self.repeats = 0
        self.by_arrival = 0  # frames labelled by arrival order (no RTP timestamp, no frame id)
        self.first_at: float | None = None
        self.last_at: float | None = None
        self.size: tuple[int, int] = (0, 0)
        self.first_frame = asyncio.Event()

    async def run(self) -> None:
        async for frame in self.stream.frames():
            if frame.repeat:  # a keep-warm repeat of the frame before: nothing new to count or write
                self.repeats += 1
                continue
            self.meter.frame(frame)
            self.frames += 1
            if frame.chunk is not None and frame.pts is None and frame.frame_id is None:
                self.by_arrival += 1
            self.first_at = frame.received_at if self.first_at is None else self.first_at
            self.last_at = frame.received_at
            self.first_frame.set()
            image = frame.image
            if self.writer is None:
                height, width = image.shape[0] - image.shape[0] % 2, image.shape[1] - image.shape[1] % 2
                self.size = (width, height)
                self.writer = Mp4Writer(self.out, width, height, self.fps, h264_encoder())
            width, height = self.size
            if image.shape[0] < height or image.shape[1] < width:
                continue  # a frame smaller than the file's (the stream changed size): not writable, skipped
            await self.writer.write(np.ascontiguousarray(image[np.newaxis, :height, :width]))

    def close(self) -> int:
        if self.writer is None:
            return 0
        self.writer.close()
        return self.writer.frames


async def wait_for_chunk(stream: LiveStream, index: int, within: float) -> bool:
    """Until the stream has seen the status of chunk `index` or the session is done (True), at most `within` seconds
    (False: LiveKit may drop a chunk status, and a session may stall)."""
    if (stream.last_chunk is not None and stream.last_chunk.index >= index) or stream.ended:
        return True
    arrived = asyncio.Event()

    def listener(message: StatusMessage) -> None:
        if (isinstance(message, ChunkStatus) and message.index >= index) or isinstance(message, DoneStatus):
            arrived.set()

    stream.add_status_listener(listener)
    try:
        async with asyncio.timeout(within):
            await arrived.wait()
    except TimeoutError:
        return False
    finally:
        stream.remove_status_listener(listener)
    return True


def _over(stream: LiveStream) -> bool:
    # A call, not the property inline: the stream ends while this coroutine awaits (mypy would narrow a property).
    return stream.ended


async def _drive(
    stream: LiveStream,
    entries: Sequence[TraceEntry],
    meter: PhotonMeter,
    tail_s: float,
    wait_s: float,
    warn: Callable[[str], None],
) -> None:
    loop = asyncio.get_running_loop()
    joined = loop.time()
    held: frozenset[str] | None = None
    for entry in entries:
        if _over(stream):
            return
        if entry.t is not None:
            await asyncio.sleep(max(0.0, joined + entry.t - loop.time()))  # an absolute deadline from the join
        elif entry.chunk and not await wait_for_chunk(stream, entry.chunk - 1, wait_s):
            warn(f"line {entry.line}: no status of chunk {entry.chunk - 1} within {wait_s:g} s; sending it now")
        if _over(stream):
            return
        try:
            if entry.reset_pose:
                await stream.reset_pose()
            elif entry.prompt is not None:
                await stream.send_prompt(entry.prompt)
        except ControlRefusedError as exc:  # an RPC refusal (LiveKit); the stream records it with the errors
            warn(f"line {entry.line}: refused: {exc}")
            continue
        if entry.reset_pose or entry.prompt is not None:
            continue
        if entry.keys is not None and entry.keys != held:
            held = entry.keys
            seq = await stream.send_keys(entry.keys)
            sent = stream.sent_at(seq)
            if sent is not None:
                meter.sent(seq, sent)
    if not _over(stream):
        await asyncio.sleep(tail_s)


def _figures(values_s: list[float]) -> tuple[float | None, float | None, float | None]:
    if not values_s:
        return None, None, None
    ms = sorted(value * 1000 for value in values_s)
    p50, p95 = percentile(ms, 50), percentile(ms, 95)
    assert p50 is not None
    assert p95 is not None
    return round(p50, 1), round(p95, 1), round(ms[-1], 1)


async def play(
    url: str,
    entries: Sequence[TraceEntry],
    out: Path,
    *,
    api_key: str | None = None,
    config: dict[str, Any] | None = None,
    image: bytes | None = None,
    livekit: dict[str, Any] | None = None,
    livekit_token: str | None = None,
    tail_s: float = 2.0,
    wait_s: float = 10.0,
    progress: Callable[[str], None] | None = None,
    record: bool = False,
) -> PlayReport:
    """Run one live session from `entries` and record it to `out`; see the module docstring. Raises the client's
    errors (`ClientError`) and `GenerationError` when no frame arrived."""
    meter = PhotonMeter()
    shown: list[tuple[str, int | None]] = []

    def show(info: SessionInfo) -> None:
        if progress is None or shown[-1:] == [(info.status, info.queue_position)]:
            return
        shown.append((info.status, info.queue_position))
        where = f" (queue position {info.queue_position})" if info.queue_position else ""
        progress(f"session {info.id}: {info.status}{where}")

    async with ServiceClient(url, api_key=api_key) as service:
        created = await service.create(config=config, image=image, livekit=livekit, record=record)
        show(created)
        try:
            info = await service.wait_streaming(created.id, on_update=show)
            stream = await connect(service, info, livekit_token=livekit_token)
        except BaseException:
            await _cancel_quietly(service, created.id)
            raise
        recorder = _Recorder(stream, out, info.fps, meter)
        reading = asyncio.create_task(recorder.run(), name="play-recorder")
        started = time.monotonic()
        try:
            await _drive(stream, entries, meter, tail_s, wait_s, progress or (lambda _line: None))
            if stream.done is None:
                async with asyncio.timeout(_STOP_WAIT_S):
                    await stream.stop()
            async with asyncio.timeout(_STOP_WAIT_S):
                await reading
        finally:
            await stream.aclose()
            if not reading.done():
                reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)
            written = recorder.close()
            await _cancel_quietly(service, info.id)
        saved = await _save_recording(service, info.id, out, wait_s) if record else None
    seconds = time.monotonic() - started
    if recorder.frames == 0:
        raise GenerationError(f"session {info.id}: no frame arrived in {seconds:.1f} s")
    span = (recorder.last_at or 0.0) - (recorder.first_at or 0.0)
    fps = (recorder.frames - 1) / span if recorder.frames > 1 and span > 0 else None
    p50, p95, worst = _figures(meter.latencies_s)
    stats = stream.statistics()
    return PlayReport(
        session_id=info.id,
        transport=str((info.transport or {}).get("kind")),
        out=str(out),
        frames=recorder.frames,
        frames_written=written,
        frames_dropped=stats.frames_dropped,
        frames_repeated=recorder.repeats,
        width=recorder.size[0],
        height=recorder.size[1],
        seconds=round(seconds, 3),
        fps=None if fps is None else round(fps, 2),
        chunks=stats.chunks,
        controls_sent=stats.controls_sent,
        control_to_photon_count=len(meter.latencies_s),
        control_to_photon_p50_ms=p50,
        control_to_photon_p95_ms=p95,
        control_to_photon_max_ms=worst,
        controls_unseen=len(meter.pending),
        done_reason=None if stream.done is None else stream.done.reason,
        errors=[f"{error.code}: {error.message}" for error in stream.errors],
        recording=None if saved is None else str(saved[0]),
        recording_controls=None if saved is None else str(saved[1]),
        labels="arrival" if recorder.by_arrival else "exact",
        reconnects=stats.reconnects,
    )


def recording_paths(out: Path) -> tuple[Path, Path]:
    """Where `--record` saves the service's recording and its control trace: beside `out`."""
    return out.with_name(f"{out.stem}.service.mp4"), out.with_name(f"{out.stem}.service.controls.jsonl")


async def _save_recording(service: ServiceClient, session_id: str, out: Path, wait_s: float) -> tuple[Path, Path]:
    """The ended session's recording and trace, saved beside `out`; retried while the service finishes them."""
    video, trace = recording_paths(out)
    deadline = time.monotonic() + wait_s
    while True:
        try:
            await service.recording(session_id, video)
            break
        except RecordingError as exc:
            if exc.code != "recording_in_progress" or time.monotonic() >= deadline:
                raise
            await asyncio.sleep(0.1)
    await service.recording_controls(session_id, trace)
    return video, trace


async def _cancel_quietly(service: ServiceClient, session_id: str) -> None:
    """End the session if it still runs (a client that gives up must not hold a slot); errors are ignored."""
    with contextlib.suppress(ClientError):
        await service.delete(session_id, "cancel")


# -- command line ------------------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="the service's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--api-key", help="bearer API key (when the service has keys)")
    parser.add_argument("--controls", type=Path, required=True, help="control trace (JSON Lines, docs/generate.md)")
    parser.add_argument("--out", type=Path, required=True, help="where to write the received video (.mp4)")
    parser.add_argument("--config", help="session config as JSON, e.g. '{\"fps\": 16}'")
    parser.add_argument("--image", type=Path, help="reference image (PNG, JPEG or WebP)")
    parser.add_argument("--tail", type=float, default=2.0, help="seconds to keep streaming after the trace (2)")
    parser.add_argument(
        "--wait", type=float, default=10.0, help="most seconds a chunk entry waits for the chunk before it (10)"
    )
    parser.add_argument("--livekit-room", help="LiveKit: publish into this existing room (docs/livekit.md)")
    parser.add_argument("--livekit-identity", help="LiveKit: the identity that controls (with --livekit-token)")
    parser.add_argument("--livekit-token", help="LiveKit: a token for --livekit-identity in --livekit-room")
    parser.add_argument("--report", type=Path, help="also write the figures as JSON to this file")
    parser.add_argument(
        "--record",
        action="store_true",
        help="record the session on the service and save its recording beside --out (OUT.service.mp4 and "
        "OUT.service.controls.jsonl)",
    )


def _options(args: argparse.Namespace) -> tuple[tuple[TraceEntry, ...], dict[str, Any], bytes | None, Any]:
    if args.out.suffix.lower() != ".mp4":
        raise UsageError(f"--out must end in .mp4, got {args.out}")
    if not (math.isfinite(args.tail) and args.tail >= 0):
        raise UsageError(f"--tail must be a number of seconds >= 0, got {args.tail:g}")
    if not (math.isfinite(args.wait) and args.wait > 0):
        raise UsageError(f"--wait must be a positive number of seconds, got {args.wait:g}")
    if (args.livekit_identity is None) != (args.livekit_token is None):
        raise UsageError("give --livekit-identity and --livekit-token together")
    if args.livekit_identity is not None and args.livekit_room is None:
        raise UsageError("--livekit-identity needs --livekit-room")
    try:
        entries = parse_trace(read_trace_text(args.controls), args.controls.name or str(args.controls))
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    config: dict[str, Any] = {}
    if args.config is not None:
        try:
            config = json.loads(args.config)
        except ValueError as exc:
            raise UsageError(f"--config is not JSON: {exc}") from None
        if not isinstance(config, dict):
            raise UsageError("--config must be a JSON object")
    image = None
    if args.image is not None:
        try:
            image = args.image.read_bytes()
        except OSError as exc:
            raise UsageError(f"--image: cannot read {args.image}: {exc.strerror or exc}") from None
    livekit = None
    if args.livekit_room is not None:
        livekit = {"room": args.livekit_room}
        if args.livekit_identity is not None:
            livekit["controller_identity"] = args.livekit_identity
    return entries, config, image, livekit


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lingstream play", description="Drive a live session from a control trace and record what it streams."
    )
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        entries, config, image, livekit = _options(args)
    except UsageError as exc:
        sys.stderr.write(f"lingstream play: {exc}\n")
        return 2

    def progress(line: str) -> None:
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()

    try:
        report = asyncio.run(
            play(
                args.url,
                entries,
                args.out,
                api_key=args.api_key,
                config=config,
                image=image,
                livekit=livekit,
                livekit_token=args.livekit_token,
                tail_s=args.tail,
                wait_s=args.wait,
                progress=progress,
                record=args.record,
            )
        )
    except UsageError as exc:
        sys.stderr.write(f"lingstream play: {exc}\n")
        return 2
    except (ClientError, GenerationError, TimeoutError) as exc:
        sys.stderr.write(f"lingstream play: {type(exc).__name__}: {exc}\n")
        return 1
    body = asdict(report)
    sys.stderr.write(report.summary() + "\n")
    sys.stdout.write(json.dumps(body, sort_keys=True) + "\n")
    sys.stdout.flush()
    if args.report is not None:
        args.report.write_text(json.dumps(body, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return 0
