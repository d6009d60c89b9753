"""Offline generation: one session through the real LingBotService, a control trace in, a decodable H.264 MP4 out."""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import pty
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from pipeline.lingbot.camera import CameraChunk
from pipeline.lingbot.chunks import ChunkPlan, frame_num_for_duration
from pipeline.lingbot.reference.model import ReferenceDiT, ReferenceVAEDecoder, ReferenceVAEEncoder
from pipeline.lingbot.seam import WorldModelParts
from service.offline.control_trace import parse_trace
from service.offline.generate import (
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    GenerateRequest,
    GenerationError,
    Progress,
    UsageError,
    add_arguments,
    generate,
    main,
    model_from_args,
    run,
)
from service.offline.mp4 import read_cpu_flags, x264_params

ROOT = Path(__file__).resolve().parents[4]
SMALL = ["--resolution", "64x48", "--chunk-size", "2", "--no-hud"]


class Clip:
    """A decoded MP4: luma and RGB hashes per frame, the size and the frame rate."""

    def __init__(self, path: Path) -> None:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            self.codec = stream.codec_context.name
            self.rate = stream.average_rate
            self.width, self.height = stream.codec_context.width, stream.codec_context.height
            assert stream.time_base is not None, "an MP4 video stream has a time base"
            self.time_base: Fraction = stream.time_base
            self.duration_s = float(stream.duration * self.time_base) if stream.duration else 0.0
            self.luma: list[np.ndarray] = []
            self.hashes: list[str] = []
            self.pts: list[int] = []
            for frame in container.decode(stream):
                self.luma.append(frame.to_ndarray(format="gray").astype(np.float32))
                self.hashes.append(hashlib.sha256(frame.to_ndarray(format="rgb24").tobytes()).hexdigest())
                self.pts.append(int(frame.pts or 0))

    @property
    def frames(self) -> int:
        return len(self.hashes)


def horizontal_shift(before: np.ndarray, after: np.ndarray, rows: slice, max_shift: int = 8) -> int:
    """The integer dx by which content moved from `before` to `after` (after[y, x + dx] ≈ before[y, x]).

    Best-shift search over the central columns (kept `max_shift` away from the borders) by mean absolute error.
    """
    width = before.shape[1]
    ref = before[rows, max_shift : width - max_shift]
    errors = {
        dx: float(np.mean(np.abs(after[rows, max_shift + dx : width - max_shift + dx] - ref)))
        for dx in range(-max_shift, max_shift + 1)
    }
    return min(errors, key=lambda dx: errors[dx])


def write_trace(tmp_path: Path, text: str, name: str = "trace.jsonl") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def request(tmp_path: Path, name: str, trace: str = "", **config: object) -> GenerateRequest:
    values: dict[str, object] = {"width": 64, "height": 48, "chunk_size": 2, "hud": False, "frame_num": 4 * 7 + 1}
    values.update(config)
    return GenerateRequest(out=tmp_path / name, config=values, trace=parse_trace(trace, "t.jsonl"), trace_source="t")


# --- the clip ---------------------------------------------------------------------------------------------------------


def test_a_generated_clip_decodes_with_the_planned_frame_count_size_and_fps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "clip.mp4"
    trace = write_trace(tmp_path, '{"chunk": 0, "keys": ["w"]}\n{"t": 1.0, "keys": ["ArrowLeft"]}\n')
    code = main(["--out", str(out), "--controls", str(trace), "--fps", "12", "--seconds", "3", *SMALL])
    assert code == 0
    plan = ChunkPlan.create(4 * (2 * 4 - 1) + 1, 2)  # 3 s at 12 fps, chunk_size 2: 4 whole chunks, 29 frames
    clip = Clip(out)
    assert clip.codec == "h264"
    assert clip.frames == plan.frame_num == 29
    assert (clip.width, clip.height) == (64, 48)
    assert clip.rate == Fraction(12)
    # constant frame rate: frame i is shown at exactly i / 12 s
    assert [pts * clip.time_base for pts in clip.pts] == [Fraction(i, 12) for i in range(29)]
    assert clip.duration_s == pytest.approx(29 / 12, abs=1e-3)  # the MP4 edit list keeps milliseconds
    # not a terminal: no progress bar, only the one-line summary
    err = capsys.readouterr().err
    assert "\r" not in err
    assert err.count("\n") == 1
    assert err.startswith(f"{out}: 29 frames (2.42 s at 12 fps, 4/4 chunks, 64x48, seed 0) in ")


