"""A LiveKit participant in a process of its own, the one way a test runs one (tests/e2e/test_livekit_sdk.py,
test_livekit_caller_token.py): the real `livekit` Python SDK joins a room with the token it is given and plays one
scenario; the last line it prints is a JSON report. A test starts it with `tests.support.livekit_stack.run_client`
(from the thread inside the test's network namespace, so the child is born there).

    python -m tests.support.livekit_client SCENARIO URL TOKEN [--topic-control T] [--topic-status S]

Scenarios:
- `join`: join and leave (`joined`, or the SDK's `error`).
- `control`: as the session's controller: a `control_state` snapshot (lossy, resent until applied) and the `chunk`
  that applies it, malformed packets and the `error` statuses they get, a second snapshot (the session still
  steers), `stop` and the final `done`.
- `foreign`: as a participant that may publish data but is not the controller: snapshots on the control topic,
  then which `chunk` statuses came in the next seconds (none may apply them), and an RPC call of `--service`'s
  `lingstream.pause` (`rpc_error`: the `RpcError`'s code and data).
- `labels URL=service-url TOKEN=session-id`: the Python client (`transport.client.connect`, the real SDK) joins the
  session, reads frames while it runs, pauses and resumes it by RPC (the keep-warm repeats between), tries bad
  RPC payloads and too many prompts, then stops it by RPC; `frames` lists every frame received with its labels
  (`frame_id`, `chunk`, `first_frame_id`, `first`, `repeat`) and the mean grey of its top half (`level`) and of its
  bottom half (`level_high`), away from the edge between them (`framed_fake_workers` paints two digits of the
  frame's index there).
- `follow URL=service-url TOKEN=session-id`: the Python client (`transport.client.connect` over LiveKit) joins the
  session, holds `w` (sent every 0.5 s), prints `{"joined": true}` once a frame is in, then reads a line from stdin:
  the monotonic time its replica was killed (CLOCK_MONOTONIC is the machine's, shared by processes), then another:
  the checkpoint's `next_chunk` the adopter goes on from. It reads on, on the same stream, until frames of two chunks
  from the checkpoint on arrived after the kill (or `_FOLLOW_S` passed) and a third line came (the test saw the
  adopter run the session), then stops the session by RPC. Reports the
  chunks before the kill, after it from the checkpoint on (`after`: the adopter's), after it before the checkpoint
  (`tail`: the old replica's last frames, in flight at the kill), the `sequence` after the kill, the first frame of
  the adopter's chunks after the kill (`first_after_s`), the link's `track_switches` (the adopter's new track) and
  `done`; the frame ids: the newest before the kill and every generated frame's after it (`ids_after`, None for a
  frame that came without one; the SDK's black placeholders left out); and, to diagnose a label that goes back, every
  frame and chunk status from 1 s before the kill (`frames_around`: seconds after the kill, frame id, chunk, repeat;
  `statuses_around`: seconds after the kill, index, first frame id).
- `paused URL=service-url TOKEN=session-id`: the Python client joins the session, holds `w` as `follow` does, pauses
  it by RPC once a labelled frame is in and prints `{"paused": state, "paused_at": monotonic time}`; then reads from
  stdin the time its replica was drained and the checkpoint's `next_chunk`, waits for a `paused` state status that
  came after the drain (the adopter's; prints `{"told_paused": true}`), reads one more line (the test checked the
  adopter) and resumes by RPC; once frames of two chunks from the checkpoint on came, stops the session by RPC.
  Reports the frames that were no repeat between the drain and the resume (`generated_while_paused`: s after the
  drain, frame id, chunk), the states told in that time, the RPC's answer to the resume (`resumed`), the chunks
  after it (`sequence`, `after`), `track_switches`, the `error` codes and `done`.
- `publish`: try to publish a video track for 3 s (`published`, or the `error`).
- `churn`: join and leave again `--times` times, each with a fresh room (`joins`: how many joins succeeded).
- `hold`: join, print `{"joined": true}` (or the report with the SDK's `error`) at once, stay in the room until
  stdin closes, then leave (for tests that need several participants in a room at the same time).
- `watch`: as the session's controller, hold `w` (a snapshot resent every 0.25 s, as a page does) and count the
  frames of the service's video track: print `{"joined": true}` once the first frame is in, then count until stdin
  closes (`frames`, and `max_gap_s`, the longest wait between two frames in that time).
- `viewer --service S --state A [--state B] [--then-post URL]`: a late viewer that subscribes to nothing: waits until
  participant S's `lingstream.state` attribute reads A and reports S's attributes then (`seen`, with
  `kind_is_agent`); with `--then-post`, POSTs that URL once A was seen (`then_status`: its HTTP status) and reports
  the attributes once the state reads B instead.

`livekit.rtc` is imported here only, in this process: the test process never loads the FFI (it forks). Every stream
and the room are closed before the process exits, and it exits through `exit_process`, never Python's finalization
(the FFI aborts a finalizing interpreter now and then: transport/livekit/ffi_exit.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import time
from collections.abc import Awaitable
from typing import Any

import httpx
from livekit import rtc

from transport.livekit.ffi_exit import exit_process

_WAIT_S = 20.0
_FOLLOW_S = 60.0  # follow: how long after the kill the frames may take to come back
MALFORMED: dict[str, bytes] = {
    "malformed_json": b"{not json",
    "unknown_type": b'{"v":1,"type":"warp"}',
    "unsupported_version": b'{"v":2,"type":"stop"}',
    # over MAX_INBOUND_BYTES (4096 since prompts travel as control messages): refused before it is parsed
    "message_too_large": b'{"v":1,"type":"control_state","seq":1,"keys":[' + b'"w",' * 1100 + b'"w"]}',
    "invalid_seq": b'{"v":1,"type":"control_state","seq":-1,"keys":[]}',
}
"""One bad packet per `error` code it must get back."""


class _Statuses:
    """Status messages from the service as they arrive (JSON objects), and a way to wait for one."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.seen: list[dict[str, Any]] = []
        self._arrived = asyncio.Event()

    def on_data(self, packet: rtc.DataPacket) -> None:
        if packet.topic != self.topic:
            return
        try:
            self.seen.append(json.loads(bytes(packet.data)))
        except ValueError:
            return
        self._arrived.set()

    async def wait(self, match: dict[str, Any]) -> dict[str, Any]:
        """The first status message with every field of `match`; `TimeoutError` after `_WAIT_S`."""
        async with asyncio.timeout(_WAIT_S):
            while True:
                for message in self.seen:
                    if all(message.get(key) == value for key, value in match.items()):
                        return message
                self._arrived.clear()
                await self._arrived.wait()


