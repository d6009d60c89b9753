"""The lingbot-fast page test (`test_browser_lingbot_fast.py`) against a service whose DiT runs over two gloo ranks
(`processes`, `LINGSTREAM_DENOISE_RANKS=2`: Ulysses context parallelism): the page's frames keep the session's size
and add up chunk by chunk to the frame contract, and each live prompt (encoded by umt5 on rank 0, its states
broadcast to rank 1) makes one more chunk. That the frames themselves equal one rank's bit for bit is checked on the
recording, before the WebRTC encoder (`test_lingbot_fast.py`)."""

from __future__ import annotations

import pytest

from tests.e2e.test_browser_lingbot_fast import WAIT_MS
from tests.e2e.test_browser_lingbot_fast import (
    test_the_page_gets_the_tiny_models_frames_at_the_sessions_size_chunk_by_chunk as test_the_page_gets_a_cp_sessions_frames,  # noqa: E501, F401  (collected here, against this module's service)
)
from tests.support.browser.chromium import BROWSER_SKIPS
from tests.support.browser.fixtures import embedded_browser_fixtures
from tests.support.serving import STARTUP_DEADLINE_S
from tests.support.tiny_model import write_tiny_checkpoint

pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")

pytestmark = [pytest.mark.browser, pytest.mark.slow, *BROWSER_SKIPS]


def _two_dit_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    checkpoint = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny") / "model")
    return {
        "LINGSTREAM_MODEL": "lingbot-fast",
        "LINGSTREAM_MODEL_PATH": str(checkpoint),
        "LINGSTREAM_STAGE_PLACEMENT": "processes",
        "LINGSTREAM_DENOISE_RANKS": "2",
    }


# Each DiT rank imports the model stack and loads the DiT in its own process: the start and the first chunk take
# longer on a loaded machine (a first run here once ran past a 60 s page wait).
service, browser, open_page = embedded_browser_fixtures(
    wait_ms=2 * WAIT_MS, settings=_two_dit_ranks, ready_within_s=4 * STARTUP_DEADLINE_S
)