async def test_every_chunk_is_generated_from_exactly_the_trace_state_for_it(tmp_path: Path) -> None:
    # Held keys that change from chunk to chunk are the hard case: the session wants its next chunk at once.
    trace = (
        '{"chunk": 0, "keys": ["l"]}\n{"chunk": 1, "keys": ["j", "w"]}\n{"chunk": 2, "keys": []}\n'
        '{"chunk": 3, "keys": ["d"]}\n{"chunk": 3, "reset_pose": true}\n{"chunk": 5, "keys": ["i"]}\n'
    )
    result = await generate(request(tmp_path, "keys.mp4", trace, frame_num=4 * 11 + 1))
    assert [(c.index, c.applied_seq, c.keys, c.reset_pose) for c in result.chunks] == [
        (0, 0, ("l",), False),
        (1, 1, ("j", "w"), False),
        (2, 2, (), False),
        (3, 3, ("d",), True),
        (4, 4, ("d",), False),
        (5, 5, ("i",), False),
    ]
    assert result.frames == Clip(result.out).frames == 45
    assert not result.interrupted
    assert result.summary is not None
    assert (result.summary.failure, result.summary.slot_leaks, dict(result.summary.cleanup_failures)) == (None, 0, {})


async def test_a_traces_prompts_change_the_picture_from_their_chunk_on(tmp_path: Path) -> None:
    plain = await generate(request(tmp_path, "plain.mp4", '{"chunk": 0, "keys": ["w"]}\n'))
    trace = '{"chunk": 0, "keys": ["w"]}\n{"chunk": 2, "prompt": "night"}\n{"chunk": 3, "prompt": ""}\n'
    prompted = await generate(request(tmp_path, "night.mp4", trace))
    before, after = Clip(plain.out), Clip(prompted.out)
    chunk_of = [0] * 5 + [1] * 8 + [2] * 8 + [3] * 8  # frame -> chunk (chunk_size 2: 5 frames, then 8 per chunk)
    for frame, chunk in enumerate(chunk_of):
        darker = float(after.luma[frame].mean()) < float(before.luma[frame].mean()) - 20
        assert darker == (chunk == 2), f"frame {frame} of chunk {chunk}"
    for frame in range(5 + 8):  # before the prompt: the same picture, up to the encoder's rounding
        assert float(np.mean(np.abs(after.luma[frame] - before.luma[frame]))) < 3, f"frame {frame}"
    assert after.frames == before.frames == 29


def test_a_clip_starts_from_its_prompt_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fog.mp4"
    assert main(["--out", str(out), "--prompt", "thick fog", "--frames", "13", *SMALL]) == 0
    plain = tmp_path / "plain.mp4"
    assert main(["--out", str(plain), "--frames", "13", *SMALL]) == 0
    assert Clip(out).hashes[1:] != Clip(plain).hashes[1:]
    assert main(["--out", str(tmp_path / "x.mp4"), "--prompt", "x" * 600, "--frames", "13", *SMALL]) == 2
    assert "--prompt: a prompt is at most 512 UTF-8 bytes" in capsys.readouterr().err


