"""Benchmark of the streaming pipeline orchestrator (runs in well under 60 s on 2 cores).

Measures, side by side in one run:
- overlap_ratio: steady-state chunk period ÷ slowest stage time, one session, stages of 20/50/20 ms (time.sleep
  on the actors' threads, which releases the GIL). A serial loop would give 1.8; perfect overlap gives 1.0.
- overhead_us_p50: scheduler cost per stage invocation with no-op stages on the event loop (core + task + wake-up),
  the median over batches; overhead_thread_us_p50 the same with LocalStageActor (adds the thread hop), and
  overhead_thread_cpu_us_p50 the process CPU it took (the loop's and the stage threads'): on a loaded machine the
  wall figure also counts the waits for a core at every hop, the CPU figure much less.
- overhead_us_by_sessions: the same loop-actor cost per invocation with 1, 64, 256 and 1 024 sessions open and fed
  at once (the same total of chunks spread over them; process CPU time, since all of it runs on the loop's thread;
  the median of rounds that run every count in turn), and overhead_growth_1024_over_1 its ratio: a scheduler whose
  decisions scan the open sessions grows here.
- hop_round_trip_us_p50 (and _cpu_): one LocalStageActor call at a time, no orchestrator — the loop hands a no-op
  call to the stage's thread and awaits its outcome, the hop's own price with nothing overlapping it;
  thread_ping_pong_us_p50: two bare threads passing an item back and forth through `queue.SimpleQueue`s, the floor
  this machine puts under any hand-over that wakes a sleeping thread (two wake-ups a round). overhead_thread_us_p50
  ÷ hop_round_trip_us_p50 (`overhead_thread_over_hop`) says what the scheduler adds, and how much the three stage
  threads overlap their hops: below 1, the pipeline beats one call at a time.
- jain_fairness: Jain's index of completed chunks across 32 sessions sharing a one-slot stage.
- sessions_64_throughput_ratio: aggregate chunks/s with 64 sessions ÷ with 1 session on the same 3 thread-actor
  stages (2/5/2 ms), each session with its own awaiting feeder and reader; sessions_64_throughput_ratio_polling the
  same with one polling client instead (every millisecond, on absolute deadlines, it tops up every session with
  `try_submit` and drains it with `get_nowait`, as a service loop serving many sessions would). Windows of 1 and 64
  sessions alternate (four of each, 1 s), and the ratio is of their medians: on a shared machine a load change
  between two long windows moved the ratio by 0.1.

`--quick` is a smoke run of a few seconds over the same path (20 chunks for the overlap, 3 batches of 200 for the
overhead, 2 048 chunks per session count, one 0.5 s window of each); its figures are not the ones to compare. The
last line printed is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import queue
import statistics
import threading
import time
from collections.abc import Awaitable, Callable, Mapping

from bench._common import jain, report
from pipeline import (
    ActorStatistics,
    CloseMode,
    DeathListener,
    FunctionStage,
    LocalStageActor,
    StageCall,
    StreamingEdgeSpec,
    StreamingPipelineOrchestrator,
    StreamingPipelineSpec,
    StreamingStageSpec,
)

STAGES = ("encode", "denoise", "decode")


def three_stage_spec(capacity: int = 2) -> StreamingPipelineSpec:
    return StreamingPipelineSpec(
        stages=(
            StreamingStageSpec("encode", consumes=("input",), produces=("a",)),
            StreamingStageSpec("denoise", consumes=("a",), produces=("b",)),
            StreamingStageSpec("decode", consumes=("b",), produces=("out",)),
        ),
        edges=(
            StreamingEdgeSpec("input", target="encode", capacity=capacity),
            StreamingEdgeSpec("a", target="denoise", source="encode", capacity=capacity),
            StreamingEdgeSpec("b", target="decode", source="denoise", capacity=capacity),
        ),
        outputs=("out",),
        output_capacity=capacity,
        latency_anchor_artifact="input",
    )


def sleeping_stage(produces: str, seconds: float) -> FunctionStage:
    def run(call: StageCall) -> Mapping[str, object]:
        if seconds:
            time.sleep(seconds)
        return {produces: call.sequence_id}

    return FunctionStage(run)


def thread_actors(costs: Mapping[str, float]) -> dict[str, LocalStageActor]:
    produced = {"encode": "a", "denoise": "b", "decode": "out"}
    return {s: LocalStageActor(s, sleeping_stage(produced[s], costs[s])) for s in STAGES}


class LoopActor:
    """A no-op actor on the event loop: isolates the scheduler's own cost."""

    def __init__(self, name: str, produces: str) -> None:
        self._name = name
        self._produces = produces

    name = property(lambda self: self._name)
    capacity = property(lambda self: 1)
    healthy = property(lambda self: True)
    incarnation = property(lambda self: 1)

    def add_death_listener(self, listener: DeathListener) -> None:
        return None

    async def start(self) -> None:
        return None

    async def aclose(self) -> None:
        return None

    async def invoke(self, call: StageCall) -> Mapping[str, object]:
        return {self._produces: call.sequence_id}

    async def release_session(self, session_id: str) -> None:
        return None

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(self._name, True, 1, 0, 0, 0, 0)


