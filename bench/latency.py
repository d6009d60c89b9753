"""Key-to-photon latency as a player feels it: from a key event in real Chromium to the first presented video frame
generated from it (issue #16).

A real `lingstream serve` (the reference model, embedded WebRTC transport, one torch thread) and a real headless
Chromium on the page at `/`. The model draws the applied keys on every frame (`pipeline/lingbot/hud.py`); the bench
asks `draw_hud` itself where a lit key's amber box lies, and the page reads those pixels of every presented frame
(requestVideoFrameCallback + a canvas). A trial arms a watcher for one key's expected state, sends the key through
Playwright's keyboard (the page's own control handling sends the snapshot), and takes the time from the key event
(`event.timeStamp`) to the callback of the first presented frame showing that state. Each trial, in order:

- press: from rest (no key held, the session idle), press `w`; wait for `w` lit: `press_*`.
- change while held: after holding `w` a random time (uniform over one chunk, so the press lands anywhere in the
  chunk), press `d` as well; wait for `d` lit: `change_while_held_*`.
- release: after a random time, release both; wait for `w` dark: `release_*`.

`hud_photon_*` is what the page's own HUD reported meanwhile as *Control → photon* (its last 20 figures, every
applied snapshot, held-key repeats included), to check the HUD against the pixels. The page ends each at the first
presented frame of the chunk that applied the snapshot, found exactly on either transport: by RTP timestamp
(`first_frame_pts`) on the embedded one, by LiveKit frame metadata (`first_frame_id`) on LiveKit, where
`livekit_frames_by_id` counts the frames the page presented with the service's frame id (0 elsewhere).

At the session defaults (416x240, 16 fps, chunk_size 3: 12 frames a chunk) and again with chunk_size 1 (4 frames),
keys prefixed `chunk1_`, each with the session's default `schedule` (just in time) and then, side by side in the same
run and server, with the old one (`schedule: media_clock`), keys prefixed `media_clock_`. `underrun_pct` is the
share of the frames of a session's chunks (the chunk statuses the page received) that the stream stood still for,
waiting for a late chunk (the `underrun` timing of each chunk, in frame slots). Percentiles are
`pipeline.metrics.percentile`. `trials` is how many of each.

`wholechunk_` (and `wholechunk_chunk1_`) repeat the just-in-time sessions on a second server, started beside the first,
that decodes whole chunks (`LINGSTREAM_PROGRESSIVE_DECODE=false`), each right after the same session on the first
(which decodes progressively, the default: a chunk's first frames are sent as soon as its first latent frame is
decoded). Both servers run from the start, and only one has a session at a time.

`jitter0_` repeats the defaults with the page asking its receiver for a jitter buffer target of 0 ms
(`?jitter_ms=0`, RTCRtpReceiver `jitterBufferTarget`); `receiver_target_ms` is what the receiver reported
(-1: none set, the browser's own choice), so the comparison shows whether the hint was taken.

`first_press_after_idle_*` (at the defaults, just in time): presses from a long rest (`IDLE_REST_S`, 10 s as
issue #16 asks; while no key is held the reference model generates nothing), each released again before the next
rest; `press_*` rests under a second. Keep-warm side by side: two servers run at once, one at the embedded
transport's default (keep-warm off: no frames at all while idle) and one with `LINGSTREAM_IDLE_FRAME_INTERVAL_MS`
250 (the last frame sent again every 250 ms while nothing new comes), a page on each; their presses after idle
alternate, and `keepwarm_on_first_press_after_idle_*` are the second's. `idle_cpu_pct` / `keepwarm_on_idle_cpu_pct`:
the CPU the server process (and its children) used while its session was idle, in percent of one core, the median
over the rests (each from 2 s into the rest, when the release's chunk is long done, to the press).

`livekit_` repeats the defaults (press, change while held, release, first press after idle, idle CPU) through
LiveKit: the service's participant (the real `livekit` SDK) and the page's livekit-client meet through a real
`livekit-server` (the release scripts/setup.sh --dev builds; an SFU, it forwards the service's packets) in a private
network namespace (`tests/support/livekit_stack.py`), as bench/transport_frames.py does, at LiveKit's default
keep-warm (100 ms); then presses after idle side by side, as on the embedded transport: a second `lingstream serve`
on the same server with keep-warm off, a page on each, their presses after idle alternating (6 each; `--quick`: 1),
measure `livekit_first_press_after_idle_*` / `livekit_idle_cpu_pct` against
`livekit_keepwarm_off_first_press_after_idle_*` / `livekit_keepwarm_off_idle_cpu_pct`, so that a load that changes
during the run weighs on both settings alike. The page waits for the service's track, not for a first frame: through
the SFU it may subscribe after the session's first chunk went out, and with keep-warm off nothing more comes until a
key is pressed (so its first press, not timed, brings the first picture). Skipped, with a note, where the namespace
cannot be made (it needs root) or livekit-server is not installed.

`--quick` runs 1 trial of each at both sizes with the default schedule, whole chunks at the defaults only, and 1 press
after a 1.5 s rest (a smoke run, about a minute with LiveKit); the full run 12 and 5 presses after idle,
both schedules, whole chunks at both sizes. With `--quick` the LiveKit part's stack (livekit-server and its two
services) starts at once, on a thread of its own, beside the embedded part, and its presses wait until the embedded
part is done (so no two presses overlap; the embedded figures then carry the stack's start-up load, which a smoke run
may); the full run starts it after the embedded part, on a quiet machine. `--idle-only` runs only the presses after
idle and the idle CPU (keep-warm on and off, both transports). The last line printed is one JSON object with every
figure. Skipped, with a note and an empty report, without Chromium or Playwright.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import random
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import torch

from bench._common import CHROMIUM, CHROMIUM_ARGS, Server, report
from pipeline.lingbot.hud import draw_hud
from pipeline.metrics import percentile

_CHROMIUM_PRESENT = Path(CHROMIUM).exists()
WIDTH, HEIGHT, FPS = 416, 240, 16
_LIT = (255, 196, 40)
_RESULT_TIMEOUT_MS = 15_000
IDLE_REST_S = 10.0  # the rest before a `first_press_after_idle` trial (--quick: 1.5 s)
_IDLE_SETTLE_S = 2.0  # idle CPU is measured from this far into a rest (--quick: 0.5 s)
KEEPWARM_OFF = {"LINGSTREAM_IDLE_FRAME_INTERVAL_MS": "0"}  # LiveKit's default is 100 ms
KEEPWARM_ON = {"LINGSTREAM_IDLE_FRAME_INTERVAL_MS": "250"}  # the embedded transport's default is off

# The watcher: every presented frame, the HUD region is drawn on a canvas and each key's box classified lit/dark.
_WATCH_JS = """
(spec) => {
  const video = document.getElementById("video");
  const canvas = document.createElement("canvas");
  canvas.width = spec.region.w; canvas.height = spec.region.h;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  const state = { armed: null, results: [], frames: 0, lit: {} };
  window.__latency = state;
  const onKey = (event) => { if (state.armed && state.armed.t0 === null) state.armed.t0 = event.timeStamp; };
  window.addEventListener("keydown", onKey, true);
  window.addEventListener("keyup", onKey, true);
  state.arm = (key, lit) => { state.armed = { key, lit, t0: null }; };
  const onFrame = (now) => {
    const { x, y, w, h } = spec.region;
    ctx.drawImage(video, x, y, w, h, 0, 0, w, h);
    const data = ctx.getImageData(0, 0, spec.region.w, spec.region.h).data;
    for (const [key, pixels] of Object.entries(spec.keys)) {
      let r = 0, b = 0;
      for (const [x, y] of pixels) {
        const at = 4 * ((y - spec.region.y) * spec.region.w + (x - spec.region.x));
        r += data[at]; b += data[at + 2];
      }
      r /= pixels.length; b /= pixels.length;
      state.lit[key] = r > 170 && r - b > 80;
    }
    state.frames += 1;
    const armed = state.armed;
    if (armed && armed.t0 !== null && now > armed.t0 && state.lit[armed.key] === armed.lit) {
      state.results.push(now - armed.t0);
      state.armed = null;
    }
    video.requestVideoFrameCallback(onFrame);
  };
  video.requestVideoFrameCallback(onFrame);
}
"""


def hud_pixels(keys: tuple[str, ...]) -> dict[str, Any]:
    """Where `draw_hud` paints each key's lit amber (its glyph and border excluded), and the box around them all."""
    blank = torch.zeros((1, HEIGHT, WIDTH, 3), dtype=torch.uint8)
    lit = torch.tensor(_LIT, dtype=torch.uint8)
    pixels: dict[str, list[tuple[int, int]]] = {}
    for key in keys:
        mask = (draw_hud(blank, [key])[0] == lit).all(dim=-1)
        ys, xs = torch.nonzero(mask, as_tuple=True)
        # Away from the glyph and the border, where the codec blurs the least: every second amber pixel will do.
        pixels[key] = [(int(x), int(y)) for x, y in zip(xs.tolist(), ys.tolist(), strict=True)][::2]
    every = [point for points in pixels.values() for point in points]
    x0, y0 = min(p[0] for p in every), min(p[1] for p in every)
    x1, y1 = max(p[0] for p in every), max(p[1] for p in every)
    return {"keys": pixels, "region": {"x": x0, "y": y0, "w": x1 - x0 + 1, "h": y1 - y0 + 1}}


