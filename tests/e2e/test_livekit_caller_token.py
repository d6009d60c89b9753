"""A session in a caller's room joined with the caller's token, on the real `livekit-server`: the avatar-provider
pattern. A replica with no LiveKit project of its own (only `LINGSTREAM_LIVEKIT_CALLER_URLS`) gets `{url, token}`
from "the agent" (this test, holding the project's key as an agent's backend would), joins as kind `agent` with the
token's identity, publishes its video, and carries the session in its participant attributes: a viewer that joins
late reads them at once, and sees the state change when the session pauses. A second session for the same room is
`room_in_use` (decided from the room's attributes: this replica has no RoomService), and a forged token is
`livekit_token_refused`, without the token ever reaching the replica's log. Skipped, with the reason, where the
namespace cannot be made or livekit-server is not installed.
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from livekit import api

from tests.support.livekit_stack import LiveKitStack, another_replica, livekit_stack, run_client

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LiveKitStack.skip_reason() is not None, reason=str(LiveKitStack.skip_reason())),
]

CONFIG = {"width": 128, "height": 96}
_WAIT = 30.0


@pytest.fixture(scope="module")
def stacks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveKitStack, LiveKitStack]]:
    """The real server (its `lingstream serve` idle here) and a callers-only replica on it."""
    workdir = tmp_path_factory.mktemp("livekit-caller-token")
    with livekit_stack(workdir) as running:
        with another_replica(
            running,
            workdir,
            LIVEKIT_URL="",
            LIVEKIT_API_KEY="",
            LIVEKIT_API_SECRET="",
            LINGSTREAM_LIVEKIT_CALLER_URLS=running.real.url,
        ) as callers_only:
            yield running, callers_only
            log = callers_only.output()
        assert "Traceback" not in log, log[-4000:]
    assert "panic" not in running.server.output(), running.server.output()[-4000:]


def _token(stack: LiveKitStack, identity: str, room: str, *, kind: str = "standard", **grants: Any) -> str:
    """A token of the caller's project (the agent's backend mints them)."""
    return (
        api.AccessToken(stack.real.api_key, stack.real.api_secret)
        .with_identity(identity)
        .with_kind(kind)  # type: ignore[arg-type]
        .with_grants(api.VideoGrants(room_join=True, room=room, **grants))
        .with_ttl(datetime.timedelta(minutes=10))
        .to_jwt()
    )


def _service_token(stack: LiveKitStack, room: str, identity: str = "world-1") -> str:
    return _token(stack, identity, room, kind="agent", can_subscribe=False, can_update_own_metadata=True)


def _create(replica: LiveKitStack, url: str, token: str) -> Any:
    body = {
        "config": CONFIG,
        "max_seconds": 600,
        "livekit": {"url": url, "token": token, "controller_identity": "user-1", "agent_identity": "agent-1"},
    }
    with replica.client() as client:
        return client.post("/v1/sessions", json=body)


def _viewer(url: str, token: str, *states: str, then_post: str | None = None) -> dict[str, Any]:
    """A late viewer (a process of its own: tests/support/livekit_client.py's `viewer`): the service participant
    world-1's attributes (`seen`) once its state read the first of `states`, or, with `then_post` POSTed once it
    did (`then_status`), once it read the second."""
    options = [option for state in states for option in ("--state", state)]
    if then_post is not None:
        options += ["--then-post", then_post]
    return run_client("viewer", url, token, "--service", "world-1", *options, within_s=90.0)


def test_a_callers_token_session_carries_its_state_in_attributes_for_late_viewers(
    stacks: tuple[LiveKitStack, LiveKitStack], tmp_path: Path
) -> None:
    stack, replica = stacks
    url = stack.real.url

    # A token the server refuses ends the create with its code (first: the replica's one slot is free).
    forged = (
        api.AccessToken(stack.real.api_key, "not-the-projects-secret-but-long-enough-0123456789")
        .with_identity("world-3")
        .with_kind("agent")
        .with_grants(api.VideoGrants(room_join=True, room="other-room", can_update_own_metadata=True))
        .to_jwt()
    )
    refused = _create(replica, url, forged)
    assert (refused.status_code, refused.json()["error"]["code"]) == (422, "livekit_token_refused"), refused.text
    assert forged not in refused.text

    assert stack.real.create_room("agent-room") == 200
    service_token = _service_token(stack, "agent-room")
    created = _create(replica, url, service_token)
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    details = created.json()["transport"]
    assert (details["url"], details["room"], details["service_identity"]) == (url, "agent-room", "world-1")
    assert details["token"] is None

    participants = stack.real.participants("agent-room")
    assert participants["world-1"].kind == api.ParticipantInfo.AGENT

    viewer = _token(stack, "viewer-1", "agent-room", can_publish=False, can_publish_data=False)

    pause = f"{replica.url}/v1/sessions/{session_id}/pause"
    report = _viewer(url, viewer, "running", "paused", then_post=pause)
    assert report["then_status"] in (200, 202), report
    seen = report["seen"]
    assert seen["kind_is_agent"] == "True", seen
    assert seen["lingstream.session_id"] == session_id
    assert seen["lingstream.controller"] == "user-1"
    assert seen["lk.publish_on_behalf"] == "agent-1"
    assert 0 < float(seen["lingstream.ends_at"]) - time.time() <= 600
    # A viewer joining now reads the paused state at once: attributes reach late joiners.
    later = _token(stack, "viewer-2", "agent-room", can_publish=False, can_publish_data=False)
    assert _viewer(url, later, "paused")["seen"]["lingstream.session_id"] == session_id

    # One session per room, across deployments: the other `lingstream serve` on this server knows nothing of the
    # session, joins, finds the first's lingstream.session_id attribute there, and leaves.
    taken = _create(stack, url, _service_token(stack, "agent-room", identity="world-2"))
    assert (taken.status_code, taken.json()["error"]["code"]) == (409, "room_in_use"), taken.text
    assert "world-2" not in stack.real.participants("agent-room")

    for token in (forged, service_token):  # never written to either log
        assert token not in replica.output()
        assert token not in stack.output()
    with replica.client() as client:
        assert client.delete(f"/v1/sessions/{session_id}", params={"mode": "cancel"}).status_code in (200, 202)
    assert "agent-room" in stack.real.rooms()  # the caller's room stays