def test_the_same_image_seed_and_trace_give_identical_frames(tmp_path: Path) -> None:
    trace = write_trace(tmp_path, '{"chunk": 0, "keys": ["l", "w"]}\n{"chunk": 2, "keys": ["k"]}\n')
    image = tmp_path / "ref.png"
    _write_png(image)
    hashes = []
    for name, seed in (("a.mp4", "7"), ("b.mp4", "7"), ("c.mp4", "8")):
        out = tmp_path / name
        args = ["--out", str(out), "--controls", str(trace), "--image", str(image), "--seed", seed, "--frames", "21"]
        assert main([*args, *SMALL]) == 0
        hashes.append(Clip(out).hashes)
    assert len(hashes[0]) == 21
    assert hashes[0] == hashes[1]
    # and so is the encoder (kept off libx264's AVX-512 code, see x264_params): the files are identical
    assert (tmp_path / "a.mp4").read_bytes() == (tmp_path / "b.mp4").read_bytes()
    assert hashes[0] != hashes[2]  # and the seed matters


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="MALLOC_PERTURB_ is glibc's")
def test_the_file_does_not_depend_on_what_the_heap_held_before(tmp_path: Path) -> None:
    # glibc fills every fresh allocation with the MALLOC_PERTURB_ byte, so an encoder that reads memory it never wrote
    # (libx264's AVX-512 MB-tree, see x264_params) writes different files here every time, not once in a while.
    trace = write_trace(tmp_path, '{"chunk": 0, "keys": ["l", "w"]}\n{"chunk": 2, "keys": ["k"]}\n')
    image = tmp_path / "ref.png"
    _write_png(image)
    for perturb in ("85", "170"):
        out = tmp_path / f"heap-{perturb}.mp4"
        argv = ["--out", str(out), "--controls", str(trace), "--image", str(image), "--seed", "7", "--frames", "21"]
        env = {**os.environ, "MALLOC_PERTURB_": perturb}
        subprocess.run([sys.executable, "-m", "service.offline.generate", *argv, *SMALL], cwd=ROOT, env=env, check=True)
    assert Clip(tmp_path / "heap-85.mp4").hashes == Clip(tmp_path / "heap-170.mp4").hashes
    assert (tmp_path / "heap-85.mp4").read_bytes() == (tmp_path / "heap-170.mp4").read_bytes()


_AVX512_FLAGS = "fpu sse4_2 avx avx2 fma bmi2 avx512f avx512dq avx512cd avx512bw avx512vl"


@pytest.mark.parametrize(
    ("machine", "flags", "params"),
    [
        ("x86_64", _AVX512_FLAGS, "asm=AVX2"),  # AVX-512: libx264 is kept on its AVX2 code
        ("AMD64", _AVX512_FLAGS, "asm=AVX2"),
        ("x86_64", "fpu sse4_2 avx avx2 fma bmi2", None),  # no AVX-512: libx264's own choice is deterministic
        ("x86_64", "fpu avx2 avx512f avx512cd", None),  # libx264 needs all five AVX-512 subsets
        ("x86_64", None, "mbtree=0"),  # flags unknown: give up MB-tree rather than determinism
        ("aarch64", None, None),
        ("arm64", "fp asimd", None),
    ],
)
def test_libx264_is_kept_off_its_avx512_code(machine: str, flags: str | None, params: str | None) -> None:
    assert x264_params(machine, None if flags is None else frozenset(flags.split())) == params


