"""A session's history (`history.py`) and the version 2 checkpoint that carries it (`continuity.py`): the ring keeps
the sink's chunks and the newest others, nothing more; its chunks go through bytes whole (latent, camera, prompt,
generator state), as one blob or per chunk; a version 1 checkpoint (no history) still reads and re-seeds without
one; a chunk the header lists but the parts lack, or an unknown version, is refused."""

from __future__ import annotations

import dataclasses
import json
import struct
from multiprocessing.reduction import ForkingPickler

import pytest
import torch

from pipeline.lingbot.camera import CameraController, CameraPose
from pipeline.lingbot.config import LingBotSessionConfig
from pipeline.lingbot.continuity import CHECKPOINT_VERSION, NO_HISTORY, SessionCheckpoint
from pipeline.lingbot.controls import ControlSnapshot
from pipeline.lingbot.errors import CheckpointVersionError
from pipeline.lingbot.history import ChunkHistory, ChunkRecord, HistorySpec, SessionHistory

CONFIG = LingBotSessionConfig.from_mapping({"width": 64, "height": 32, "seed": 3})
SPEC = HistorySpec(sink_chunks=2, recent_chunks=3)


def _chunks(count: int, spec: HistorySpec = SPEC) -> list[ChunkHistory]:
    camera = CameraController(CONFIG.pose_steps(), CONFIG.camera_intrinsics())
    generator = torch.Generator().manual_seed(1)
    chunks = []
    for index in range(count):
        control = camera.chunk_control(ControlSnapshot.from_keys(index, ["w", "l"]), index, 3).camera
        latent = torch.randn(16, 3, CONFIG.latent_height, CONFIG.latent_width, generator=generator)
        state = bytes(generator.get_state().numpy())
        chunks.append(ChunkHistory(ChunkRecord(index, control, f"prompt {index % 2}", state, spec), latent))
    return chunks


def _history(count: int) -> SessionHistory:
    history = SessionHistory()
    for chunk in _chunks(count):
        history = history.append(chunk)
    return history


def _checkpoint(history: SessionHistory, image: torch.Tensor | None = None) -> SessionCheckpoint:
    return SessionCheckpoint(
        session_id="s",
        config=CONFIG,
        image=image,
        next_chunk=len(history.chunks) and history.chunks[-1].chunk_index + 1,
        pose=CameraPose(x=0.5, z=-1.0, yaw=0.25),
        prompt="a road",
        prompt_seq=1,
        applied_seq=4,
        latest=ControlSnapshot.from_keys(5, ["w"]),
        frames_emitted=33,
        taken_at=2.5,
        history=history,
    )


def test_the_ring_keeps_the_sink_and_the_newest_chunks_only() -> None:
    history = SessionHistory()
    seen = []
    for chunk in _chunks(9):
        history = history.append(chunk)
        seen.append(history.indices())
    assert seen[:5] == [(0,), (0, 1), (0, 1, 2), (0, 1, 2, 3), (0, 1, 2, 3, 4)]
    assert seen[5:] == [(0, 1, 3, 4, 5), (0, 1, 4, 5, 6), (0, 1, 5, 6, 7), (0, 1, 6, 7, 8)]
    assert _history(5).complete
    assert not history.complete
    assert history.nbytes == 5 * 16 * 3 * CONFIG.latent_height * CONFIG.latent_width * 4


def test_a_chunk_after_a_gap_starts_the_history_again() -> None:
    chunks = _chunks(6)
    history = SessionHistory().append(chunks[0]).append(chunks[1]).append(chunks[4]).append(chunks[5])
    assert history.indices() == (4, 5)


def test_the_decoder_prime_is_the_newest_run_of_consecutive_chunks_before_the_start() -> None:
    history = _history(9)  # (0, 1, 6, 7, 8)
    prime = history.prime(9)
    assert prime is not None
    assert torch.equal(prime, torch.cat([c.latent for c in history.chunks[2:]], dim=1))
    complete = _history(3)
    prime = complete.prime(3)
    assert prime is not None
    assert prime.shape[1] == 9
    assert history.prime(3) is None  # the history does not reach chunk 2


def test_a_re_seed_replays_no_chunk_at_or_after_the_one_it_goes_on_from() -> None:
    """A checkpoint that goes on from an earlier chunk than the newest latents it holds (a store that wrote them
    before the client saw their chunks) replays the chunks before it only, and the decoder's prime ends there."""
    history = _history(4)  # chunks 0-3 (sink 2, recent 3: all held)
    assert _checkpoint(history).resume_point.history is history  # the usual case: nothing newer, nothing copied
    earlier = dataclasses.replace(_checkpoint(history), next_chunk=2)
    resumed = earlier.resume_point.history
    assert resumed is not None
    assert resumed.indices() == (0, 1)
    prime = resumed.prime(2)
    assert prime is not None
    assert torch.equal(prime, torch.cat([c.latent for c in history.chunks[:2]], dim=1))
    assert dataclasses.replace(_checkpoint(history), next_chunk=0).resume_point.history is None