async def _timed(page: Any, key: str, lit: bool, action: Any) -> float:
    await page.evaluate("([key, lit]) => window.__latency.arm(key, lit)", [key, lit])
    count = await page.evaluate("window.__latency.results.length")
    await action()
    await page.wait_for_function(f"window.__latency.results.length > {count}", timeout=_RESULT_TIMEOUT_MS)
    value: float = await page.evaluate("window.__latency.results[window.__latency.results.length - 1]")
    return value


_COLLECT_CHUNKS_JS = """
() => {
  const seen = window.__chunks || (window.__chunks = {});
  for (const chunk of window.lingstream.chunks) seen[chunk.index] = chunk.timings;
}
"""


async def _underrun_pct(page: Any, chunk_size: int) -> float:
    """The share of the chunks' frame slots the stream stood still for (`underrun` timings), in percent."""
    frames, stalled = await page.evaluate(
        """([fps, size]) => {
          let frames = 0, stalled = 0;
          for (const [index, timings] of Object.entries(window.__chunks || {})) {
            frames += Number(index) === 0 ? 4 * (size - 1) + 1 : 4 * size;
            stalled += Math.ceil((timings.underrun || 0) * fps - 1e-9);
          }
          return [frames, stalled];
        }""",
        [FPS, chunk_size],
    )
    return 100.0 * stalled / frames if frames else 0.0


