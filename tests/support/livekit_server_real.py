"""`LiveKitServerProcess`: a real `livekit-server` (the pinned release `scripts/setup.sh --dev` installs) in a
subprocess, configured for a private network namespace, with a small synchronous RoomService client for the tests.

The server gets a YAML config written next to its log: the test keys (`API_KEY`/`API_SECRET`, the ones the
service is given), its signalling port and one UDP and one TCP port for media, all bound to the address it is
given (the namespace's veth address: libwebrtc gathers no loopback candidates), `node_ip` that address, no STUN
servers and no external-IP lookup (nothing may leave the namespace), no rooms made by a join, and its webhooks
signed with the test key and sent to the URL given (the service's `/v1/livekit/webhook`). Start it from the thread
that is inside the namespace: the process is born there. `livekit_server_support()` says why there is none here,
for a skip.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import tomllib
from functools import cache
from pathlib import Path
from typing import Any

import httpx
from livekit import api
from livekit.protocol import models

from tests.support.server_process import ServerProcess

__all__ = [
    "API_KEY",
    "API_SECRET",
    "LIVEKIT_SERVER_VERSION",
    "LiveKitServerProcess",
    "livekit_server_binary",
    "livekit_server_support",
]

_ROOT = Path(__file__).resolve().parents[2]
LIVEKIT_SERVER_VERSION: str = tomllib.loads((_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "lingstream"
]["dev-tools"]["livekit-server"]
"""The release scripts/setup.sh --dev builds (pinned in pyproject.toml, `[tool.lingstream.dev-tools]`)."""
API_KEY = "lingstream-test-key"
API_SECRET = "lingstream-test-secret-long-enough-for-hs256-0123"
_READY_S = 30.0


@cache
def livekit_server_binary() -> Path | None:
    """The `livekit-server` to run: the one setup installed into .venv/bin, else one on PATH."""
    own = _ROOT / ".venv" / "bin" / "livekit-server"
    if own.is_file() and os.access(own, os.X_OK):
        return own
    found = shutil.which("livekit-server")
    return Path(found) if found is not None else None


@cache
def livekit_server_support() -> str | None:
    """None when the pinned `livekit-server` is installed here; otherwise why not (for a skip)."""
    binary = livekit_server_binary()
    if binary is None:
        if shutil.which("go") is None:
            return "needs livekit-server, which scripts/setup.sh --dev builds with Go, and go is not installed"
        return "needs livekit-server: run scripts/setup.sh --dev (it builds the pinned release with go install)"
    done = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=30, check=False)
    found = re.search(r"version (\S+)", done.stdout)
    if found is None or found.group(1) != LIVEKIT_SERVER_VERSION:
        return (
            f"{binary} is not livekit-server {LIVEKIT_SERVER_VERSION} ({done.stdout.strip() or done.stderr.strip()}):"
            " run scripts/setup.sh --dev"
        )
    return None


def _config(host: str, port: int, rtc_port: int, webhook_url: str | None, api_key: str, api_secret: str) -> str:
    lines = [
        f"port: {port}",
        f"bind_addresses: [{host}]",
        "rtc:",
        f"  udp_port: {rtc_port}",
        f"  tcp_port: {rtc_port}",
        "  use_external_ip: false",
        f"  node_ip: {host}",
        "  stun_servers: []",
        "  enable_loopback_candidate: false",
        # Rooms exist only when made through the RoomService (the service's own, or a caller's): a join to any other
        # room is refused, as the stand-in refuses it.
        "room:",
        "  auto_create: false",
        "keys:",
        f"  {api_key}: {api_secret}",
        "logging:",
        "  level: info",
        "  json: false",
    ]
    if webhook_url is not None:
        lines += ["webhook:", f"  api_key: {api_key}", "  urls:", f"    - {webhook_url}"]
    return "\n".join(lines) + "\n"


class LiveKitServerProcess(ServerProcess):
    """`livekit-server --config …` on `host:port` (media on UDP and TCP `rtc_port` of the same address), output in
    `log`; started on construction and waited for (its HTTP root answers). `stop()` (or leaving the `with` block)
    sends SIGTERM and waits; the exit code is in `returncode`."""

    def __init__(
        self,
        host: str,
        port: int,
        rtc_port: int,
        log: Path,
        *,
        webhook_url: str | None = None,
        api_key: str = API_KEY,
        api_secret: str = API_SECRET,
    ) -> None:
        binary = livekit_server_binary()
        if binary is None:
            raise RuntimeError(str(livekit_server_support()))
        self.host = host
        self.port = port
        self.url = f"ws://{host}:{port}"
        self.http = f"http://{host}:{port}"
        self.api_key = api_key
        self.api_secret = api_secret
        self.log = log
        config = log.with_suffix(".yaml")
        config.write_text(_config(host, port, rtc_port, webhook_url, api_key, api_secret), encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_"))}
        command = [str(binary), "--config", str(config)]
        self._launch("livekit-server", command, cwd=log.parent, env=env, ready_path="/", ready_s=_READY_S)

    # -- the RoomService, as any server-side client calls it (Twirp, protobuf, an admin token) ---------------------

    def _twirp(self, method: str, body: bytes, room: str = "") -> httpx.Response:
        token = (
            api.AccessToken(self.api_key, self.api_secret)
            .with_grants(api.VideoGrants(room_create=True, room_list=True, room_admin=True, room=room))
            .with_ttl(datetime.timedelta(minutes=1))
            .to_jwt()
        )
        return self._client.post(
            f"/twirp/livekit.RoomService/{method}",
            content=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/protobuf"},
        )

    def create_room(self, room: str, *, departure_timeout: int = 60) -> int:
        """CreateRoom, as a caller that owns the room would (a lobby, a voice agent's room); the HTTP status."""
        request = api.CreateRoomRequest(name=room, empty_timeout=300, departure_timeout=departure_timeout)
        return self._twirp("CreateRoom", request.SerializeToString()).status_code

    def delete_room(self, room: str) -> int:
        """DeleteRoom, as any server-side client would; the HTTP status."""
        return self._twirp("DeleteRoom", api.DeleteRoomRequest(room=room).SerializeToString(), room).status_code

    def rooms(self) -> dict[str, models.Room]:
        """The server's rooms by name."""
        response = self._twirp("ListRooms", api.ListRoomsRequest().SerializeToString())
        response.raise_for_status()
        listed = api.ListRoomsResponse.FromString(response.content)
        return {room.name: room for room in listed.rooms}

    def participants(self, room: str) -> dict[str, models.ParticipantInfo]:
        """The room's participants by identity (none when the room does not exist)."""
        response = self._twirp("ListParticipants", api.ListParticipantsRequest(room=room).SerializeToString(), room)
        if response.status_code == 404:
            return {}
        response.raise_for_status()
        listed = api.ListParticipantsResponse.FromString(response.content)
        return {participant.identity: participant for participant in listed.participants}

    def remove_participant(self, room: str, identity: str) -> int:
        """RemoveParticipant: the server sends the participant a leave and drops it; the HTTP status."""
        request = api.RoomParticipantIdentity(room=room, identity=identity)
        return self._twirp("RemoveParticipant", request.SerializeToString(), room).status_code

    def logged(self, *messages: str) -> list[dict[str, Any]]:
        """The server's log lines whose message is one of `messages`, oldest first: each line's fields (`participant`,
        `room` …) and `message`."""
        found = []
        for line in self.output().splitlines():
            parts = line.split("\t")
            if len(parts) >= 6 and parts[4] in messages:
                fields: dict[str, Any] = json.loads(parts[5])
                found.append({**fields, "message": parts[4]})
        return found

    def webhooks(self) -> list[dict[str, Any]]:
        """The webhooks the server tried to send, from its log: each line's fields (`event`, `room`, `statusCode`
        …) and `sent` (False: the send failed, e.g. the service answered 401 to a signature it refused)."""
        return [
            {**entry, "sent": entry["message"] == "sent webhook"}
            for entry in self.logged("sent webhook", "failed to send webhook")
        ]

    def resumes(self, identity: str) -> int:
        """How many times the participant `identity` resumed its session (a signal connection re-established with
        the participant kept: the server logs "resuming RTC session")."""
        return sum(entry.get("participant") == identity for entry in self.logged("resuming RTC session"))

    def state(self) -> dict[str, Any]:
        """Rooms and their participants' identities, for failure messages."""
        return {name: sorted(self.participants(name)) for name in self.rooms()}