def test_cpu_flags_are_read_from_the_first_processor_of_proc_cpuinfo(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    assert read_cpu_flags(cpuinfo) == frozenset({"fpu", "avx2", "avx512f"})
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd\n")  # arm64 names them differently
    assert read_cpu_flags(cpuinfo) is None
    assert read_cpu_flags(tmp_path / "missing") is None


def test_yawing_right_pans_the_decoded_picture_so_content_moves_left(tmp_path: Path) -> None:
    common = ["--resolution", "128x96", "--chunk-size", "2", "--frames", "29", "--no-hud"]
    yaw = write_trace(tmp_path, '{"chunk": 0, "keys": ["l"]}\n')
    assert main(["--out", str(tmp_path / "yaw.mp4"), "--controls", str(yaw), *common]) == 0
    assert main(["--out", str(tmp_path / "still.mp4"), *common]) == 0
    rows = slice(4, 56)  # sky and mountains, above the ground's perspective
    shifts = {}
    for name in ("yaw", "still"):
        clip = Clip(tmp_path / f"{name}.mp4")
        assert clip.frames == 29
        shifts[name] = [horizontal_shift(a, b, rows) for a, b in zip(clip.luma, clip.luma[1:], strict=False)]
    # 2 degrees per frame over a 90 degree field of view 128 pixels wide: about 2.8 pixels per frame, leftwards
    assert all(dx == 0 for dx in shifts["still"]), shifts["still"]
    assert all(dx < 0 for dx in shifts["yaw"]), shifts["yaw"]
    assert -4 <= float(np.median(shifts["yaw"])) <= -2
    assert sum(shifts["yaw"]) < -2.0 * 28


def test_the_report_holds_per_chunk_and_per_stage_timings_and_the_real_time_factor(tmp_path: Path) -> None:
    out, report = tmp_path / "r.mp4", tmp_path / "r.json"
    trace = write_trace(tmp_path, '{"chunk": 0, "keys": ["l"]}\n{"chunk": 2, "reset_pose": true}\n')
    argv = ["--out", str(out), "--controls", str(trace), "--report", str(report), "--frames", "29", *SMALL]
    assert main(argv) == 0
    data = json.loads(report.read_text(encoding="utf-8"))
    assert (data["frames"], data["chunks"], data["chunks_planned"], data["frames_planned"]) == (29, 4, 4, 29)
    assert data["seed"] == 0
    assert data["config"]["width"] == 64
    assert data["encoder"] == "libx264"
    assert data["interrupted"] is False
    assert data["media_s_per_chunk"] == pytest.approx(0.5)
    assert data["real_time_factor"] == pytest.approx(data["chunk_period_s"]["p95"] / 0.5)
    assert data["first_output_latency_s"] > 0
    assert data["chunk_period_s"]["count"] == 3
    assert set(data["stages"]) == {"encode", "denoise", "decode"}
    assert data["stages"]["denoise"]["duration_s"]["count"] == 4
    assert [c["index"] for c in data["per_chunk"]] == [0, 1, 2, 3]
    assert [c["reset_pose"] for c in data["per_chunk"]] == [False, False, True, False]
    assert all(c["wall_s"] > 0 and c["control_to_output_s"] > 0 for c in data["per_chunk"])
    assert data["session"] == {"chunks": 4, "failure": None, "cleanup_failures": {}, "slot_leaks": 0}


def test_add_arguments_and_run_work_under_a_lingstream_subcommand(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="lingstream")
    commands = parser.add_subparsers(dest="command", required=True)
    add_arguments(commands.add_parser("generate"))
    out = tmp_path / "sub.mp4"
    assert run(parser.parse_args(["generate", "--out", str(out), "--frames", "13", *SMALL])) == 0
    assert Clip(out).frames == 13


# --- bad input: exit 2, nothing written -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trace", "message"),
    [
        ('{"chunk": 0, "keys": ["w"]}\n\n{"chunk": 1, "keys": ["q"]}\n', "bad.jsonl:3: unknown key 'q' (allowed: "),
        ('{"chunk": 2, "keys": []}\n{"chunk": 1, "keys": []}\n', "bad.jsonl:2: chunk 1 comes before chunk 2"),
        ('{"chunk": 4, "keys": []}\n', "bad.jsonl:1: chunk 4 is beyond the clip's last chunk 3"),
        ('{"t": 2.5, "keys": []}\n', "bad.jsonl:1: t=2.5 s is beyond the end of the clip"),
        ('{"chunk": 0, "keys": [], "speed": 1}\n', "bad.jsonl:1: unknown field 'speed'"),
        ('{"chunk": "0", "keys": []}\n', "bad.jsonl:1: 'chunk' must be an integer >= 0"),
    ],
)
def test_a_bad_trace_exits_2_naming_the_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], trace: str, message: str
) -> None:
    out = tmp_path / "never.mp4"
    path = write_trace(tmp_path, trace, "bad.jsonl")
    assert main(["--out", str(out), "--controls", str(path), "--frames", "29", *SMALL]) == EXIT_USAGE
    assert f"lingstream generate: {message}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--frames", "30"], "--frames: frame_num: frame_num 30 is not 4n+1; nearest valid: 29 or 33"),
        (["--frames", "25", "--chunk-size", "4"], "--frames: frame_num: frame_num 25 gives 7 latent frames"),
        (["--resolution", "100x48"], "--resolution: width must be a multiple of 16, got 100"),
        (["--resolution", "64by48"], "--resolution must be WIDTHxHEIGHT (e.g. 416x240), got '64by48'"),
        (["--fps", "0"], "--fps: fps must be in 1..60, got 0"),
        (["--seconds", "-1"], "--seconds must be a positive number, got -1"),
        (["--threads", "0"], "--threads must be >= 1, got 0"),
        (["--image", "{tmp}/missing.png"], "--image: cannot read {tmp}/missing.png"),
        (["--image", "{tmp}/garbage.png"], "--image: not a supported image: expected PNG, JPEG or WebP"),
        (["--controls", "{tmp}/missing.jsonl"], "cannot read the trace"),
        (["--report", "{tmp}/nowhere/r.json"], "--report: the directory {tmp}/nowhere does not exist"),
    ],
)
def test_bad_options_exit_2_with_a_clear_message_and_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    (tmp_path / "garbage.png").write_bytes(b"not an image at all")
    out = tmp_path / "never.mp4"
    argv = ["--out", str(out), "--resolution", "64x48", "--no-hud", *[a.format(tmp=tmp_path) for a in extra]]
    assert main(argv) == EXIT_USAGE
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["garbage.png"]


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("clip.avi", "--out: {tmp}/clip.avi must end in .mp4"),
        ("nowhere/clip.mp4", "--out: the directory {tmp}/nowhere does not exist"),
        ("folder.mp4", "--out: {tmp}/folder.mp4 is a directory"),
    ],
)
def test_an_unwritable_output_path_exits_2_before_generating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], out: str, message: str
) -> None:
    (tmp_path / "folder.mp4").mkdir()
    assert main(["--out", str(tmp_path / out), *SMALL]) == EXIT_USAGE
    assert message.format(tmp=tmp_path) in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.mp4"]


