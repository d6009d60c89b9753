"""Benchmark of recordings in object storage: how long uploading one recorded minute takes (issue #35).

A real S3-compatible server on loopback (SeaweedFS, `weed server -s3`, the tests' `tests/support/seaweedfs.py`) and
the service's own upload path (`service.runtime.recording_objects.RecordingObjects` over `service.storage.S3Client`:
SigV4-signed, each part read and hashed on a worker thread). The recording is one minute of 416x240 video at 16 fps
(960 frames), encoded once by the recordings' own writer (H.264 in MP4, `service.offline.mp4.Mp4Writer`) from a
synthetic picture: smooth gradients that drift every frame, with a little per-pixel noise (a stand-in for a world
model's output; the MP4's size, and so the figure, depends on the picture), plus a control trace of 240 chunks.
Then the recording (trace, then MP4) is uploaded `--rounds` times, each under new keys, and timed.

Figures:
- upload_s_per_recorded_minute_p50, upload_s_per_recorded_minute_max: seconds per upload of one recorded minute;
- recorded_minute_mb: the MP4 and trace of one minute (MB, 10^6 bytes);
- upload_mb_per_s: recorded_minute_mb / upload_s_per_recorded_minute_p50;
- encode_s_per_recorded_minute: the time the writer took to encode that minute here (for scale: it runs while the
  session streams, the upload only after the session ended);
- multipart_upload_s_per_recorded_minute_p50, multipart_parts: four recorded minutes in one MP4-sized file (the
  minute's bytes four times over) uploaded in 5 MiB parts, a long recording's path, per recorded minute.

Loopback numbers: a store across a network adds its latency and bandwidth. `--quick` is a smoke run (10 s of
video scaled to a minute, one round): its figures are not the ones to compare. The last line printed is one JSON
object with every figure.

    .venv/bin/python -m bench.recording_upload
"""

from __future__ import annotations

import argparse
import asyncio
import math
import tempfile
import time
from pathlib import Path

import numpy as np

from bench._common import report
from pipeline.metrics import percentile
from service.offline.mp4 import Mp4Writer, h264_encoder
from service.runtime.recording_objects import RecordingObjects
from service.storage import ObjectStoreConfig, S3Client
from tests.support.seaweedfs import SeaweedS3

WIDTH, HEIGHT, FPS = 416, 240, 16
CHUNK_FRAMES = 4
BUCKET = "recordings"
_MIB = 1024 * 1024


def _p50(values: list[float]) -> float:
    middle = percentile(values, 50)
    assert middle is not None  # at least one round
    return middle


def _frames(count: int, seed: int = 7) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    frames = []
    for index in range(count):
        phase = index / FPS
        r = 128 + 100 * np.sin(x / 37.0 + phase)
        g = 128 + 100 * np.sin(y / 23.0 - 0.7 * phase)
        b = 128 + 100 * np.sin((x + y) / 51.0 + 0.3 * phase)
        picture = np.stack([r, g, b], axis=-1) + rng.normal(0.0, 4.0, (HEIGHT, WIDTH, 3))
        frames.append(np.clip(picture, 0, 255).astype(np.uint8))
    return frames


async def _encode(video: Path, seconds: float) -> float:
    frames = _frames(round(seconds * FPS))
    started = time.perf_counter()
    writer = Mp4Writer(video, WIDTH, HEIGHT, FPS, h264_encoder())
    for start in range(0, len(frames), CHUNK_FRAMES):
        await writer.write(np.stack(frames[start : start + CHUNK_FRAMES]))
    await asyncio.to_thread(writer.close)
    return time.perf_counter() - started


async def _uploads(s3: SeaweedS3, video: Path, trace: Path, rounds: int, part_bytes: int) -> list[float]:
    config = ObjectStoreConfig(s3.endpoint, BUCKET, s3.admin, prefix="bench/", part_bytes=part_bytes)
    objects = RecordingObjects(S3Client(config), max_count=1000, max_bytes=1 << 40)
    timings = []
    try:
        for number in range(rounds):
            started = time.perf_counter()
            await objects.upload(f"bench-{part_bytes}-{number}", video, trace)
            timings.append(time.perf_counter() - started)
    finally:
        await objects.aclose()
    return timings


async def main(quick: bool, rounds: int) -> None:
    started = time.perf_counter()
    seconds = 10.0 if quick else 60.0
    rounds = 1 if quick else rounds
    with tempfile.TemporaryDirectory(prefix="lingstream-upload-bench-") as folder:
        work = Path(folder)
        video, trace = work / "minute.mp4", work / "minute.controls.jsonl"
        encode_s = await _encode(video, seconds)
        chunks = round(seconds * FPS / CHUNK_FRAMES)
        trace.write_text("".join(f'{{"chunk": {n}, "keys": ["w"]}}\n' for n in range(chunks)))
        scale = 60.0 / seconds
        size = video.stat().st_size + trace.stat().st_size
        with SeaweedS3(work, buckets=(BUCKET,)) as s3:
            plain = await _uploads(s3, video, trace, rounds, 64 * _MIB)
            long_video = work / "four-minutes.mp4"
            long_video.write_bytes(video.read_bytes() * 4)
            multipart = await _uploads(s3, long_video, trace, rounds, 5 * _MIB)
        per_minute = [value * scale for value in plain]
        p50 = _p50(per_minute)
        figures: dict[str, object] = {
            "upload_s_per_recorded_minute_p50": p50,
            "upload_s_per_recorded_minute_max": max(per_minute),
            "recorded_minute_mb": size * scale / 1e6,
            "upload_mb_per_s": size / 1e6 / _p50(plain),
            "encode_s_per_recorded_minute": encode_s * scale,
            "multipart_upload_s_per_recorded_minute_p50": _p50([value * scale / 4 for value in multipart]),
            "multipart_parts": math.ceil(4 * video.stat().st_size / (5 * _MIB)),
            "rounds": rounds,
        }
    report(figures, started)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 10 s of video, one round")
    parser.add_argument("--rounds", type=int, default=5, help="uploads timed (default 5)")
    arguments = parser.parse_args()
    asyncio.run(main(arguments.quick, arguments.rounds))
