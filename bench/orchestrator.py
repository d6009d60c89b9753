"""Benchmark of the streaming pipeline orchestrator (runs in well under 60 s on 2 cores).

Measures, side by side in one run:
- overlap_ratio: steady-state chunk period ÷ slowest stage time, one session, stages of 20/50/20 ms (time.sleep
  on the actors' threads, which releases the GIL). A serial loop would give 1.8; perfect overlap gives 1.0.
- overhead_us_p50: scheduler cost per stage invocation with no-op stages on the event loop (core + task + wake-up),
  the median over batches; overhead_thread_us_p50 the same with LocalStageActor (adds the thread hop).
- jain_fairness: Jain's index of completed chunks across 32 sessions sharing a one-slot stage.
- sessions_64_throughput_ratio: aggregate chunks/s with 64 sessions ÷ with 1 session on the same 3 stages.

`--quick` is a smoke run of a few seconds over the same path (20 chunks for the overlap, 3 batches of 200 for the
overhead, 0.5 s windows); its figures are not the ones to compare. The last line printed is one JSON object with
every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import time
from collections.abc import Mapping

from _common import jain, report

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

    async def stop(self) -> None:
        return None

    async def invoke(self, call: StageCall) -> Mapping[str, object]:
        return {self._produces: call.sequence_id}

    async def release_session(self, session_id: str) -> None:
        return None

    def statistics(self) -> ActorStatistics:
        return ActorStatistics(self._name, True, 1, 0, 0, 0, 0)


async def run_sessions(
    orch: StreamingPipelineOrchestrator, sessions: int, chunks: int | None, seconds: float | None
) -> tuple[dict[str, list[float]], float]:
    """Feed every session as fast as room allows and read its outputs; return output times per session."""
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
    for sid in ids:
        await orch.close_session(sid, CloseMode.CANCEL)
    return done_at, elapsed


async def overlap_ratio(chunks: int) -> dict[str, float]:
    costs = {"encode": 0.020, "denoise": 0.050, "decode": 0.020}
    async with StreamingPipelineOrchestrator(three_stage_spec(), thread_actors(costs)) as orch:
        times, _ = await run_sessions(orch, 1, chunks, None)
    outputs = times["s0"]
    periods = [b - a for a, b in itertools.pairwise(outputs[10:])]
    period = statistics.median(periods)
    return {"chunk_period_ms": period * 1e3, "slowest_stage_ms": 50.0, "overlap_ratio": period / 0.050}


async def overhead(kind: str, batches: int = 15, chunks: int = 400) -> float:
    samples = []
    for _ in range(batches):
        if kind == "loop":
            produced = {"encode": "a", "denoise": "b", "decode": "out"}
            actors: Mapping[str, object] = {s: LoopActor(s, produced[s]) for s in STAGES}
        else:
            actors = thread_actors(dict.fromkeys(STAGES, 0.0))
        async with StreamingPipelineOrchestrator(three_stage_spec(capacity=8), actors) as orch:  # type: ignore[arg-type]
            _, elapsed = await run_sessions(orch, 1, chunks, None)
        samples.append(elapsed / (chunks * len(STAGES)) * 1e6)
    return statistics.median(samples)


async def fairness(sessions: int = 32, seconds: float = 3.0) -> float:
    spec = StreamingPipelineSpec(
        stages=(StreamingStageSpec("only", consumes=("input",), produces=("out",)),),
        edges=(StreamingEdgeSpec("input", target="only", capacity=2),),
        outputs=("out",),
    )
    actors = {"only": LocalStageActor("only", sleeping_stage("out", 0.001))}
    async with StreamingPipelineOrchestrator(spec, actors) as orch:
        times, _ = await run_sessions(orch, sessions, None, seconds)
    return jain([float(len(t)) for t in times.values()])


async def throughput(sessions: int, seconds: float) -> float:
    costs = {"encode": 0.002, "denoise": 0.005, "decode": 0.002}
    async with StreamingPipelineOrchestrator(three_stage_spec(), thread_actors(costs)) as orch:
        times, elapsed = await run_sessions(orch, sessions, None, seconds)
    return sum(len(t) for t in times.values()) / elapsed


async def main(quick: bool) -> dict[str, float]:
    results: dict[str, float] = {}
    results.update(await overlap_ratio(chunks=20 if quick else 40))
    results["overhead_us_p50"] = await overhead("loop", batches=3 if quick else 15, chunks=200 if quick else 400)
    results["overhead_thread_us_p50"] = await overhead(
        "thread", batches=3 if quick else 15, chunks=200 if quick else 400
    )
    results["jain_fairness"] = await fairness(seconds=0.5 if quick else 3.0)
    one = await throughput(1, 0.5 if quick else 4.0)
    many = await throughput(64, 0.5 if quick else 4.0)
    results["chunks_per_s_1_session"] = one
    results["chunks_per_s_64_sessions"] = many
    results["sessions_64_throughput_ratio"] = many / one
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run of a few seconds (fewer chunks and batches, 0.5 s windows)"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    report(asyncio.run(main(args.quick)), started)