async def _send(room: rtc.Room, topic: str, payload: bytes, *, reliable: bool) -> None:
    await room.local_participant.publish_data(payload, reliable=reliable, topic=topic)


def _snapshot(seq: int, keys: list[str]) -> bytes:
    return json.dumps({"v": 1, "type": "control_state", "seq": seq, "keys": keys}).encode()


async def _steer(room: rtc.Room, statuses: _Statuses, control: str, seq: int, keys: list[str]) -> dict[str, Any]:
    """Send a snapshot on the lossy channel until the chunk that applies it arrives, as a page resends the keys it
    holds: a lossy packet may be lost (a real server drops what arrives before the service's data channel is open)."""

    async def resend() -> None:
        while True:
            await _send(room, control, _snapshot(seq, keys), reliable=False)
            await asyncio.sleep(0.25)  # a page's resend period, roughly

    sender = asyncio.create_task(resend())
    try:
        return await statuses.wait({"type": "chunk", "applied_seq": seq})
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sender


async def _control(room: rtc.Room, statuses: _Statuses, control: str) -> dict[str, Any]:
    report: dict[str, Any] = {"malformed_sent": sorted(MALFORMED)}
    report["first_chunk"] = await _steer(room, statuses, control, 1, ["w"])
    for payload in MALFORMED.values():
        await _send(room, control, payload, reliable=True)
    deadline = time.monotonic() + _WAIT_S
    while time.monotonic() < deadline:
        codes = {m.get("code") for m in statuses.seen if m.get("type") == "error"}
        if set(MALFORMED) <= codes:
            break
        await asyncio.sleep(0.05)  # waiting on another process's replies, with a deadline
    report["error_codes"] = sorted(str(m.get("code")) for m in statuses.seen if m.get("type") == "error")
    report["second_chunk"] = await _steer(room, statuses, control, 2, [])
    await _send(room, control, b'{"v":1,"type":"stop"}', reliable=True)
    report["done"] = (await statuses.wait({"type": "done"})).get("reason")
    return report