def _cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) the process `pid` and its live descendants used so far (from /proc)."""
    children: dict[int, list[int]] = {}
    times: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        times[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += times.get(current, 0.0)
        todo.extend(children.get(current, []))
    return total


_PAGE_STATE_JS = """
() => ({
  state: window.lingstream.state,
  connection: window.lingstream.connection,
  frames: window.lingstream.frames,
  chunks: window.lingstream.chunks.map((chunk) => [chunk.index, chunk.keys]),
  lastSent: window.lingstream.lastSent,
  watcher: window.__latency
    ? { frames: window.__latency.frames, lit: window.__latency.lit, armed: window.__latency.armed }
    : null,
  message: document.getElementById("message").innerText,
  video: {
    subscribed: document.getElementById("video").srcObject !== null,
    readyState: document.getElementById("video").readyState,
    width: document.getElementById("video").videoWidth,
  },
})
"""


async def _open(browser: Any, url: str, config: dict[str, Any], query: str = "") -> Any:
    """A page on `url` streaming a session with `config`, the watcher armed, a first press and release done."""
    page = await browser.new_page()
    page.set_default_timeout(30_000)

    async def with_config(route: Any) -> None:
        request = route.request
        if request.method != "POST":
            await route.continue_()
            return
        body = request.post_data_json or {}
        body.setdefault("config", {}).update(config)
        await route.continue_(post_data=json.dumps(body))

    await page.route("**/v1/sessions", with_config)
    await page.goto(f"{url}/{query}")
    await page.wait_for_function("window.lingstream !== undefined")
    await page.fill("#width", str(WIDTH))
    await page.fill("#height", str(HEIGHT))
    await page.fill("#fps", str(FPS))
    await page.click("#start")
    try:
        # Subscribed: the page has the service's video track. Not its first frame: through a real LiveKit server the
        # page may subscribe after the session's first chunk went out (the SFU forwards, it does not re-encode), and
        # with keep-warm off nothing more comes until a key is pressed, so the first press below brings the first
        # picture. Polled on a timer: a page gets no animation frames to poll on while it is not the one in front.
        await page.wait_for_function("document.getElementById('video').srcObject !== null", polling=100)
    except Exception as exc:
        raise RuntimeError(f"the page got no video track: {await page.evaluate(_PAGE_STATE_JS)}") from exc
    # The controls are live once the page sent its first control state (on its link's open). A key pressed before
    # that is dropped by the page, and a key held by Playwright sends no repeats: that press never comes (seen in
    # CI, where the data channel opened after the video track: two chunks, no picture of the press in 15 s).
    try:
        await page.wait_for_function("window.lingstream.lastSent !== null", polling=100)
    except Exception as exc:
        raise RuntimeError(f"the page's controls never went live: {await page.evaluate(_PAGE_STATE_JS)}") from exc
    await page.evaluate(_WATCH_JS, hud_pixels(("w", "d")))
    await page.focus("#stage")
    # A first press and release so that the stream is up and the watcher has seen frames.
    try:
        await _timed(page, "w", True, lambda: page.keyboard.down("w"))
    except Exception as exc:
        raise RuntimeError(
            f"the page showed no picture of the first press: {await page.evaluate(_PAGE_STATE_JS)}"
        ) from exc
    await _timed(page, "w", False, lambda: page.keyboard.up("w"))
    return page


async def _idle_press(
    page: Any, rest_s: float, settle_s: float, rng: random.Random, chunk_s: float, pids: dict[str, int]
) -> tuple[float, dict[str, float]]:
    """Rest `rest_s` (no key held), press `w` and time it, release. Also the CPU (percent of a core) each process of
    `pids` used from `settle_s` into the rest to its end."""
    await asyncio.sleep(settle_s)  # from the release's presented frame: the release's chunk is done by then
    before = {label: _cpu_seconds(pid) for label, pid in pids.items()}
    started = time.monotonic()
    await asyncio.sleep(rest_s - settle_s)
    elapsed = time.monotonic() - started
    cpu = {label: 100.0 * (_cpu_seconds(pid) - before[label]) / elapsed for label, pid in pids.items()}
    figure = await _timed(page, "w", True, lambda: page.keyboard.down("w"))
    await asyncio.sleep(rng.uniform(0.1, 0.1 + chunk_s))
    await _timed(page, "w", False, lambda: page.keyboard.up("w"))
    await page.evaluate(_COLLECT_CHUNKS_JS)
    return figure, cpu


async def _close(page: Any) -> None:
    await page.click("#stop")
    await page.wait_for_function("window.lingstream.state === 'closed' || window.lingstream.ended")
    await page.close()


async def _session(
    browser: Any,
    url: str,
    config: dict[str, Any],
    trials: int,
    rng: random.Random,
    query: str = "",
    *,
    idle_trials: int = 0,
    idle_rest_s: float = IDLE_REST_S,
    pid: int | None = None,
) -> dict[str, list[float]]:
    chunk_size = int(config["chunk_size"])
    chunk_s = 4 * chunk_size / FPS
    page = await _open(browser, url, config, query)
    figures: dict[str, list[float]] = {"press": [], "change_while_held": [], "release": []}
    for _ in range(trials):
        await asyncio.sleep(rng.uniform(0.3, 0.3 + chunk_s))  # rest: the session goes idle
        figures["press"].append(await _timed(page, "w", True, lambda: page.keyboard.down("w")))
        await asyncio.sleep(rng.uniform(0.2, 0.2 + chunk_s))

        async def change() -> None:
            await page.keyboard.down("d")

        figures["change_while_held"].append(await _timed(page, "d", True, change))
        await asyncio.sleep(rng.uniform(0.1, 0.1 + chunk_s))

        async def release() -> None:
            await page.keyboard.up("w")
            await page.keyboard.up("d")

        figures["release"].append(await _timed(page, "w", False, release))
        await page.evaluate(_COLLECT_CHUNKS_JS)
    if idle_trials:
        figures["first_press_after_idle"] = []
        if pid is not None:
            figures["idle_cpu_pct"] = []
    for _ in range(idle_trials):
        settle = min(_IDLE_SETTLE_S, idle_rest_s / 3)
        figure, cpu = await _idle_press(page, idle_rest_s, settle, rng, chunk_s, {} if pid is None else {"": pid})
        figures["first_press_after_idle"].append(figure)
        if pid is not None:
            figures["idle_cpu_pct"].append(cpu[""])
    figures["hud_photon"] = await page.evaluate("window.lingstream.photonsMs")
    figures["frames_by_id"] = [float(await page.evaluate("window.lingstream.framesById"))]
    figures["underrun_pct"] = [await _underrun_pct(page, chunk_size)]
    target = await page.evaluate("window.lingstream.jitterBufferTarget")
    figures["receiver_target_ms"] = [-1.0 if target is None else float(target)]
    await _close(page)
    return figures


async def _keepwarm_side_by_side(
    playwright: Any, servers: dict[str, tuple[str, int]], trials: int, rest_s: float, rng: random.Random
) -> dict[str, float]:
    """Presses after idle on two servers at once (`servers`: key prefix -> the service's URL and process id; one at
    keep-warm's default, one with it the other way), alternating which goes first; every rest measures every
    server's idle CPU. A browser per server, so that no page is a background tab (whose video the browser may stop
    presenting); the browsers start, and their pages open, at the same time (nothing is measured before the first
    rest)."""
    launched = await asyncio.gather(
        *(playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS) for _ in servers),
        return_exceptions=True,
    )
    try:
        failed = [browser for browser in launched if isinstance(browser, BaseException)]
        if failed:
            raise failed[0]
        return await _alternate(dict(zip(servers, launched, strict=True)), servers, trials, rest_s, rng)
    finally:
        for browser in launched:
            if not isinstance(browser, BaseException):
                await browser.close()


async def _alternate(
    browsers: dict[str, Any], servers: dict[str, tuple[str, int]], trials: int, rest_s: float, rng: random.Random
) -> dict[str, float]:
    opened = [_open(browsers[prefix], url, {"chunk_size": 3}) for prefix, (url, _) in servers.items()]
    pages = dict(zip(servers, await asyncio.gather(*opened), strict=True))
    pids = {prefix: pid for prefix, (_, pid) in servers.items()}
    presses: dict[str, list[float]] = {prefix: [] for prefix in servers}
    cpu: dict[str, list[float]] = {prefix: [] for prefix in servers}
    order = list(servers)
    settle = min(_IDLE_SETTLE_S, rest_s / 3)
    for trial in range(trials):
        for prefix in order if trial % 2 == 0 else order[::-1]:
            figure, used = await _idle_press(pages[prefix], rest_s, settle, rng, 4 * 3 / FPS, pids)
            presses[prefix].append(figure)
            for label, value in used.items():
                cpu[label].append(value)
    for page in pages.values():
        await _close(page)
    out: dict[str, float] = {}
    for prefix in servers:
        out[f"{prefix}first_press_after_idle_p50_ms"] = percentile(presses[prefix], 50) or 0.0
        out[f"{prefix}first_press_after_idle_p90_ms"] = percentile(presses[prefix], 90) or 0.0
        out[f"{prefix}idle_cpu_pct"] = percentile(cpu[prefix], 50) or 0.0
    return out


def _summary(prefix: str, figures: dict[str, list[float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, values in figures.items():
        if name in ("underrun_pct", "receiver_target_ms", "frames_by_id"):
            out[f"{prefix}{name}"] = values[0]
            continue
        if name == "idle_cpu_pct":
            out[f"{prefix}{name}"] = percentile(values, 50) or 0.0
            continue
        out[f"{prefix}{name}_p50_ms"] = percentile(values, 50) or 0.0
        out[f"{prefix}{name}_p90_ms"] = percentile(values, 90) or 0.0
    out[f"{prefix}trials"] = float(len(figures["press"]))
    return out


async def _livekit(
    quick: bool, trials: int, rng: random.Random, proceed: Callable[[], bool] | None = None
) -> dict[str, float]:
    """The defaults through LiveKit (`livekit_` keys), then presses after idle side by side with a second service
    on the same server with keep-warm off (`livekit_keepwarm_off_`); empty, with a note, where the stack cannot run.
    `proceed` (blocking, called once the stack is up): whether to go on to the presses (`_EarlyLiveKit`)."""
    from tests.support.livekit_stack import LiveKitStack, another_replica, livekit_stack

    reason = LiveKitStack.skip_reason()
    if reason is not None:
        print(f"latency: LiveKit part skipped ({reason})", file=sys.stderr)
        return {}
    from playwright.async_api import async_playwright

    # The loop's thread enters the namespace: livekit-server, both services and Chromium are all started from it.
    settings = {"LINGSTREAM_LOG_LEVEL": "WARNING", "LINGSTREAM_MAX_SESSIONS_PER_WORKER": "1"}
    results: dict[str, float] = {}
    with (
        tempfile.TemporaryDirectory() as folder,
        livekit_stack(Path(folder), **settings) as stack,
        another_replica(stack, Path(folder), **settings, **KEEPWARM_OFF) as off,
    ):
        if proceed is not None and not await asyncio.to_thread(proceed):
            return {}
        async with async_playwright() as playwright:
            if trials:
                browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    figures = await _session(browser, stack.url, {"chunk_size": 3}, trials, rng)
                finally:
                    await browser.close()
                results |= _summary("livekit_", figures)
            results |= await _keepwarm_side_by_side(
                playwright,
                {"livekit_": (stack.url, stack.process.pid), "livekit_keepwarm_off_": (off.url, off.process.pid)},
                1 if quick else 6,
                1.5 if quick else IDLE_REST_S,
                rng,
            )
    return results


class _EarlyLiveKit:
    """`--quick`: the LiveKit part started at once on a thread of its own, beside the embedded part. The thread enters
    the private network namespace with `livekit_stack`, so everything the part starts is born inside it (its
    services, its Chromium), while the embedded part's servers and browser stay outside. Once the stack is up, the
    part waits for `result()` (after the embedded part: its presses never overlap the embedded ones, and `rng` is
    drawn from in the same order as when the parts ran one after the other) or `abandon()` (the embedded part
    failed: the stack is torn down unused). Either awaits the thread's end, so nothing it started outlives `main`."""

    def __init__(self, trials: int, rng: random.Random) -> None:
        self._go = threading.Event()
        self._run = False
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="latency-livekit")
        self._future = self._executor.submit(asyncio.run, _livekit(True, trials, rng, self._proceed))

    def _proceed(self) -> bool:
        self._go.wait()
        return self._run

    async def _finish(self) -> dict[str, float]:
        self._go.set()
        try:
            return await asyncio.wrap_future(self._future)
        finally:
            self._executor.shutdown(wait=False)

    async def result(self) -> dict[str, float]:
        self._run = True
        return await self._finish()

    async def abandon(self) -> None:
        try:
            await self._finish()
        except Exception as exc:  # the embedded part's failure is the one to report
            print(f"latency: the LiveKit part, abandoned, failed too: {exc!r}", file=sys.stderr)


