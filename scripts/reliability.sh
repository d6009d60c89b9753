#!/usr/bin/env bash
# Regenerates docs/reliability.md (issue #8): runs the reliability tests (tests/reliability, junit XML report) and
# `python -m bench.load --quick`, then writes the report from their results. With --soak it also runs the soak (12 minutes
# of churn; memory is judged over its last 5, after a 7-minute warm-up: `python -m bench.load --minutes 12 --warmup 420`)
# and records its figures; without it, the soak figures already in the report are kept.
#
#   bash scripts/reliability.sh            # tests + quick load run (about 2 minutes on 2 cores)
#   bash scripts/reliability.sh --soak     # the same, plus the soak (15 minutes in all)
#
# Exits non-zero when a test fails or a load figure misses its bound (errors_5xx, slots_leaked, sessions_lost, the
# server's exit code); the report is written in every case.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
SOAK=0
[ "${1:-}" = "--soak" ] && SOAK=1
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

status=0
echo "== reliability tests"
started=$(date +%s)
$PY -m pytest tests/reliability -p no:cacheprovider -q --junitxml "$work/junit.xml" || status=$?
echo $(( $(date +%s) - started )) > "$work/tests_seconds"

echo "== python -m bench.load --quick"
$PY -m bench.load --quick | tee "$work/quick.txt" || status=$?
if [ "$SOAK" = 1 ]; then
  echo "== python -m bench.load --minutes 12 --warmup 420"
  $PY -m bench.load --minutes 12 --warmup 420 | tee "$work/soak.txt" || status=$?
fi

$PY - "$work" "$SOAK" <<'PYTHON' || status=$?
"""Writes docs/reliability.md from the junit XML, the load runs' last lines and the tests' own docstrings."""

import ast
import datetime
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