async def _foreign(room: rtc.Room, statuses: _Statuses, control: str, service: str | None) -> dict[str, Any]:
    seq = 2**52
    for step in range(5):
        await _send(room, control, _snapshot(seq + step, ["l"]), reliable=step % 2 == 0)
        await asyncio.sleep(0.2)  # a held key, as a page resends it
    await asyncio.sleep(2.0)  # the window in which a chunk applying it would have come
    chunks = [m for m in statuses.seen if m.get("type") == "chunk"]
    report: dict[str, Any] = {"chunks": chunks, "sent": 5}
    if service is not None:
        report["rpc_error"] = await _rpc_error(room, service, "lingstream.pause", "")
    return report


async def _rpc_error(room: rtc.Room, service: str, method: str, payload: str) -> dict[str, Any]:
    try:
        answer = await room.local_participant.perform_rpc(destination_identity=service, method=method, payload=payload)
    except rtc.RpcError as exc:
        return {"code": exc.code, "data": exc.data, "message": exc.message}
    return {"answer": answer}


def _band_level(image: Any, top: float, bottom: float) -> float:
    """The mean grey of the rows from `top` to `bottom` (fractions of the height) of a frame."""
    height = image.shape[0]
    return float(image[int(height * top) : int(height * bottom)].mean())


async def _labels(service_url: str, session_id: str) -> dict[str, Any]:
    # The client under test, imported only in this process (it loads livekit.rtc when it joins).
    from transport.client import ControlRefusedError, LiveKitLink, ServiceClient, connect

    frames: list[dict[str, Any]] = []
    report: dict[str, Any] = {"scenario": "labels", "frames": frames}
    async with ServiceClient(service_url) as service:
        info = await service.get(session_id)
        stream = await connect(service, info)
        report["joined"] = True

        async def read() -> None:
            async for frame in stream.frames():
                chunk = frame.chunk
                frames.append(
                    {
                        "frame_id": frame.frame_id,
                        "chunk": None if chunk is None else chunk.index,
                        "first_frame_id": None if chunk is None else chunk.first_frame_id,
                        "first": frame.first_of_chunk,
                        "repeat": frame.repeat,
                        "level": _band_level(frame.image, 1 / 8, 3 / 8),
                        "level_high": _band_level(frame.image, 5 / 8, 7 / 8),
                    }
                )

        reader = asyncio.create_task(read())
        try:
            link = stream.link  # the link `connect` made: its SDK room makes the raw calls below
            assert isinstance(link, LiveKitLink)
            await asyncio.sleep(2.0)  # frames flow
            report["pause"] = [await stream.pause(), await stream.pause()]  # twice: idempotent
            await asyncio.sleep(1.0)  # paused: keep-warm repeats of the last frame
            report["resume"] = await stream.resume()
            await asyncio.sleep(1.5)
            report["bad"] = {
                "malformed": await _rpc_error(link.room, link.service_identity, "lingstream.pause", "{"),
                "other_type": await _rpc_error(
                    link.room, link.service_identity, "lingstream.pause", '{"v":1,"type":"resume"}'
                ),
                "prompt_without_seq": await _rpc_error(link.room, link.service_identity, "lingstream.prompt", ""),
            }
            refused: list[str] = []
            for index in range(7):
                try:
                    await stream.send_prompt(f"prompt {index}")
                except ControlRefusedError as exc:
                    refused.append(exc.code)
            report["prompts_refused"] = refused
            async with asyncio.timeout(_WAIT_S):
                report["done"] = (await stream.stop()).reason
        finally:
            await stream.aclose()
            await asyncio.gather(reader, return_exceptions=True)
    return report