def test_both_frames_and_seconds_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["--out", str(tmp_path / "x.mp4"), "--frames", "29", "--seconds", "2"])
    assert caught.value.code == EXIT_USAGE
    assert "not allowed with argument" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


# --- interruption -----------------------------------------------------------------------------------------------------


async def test_ctrl_c_during_generation_leaves_a_shorter_valid_mp4_and_a_cleanly_closed_session(
    tmp_path: Path,
) -> None:
    seen: list[Progress] = []

    def interrupt_after_two(progress: Progress) -> None:
        seen.append(progress)
        if progress.chunks_done == 2:
            raise KeyboardInterrupt

    req = request(tmp_path, "short.mp4", '{"chunk": 0, "keys": ["l"]}', frame_num=4 * 15 + 1)
    result = await generate(req, on_progress=interrupt_after_two)
    assert result.interrupted
    assert [p.chunks_done for p in seen] == [1, 2]
    assert seen[-1].chunks_total == result.chunks_planned == 8
    assert [c.index for c in result.chunks] == [0, 1]
    assert result.frames == 5 + 8
    assert result.summary is not None
    assert (result.summary.failure, result.summary.slot_leaks, dict(result.summary.cleanup_failures)) == (None, 0, {})
    clip = Clip(result.out)
    assert clip.frames == 13
    assert clip.duration_s == pytest.approx(13 / 16, abs=1e-3)