NOTES = """
## Sessions that outlive their worker (issue #33)

With `processes` placement a model-worker group that dies (or a stage that raises) no longer fails its sessions:
each is rebuilt from its checkpoint on the restarted group and goes on with the same id, slot and picture (state
`recovering`, then `running`); only a session that cannot be rebuilt fails, with `model_failure`. The design, the
budget, what stays held and the figures (`python -m bench.continuity`) are in docs/continuity.md;
`test_process_recovery.py` is the proof (the frames after a SIGKILL equal an uninterrupted run's).
`test_process_faults.py` keeps testing the worker without recovery (`LingBotService(recovery=None)`, as on threads
and for `lingbot-fast`): there the sessions fail as before.

## Defects the tests found, and their fixes

| test that found it | defect | fix |
|---|---|---|
| `test_model_faults.py::test_a_failing_cleanup_hook_poisons_the_session_id_until_the_retry_succeeds` | When a stage's per-session release failed, the session id stayed poisoned for ever and the stage's cache for it stayed resident: nothing ever called `retry_release`. | `pipeline/lingbot/policy/service.py`: `LingBotService._retry_release` retries the failed releases in the background with exponential back-off (`release_retry_s`, 0.5 s doubling to 30 s, 10 attempts, then an error log; `stop()` cancels it). |
| `test_transport_faults.py::test_a_peer_that_never_consumes_its_data_channel_leaves_the_service_buffers_bounded` | A browser that stops acknowledging its data channel (frozen, or hostile) made the service keep every status message it sent in aiortc's unbounded SCTP queue for the whole session (in the test: 21.7 KB held after 300 statuses against a 4 KiB bound, growing linearly). | `transport/embedded/transport.py` `send_status` drops status messages (counted: `status_dropped_congested`) while the channel holds more than `EmbeddedConfig.status_buffer_bytes` (64 KiB, new, `transport/config.py`) unacknowledged. |
| the same test (its end) | Stopping the app right after a session ended cancelled the session's runner while it was still detaching the transport: the peer connection stayed half-closed (ICE transport `completed`, its UDP socket leaked). | `service/runtime/runtime.py` `aclose`: after the sessions are idle, wait for the runners to finish (detach included) within the same shutdown deadline before cancelling what is left. |
| `test_client_faults.py::test_an_sse_subscriber_that_never_reads_keeps_a_bounded_buffer_and_is_released_when_it_goes` | An SSE client that stopped reading and then disconnected left its subscription registered (Starlette cancels the stream without closing its body iterator), so the session kept publishing to it until the garbage collector found the generator. | `service/http/routes.py`: the event stream is an `_EventStreamResponse` that closes its subscription whenever it ends. |
| `test_security.py::test_cors_answers_only_configured_origins` | With CORS configured, origins that are not configured still got `Access-Control-Allow-Methods/-Headers/-Max-Age` on a refused preflight (a plain-text 400, not the one error shape) and `Access-Control-Expose-Headers` on every other answer. | `service/http/middleware.py` `StrictCORSMiddleware` (used by `service/app.py`): no CORS header at all for an origin that is not configured; a refused preflight answers `{"error": {"code": "bad_request", ...}}`. |
| `bench/load.py` (the 5-minute soak) | RSS crept up under session churn (+0.87 MB/min in the second half of the soak, still rising at its end) although the malloc heap in use stayed flat: glibc gave each of the service's many threads (event loop, stage threads, aiortc's codec and network threads, torch's pool) an arena of its own, up to 8 per core, and each kept what was freed into it. Finished sessions were also larger than needed (four `asyncio.Event`s with their waiter deques, per-instance dicts: 5.9 KB each in the history). | `service/telemetry/heap.py` + `service/cli.py`: `lingstream serve` limits glibc to `LINGSTREAM_MALLOC_ARENAS` arenas (default 2; `MALLOC_ARENA_MAX` wins) before its threads start; `service/runtime/fanout.py` `Flag` (a one-way event that allocates only while waited on) and `__slots__` on `Session` and `Broadcast` (2.8 KB per finished session); `LINGSTREAM_SESSION_HISTORY` (default 256) bounds every finished-session record; `/metrics` shows the heap (`lingstream_process_heap_*`) so a leak (in use grows) and fragmentation (free grows) can be told apart. |

## What was knowingly left

- **Memory grows for about six minutes, then stays flat.** The newest `LINGSTREAM_SESSION_HISTORY` finished
  sessions (default 256) stay readable by GET, with their admission tickets, close reports and summaries (the
  oldest are forgotten); each holds 2.8 KB of Python objects (tracemalloc, in-process) and 10-20 KB of RSS with the
  allocator pages it keeps from being returned. Other bounded windows (recent session lengths for Retry-After, lease
  wait times, the orchestrator's recent results) fill too, and Python's object arenas and the two malloc arenas
  settle. In a 12-minute run (`python -m bench.load --minutes 12`, 1 103 sessions, 2026-11-30) RSS rose from 359.0 MB
  after the first 2.4 minutes to 361.8 MB at 6 minutes and then stayed at 361.8-362.0 MB to the end (second-half
  slope 0.016 MB/min, second-half peak 0.1 MB above the first's), with the malloc heap in use falling 2.9 MB. Plain
  5-minute runs (warm-up: their first minute) end inside that rise: second-half slopes of 0.02-0.7 MB/min in four
  runs on 2026-11-30, so the soak leaves 7 minutes out. A larger history moves the plateau out and up (with 1 024,
  +0.75-1.1 MB/min over a 5-minute run).
- **Never-reading HTTP connections are capped only when asked.** uvicorn has no write timeout: a client that never
  reads holds its connection and one subscription of at most 16 snapshots until it disconnects. Set
  `LINGSTREAM_MAX_CONNECTIONS` (uvicorn's `limit_concurrency`: a plain-text 503 beyond it, before the app) or put a
  proxy in front for a hard cap.
- **The service runs thread actors only.** The SIGKILL test drives `ParallelWorkerStageActor` through the real
  service with a test model worker (`tests/support/process_world.py`, one stage in a spawned process per model
  worker), since `LingBotService` places its stages on `LocalStageActor` threads.
- **LiveKit's own buffers.** The LiveKit binding hands status messages to the livekit SDK; its buffering under a
  slow subscriber can only be observed against a real LiveKit server (none here). Control from the wrong identity
  was tested over the scripted room.
- A release that keeps failing is retried 10 times (about 2.5 minutes), then left poisoned and logged; the
  `lingstream_pipeline_sessions_poisoned` gauge shows it.
"""

work, soak_ran = Path(sys.argv[1]), sys.argv[2] == "1"
report = Path("docs/reliability.md")
MARK = "<!-- soak-json: "


def last_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    lines = [line for line in path.read_text().splitlines() if line.startswith("{")]
    return json.loads(lines[-1]) if lines else None


quick = last_json(work / "quick.txt")
soak = last_json(work / "soak.txt") if soak_ran else None
soak_command = "bash scripts/reliability.sh --soak  (python -m bench.load --minutes 12 --warmup 420)"
if soak is None and report.exists():
    kept = re.search(re.escape(MARK) + r"(\{.*\}) -->", report.read_text())
    if kept:
        soak = json.loads(kept.group(1))