async def run_sessions(
    orch: StreamingPipelineOrchestrator, sessions: int, chunks: int | None, seconds: float | None
) -> tuple[dict[str, list[float]], float, float]:
    """Feed every session as fast as room allows and read its outputs; return output times per session, the
    elapsed wall time and the process CPU time it took (sessions opened before and closed after either)."""
    done_at: dict[str, list[float]] = {}
    stop = asyncio.Event()

    async def feed(sid: str) -> None:
        i = 0
        while not stop.is_set() and (chunks is None or i < chunks):
            await orch.submit(sid, {"input": (i, i)})
            i += 1

    async def read(sid: str) -> None:
        stream = orch.outputs(sid)
        times = done_at[sid]
        while chunks is None or len(times) < chunks:
            await anext(stream)
            times.append(time.perf_counter())
            if stop.is_set():
                return

    ids = [f"s{i}" for i in range(sessions)]
    for sid in ids:
        orch.open_session(sid)
        done_at[sid] = []
    start = time.perf_counter()
    cpu_start = time.process_time()
    tasks = [asyncio.create_task(feed(sid)) for sid in ids] + [asyncio.create_task(read(sid)) for sid in ids]
    if seconds is not None:
        await asyncio.sleep(seconds)
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    else:
        await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    for sid in ids:
        await orch.close_session(sid, CloseMode.CANCEL)
    return done_at, elapsed, cpu


async def overlap_ratio(chunks: int) -> dict[str, float]:
    costs = {"encode": 0.020, "denoise": 0.050, "decode": 0.020}
    async with StreamingPipelineOrchestrator(three_stage_spec(), thread_actors(costs)) as orch:
        times, _, _ = await run_sessions(orch, 1, chunks, None)
    outputs = times["s0"]
    periods = [b - a for a, b in itertools.pairwise(outputs[10:])]
    period = statistics.median(periods)
    return {"chunk_period_ms": period * 1e3, "slowest_stage_ms": 50.0, "overlap_ratio": period / 0.050}


async def overhead(kind: str, batches: int = 15, chunks: int = 400) -> tuple[float, float]:
    """Median wall and process-CPU microseconds per invocation over `batches` runs of one session."""
    samples = []
    cpu_samples = []
    for _ in range(batches):
        if kind == "loop":
            produced = {"encode": "a", "denoise": "b", "decode": "out"}
            actors: Mapping[str, object] = {s: LoopActor(s, produced[s]) for s in STAGES}
        else:
            actors = thread_actors(dict.fromkeys(STAGES, 0.0))
        async with StreamingPipelineOrchestrator(three_stage_spec(capacity=8), actors) as orch:  # type: ignore[arg-type]
            _, elapsed, cpu = await run_sessions(orch, 1, chunks, None)
        samples.append(elapsed / (chunks * len(STAGES)) * 1e6)
        cpu_samples.append(cpu / (chunks * len(STAGES)) * 1e6)
    return statistics.median(samples), statistics.median(cpu_samples)