async def test_a_stop_event_ends_generation_like_ctrl_c(tmp_path: Path) -> None:
    stop = asyncio.Event()

    def stop_after_one(progress: Progress) -> None:
        stop.set()

    result = await generate(request(tmp_path, "stop.mp4"), on_progress=stop_after_one, stop=stop)
    assert result.interrupted
    assert result.frames == Clip(result.out).frames == 5
    assert result.report()["interrupted"] is True


class _DenoiserFailingAt(ReferenceDiT):
    def __init__(self, failing_chunk: int) -> None:
        super().__init__("cpu")
        self._failing_chunk = failing_chunk

    def denoise_chunk(
        self, session_id: str, chunk_index: int, chunk_size: int, control: CameraChunk, *, prompt: str
    ) -> torch.Tensor:
        if chunk_index == self._failing_chunk:
            raise RuntimeError("the GPU caught fire")
        return super().denoise_chunk(session_id, chunk_index, chunk_size, control, prompt=prompt)


async def test_a_model_failure_mid_clip_is_a_generation_error_and_keeps_the_chunks_written(tmp_path: Path) -> None:
    model = WorldModelParts(ReferenceVAEEncoder("cpu"), _DenoiserFailingAt(2), ReferenceVAEDecoder("cpu"))
    req = request(tmp_path, "failed.mp4", '{"chunk": 0, "keys": ["w"]}')
    with pytest.raises(GenerationError, match=r"the session failed at chunk 2: .*the GPU caught fire"):
        await generate(req, model=model)
    assert Clip(req.out).frames == 5 + 8


def test_sigint_in_a_terminal_shows_progress_then_exits_130_with_a_valid_shorter_mp4(tmp_path: Path) -> None:
    out = tmp_path / "long.mp4"
    argv = [sys.executable, "-m", "service.offline.generate", "--out", str(out), "--seconds", "3600", *SMALL]
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=terminal, close_fds=True
    )
    os.close(terminal)
    seen = b""
    try:
        deadline = time.monotonic() + 60
        while b"chunks" not in seen and time.monotonic() < deadline:  # the first progress line: generating now
            ready, _, _ = select.select([controller], [], [], 1.0)
            if ready:
                seen += os.read(controller, 4096)
        assert b"chunks" in seen, seen
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == EXIT_INTERRUPTED
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(controller)
    text = seen.decode("utf-8", "replace")
    assert "\r[" in text
    assert " RTF " in text
    assert " ETA " in text
    assert "interrupted: " in text
    clip = Clip(out)
    assert 0 < clip.frames < frame_num_for_duration(3600, 16, 2)
    assert (clip.frames - 5) % 8 == 0  # whole chunks: 5 frames in chunk 0, 8 in each later one


def _write_png(path: Path) -> None:
    from PIL import Image

    gradient = np.linspace(0, 255, 96 * 72 * 3).reshape(72, 96, 3).astype(np.uint8)
    gradient[20:40, 30:60] = (200, 40, 40)
    Image.fromarray(gradient).save(path)


# --- a clip the model cannot hold -------------------------------------------------------------------------------------