# -- the tests ---------------------------------------------------------------------------------------------------
results: dict[str, dict[str, dict]] = defaultdict(dict)
for case in ET.parse(work / "junit.xml").getroot().iter("testcase"):
    module = case.get("classname", "").rsplit(".", 1)[-1]
    name = case.get("name", "")
    entry = results[module].setdefault(name, {"passed": 0, "failed": 0, "skipped": 0, "time": 0.0})
    entry["time"] += float(case.get("time", 0))
    if case.find("failure") is not None or case.find("error") is not None:
        entry["failed"] += 1
    elif case.find("skipped") is not None:
        entry["skipped"] += 1
    else:
        entry["passed"] += 1


def intro(module: str) -> str:
    source = Path("tests/reliability") / f"{module}.py"
    doc = ast.get_docstring(ast.parse(source.read_text())) or ""
    return " ".join(doc.split())


def sentence(name: str) -> str:
    base = re.sub(r"\[.*\]$", "", name).removeprefix("test_").replace("_", " ")
    return base[:1].upper() + base[1:]


def verdict(entry: dict) -> str:
    if entry["failed"]:
        return f"**FAILED** ({entry['failed']} of {entry['passed'] + entry['failed']})"
    if entry["skipped"] and not entry["passed"]:
        return "skipped"
    runs = entry["passed"]
    return "held" if runs == 1 else f"held ({runs} cases)"


totals = {k: sum(e[k] for m in results.values() for e in m.values()) for k in ("passed", "failed", "skipped")}
tests_seconds = int((work / "tests_seconds").read_text())
SECTIONS = [
    ("test_model_faults", "Faults in the model workers"),
    ("test_transport_faults", "Faults in the transport"),
    ("test_client_faults", "Clients that misbehave"),
    ("test_drain_under_load", "SIGTERM under load"),
    ("test_http_fuzz", "Bad input: OpenAPI and route fuzzing"),
    ("test_protocol_fuzz", "Bad input: the control protocol decoder"),
    ("test_bad_input", "Bad input: bodies, images, content types, fields, configs, identities"),
    ("test_security", "Security"),
]
known = {module for module, _ in SECTIONS}
SECTIONS += [(module, module) for module in sorted(results) if module not in known]

# -- the load figures --------------------------------------------------------------------------------------------
FIGURES = [
    ("sessions_created", "sessions created (201 + 202)", None),
    ("sessions_completed", "sessions completed (closed after running, full client life cycle)", None),
    ("sessions_lost", "sessions without a terminal status seen by their client", "must be 0"),
    ("rejected_429", "creates refused 429 (queue full)", None),
    ("missing_retry_after", "429s without Retry-After", "must be 0"),
    ("queued_202", "creates queued 202", None),
    ("expired_heartbeat", "vanished queued clients expired (heartbeat_lost)", None),
    ("failed", "sessions failed", "must be 0"),
    ("errors_5xx", "answers >= 500", "must be 0"),
    ("slots_leaked", "slots leaked (retained + mismatch + pipeline leaks + live, from /metrics after the run)", "must be 0"),
    ("create_p50_ms", "POST /v1/sessions p50 (ms)", None),
    ("create_p99_ms", "POST /v1/sessions p99 (ms)", None),
    ("peer_sessions", "sessions joined by a real aiortc peer", None),
    ("peer_chunks", "chunk statuses those peers received", None),
    ("lease_fairness_index", "Jain's index of chunks per concurrent peer session (time-weighted)", "1.0 = even"),
    ("lease_fairness_min", "worst window's Jain's index", None),
    ("rss_ready_mb", "server RSS when ready (MB)", None),
    ("rss_start_mb", "server RSS after the warm-up (MB)", None),
    ("rss_end_mb", "server RSS at the end (MB)", None),
    ("rss_growth_mb", "RSS growth after the warm-up (MB)", "flat"),
    ("rss_slope_mb_per_min", "RSS slope after the warm-up (MB/min)", "flat"),
    ("rss_slope_last_half_mb_per_min", "RSS slope, second half (MB/min)", "flat"),
    ("rss_peak_growth_last_half_mb", "RSS peak of the second half minus that of the first, after the warm-up (MB)", "flat"),
    ("heap_in_use_start_mb", "malloc heap in use after the warm-up (MB, /metrics)", None),
    ("heap_in_use_end_mb", "malloc heap in use at the end (MB)", None),
    ("heap_in_use_growth_mb", "malloc heap in use, growth after the warm-up (MB): a leak grows it", "flat"),
    ("heap_free_end_mb", "malloc heap held free at the end (MB): fragmentation grows it", None),
    ("heap_arenas", "malloc arenas (`LINGSTREAM_MALLOC_ARENAS`)", None),
    ("session_history", "finished sessions kept readable (`LINGSTREAM_SESSION_HISTORY`)", None),
    ("serve_exit_code", "`lingstream serve` exit code after SIGTERM", "must be 0"),
    ("server_tracebacks", "tracebacks in the server's log", "must be 0"),
    ("duration_s", "load duration (s)", None),
    ("warmup_s", "warm-up left out of the RSS and heap figures (s)", None),
]


