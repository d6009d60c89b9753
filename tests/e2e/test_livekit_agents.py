"""The LiveKit Agents integration end to end: a real `livekit-agents` worker (`tests/support/agents_worker.py`, no LLM:
a scripted agent) registered with the real `livekit-server`, dispatched by name to a room, starts a lingstream world
there with `transport.livekit.agents.WorldSession` (the token it mints: kind agent, `lk.publish_on_behalf`), steers it
with the world's function tools, and a browser page in the room (headless Chromium, livekit-client) finds the video
the way Agents front ends do, by the `lk.publish_on_behalf` attribute naming the agent, and plays it. Closing the agent
session ends the world session. All inside the private network namespace, against `lingstream serve` (the reference
model).

livekit-agents 1.8 pins `livekit==1.1.x` while the service runs livekit 1.2, so the worker runs in its own environment,
`.venv-agents` (scripts/setup.sh --dev), with this checkout on its path. Skipped, with the reason, where that
environment, the namespace, livekit-server or Chromium is missing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from livekit import api

from tests.support.browser.chromium import BROWSER_SKIPS, launch_chromium
from tests.support.livekit_stack import LiveKitStack, livekit_stack
from tests.support.serving import ROOT
from tests.support.waits import until_sync

if TYPE_CHECKING:
    from playwright.sync_api import Browser

AGENTS_PYTHON = ROOT / ".venv-agents" / "bin" / "python"
AGENT_NAME = "lingstream-test"
ROOM = "agents-room"
CONFIG = {"width": 128, "height": 96}
WAIT_S = 60.0  # generous: a loaded 2-core machine; every wait ends as soon as its condition holds


def _agents_skip() -> str | None:
    if not AGENTS_PYTHON.exists():
        return f"no {AGENTS_PYTHON} (scripts/setup.sh --dev makes the LiveKit Agents environment)"
    found = subprocess.run(
        [str(AGENTS_PYTHON), "-c", "import livekit.agents"], capture_output=True, timeout=60, check=False
    )
    return None if found.returncode == 0 else f"livekit-agents is not importable in {AGENTS_PYTHON}"


pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    *BROWSER_SKIPS,
    pytest.mark.skipif(LiveKitStack.skip_reason() is not None, reason=str(LiveKitStack.skip_reason())),
    pytest.mark.skipif(_agents_skip() is not None, reason=str(_agents_skip())),
]

# A page the way an Agents front end finds the agent's video: the participant whose `lk.publish_on_behalf` names the
# agent, its camera track attached to a <video>; it resolves once frames play.
_WATCH_JS = """
async ([bundle, url, token, agent]) => {
  const lk = await import(bundle);
  const room = new lk.Room({ adaptiveStream: false, dynacast: false });
  const video = document.createElement("video");
  video.muted = true;
  video.autoplay = true;
  document.body.appendChild(video);
  window.watched = { publisher: null, kind: null, frames: 0 };
  const attach = () => {
    for (const participant of room.remoteParticipants.values()) {
      if (participant.attributes["lk.publish_on_behalf"] !== agent) continue;
      for (const publication of participant.videoTrackPublications.values()) {
        if (publication.track && !window.watched.publisher) {
          publication.track.attach(video);
          window.watched.publisher = participant.identity;
          window.watched.kind = participant.kind;
          const count = () => { window.watched.frames += 1; video.requestVideoFrameCallback(count); };
          video.requestVideoFrameCallback(count);
        }
      }
    }
  };
  room.on(lk.RoomEvent.TrackSubscribed, attach);
  room.on(lk.RoomEvent.ParticipantAttributesChanged, attach);
  await room.connect(url, token, { autoSubscribe: true });
  attach();
  window.watchedRoom = room;
}
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveKitStack]:
    workdir = tmp_path_factory.mktemp("livekit-agents")
    with livekit_stack(workdir) as running:
        yield running
    assert "Traceback" not in running.output(), running.output()[-4000:]
    assert "panic" not in running.server.output(), running.server.output()[-4000:]


@pytest.fixture(scope="module")
def browser(stack: LiveKitStack) -> Iterator[Browser]:
    with launch_chromium() as chromium:
        yield chromium


def _user_token(stack: LiveKitStack) -> str:
    return (
        api.AccessToken(stack.real.api_key, stack.real.api_secret)
        .with_identity("user-1")
        .with_grants(api.VideoGrants(room_join=True, room=ROOM, can_subscribe=True, can_publish=False))
        .with_ttl(datetime.timedelta(minutes=10))
        .to_jwt()
    )