async def hop_round_trip(calls: int, batches: int) -> tuple[float, float]:
    """Median wall and process-CPU microseconds of one awaited `LocalStageActor.invoke` of a no-op stage."""
    actor = LocalStageActor("hop", sleeping_stage("out", 0.0))
    await actor.start()
    samples: list[float] = []
    cpu_samples: list[float] = []
    try:
        for _ in range(batches):
            start, cpu_start = time.perf_counter(), time.process_time()
            for i in range(calls):
                await actor.invoke(StageCall("hop", "s0", i, {}))
            samples.append((time.perf_counter() - start) / calls * 1e6)
            cpu_samples.append((time.process_time() - cpu_start) / calls * 1e6)
    finally:
        await actor.aclose()
    return statistics.median(samples), statistics.median(cpu_samples)


def thread_ping_pong(rounds: int, batches: int) -> float:
    """Median microseconds per round of two threads handing an item back and forth (two wake-ups a round)."""
    there: queue.SimpleQueue[int | None] = queue.SimpleQueue()
    back: queue.SimpleQueue[int] = queue.SimpleQueue()

    def echo() -> None:
        while (item := there.get()) is not None:
            back.put(item)

    thread = threading.Thread(target=echo, name="ping-pong")
    thread.start()
    samples: list[float] = []
    try:
        for _ in range(batches):
            start = time.perf_counter()
            for i in range(rounds):
                there.put(i)
                back.get()
            samples.append((time.perf_counter() - start) / rounds * 1e6)
    finally:
        there.put(None)
        thread.join()
    return statistics.median(samples)