async def _publish(room: rtc.Room) -> dict[str, Any]:
    source = rtc.VideoSource(64, 64)
    track = rtc.LocalVideoTrack.create_video_track("forbidden", source)
    options = rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_CAMERA, simulcast=False)
    try:
        # A real server answers a refused `add_track` with RequestResponse NOT_ALLOWED, which the SDK does not turn
        # into an error: it waits for a `track_published` that never comes.
        async with asyncio.timeout(3.0):
            await room.local_participant.publish_track(track, options)
        return {"published": True}
    except Exception as exc:  # the SDK's refusal, whatever its type
        return {"published": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        await source.aclose()


async def _churn(url: str, token: str, times: int) -> dict[str, Any]:
    joins, errors = 0, []
    for _ in range(times):
        room = rtc.Room()
        try:
            await room.connect(url, token, rtc.RoomOptions(auto_subscribe=True, connect_timeout=10.0))
            joins += 1
            await asyncio.sleep(0.3)  # long enough to subscribe to the service's track
        except rtc.ConnectError as exc:
            errors.append(exc.message)
        finally:
            await room.disconnect()
    return {"scenario": "churn", "joined": joins > 0, "joins": joins, "errors": errors}


async def _follow(service_url: str, session_id: str) -> dict[str, Any]:
    from transport.base import ChunkStatus, StatusMessage
    from transport.client import LiveKitLink, ServiceClient, connect

    report: dict[str, Any] = {"scenario": "follow"}
    arrivals: list[tuple[float, int, bool]] = []  # (received_at, chunk index, repeat)
    trace: list[tuple[float, int | None, int | None, bool]] = []  # every frame: (received_at, id, chunk, repeat)
    statuses: list[tuple[float, int, int | None]] = []  # every chunk status: (received_at, index, first_frame_id)
    ids: list[tuple[float, int | None]] = []  # (received_at, frame id) of every generated frame, not the placeholders
    arrived = asyncio.Event()
    async with ServiceClient(service_url) as service:
        stream = await connect(service, await service.get(session_id))
        link = stream.link
        assert isinstance(link, LiveKitLink)

        def on_status(message: StatusMessage) -> None:
            if isinstance(message, ChunkStatus):
                statuses.append((time.monotonic(), message.index, message.first_frame_id))

        stream.add_status_listener(on_status)

        async def read() -> None:
            async for frame in stream.frames():
                chunk = None if frame.chunk is None else frame.chunk.index
                trace.append((frame.received_at, frame.frame_id, chunk, frame.repeat))
                if not frame.repeat and (frame.frame_id is not None or frame.image.any()):
                    ids.append((frame.received_at, frame.frame_id))  # not the SDK's black placeholder frames
                if frame.chunk is not None:
                    arrivals.append((frame.received_at, frame.chunk.index, frame.repeat))
                    arrived.set()

        async def hold() -> None:
            while True:  # as a page does: the held keys again every half second (snapshots are idempotent)
                await stream.send_keys(["w"])
                await asyncio.sleep(0.5)

        reader = asyncio.create_task(read())
        holder = asyncio.create_task(hold())
        try:
            try:
                async with asyncio.timeout(_WAIT_S):
                    await arrived.wait()
            except TimeoutError:
                report |= {"joined": False, "error": "no labelled frame in time", "state": stream.state}
                report |= {"statistics": str(stream.statistics()), "done_early": str(stream.done)}
                print(json.dumps(report), flush=True)
                return report
            report["joined"] = True
            print(json.dumps({"joined": True}), flush=True)
            loop = asyncio.get_running_loop()
            killed_at = float(await loop.run_in_executor(None, sys.stdin.readline))
            # The checkpoint's next chunk, once the test saw the adoption: the adopter goes on from it, and the old
            # replica's last frames, in flight at the kill, arrive after it with earlier chunks (the tail).
            next_chunk = int(await loop.run_in_executor(None, sys.stdin.readline))

            def new_chunks() -> list[tuple[float, int]]:  # the adopter's: from the checkpoint on
                return [(at, c) for at, c, r in arrivals if at > killed_at and not r and c >= next_chunk]

            deadline = time.monotonic() + _FOLLOW_S
            while len({c for _, c in new_chunks()}) < 2 and time.monotonic() < deadline:
                arrived.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        await arrived.wait()
            # A third line once the test read the session `running` on its adopter: only then is it stopped (the
            # adopter's first chunks come at once, they waited for its attach; a stop before that read ended it first).
            await loop.run_in_executor(None, sys.stdin.readline)
            after = new_chunks()
            report["before"] = sorted({c for at, c, _ in arrivals if at <= killed_at})
            sequence = [c for at, c, r in arrivals if at > killed_at and not r]
            report["sequence"] = [c for i, c in enumerate(sequence) if i == 0 or c != sequence[i - 1]]
            report["after"] = sorted({c for _, c in after})
            report["tail"] = sorted({c for c in sequence if c < next_chunk})
            report["first_after_s"] = None if not after else round(after[0][0] - killed_at, 3)
            report["track_switches"] = link.track_switches
            # Frame ids (the session's stream clock, continued by the adopter) around the kill: None for a frame that
            # came without one (a new track's first frames may lack LiveKit's frame metadata, docs/continuity.md).
            report["last_id_before"] = max((i for at, i in ids if at <= killed_at and i is not None), default=None)
            report["ids_after"] = [i for at, i in ids if at > killed_at]
            # Around the kill, to diagnose labels that go back: frames as (s after the kill, frame id, chunk, repeat)
            # and chunk statuses as (s after the kill, index, first frame id), from 1 s before it, 80 at most.
            report["frames_around"] = [
                (round(at - killed_at, 3), frame_id, chunk, repeat)
                for at, frame_id, chunk, repeat in trace
                if at > killed_at - 1.0
            ][:80]
            report["statuses_around"] = [
                (round(at - killed_at, 3), index, first) for at, index, first in statuses if at > killed_at - 1.0
            ][:40]
            report["done_early"] = None if stream.done is None else stream.done.reason
            holder.cancel()
            async with asyncio.timeout(_WAIT_S):
                report["done"] = (await stream.stop()).reason
        finally:
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
            await stream.aclose()
            await asyncio.gather(reader, return_exceptions=True)
    return report


async def _paused(service_url: str, session_id: str) -> dict[str, Any]:
    from transport.base import StateStatus, StatusMessage
    from transport.client import LiveKitLink, ServiceClient, connect

    report: dict[str, Any] = {"scenario": "paused"}
    frames: list[tuple[float, int | None, int | None, bool]] = []  # (received_at, frame id, chunk, repeat)
    states: list[tuple[float, str]] = []  # (received_at, state) of every `state` status
    arrived, told = asyncio.Event(), asyncio.Event()
    async with ServiceClient(service_url) as service:
        stream = await connect(service, await service.get(session_id))
        link = stream.link
        assert isinstance(link, LiveKitLink)

        def on_status(message: StatusMessage) -> None:
            if isinstance(message, StateStatus):
                states.append((time.monotonic(), message.state))
                told.set()

        stream.add_status_listener(on_status)

        async def read() -> None:
            async for frame in stream.frames():
                chunk = None if frame.chunk is None else frame.chunk.index
                frames.append((frame.received_at, frame.frame_id, chunk, frame.repeat))
                arrived.set()

        async def hold() -> None:
            while True:  # as a page does: the held keys again every half second (paused, they generate nothing)
                await stream.send_keys(["w"])
                await asyncio.sleep(0.5)

        def line() -> Awaitable[str]:
            return asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

        reader = asyncio.create_task(read())
        holder = asyncio.create_task(hold())
        try:
            async with asyncio.timeout(_WAIT_S):
                while not any(chunk is not None for _, _, chunk, _ in frames):
                    arrived.clear()
                    await arrived.wait()
                paused = await stream.pause()
            print(json.dumps({"paused": paused, "paused_at": time.monotonic()}), flush=True)
            drained_at = float(await line())
            next_chunk = int(await line())  # the checkpoint the adopter goes on from, once the test saw the adoption
            async with asyncio.timeout(_FOLLOW_S):  # the adopter tells the client in the room its state: paused
                while not any(at > drained_at and state == "paused" for at, state in states):
                    told.clear()
                    await told.wait()
            print(json.dumps({"told_paused": True}), flush=True)
            await line()  # the test checked the adopter: resume
            resumed_at = time.monotonic()
            report["resumed"] = await stream.resume()
            ids_before = [frame_id for at, frame_id, _, _ in frames if at <= drained_at and frame_id is not None]

            def after() -> set[int]:
                return {c for at, _, c, r in frames if at > resumed_at and not r and c is not None and c >= next_chunk}

            async with asyncio.timeout(_FOLLOW_S):
                while len(after()) < 2:
                    arrived.clear()
                    await arrived.wait()
            # Frames generated between the drain and the resume: any that is no repeat (paused, none may come).
            report["generated_while_paused"] = [
                (round(at - drained_at, 3), frame_id, chunk)
                for at, frame_id, chunk, repeat in frames
                if drained_at < at < resumed_at and not repeat
            ]
            report["newest_id_before"] = max(ids_before, default=None)
            report["states_while_paused"] = [state for at, state in states if drained_at < at < resumed_at]
            sequence = [c for at, _, c, r in frames if at > resumed_at and not r and c is not None]
            report["sequence"] = [c for i, c in enumerate(sequence) if i == 0 or c != sequence[i - 1]]
            report["after"] = sorted(after())
            report["track_switches"] = link.track_switches
            report["errors"] = [error.code for error in stream.errors]
            report["done_early"] = None if stream.done is None else stream.done.reason
            holder.cancel()
            async with asyncio.timeout(_WAIT_S):
                report["done"] = (await stream.stop()).reason
        except TimeoutError:
            report |= {"error": "timed out", "states": [state for _, state in states], "frames": frames[-20:]}
        finally:
            holder.cancel()
            await asyncio.gather(holder, return_exceptions=True)
            await stream.aclose()
            await asyncio.gather(reader, return_exceptions=True)
    return report


async def _watch(room: rtc.Room, control: str) -> dict[str, Any]:
    arrivals: list[float] = []
    first = asyncio.Event()
    video: asyncio.Future[rtc.Track] = asyncio.get_running_loop().create_future()

    def on_subscribed(track: rtc.Track, *_: Any) -> None:
        if track.kind == rtc.TrackKind.KIND_VIDEO and not video.done():
            video.set_result(track)

    room.on("track_subscribed", on_subscribed)
    for participant in room.remote_participants.values():
        for publication in participant.track_publications.values():
            if publication.track is not None and publication.kind == rtc.TrackKind.KIND_VIDEO and not video.done():
                video.set_result(publication.track)

    async def count() -> None:
        stream = rtc.VideoStream(await video)
        try:
            async for _ in stream:
                arrivals.append(time.monotonic())
                first.set()
        finally:
            await stream.aclose()

    async def hold() -> None:
        while True:
            await _send(room, control, _snapshot(1, ["w"]), reliable=False)
            await asyncio.sleep(0.25)  # a page's resend period, roughly

    tasks = [asyncio.create_task(count()), asyncio.create_task(hold())]
    try:
        async with asyncio.timeout(_WAIT_S):
            await first.wait()
        print(json.dumps({"joined": True}), flush=True)
        since = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        until = time.monotonic()
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    seen = [since, *(at for at in arrivals if since < at < until), until]
    return {
        "frames": len(seen) - 2,
        "watched_s": round(until - since, 2),
        "max_gap_s": round(max(b - a for a, b in itertools.pairwise(seen)), 3),
    }


async def _viewer(room: rtc.Room, service: str, states: list[str], then_post: str | None) -> dict[str, Any]:
    changed = asyncio.Event()
    room.on("participant_attributes_changed", lambda *_: changed.set())
    room.on("participant_connected", lambda *_: changed.set())
    seen: dict[str, str] = {}
    report: dict[str, Any] = {}
    async with asyncio.timeout(_WAIT_S):
        for number, target in enumerate(states):
            while True:
                participant = room.remote_participants.get(service)
                if participant is not None and participant.attributes.get("lingstream.state") == target:
                    seen = dict(participant.attributes)
                    seen["kind_is_agent"] = str(participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT)
                    break
                changed.clear()
                await changed.wait()
            if number == 0 and then_post is not None:
                async with httpx.AsyncClient(timeout=10.0) as client:
                    answer = await client.post(then_post)
                report["then_status"] = answer.status_code
    return report | {"seen": seen}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    if args.scenario == "churn":
        return await _churn(args.url, args.token, args.times)
    if args.scenario == "labels":
        return await _labels(args.url, args.token)
    if args.scenario == "follow":
        return await _follow(args.url, args.token)
    if args.scenario == "paused":
        return await _paused(args.url, args.token)
    room = rtc.Room()
    statuses = _Statuses(args.topic_status)
    room.on("data_received", statuses.on_data)
    report: dict[str, Any] = {"scenario": args.scenario, "joined": False}
    try:
        # A viewer may join while another module's stack loads the machine: 30 s ("signal failure: transport timed
        # out" at 10 s on the 2-worker suite).
        connect_timeout = 30.0 if args.scenario == "viewer" else 10.0
        options = rtc.RoomOptions(auto_subscribe=args.scenario == "watch", connect_timeout=connect_timeout)
        await room.connect(args.url, args.token, options)
    except rtc.ConnectError as exc:
        report["error"] = exc.message
        return report
    report["joined"] = True
    report["identity"] = room.local_participant.identity
    try:
        match args.scenario:
            case "hold":
                print(json.dumps({"joined": True}), flush=True)
                await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
            case "control":
                report |= await _control(room, statuses, args.topic_control)
            case "foreign":
                report |= await _foreign(room, statuses, args.topic_control, args.service)
            case "publish":
                report |= await _publish(room)
            case "watch":
                report |= await _watch(room, args.topic_control)
            case "viewer":
                report |= await _viewer(room, args.service, args.state, args.then_post)
    except TimeoutError:
        report["error"] = "timed out"
    finally:
        report["statuses"] = statuses.seen[-50:]
        await room.disconnect()
    return report


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "scenario",
        choices=[
            "join",
            "control",
            "foreign",
            "publish",
            "hold",
            "churn",
            "labels",
            "watch",
            "viewer",
            "follow",
            "paused",
        ],
    )
    parser.add_argument("--service", help="foreign, viewer: the service participant's identity")
    parser.add_argument("--state", action="append", default=[], help="viewer: the states to wait for, in order")
    parser.add_argument("--then-post", help="viewer: a URL to POST once the first state was seen")
    parser.add_argument("--times", type=int, default=5, help="churn: how many joins")
    parser.add_argument("url")
    parser.add_argument("token")
    parser.add_argument("--topic-control", default="lingstream.control")
    parser.add_argument("--topic-status", default="lingstream.status")
    print(json.dumps(asyncio.run(main(parser.parse_args()))), flush=True)
    exit_process(0)  # not sys.exit: the FFI can abort a finalizing interpreter (transport/livekit/ffi_exit.py)
