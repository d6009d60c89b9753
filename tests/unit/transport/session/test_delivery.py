"""`DeliveryWatermark`: the newest chunk whose every frame left the pacer, sent or dropped late (issue #33)."""

from __future__ import annotations

import numpy as np

from transport.session.delivery import DeliveryWatermark
from transport.session.pacing import PacingConfig, PacingCore, SendFrame


def test_a_chunk_is_done_when_its_last_frame_is_released() -> None:
    mark = DeliveryWatermark()
    assert mark.fed(0, last_frame=2) is None
    assert mark.released(0, frame=0) is None
    assert mark.released(0, frame=1) is None
    assert mark.released(0, frame=2) == 0
    assert mark.fed(1, last_frame=5) is None
    assert mark.released(1, frame=5) == 1
    assert mark.through == 1


def test_a_frame_of_a_later_chunk_means_the_earlier_ones_are_done_even_unseen() -> None:
    mark = DeliveryWatermark()
    mark.fed(3, last_frame=11)
    # The broadcast skipped chunks 4 and 5 for this feed; chunk 6's first frame goes out.
    assert mark.released(6, frame=24) == 5
    assert mark.released(6, frame=25) is None  # chunk 6's last frame is not known yet
    assert mark.fed(6, last_frame=27) is None
    assert mark.released(6, frame=27) == 6


def test_frames_released_ahead_of_the_whole_chunk_count_when_it_is_fed() -> None:
    """Progressive decode: the chunk's parts are paced before the whole chunk reaches the feed."""
    mark = DeliveryWatermark()
    assert mark.released(0, frame=0) is None
    assert mark.released(0, frame=1) is None
    assert mark.fed(0, last_frame=1) == 0
    assert mark.fed(0, last_frame=1) is None  # never twice, never back


def test_a_chunk_whose_frames_the_pacer_dropped_late_still_counts_as_delivered() -> None:
    """The pacer fell behind (a blocked loop): it drops the late frames, keeps the newest, and the client's clock
    moved past them: chunk 0, never sent whole, is done once chunk 1's newest frame goes."""
    core = PacingCore(PacingConfig(fps=10, width=2, height=2, reanchor_after=10.0))
    mark = DeliveryWatermark()
    done: list[int] = []
    frames = np.zeros((3, 2, 2, 3), dtype=np.uint8)

    def feed(chunk: int, first: int) -> None:
        core.push_chunk(frames, first_frame_index=first, chunk_index=chunk, now=0.0)
        if (through := mark.fed(chunk, last_frame=first + 2)) is not None:
            done.append(through)

    def poll(now: float) -> None:
        action = core.poll(now)
        if (
            isinstance(action, SendFrame)
            and (through := mark.released(action.frame.chunk_index, action.frame.frame_index)) is not None
        ):
            done.append(through)

    feed(0, 0)
    feed(1, 3)
    poll(0.0)  # frame 0 on time
    poll(5.0)  # 50 slots late: frames 1-4 dropped, the newest (5) kept and sent
    assert core.statistics().dropped_late == 4
    assert done == [1]
