"""`lingstream serve` with `processes` placement stops cleanly: SIGTERM while a chunk is in flight in the worker
processes drains, the service exits 0, and afterwards no process it started is left (the whole tree is checked) and
no shared-memory segment it mapped is left in /dev/shm."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import httpx
import pytest

from tests.support.process_tree import alive, descendants, shm_paths
from tests.support.reliability import samples
from tests.support.serving import serve

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads the process tree from /proc")

DRAIN_TIMEOUT_S = 2.0
HEAVY = {"width": 256, "height": 160, "fps": 16, "chunk_size": 3, "compute_scale": 16, "hud": False}


async def test_sigterm_with_a_chunk_in_flight_leaves_no_process_and_no_shared_memory(tmp_path: Path) -> None:
    with serve(
        tmp_path,
        factory=None,  # the product's own workers
        LINGSTREAM_STAGE_PLACEMENT="processes",
        LINGSTREAM_DENOISE_RANKS="2",
        LINGSTREAM_TORCH_THREADS="1",
        LINGSTREAM_DRAIN_TIMEOUT=str(DRAIN_TIMEOUT_S),
    ) as service:
        async with httpx.AsyncClient(base_url=service.url, timeout=10.0) as client:
            await service.wait_ready(client)
            created = (await client.post("/v1/sessions", json={"config": HEAVY})).json()
            assert created["status"] == "running", created

            async def denoising() -> bool:
                text = (await client.get("/metrics")).text
                return samples(text, "lingstream_pipeline_stage_in_flight").get('{stage="denoise",worker="0"}') == 1

            deadline = time.monotonic() + 30
            while not await denoising():
                assert time.monotonic() < deadline, "no denoise call came in flight"
                await asyncio.sleep(0.05)  # state of another process: poll with a deadline
            tree = descendants(service.process.pid)
            mapped = shm_paths({service.process.pid, *tree})
            assert len(tree) >= 4, tree  # encode, 2 DiT ranks, decode (and multiprocessing's resource tracker)
            assert mapped, "the channels' semaphores live in /dev/shm"

            service.process.send_signal(signal.SIGTERM)
            returncode = await asyncio.to_thread(service.process.wait, DRAIN_TIMEOUT_S + 30)

    assert returncode == 0, service.output()[-4000:]
    _assert_nothing_left({service.process.pid, *tree}, mapped)
    log = service.output()
    assert "Traceback" not in log
    assert "drain complete" in log


def _assert_nothing_left(pids: set[int], mapped: set[str]) -> None:
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)  # the resource tracker ends once it reads its pipe's end
    assert [pid for pid in pids if alive(pid)] == [], "orphaned processes"
    assert sorted(path for path in mapped if Path(path).exists()) == [], "shared memory left in /dev/shm"
    names = {str(pid) for pid in pids}  # torch names its segments torch_<pid>_...
    leftover = [entry.name for entry in Path("/dev/shm").iterdir() if names & set(entry.name.split("_"))]
    assert leftover == [], leftover
