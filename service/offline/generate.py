"""Offline chunked generation (`lingstream generate`): one session, driven by a control trace, written to an MP4.

It runs exactly the session lifecycle a browser session runs, through the model worker's real `LingBotService`
(`realtime=False`, so chunks come as fast as the model allows): `prepare(config, image)` → `create_session` →
for every chunk, push the trace's `ControlState` (and `ResetPose`, `SetPrompt` when asked) → read `outputs()` →
`close_session`.
Only the source of control (a trace instead of a browser) and the sink of frames (an H.264 MP4 through PyAV instead
of a video track) differ.

This module is the command line (`python -m service.offline.generate`: `add_arguments`, `run`, `main`); the
session runs in `service.offline.driver` (`generate`, re-exported here; how it stays deterministic and how it
stops), the records and errors are in `service.offline.clip` (re-exported here), the MP4 writer is
`service.offline.mp4`, the progress bar and summary line are `service.offline.console`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pipeline.bidirectional import check_prompt
from pipeline.lingbot.config import (
    ATTENTION_CHOICES,
    DEFAULT_MAX_IMAGE_BYTES,
    DEFAULT_MAX_IMAGE_PIXELS,
    LingBotSessionConfig,
)
from pipeline.lingbot.errors import SessionConfigError
from pipeline.lingbot.graph.actors import ProcessPlacement
from pipeline.lingbot.seam import WorldModel
from service.offline.clip import ChunkRecord, GenerateRequest, GenerateResult, GenerationError, Progress, UsageError
from service.offline.console import ProgressBar, summary_line
from service.offline.control_trace import TraceEntry, TraceError, parse_trace, read_trace_text
from service.offline.driver import check_output_path, config_message, generate

__all__ = [
    "DEFAULT_SECONDS",
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "ChunkRecord",
    "GenerateRequest",
    "GenerateResult",
    "GenerationError",
    "Progress",
    "UsageError",
    "add_arguments",
    "generate",
    "main",
    "model_from_args",
    "run",
]


EXIT_OK = 0
EXIT_FAILED = 1  # the session or the encoder failed during generation
EXIT_USAGE = 2  # bad options or inputs, found before anything was generated
EXIT_INTERRUPTED = 130  # Ctrl-C: the file holds the chunks written so far

DEFAULT_SECONDS = 10.0
"""Clip length when neither --frames nor --seconds is given."""

_RESOLUTION = re.compile(r"^\s*(\d{1,5})\s*[xX]\s*(\d{1,5})\s*$")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `generate`'s options to `parser` (the `lingstream generate` subparser, or a standalone parser)."""
    parser.add_argument(
        "--image", type=Path, metavar="IMG", help="reference image (PNG, JPEG or WebP); default: the built-in scene"
    )
    parser.add_argument(
        "--controls", type=Path, metavar="TRACE", help="control trace, JSON Lines (docs/generate.md); default: no keys"
    )
    parser.add_argument("--out", type=Path, required=True, metavar="OUT.mp4", help="the H.264 MP4 to write")
    parser.add_argument("--seed", type=int, help="noise seed (default 0): same seed, image and trace, same video")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--frames", type=int, metavar="N", help="clip length in frames (4n+1, whole chunks)")
    length.add_argument(
        "--seconds",
        type=float,
        metavar="S",
        help=f"clip length in seconds, rounded down to whole chunks (default {DEFAULT_SECONDS:g})",
    )
    parser.add_argument("--fps", type=int, metavar="F", help="frames per second, 1..60 (default 16)")
    parser.add_argument("--resolution", metavar="WxH", help="frame size, multiples of 16 (default 416x240)")
    parser.add_argument("--chunk-size", type=int, metavar="N", help="latent frames per chunk, 1..16 (default 3)")
    parser.add_argument("--report", type=Path, metavar="REPORT.json", help="write a JSON report of the timings")
    parser.add_argument("--threads", type=int, metavar="N", help="torch CPU threads (default: torch's own choice)")
    parser.add_argument("--no-hud", action="store_true", help="do not draw the held keys on the frames")
    parser.add_argument(
        "--prompt", metavar="TEXT", help="the text prompt the clip starts from (a trace's prompt entries change it)"
    )
    parser.add_argument(
        "--compute-scale", type=float, metavar="X", help="emulate a model X times as costly (reference model, 1..64)"
    )
    parser.add_argument(
        "--model",
        choices=("reference", "lingbot-fast"),
        default=_word_environment("LINGSTREAM_MODEL", "reference"),
        help="the world model (default LINGSTREAM_MODEL, else reference)",
    )
    parser.add_argument(
        "--model-path",
        type=Path,
        metavar="DIR",
        default=os.environ.get("LINGSTREAM_MODEL_PATH") or None,
        help="lingbot-fast model directory (default LINGSTREAM_MODEL_PATH; docs/lingbot-fast.md)",
    )
    parser.add_argument(
        "--model-dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default=_word_environment("LINGSTREAM_MODEL_DTYPE", "auto"),
        help="lingbot-fast dtype (default LINGSTREAM_MODEL_DTYPE, else auto: bfloat16 on CUDA, float32 on CPU)",
    )
    parser.add_argument(
        "--decoder",
        choices=("wan", "tiny"),
        default=_word_environment("LINGSTREAM_DECODER", "wan"),
        help="lingbot-fast's decode stage (default LINGSTREAM_DECODER, else wan): the Wan VAE, or the tiny decoder "
        "from the model directory's tiny_decoder/",
    )
    parser.add_argument(
        "--attention",
        choices=ATTENTION_CHOICES,
        default=_word_environment("LINGSTREAM_ATTENTION", "auto"),
        help="lingbot-fast's attention kernel (default LINGSTREAM_ATTENTION, else auto). A replay is bit-exact only "
        "with the kernel the session ran: on the CPU, auto's flash kernel and math differ in the last bits",
    )
    parser.add_argument(
        "--device", default="cpu", metavar="DEV", help="lingbot-fast device: cpu or cuda:N (default cpu)"
    )
    parser.add_argument(
        "--placement",
        choices=("threads", "processes"),
        default=_word_environment("LINGSTREAM_STAGE_PLACEMENT", "threads"),
        help="where the stages run, as `lingstream serve` places them (default LINGSTREAM_STAGE_PLACEMENT, else "
        "threads)",
    )
    parser.add_argument(
        "--denoise-ranks",
        type=int,
        metavar="P",
        default=_int_environment("LINGSTREAM_DENOISE_RANKS", 1),
        help="ranks of the DiT group with --placement processes (default LINGSTREAM_DENOISE_RANKS, else 1; on CUDA "
        "one GPU each, from --device's on)",
    )