_WINDOW = "chunk_size: 13 latent frames do not fit the model's attention window (18 frames, 6 of them the sink)"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--resolution", "1280x720"],
            "--resolution: width x height: 1280x720 is more pixels than the 832x480 this lingbot-fast worker plans "
            "its memory for",
        ),
        (["--chunk-size", "13", "--frames", str(4 * 26 - 3)], f"--chunk-size: {_WINDOW}: at most 12"),
    ],
)
def test_lingbot_fast_refuses_a_clip_it_cannot_hold_before_reading_any_weight(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    pytest.importorskip("diffusers", reason="the lingbot extra (diffusers) is not installed")
    pytest.importorskip("transformers", reason="the lingbot extra (transformers) is not installed")
    missing = tmp_path / "no-model"  # never opened: the session check comes before the model loads
    argv = ["--out", str(tmp_path / "never.mp4"), "--model", "lingbot-fast", "--model-path", str(missing), *extra]
    assert main([*argv, "--no-hud"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert message in err
    assert "--model-path" not in err
    assert list(tmp_path.iterdir()) == []


def test_generate_runs_the_models_session_check_before_it_writes_anything(tmp_path: Path) -> None:
    models = pytest.importorskip("pipeline.lingbot.models", reason="the lingbot extra is not installed")
    check = models.session_limits(models.LingBotFastOptions(str(tmp_path / "unused")))
    refused = request(tmp_path, "never.mp4", chunk_size=13, frame_num=4 * 26 - 3)
    with pytest.raises(UsageError, match=re.escape(f"--chunk-size: {_WINDOW}")):
        asyncio.run(generate(refused, check_config=check))
    assert list(tmp_path.iterdir()) == []
    held = request(tmp_path, "held.mp4", chunk_size=2, frame_num=4 * 5 + 1)  # within the limits: generated
    assert asyncio.run(generate(held, check_config=check)).frames == 21


def test_the_tiny_decoder_is_lingbot_fasts_and_needs_its_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--decoder tiny` (default: LINGSTREAM_DECODER) on the reference model is a usage error; on lingbot-fast a
    model directory without the tiny decoder's weights is one too, naming the file, on either placement."""
    out = tmp_path / "never.mp4"
    assert main(["--out", str(out), "--decoder", "tiny", "--frames", "13", *SMALL]) == EXIT_USAGE
    assert "--decoder tiny chooses lingbot-fast's decoder (--model lingbot-fast)" in capsys.readouterr().err
    models = pytest.importorskip("pipeline.lingbot.models", reason="the lingbot extra is not installed")
    root = models.write_tiny_model(tmp_path / "model", seed=0)
    shutil.rmtree(root / models.TINY_DECODER_DIR)
    argv = ["--out", str(out), "--model", "lingbot-fast", "--model-path", str(root), "--decoder", "tiny"]
    for placement in ("threads", "processes"):
        assert main([*argv, "--frames", "9", "--resolution", "64x32", "--placement", placement]) == EXIT_USAGE
        err = capsys.readouterr().err
        assert f"--model-path {root}: LINGSTREAM_DECODER=tiny needs the tiny decoder's weights at {root}" in err
    assert not out.exists()


def test_the_attention_kernel_is_the_services_setting_unless_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--attention` (default: LINGSTREAM_ATTENTION, else auto) is the kernel the loaded DiT runs: a replay is
    bit-exact only with the kernel its session ran (on the CPU, auto's flash kernel and math differ in the last bits:
    docs/generate.md). An unknown kernel is a usage error."""
    models = pytest.importorskip("pipeline.lingbot.models", reason="the lingbot extra is not installed")
    root = models.write_tiny_model(tmp_path / "model", seed=0)
    req = request(tmp_path, "unused.mp4", width=64, height=32, chunk_size=3, frame_num=9)

    def kernel(*argv: str) -> str:
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(["--out", "x.mp4", "--model", "lingbot-fast", "--model-path", str(root), *argv])
        world, _ = model_from_args(args, req)
        assert isinstance(world, models.LingBotFastWorldModel)
        plan = world.denoiser.dit.attention
        return f"{plan.name} {','.join(plan.sdpa_order)}"

    monkeypatch.delenv("LINGSTREAM_ATTENTION", raising=False)
    assert kernel() == "sdpa "  # PyTorch's own choice on the CPU
    assert kernel("--attention", "math") == "math math"
    monkeypatch.setenv("LINGSTREAM_ATTENTION", "math")
    assert kernel() == "math math"
    assert kernel("--attention", "auto") == "sdpa "
    with pytest.raises(SystemExit) as refused:
        kernel("--attention", "fastest")
    assert refused.value.code == 2
    assert "argument --attention: invalid choice: 'fastest'" in capsys.readouterr().err