def _dispatch(stack: LiveKitStack) -> None:
    """Dispatch the agent to the room (AgentDispatchService), as an app's backend does. On a thread of its own:
    Playwright's sync API runs an event loop on this one (the thread inherits this thread's network namespace)."""

    async def dispatch() -> None:
        async with api.LiveKitAPI(stack.real.url, stack.real.api_key, stack.real.api_secret) as lkapi:
            await lkapi.agent_dispatch.create_dispatch(api.CreateAgentDispatchRequest(agent_name=AGENT_NAME, room=ROOM))

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, dispatch()).result(timeout=WAIT_S)


def _read(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else None


def test_an_agents_worker_starts_a_world_steers_it_with_tools_and_the_page_shows_it_as_the_agents_video(
    stack: LiveKitStack, browser: Browser, tmp_path: Path
) -> None:
    report_path, finish, log = tmp_path / "report.json", tmp_path / "finish", tmp_path / "worker.log"
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith(("LINGSTREAM_", "LIVEKIT_"))}
    env.update(
        PYTHONPATH=str(ROOT),
        LIVEKIT_URL=stack.real.url,
        LIVEKIT_API_KEY=stack.real.api_key,
        LIVEKIT_API_SECRET=stack.real.api_secret,
        LINGSTREAM_URL=stack.url,
        LINGSTREAM_AGENT_REPORT=str(report_path),
        LINGSTREAM_AGENT_FINISH=str(finish),
        LINGSTREAM_AGENT_CONFIG=json.dumps(CONFIG),
    )
    with log.open("wb") as sink:
        worker = subprocess.Popen(
            [str(AGENTS_PYTHON), "-m", "tests.support.agents_worker"], cwd=ROOT, env=env, stdout=sink, stderr=sink
        )
    try:
        until_sync(
            lambda: "registered worker" in log.read_text(errors="replace") or worker.poll() is not None,
            "the Agents worker registered with the LiveKit server",
            within=WAIT_S,
        )
        assert worker.poll() is None, log.read_text(errors="replace")[-4000:]
        assert stack.real.create_room(ROOM) == 200
        _dispatch(stack)
        until_sync(lambda: _read(report_path) is not None, "the agent steered its world", within=WAIT_S * 2)
        report = _read(report_path)
        assert report is not None
        agent = report["agent_identity"]
        assert report["tools"] == ["move", "pause", "set_prompt", "turn"]
        assert report["move"].startswith("moved forward for 1.5 s"), report
        assert report["turn"].startswith("turned left for 1.0 s"), report
        assert "no frame showed it" not in report["move"] + report["turn"], report
        assert report["set_prompt"] == "the world now follows: a snowy night"
        assert ["w"] in report["chunk_keys"], report["chunk_keys"]
        assert ["j"] in report["chunk_keys"], report["chunk_keys"]

        with stack.client() as client:
            session = client.get(f"/v1/sessions/{report['session_id']}").json()
        assert session["status"] == "running", session
        assert session["transport"]["room"] == ROOM
        assert session["transport"]["identity"] == agent  # the agent is the controller
        participants = stack.real.participants(ROOM)
        assert participants["world-1"].kind == api.ParticipantInfo.AGENT
        assert participants["world-1"].attributes["lk.publish_on_behalf"] == agent

        page = browser.new_context().new_page()
        page.goto(stack.url + "/")
        bundle = stack.url + "/vendor/livekit-client/livekit-client.esm.mjs"
        page.evaluate(_WATCH_JS, [bundle, stack.real.url, _user_token(stack), agent])
        page.wait_for_function("window.watched.frames >= 10", timeout=WAIT_S * 1000)
        watched = page.evaluate("window.watched")
        assert watched["publisher"] == "world-1"
        assert watched["kind"] == 4  # ParticipantInfo.Kind.AGENT: the world is the agent's video
        page.context.close()

        finish.touch()
        until_sync(lambda: (_read(report_path) or {}).get("closed") is True, "the agent closed", within=WAIT_S)
        assert (_read(report_path) or {})["pause"] == "the world is paused"

        def ended() -> bool:
            with stack.client() as client:
                status = client.get(f"/v1/sessions/{report['session_id']}").json()["status"]
            return status in ("closed", "cancelled", "failed", "expired")

        until_sync(ended, "the world session ended with the agent session", within=WAIT_S)
        until_sync(lambda: "world-1" not in stack.real.participants(ROOM), "the world left the room", within=WAIT_S)
        assert ROOM in stack.real.rooms()  # the agent's room stays
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(timeout=10)
    assert "Traceback" not in log.read_text(errors="replace"), log.read_text(errors="replace")[-4000:]