def _word_environment(name: str, default: str) -> str:
    """A choice from the environment as `lingstream serve` reads it (trimmed, lower case); `default` when unset."""
    return os.environ.get(name, default).strip().lower() or default


def _int_environment(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else default


def run(args: argparse.Namespace) -> int:
    """Run `generate` from parsed arguments; returns the exit code (0, 1 failed, 2 bad usage, 130 interrupted)."""
    bar = ProgressBar(sys.stderr) if sys.stderr.isatty() else None
    try:
        request = _request_from_args(args)
        if args.report is not None:
            check_output_path(args.report, None, "--report")
        model, check_config = model_from_args(args, request)
        progress = bar.update if bar is not None else None
        result = asyncio.run(_generate_until_sigint(request, progress, model, check_config))
    except UsageError as exc:
        sys.stderr.write(f"lingstream generate: {exc}\n")
        return EXIT_USAGE
    except GenerationError as exc:
        _finish(bar)
        sys.stderr.write(f"lingstream generate: failed: {exc}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:  # outside generation, or a second Ctrl-C during its cleanup
        _finish(bar)
        sys.stderr.write("lingstream generate: interrupted\n")
        return EXIT_INTERRUPTED
    _finish(bar)
    if args.report is not None:
        try:
            args.report.write_text(json.dumps(result.report(), indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            sys.stderr.write(f"lingstream generate: cannot write the report {args.report}: {exc}\n")
            return EXIT_FAILED
    sys.stderr.write(summary_line(result) + "\n")
    return EXIT_INTERRUPTED if result.interrupted else EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lingstream generate", description="Generate a clip offline from a reference image and a control trace."
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


def _request_from_args(args: argparse.Namespace) -> GenerateRequest:
    if args.frames is not None and args.seconds is not None:
        raise UsageError("give --frames or --seconds, not both")
    check_output_path(args.out, ".mp4", "--out")
    config: dict[str, object] = {}
    if args.frames is not None:
        config["frame_num"] = args.frames
    else:
        seconds = DEFAULT_SECONDS if args.seconds is None else args.seconds
        if not (math.isfinite(seconds) and seconds > 0):
            raise UsageError(f"--seconds must be a positive number, got {seconds:g}")
        config["max_duration_s"] = seconds
    for option, name in (("seed", "seed"), ("fps", "fps"), ("chunk_size", "chunk_size")):
        value = getattr(args, option)
        if value is not None:
            config[name] = value
    if args.compute_scale is not None:
        config["compute_scale"] = args.compute_scale
    if args.no_hud:
        config["hud"] = False
    if args.prompt is not None:
        try:
            config["prompt"] = check_prompt(args.prompt)
        except ValueError as exc:
            raise UsageError(f"--prompt: {exc}") from None
    if args.resolution is not None:
        match = _RESOLUTION.match(args.resolution)
        if match is None:
            raise UsageError(f"--resolution must be WIDTHxHEIGHT (e.g. 416x240), got {args.resolution!r}")
        config["width"], config["height"] = int(match.group(1)), int(match.group(2))
    if args.threads is not None and args.threads < 1:
        raise UsageError(f"--threads must be >= 1, got {args.threads}")
    image = _read_image(args.image) if args.image is not None else None
    entries: tuple[TraceEntry, ...] = ()
    source = "<trace>"
    if args.controls is not None:
        source = args.controls.name or str(args.controls)
        try:
            entries = parse_trace(read_trace_text(args.controls), source)
        except TraceError as exc:
            raise UsageError(str(exc)) from None
    return GenerateRequest(
        out=args.out, config=config, image=image, trace=entries, trace_source=source, torch_threads=args.threads
    )


def _read_image(path: Path) -> bytes:
    try:
        with path.open("rb") as handle:
            return handle.read(DEFAULT_MAX_IMAGE_BYTES + 1)  # one byte over the limit is enough to refuse it
    except OSError as exc:
        raise UsageError(f"--image: cannot read {path}: {exc.strerror or exc}") from None


def model_from_args(
    args: argparse.Namespace, request: GenerateRequest
) -> tuple[WorldModel | ProcessPlacement | None, Callable[[LingBotSessionConfig], None] | None]:
    """None for the reference model on threads (`generate`'s default); LingBot-World-Fast loaded from `--model-path`,
    with the check `lingstream serve` runs at create (`session_limits`: a session the model cannot hold). The check
    runs here first, before any weight is read, so a clip the model cannot hold fails at once with the message create
    gives. With `--placement processes` either model runs in worker processes as `lingstream serve` places them (the
    DiT over `--denoise-ranks` ranks), so an offline render uses every GPU."""
    ranks = args.denoise_ranks
    if ranks < 1:
        raise UsageError(f"--denoise-ranks must be >= 1, got {ranks}")
    if ranks > 1 and args.placement != "processes":
        raise UsageError(f"--denoise-ranks {ranks} needs --placement processes (threads run one rank)")
    if args.model != "lingbot-fast":
        if args.decoder != "wan":
            raise UsageError(f"--decoder {args.decoder} chooses lingbot-fast's decoder (--model lingbot-fast)")
        return (_placement(args, None) if args.placement == "processes" else None), None
    if args.model_path is None:
        raise UsageError("--model lingbot-fast needs --model-path DIR (or LINGSTREAM_MODEL_PATH)")
    try:
        from pipeline.lingbot.models import (
            PLAN_HEIGHT,
            PLAN_WIDTH,
            LingBotFastOptions,
            LingBotFastWorldModel,
            ModelConfigError,
            check_model_dir,
            check_parallel,
            session_limits,
        )
    except ImportError as exc:
        raise UsageError(
            f"--model lingbot-fast needs the lingbot extra (pip install 'lingstream[lingbot]'): {exc}"
        ) from None
    options = LingBotFastOptions(
        str(args.model_path),
        dtype=args.model_dtype,
        denoise_ranks=ranks,
        decoder=args.decoder,
        attention=args.attention,
    )
    check = session_limits(options)
    try:
        check(LingBotSessionConfig.from_mapping(request.config))
    except SessionConfigError as exc:
        raise UsageError(config_message(exc)) from None
    try:
        if args.placement == "processes":
            dit = check_model_dir(
                options.root, decoder=options.decoder
            ).dit  # headers only: the group's rule fails here, not in a worker
            try:
                check_parallel(dit, ranks, dit.frame_tokens(PLAN_HEIGHT // 8, PLAN_WIDTH // 8))
            except ModelConfigError as exc:
                raise UsageError(f"--denoise-ranks {ranks}: {exc}") from None
            return _placement(args, args.model_path), check
        return LingBotFastWorldModel.load(options, args.device), check
    except ImportError as exc:
        raise UsageError(
            f"--model lingbot-fast needs the lingbot extra (pip install 'lingstream[lingbot]'): {exc}"
        ) from None
    except ValueError as exc:  # CheckpointError, ModelConfigError
        raise UsageError(f"--model-path {args.model_path}: {exc}") from None


def _placement(args: argparse.Namespace, model_path: Path | None) -> ProcessPlacement:
    """The worker groups `lingstream serve` would place for one model worker with these options (on CUDA the DiT's
    ranks take `--device`'s GPU and the next ones)."""
    from service.workers import WorkerOptions, process_placement

    ranks = args.denoise_ranks
    devices: tuple[str, ...] = ("cpu",)
    if args.device != "cpu":
        first = int(args.device.partition(":")[2] or 0)
        devices = tuple(f"cuda:{first + rank}" for rank in range(ranks))
    options = WorkerOptions(
        worker_index=0,
        num_workers=1,
        max_sessions_per_worker=1,
        device="cpu" if args.device == "cpu" else "cuda",
        torch_threads=args.threads,
        max_image_bytes=DEFAULT_MAX_IMAGE_BYTES,
        max_image_pixels=DEFAULT_MAX_IMAGE_PIXELS,
        stage_placement="processes",
        denoise_ranks=ranks,
        devices=devices,
        model="lingbot-fast" if model_path is not None else "reference",
        model_path=str(model_path) if model_path is not None else None,
        model_dtype=args.model_dtype,
        attention=args.attention,
        decoder=args.decoder,
    )
    return process_placement(options)


async def _generate_until_sigint(
    request: GenerateRequest,
    on_progress: Callable[[Progress], None] | None,
    model: WorldModel | ProcessPlacement | None = None,
    check_config: Callable[[LingBotSessionConfig], None] | None = None,
) -> GenerateResult:
    """`generate` with SIGINT setting its stop event; a second SIGINT gets Python's default (KeyboardInterrupt)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_sigint() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        installed = True
    except (NotImplementedError, RuntimeError, ValueError):  # not the main thread, or no signals on this platform
        installed = False
    try:
        return await generate(request, model=model, check_config=check_config, on_progress=on_progress, stop=stop)
    finally:
        if installed:
            loop.remove_signal_handler(signal.SIGINT)


def _finish(bar: ProgressBar | None) -> None:
    if bar is not None:
        bar.finish()


if __name__ == "__main__":
    raise SystemExit(main())