async def overhead_by_sessions(counts: tuple[int, ...], total_chunks: int, rounds: int) -> dict[int, float]:
    """Loop-actor cost per invocation with each count of sessions open, `total_chunks` spread over them, in process
    CPU time (everything runs on the loop's thread, so another process on the machine does not count); every round
    runs each count in turn (a load change touches them alike), and the median per count is kept."""
    produced = {"encode": "a", "denoise": "b", "decode": "out"}
    samples: dict[int, list[float]] = {n: [] for n in counts}
    for _ in range(rounds):
        for n in counts:
            chunks = max(1, total_chunks // n)
            actors = {s: LoopActor(s, produced[s]) for s in STAGES}
            async with StreamingPipelineOrchestrator(three_stage_spec(capacity=8), actors) as orch:
                _, _, cpu = await run_sessions(orch, n, chunks, None)
            samples[n].append(cpu / (n * chunks * len(STAGES)) * 1e6)
    return {n: statistics.median(values) for n, values in samples.items()}


async def run_polling(orch: StreamingPipelineOrchestrator, sessions: int, seconds: float, period: float) -> float:
    """One client polls every session each `period` (absolute deadlines): drains its readable outputs with
    `get_nowait`, then submits while `try_submit` accepts. Returns outputs per second over `seconds`."""
    ids = [f"s{i}" for i in range(sessions)]
    streams = {sid: orch.open_session(sid) for sid in ids}
    next_seq = dict.fromkeys(ids, 0)
    outputs = 0
    loop = asyncio.get_running_loop()
    started = loop.time()
    tick = started
    while loop.time() - started < seconds:
        for sid in ids:
            stream = streams[sid]
            while stream.get_nowait() is not None:
                outputs += 1
            while orch.try_submit(sid, {"input": (next_seq[sid], next_seq[sid])}):
                next_seq[sid] += 1
        tick += period
        await asyncio.sleep(max(0.0, tick - loop.time()))
    elapsed = loop.time() - started
    for sid in ids:
        await orch.close_session(sid, CloseMode.CANCEL)
    return outputs / elapsed


async def fairness(sessions: int = 32, seconds: float = 3.0) -> float:
    spec = StreamingPipelineSpec(
        stages=(StreamingStageSpec("only", consumes=("input",), produces=("out",)),),
        edges=(StreamingEdgeSpec("input", target="only", capacity=2),),
        outputs=("out",),
    )
    actors = {"only": LocalStageActor("only", sleeping_stage("out", 0.001))}
    async with StreamingPipelineOrchestrator(spec, actors) as orch:
        times, _, _ = await run_sessions(orch, sessions, None, seconds)
    return jain([float(len(t)) for t in times.values()])


async def throughput(sessions: int, seconds: float) -> float:
    costs = {"encode": 0.002, "denoise": 0.005, "decode": 0.002}
    async with StreamingPipelineOrchestrator(three_stage_spec(), thread_actors(costs)) as orch:
        times, elapsed, _ = await run_sessions(orch, sessions, None, seconds)
    return sum(len(t) for t in times.values()) / elapsed


async def polling_throughput(sessions: int, seconds: float) -> float:
    costs = {"encode": 0.002, "denoise": 0.005, "decode": 0.002}
    async with StreamingPipelineOrchestrator(three_stage_spec(), thread_actors(costs)) as orch:
        return await run_polling(orch, sessions, seconds, period=0.001)


async def main(quick: bool) -> dict[str, object]:
    results: dict[str, object] = {}
    results.update(await overlap_ratio(chunks=20 if quick else 40))
    results["overhead_us_p50"], _ = await overhead("loop", batches=3 if quick else 15, chunks=200 if quick else 400)
    thread_us, results["overhead_thread_cpu_us_p50"] = await overhead(
        "thread", batches=3 if quick else 15, chunks=200 if quick else 400
    )
    hop_batches, hop_calls = (3, 500) if quick else (15, 2000)
    hop_us, results["hop_round_trip_cpu_us_p50"] = await hop_round_trip(hop_calls, hop_batches)
    results["overhead_thread_us_p50"], results["hop_round_trip_us_p50"] = thread_us, hop_us
    results["overhead_thread_over_hop"] = thread_us / hop_us
    results["thread_ping_pong_us_p50"] = thread_ping_pong(hop_calls, hop_batches)
    by_sessions = await overhead_by_sessions(
        (1, 64, 256, 1024), total_chunks=2048 if quick else 8192, rounds=1 if quick else 5
    )
    results["overhead_us_by_sessions"] = {str(n): round(us, 2) for n, us in by_sessions.items()}
    results["overhead_growth_1024_over_1"] = by_sessions[1024] / by_sessions[1]
    results["jain_fairness"] = await fairness(seconds=0.5 if quick else 3.0)
    window, rounds = (0.5, 1) if quick else (1.0, 4)
    for suffix, measure in (("", throughput), ("_polling", polling_throughput)):
        one, many = await alternating(measure, window, rounds)
        results[f"chunks_per_s_1_session{suffix}"] = one
        results[f"chunks_per_s_64_sessions{suffix}"] = many
        results[f"sessions_64_throughput_ratio{suffix}"] = many / one
    return results


async def alternating(
    measure: Callable[[int, float], Awaitable[float]], window: float, rounds: int
) -> tuple[float, float]:
    """Median chunks/s of 1 and of 64 sessions over `rounds` alternating windows of each."""
    one: list[float] = []
    many: list[float] = []
    for _ in range(rounds):
        one.append(await measure(1, window))
        many.append(await measure(64, window))
    return statistics.median(one), statistics.median(many)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds (fewer chunks and batches, 0.5 s windows)"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    report(asyncio.run(main(args.quick)), started)