def show(run: dict | None, key: str) -> str:
    if run is None or key not in run:
        return "—"
    value = run[key]
    return f"{value:g}" if isinstance(value, float) else str(value)


bounds_ok = True
for run in (quick, soak if soak_ran else None):
    if run is not None:
        for key in ("errors_5xx", "slots_leaked", "sessions_lost", "failed", "serve_exit_code", "missing_retry_after"):
            bounds_ok &= run.get(key) in (0, 0.0)
        bounds_ok &= not run.get("problems")

now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
out: list[str] = []
w = out.append
w("# Reliability report (issue #8)")
w("")
w(f"Generated {now} by `bash scripts/reliability.sh` (do not edit by hand: the script rewrites this file). It runs")
w("the reliability tests in `tests/reliability/` with a junit report and `python -m bench.load --quick`; `--soak` adds the")
w("soak (12 minutes of churn, memory judged over the last 5). Everything runs on this machine (2 cores), on")
w("127.0.0.1 only.")
w("")
w(f"**Tests:** {totals['passed']} passed, {totals['failed']} failed, {totals['skipped']} skipped in {tests_seconds} s "
  "(`.venv/bin/pytest tests/reliability`). **Load:** " + ("all bounds held." if bounds_ok else "**a bound was missed** (see the figures)."))
w("")
w("## What was tried and what held")
w("")
for module, title in SECTIONS:
    if module not in results:
        continue
    w(f"### {title}")
    w("")
    w(intro(module))
    w("")
    w("| test | result | time (s) |")
    w("|---|---|---|")
    for name, entry in results[module].items():
        w(f"| {sentence(name)} (`{module}.py::{name}`) | {verdict(entry)} | {entry['time']:.2f} |")
    w("")

w("## Load, churn and soak: `bench/load.py`")
w("")
w("A real `lingstream serve` on a free loopback port with the embedded WebRTC transport and the **real reference")
w("world model** (`LingBotService`: three stage threads, the execution lease) at 64x48, chunk_size 1, compute_scale 8,")
w("one torch thread; one model worker with 4 session slots and a queue of 6 (heartbeat 3 s). Every 4 s a wave of 14")
w("clients (more than slots + queue: some queue, some get 429) runs the whole life cycle: create, SSE events or GET")
w("polling, a real aiortc peer (`tests/support/fakes/webrtc_client.py`) for 3 in 7 that holds keys (a `control_state` every")
w("250 ms), counts `chunk` statuses, sends `stop` and waits for `done`; DELETE (drain or cancel) for the others; 1 in 7")
w("vanishes while queued. Every session must reach a terminal status its client saw. RSS is the server's VmRSS from")
w("`/proc/<pid>/status` every 1 s (quick) or 2 s (soak); the warm-up left out of the memory figures is the first")
w("fifth of the quick run and the first 7 minutes of the soak (bounded histories and caches fill, the allocator")
w("arenas settle: about 6 minutes, 550 sessions, under this load), so the soak judges memory over 5 minutes. The fake world")
w("(`--world fake`, the test hook) is available for pure churn; the figures below use the reference model. The quick")
w("run's RSS figures are dominated by the warm-up (30 s); flatness is judged on the soak. The server keeps the")
w("service's defaults for the finished-session history (`LINGSTREAM_SESSION_HISTORY`, 256) and the malloc arenas")
w("(`LINGSTREAM_MALLOC_ARENAS`, 2); the heap figures come from its `/metrics` (`lingstream_process_heap_*`).")
w("")
soak_label = "soak: 12 min, the last 5 measured"
if soak is not None:
    soak_label += f" ({soak.get('started_at', '?')})"
w(f"| figure | bound | quick run (this report) | {soak_label} |")
w("|---|---|---|---|")
for key, label, bound in FIGURES:
    w(f"| {label} (`{key}`) | {bound or ''} | {show(quick, key)} | {show(soak, key)} |")
w("")
if quick is not None:
    w("Quick run, last line of `.venv/bin/python -m bench.load --quick`:")
    w("")
    w("```json")
    w(json.dumps(quick))
    w("```")
    w("")
if soak is not None:
    w(f"Soak, started {soak.get('started_at')} with `{soak_command}`, last line:")
    w("")
    w("```json")
    w(json.dumps(soak))
    w("```")
    w("")
    w(MARK + json.dumps(soak) + " -->")
    w("")
w(NOTES.strip())
report.write_text("\n".join(out).rstrip() + "\n")
print(f"wrote {report}")
sys.exit(0 if bounds_ok and totals["failed"] == 0 else 1)
PYTHON
exit "$status"