@pytest.mark.parametrize("image", [None, torch.rand(3, 32, 64)], ids=["no-image", "image"])
def test_a_checkpoint_with_history_round_trips_through_bytes_whole_and_in_parts(image: torch.Tensor | None) -> None:
    checkpoint = _checkpoint(_history(7), image)
    assert checkpoint.version == CHECKPOINT_VERSION == 2
    whole = SessionCheckpoint.from_bytes(checkpoint.to_bytes())
    parts = SessionCheckpoint.from_parts(checkpoint.header_bytes(), checkpoint.image_data(), checkpoint.history_parts())
    for got in (whole, parts):
        assert got.history.indices() == checkpoint.history.indices() == (0, 1, 4, 5, 6)
        for mine, theirs in zip(checkpoint.history.chunks, got.history.chunks, strict=True):
            assert torch.equal(mine.latent, theirs.latent)
            assert torch.equal(mine.record.camera.start, theirs.record.camera.start)
            assert torch.equal(mine.record.camera.relative, theirs.record.camera.relative)
            assert mine.record.camera.translation_scale == theirs.record.camera.translation_scale
            assert mine.record.camera.intrinsics == theirs.record.camera.intrinsics
            assert (mine.record.prompt, mine.record.generator_state, mine.record.spec) == (
                theirs.record.prompt,
                theirs.record.generator_state,
                theirs.record.spec,
            )
        assert (got.next_chunk, got.pose, got.frames_emitted) == (7, checkpoint.pose, 33)
        assert (got.image is None) == (image is None)
        resume = got.resume_point
        assert resume.history is not None
        assert resume.history.indices() == (0, 1, 4, 5, 6)
    assert checkpoint.state_bytes() == len(checkpoint.header_bytes()) + checkpoint.history.nbytes


def test_a_version_1_checkpoint_still_reads_and_resumes_without_history() -> None:
    image = torch.rand(3, 32, 64)
    current = _checkpoint(NO_HISTORY, image)
    header = json.loads(current.header_bytes())
    header["version"] = 1
    del header["history"]
    old = json.dumps(header).encode()
    data = struct.pack(">I", len(old)) + old + image.numpy().tobytes()
    got = SessionCheckpoint.from_bytes(data)
    assert got.history is NO_HISTORY
    assert got.resume_point.history is None
    assert got.image is not None
    assert torch.equal(got.image, image)
    assert SessionCheckpoint.from_parts(old, image.numpy().tobytes()).history is NO_HISTORY


def test_a_missing_chunk_of_history_or_an_unknown_version_is_refused() -> None:
    checkpoint = _checkpoint(_history(4))
    parts = checkpoint.history_parts()
    del parts[2]
    with pytest.raises(CheckpointVersionError, match=r"lacks chunk\(s\) \[2\]"):
        SessionCheckpoint.from_parts(checkpoint.header_bytes(), None, parts)
    header = json.loads(checkpoint.header_bytes())
    header["version"] = 3
    with pytest.raises(CheckpointVersionError, match="version 3"):
        SessionCheckpoint.from_parts(json.dumps(header).encode(), None, checkpoint.history_parts())
    with pytest.raises(CheckpointVersionError, match="cut short"):
        SessionCheckpoint.from_bytes(checkpoint.to_bytes()[:-100])


def test_a_chunk_of_history_crosses_a_worker_reply_inside_the_pickle_not_in_shared_memory() -> None:
    """What the worker's reply pickler (`ForkingPickler`, torch's reductions registered) makes of a chunk: the latent
    and the camera come back equal, as ordinary tensors (a shared-memory segment each cost 15 ms per latent)."""
    import torch.multiprocessing  # registers torch's reductions, as in a worker

    chunk = _chunks(1)[0]
    again = ForkingPickler.loads(bytes(ForkingPickler.dumps(chunk)))
    assert torch.equal(again.latent, chunk.latent)
    assert not again.latent.is_shared()
    assert torch.equal(again.record.camera.start, chunk.record.camera.start)
    assert torch.equal(again.record.camera.relative, chunk.record.camera.relative)
    assert not again.record.camera.relative.is_shared()
    assert (again.record.prompt, again.record.generator_state, again.record.spec) == (
        chunk.record.prompt,
        chunk.record.generator_state,
        chunk.record.spec,
    )