async def main(quick: bool, idle_only: bool = False) -> dict[str, float]:
    if importlib.util.find_spec("playwright") is None:
        print("latency: skipped (playwright is not installed)", file=sys.stderr)
        return {}
    if not _CHROMIUM_PRESENT:
        print(f"latency: skipped (no Chromium at {CHROMIUM})", file=sys.stderr)
        return {}
    trials = 1 if quick else 12
    rng = random.Random(16)
    settings = {"LINGSTREAM_TORCH_THREADS": "1", "LINGSTREAM_LOG_LEVEL": "WARNING"}
    results: dict[str, float] = {}
    early = _EarlyLiveKit(0 if idle_only else trials, rng) if quick else None
    try:
        results |= await _embedded(quick, idle_only, trials, rng, settings)
    except BaseException:
        if early is not None:
            await early.abandon()
        raise
    if early is not None:
        results |= await early.result()
    else:
        results |= await _livekit(quick, 0 if idle_only else trials, rng)
    return results


async def _embedded(
    quick: bool, idle_only: bool, trials: int, rng: random.Random, settings: dict[str, str]
) -> dict[str, float]:
    """The embedded transport's figures (the module docstring): three servers side by side, one Chromium."""
    from playwright.async_api import async_playwright

    results: dict[str, float] = {}
    whole_settings = {**settings, "LINGSTREAM_PROGRESSIVE_DECODE": "false"}
    with (
        tempfile.TemporaryDirectory() as folder,
        Server(Path(folder) / "serve.log", settings) as server,
        Server(Path(folder) / "serve-whole.log", whole_settings) as whole,
        Server(Path(folder) / "serve-keepwarm-on.log", settings | KEEPWARM_ON) as server_on,
    ):
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                async with httpx.AsyncClient(timeout=5.0) as client:
                    await server.wait_ready(client)
                    await whole.wait_ready(client)
                    await server_on.wait_ready(client)
                schedules = (("just_in_time", ""), ("media_clock", "media_clock_"))
                for schedule, prefix in () if idle_only else schedules[:1] if quick else schedules:
                    for chunk_size, size_prefix in ((3, ""), (1, "chunk1_")):
                        config = {"chunk_size": chunk_size, "schedule": schedule}
                        figures = await _session(browser, server.url, config, trials, rng)
                        results |= _summary(prefix + size_prefix, figures)
                        if prefix or (quick and size_prefix):
                            continue
                        # The same session on the server that decodes whole chunks, right after it.
                        figures = await _session(browser, whole.url, config, trials, rng)
                        results |= _summary("wholechunk_" + size_prefix, figures)
                if not idle_only:
                    # The receiver asked to keep no jitter buffer beyond what it needs (`?jitter_ms=0`).
                    figures = await _session(browser, server.url, {"chunk_size": 3}, trials, rng, "?jitter_ms=0")
                    results |= _summary("jitter0_", figures)
            finally:
                await browser.close()
            # Presses after a long rest at the defaults (keep-warm off) and with keep-warm on, side by side.
            results |= await _keepwarm_side_by_side(
                playwright,
                {"": (server.url, server.process.pid), "keepwarm_on_": (server_on.url, server_on.process.pid)},
                1 if quick else 5,
                1.5 if quick else IDLE_REST_S,
                rng,
            )
        await asyncio.gather(
            *(asyncio.to_thread(process.stop, 30.0) for process in (server, whole, server_on)),
        )
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: 1 trial of each, the default schedule only (about a minute)",
    )
    parser.add_argument(
        "--idle-only",
        action="store_true",
        help="only the presses after idle and the idle CPU, keep-warm on and off (both transports)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    report(asyncio.run(main(args.quick, args.idle_only)), started)
