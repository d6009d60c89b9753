"""`StandInProcess`: the stand-in in a subprocess of its own (its media work stays off the test's loop and cores'
turn order), started on construction, with a small synchronous client for its test controls.

Start it from the thread that is inside the test's network namespace: the process is born there.
"""

from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path
from typing import Any

from livekit import api

from tests.support.server_process import ServerProcess

__all__ = ["API_KEY", "API_SECRET", "StandInProcess"]

API_KEY = "standin-key"
API_SECRET = "standin-secret-long-enough-for-hs256-0123456789"
_ROOT = Path(__file__).resolve().parents[3]
_READY_S = 30.0


class StandInProcess(ServerProcess):
    """`python -m tests.support.livekit_server` on `host:port`, output in `log`. `stop()` (or leaving the `with` block)
    sends SIGTERM and waits; the exit code is in `returncode`."""

    def __init__(
        self,
        host: str,
        port: int,
        log: Path,
        *,
        webhook_url: str | None = None,
        resume_window: float = 10.0,
        api_key: str = API_KEY,
        api_secret: str = API_SECRET,
    ) -> None:
        self.host = host
        self.port = port
        self.url = f"ws://{host}:{port}"
        self.http = f"http://{host}:{port}"
        self.api_key = api_key
        self.api_secret = api_secret
        self.log = log
        env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_"))}
        env.update(PYTHONPATH=str(_ROOT), LIVEKIT_API_KEY=api_key, LIVEKIT_API_SECRET=api_secret)
        command = [sys.executable, "-m", "tests.support.livekit_server", "--host", host, "--port", str(port)]
        # LINGSTREAM_TEST_STANDIN_LOG=DEBUG shows every signal message in the stand-in's log (when a test fails).
        log_level = os.environ.get("LINGSTREAM_TEST_STANDIN_LOG", "INFO")
        command += ["--resume-window", str(resume_window), "--log-level", log_level]
        if webhook_url is not None:
            command += ["--webhook-url", webhook_url]
        self._launch("the stand-in", command, cwd=_ROOT, env=env, ready_path="/_standin/state", ready_s=_READY_S)

    # -- test controls --------------------------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        response = self._client.get("/_standin/state")
        response.raise_for_status()
        state: dict[str, Any] = response.json()
        return state

    def participants(self, room: str) -> dict[str, Any]:
        rooms: dict[str, Any] = self.state()["rooms"]
        participants: dict[str, Any] = rooms.get(room, {}).get("participants", {})
        return participants

    def counters(self) -> dict[str, int]:
        counters: dict[str, int] = self.state()["counters"]
        return counters

    def _post(self, path: str, body: dict[str, Any]) -> None:
        response = self._client.post(path, json=body)
        response.raise_for_status()

    def drop(self, identity: str, *, resume: bool) -> None:
        """Close the participant's signal websocket; `resume`: keep it in the room for a resume (else it is
        removed, and its resume is refused)."""
        self._post("/_standin/drop", {"identity": identity, "resume": resume})

    def leave(self, identity: str, reason: str, action: str = "DISCONNECT") -> None:
        """Send the participant a `LeaveRequest` (a `DisconnectReason` and `LeaveRequest.Action` name); remove it."""
        self._post("/_standin/leave", {"identity": identity, "reason": reason, "action": action})

    def block(self, identity: str, seconds: float) -> None:
        """Refuse the identity's joins and resumes (503) for `seconds` (0: from now on, no longer)."""
        self._post("/_standin/block", {"identity": identity, "seconds": seconds})

    def create_room(self, room: str, *, departure_timeout: int = 60) -> int:
        """CreateRoom through the RoomService, as a caller that owns the room would (a lobby, a voice agent's room);
        the HTTP status."""
        request = api.CreateRoomRequest(name=room, empty_timeout=300, departure_timeout=departure_timeout)
        return self._twirp("CreateRoom", request.SerializeToString())

    def delete_room(self, room: str) -> int:
        """DeleteRoom through the RoomService (Twirp, protobuf, an admin token), as any server-side client would;
        the HTTP status."""
        return self._twirp("DeleteRoom", api.DeleteRoomRequest(room=room).SerializeToString())

    def _twirp(self, method: str, body: bytes) -> int:
        token = (
            api.AccessToken(self.api_key, self.api_secret)
            .with_grants(api.VideoGrants(room_create=True))
            .with_ttl(datetime.timedelta(minutes=1))
            .to_jwt()
        )
        response = self._client.post(
            f"/twirp/livekit.RoomService/{method}",
            content=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/protobuf"},
        )
        return response.status_code
