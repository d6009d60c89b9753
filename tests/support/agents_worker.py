"""A real LiveKit Agents worker for the tests (livekit-agents' `AgentServer`, run by the agents environment's Python:
`.venv-agents/bin/python -m tests.support.agents_worker`, scripts/setup.sh --dev makes it).

No LLM: a scripted agent. Dispatched by name (`lingstream-test`) to a room, it starts an `AgentSession` with no
models (audio in and out off), starts a `WorldSession` in its room, then calls the world's function tools as a
model's tool calls would (through the `FunctionTool` objects its `Agent` holds): move, turn, set_prompt. It writes a
JSON report to `LINGSTREAM_AGENT_REPORT` (the session id, each tool's answer, the keys of the chunks it saw), waits
until the file `LINGSTREAM_AGENT_FINISH` exists (the test has looked at the room), pauses the world with the `pause`
tool, closes the agent session (which ends the world session) and reports again.

Environment: `LIVEKIT_URL`, `LIVEKIT_API_KEY`, `LIVEKIT_API_SECRET` (as every Agents worker), `LINGSTREAM_URL`,
`LINGSTREAM_AGENT_REPORT`, `LINGSTREAM_AGENT_FINISH`, `LINGSTREAM_AGENT_CONFIG` (the session's config, JSON).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from livekit.agents import (  # type: ignore[import-not-found,unused-ignore]
    Agent,
    AgentServer,
    AgentSession,
    JobContext,
    JobExecutorType,
    room_io,
)

from transport.livekit.agents import WorldSession

AGENT_NAME = "lingstream-test"
_FINISH_WAIT_S = 120.0


def _write(report: dict[str, Any]) -> None:
    path = Path(os.environ["LINGSTREAM_AGENT_REPORT"])
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(report), encoding="utf-8")
    partial.replace(path)


def _wait_for(path: Path) -> None:
    """Until the test process creates `path` (another process: a file is the simplest signal across them)."""
    deadline = time.monotonic() + _FINISH_WAIT_S
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear in {_FINISH_WAIT_S} s")
        time.sleep(0.1)  # polling a file another process writes


async def entrypoint(ctx: JobContext) -> None:
    await ctx.connect()
    world = WorldSession(
        os.environ["LINGSTREAM_URL"],
        livekit_url=os.environ["LIVEKIT_URL"],
        livekit_api_key=os.environ["LIVEKIT_API_KEY"],
        livekit_api_secret=os.environ["LIVEKIT_API_SECRET"],
        identity="world-1",
        config=json.loads(os.environ.get("LINGSTREAM_AGENT_CONFIG", "{}")),
        max_seconds=300,
    )
    agent = Agent(instructions="You steer a generated world with your tools.", tools=world.tools())
    session: AgentSession[Any] = AgentSession()
    # No models, so no audio either way; and the session outlives the user's page (the test closes it first).
    options = room_io.RoomOptions(audio_input=False, audio_output=False, text_output=False, close_on_disconnect=False)
    await session.start(agent=agent, room=ctx.room, room_options=options, record=False)
    info = await world.start(session, ctx.room)
    tools = {tool.info.name: tool for tool in agent.tools}
    report: dict[str, Any] = {
        "session_id": info.id,
        "agent_identity": ctx.room.local_participant.identity,
        "tools": sorted(tools),
    }
    report["move"] = await tools["move"](direction="forward", seconds=1.5)
    report["turn"] = await tools["turn"](direction="left", seconds=1.0)
    report["set_prompt"] = await tools["set_prompt"](text="a snowy night")
    report["chunk_keys"] = [sorted(keys) for keys in world.chunk_keys]
    _write(report)
    finish = Path(os.environ["LINGSTREAM_AGENT_FINISH"])
    await asyncio.to_thread(_wait_for, finish)
    report["pause"] = await tools["pause"](paused=True)
    await session.aclose()  # the agent session closes: the world session ends with it
    await world.aclose()  # idempotent: waits for nothing new when the close event already ended it
    report["closed"] = True
    _write(report)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    server = AgentServer(job_executor_type=JobExecutorType.THREAD, num_idle_processes=0, port=0)
    server.rtc_session(entrypoint, agent_name=AGENT_NAME)
    # The test waits for this line before it dispatches the agent.
    server.on("worker_registered", lambda *_: print("registered worker", flush=True))
    asyncio.run(server.run(devmode=True))


if __name__ == "__main__":
    main()
