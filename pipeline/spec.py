"""Pipeline specs and graph validation.

A streaming pipeline is a DAG of typed artifacts: stages consume and produce named artifacts, bounded edges carry
one artifact from an external ingress or a producing stage to one consuming stage, and some produced artifacts are
the pipeline's outputs. `validate_pipeline` checks a `StreamingPipelineSpec` and compiles it into a
`PipelineGraph` (indices, topological order) that the scheduling core runs on. Every rejection names the culprit.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from pipeline.errors import PipelineSpecError

__all__ = [
    "PipelineGraph",
    "StageOrdering",
    "StreamingEdgeSpec",
    "StreamingPipelineSpec",
    "StreamingResourceGroupSpec",
    "StreamingStageSpec",
    "validate_pipeline",
]


class StageOrdering(enum.Enum):
    # Within a session the stage runs sequences 0, 1, 2, ... one at a time (causal order of stateful updates).
    PER_SESSION_STRICT = "per_session_strict"
    # Any sequence whose inputs are joined may run, up to the stage's per-session limit; outputs are still
    # delivered in sequence order.
    NONE = "none"


@dataclass(frozen=True, slots=True)
class StreamingStageSpec:
    """One logical stage: what it consumes and produces and how much of it may run at once.

    `max_in_flight` is the stage's global limit across sessions (None: the actor's capacity decides);
    `max_in_flight_per_session` must be 1 under strict ordering. A stage joins a resource group only by naming it.
    """

    stage_id: str
    consumes: tuple[str, ...]
    produces: tuple[str, ...]
    ordering: StageOrdering = StageOrdering.PER_SESSION_STRICT
    max_in_flight_per_session: int = 1
    max_in_flight: int | None = None
    resource_group: str | None = None


@dataclass(frozen=True, slots=True)
class StreamingEdgeSpec:
    """One bounded artifact path into `target`: from the stage `source`, or from outside when `source` is None.

    `capacity` bounds, per session, the items buffered on the edge plus those reserved by in-flight producers.
    """

    artifact: str
    target: str
    source: str | None = None
    capacity: int = 2


@dataclass(frozen=True, slots=True)
class StreamingResourceGroupSpec:
    """An explicit shared-concurrency limit: at most `max_concurrency` calls of its member stages at once."""

    name: str
    max_concurrency: int = 1


@dataclass(frozen=True, slots=True)
class StreamingPipelineSpec:
    """The whole graph.

    `outputs` are produced artifacts delivered to each session's output stream (in sequence order), each bounded
    per session by `output_capacity`. `latency_anchor_artifact` is the external input whose acceptance starts the
    control-to-output clock of a sequence.
    """

    stages: tuple[StreamingStageSpec, ...]
    edges: tuple[StreamingEdgeSpec, ...]
    outputs: tuple[str, ...]
    output_capacity: int = 2
    resource_groups: tuple[StreamingResourceGroupSpec, ...] = ()
    latency_anchor_artifact: str | None = None


@dataclass(frozen=True, slots=True)
class PipelineGraph:
    """A validated spec compiled to indices. Edge and stage indices are positions in `spec`'s tuples."""

    spec: StreamingPipelineSpec
    stage_index: Mapping[str, int]
    topo_order: tuple[int, ...]
    external_artifacts: tuple[str, ...]
    # artifact -> indices of the ingress edges that carry it from outside
    ingress_edges: Mapping[str, tuple[int, ...]]
    # stage index -> indices of the edges into it (one per consumed artifact)
    in_edges: tuple[tuple[int, ...], ...]
    # stage index -> produced artifact -> indices of the edges leaving with it
    out_edges: tuple[Mapping[str, tuple[int, ...]], ...]
    producer: Mapping[str, int]
    output_set: frozenset[str] = field(default_factory=frozenset)

    @property
    def stages(self) -> tuple[StreamingStageSpec, ...]:
        return self.spec.stages

    @property
    def edges(self) -> tuple[StreamingEdgeSpec, ...]:
        return self.spec.edges

    def release_order(self) -> tuple[str, ...]:
        """Stage ids in reverse topological order: the order per-session state is released in."""
        return tuple(self.spec.stages[i].stage_id for i in reversed(self.topo_order))


def validate_pipeline(spec: StreamingPipelineSpec) -> PipelineGraph:
    """Check `spec` and compile it; raise `PipelineSpecError` naming the first culprit found."""
    if not spec.stages:
        raise PipelineSpecError("the pipeline has no stages")
    stage_index: dict[str, int] = {}
    for i, stage in enumerate(spec.stages):
        if not stage.stage_id:
            raise PipelineSpecError(f"stage #{i} has an empty stage_id")
        if stage.stage_id in stage_index:
            raise PipelineSpecError(f"duplicate stage id {stage.stage_id!r}")
        stage_index[stage.stage_id] = i

    groups: dict[str, StreamingResourceGroupSpec] = {}
    for group in spec.resource_groups:
        if group.name in groups:
            raise PipelineSpecError(f"duplicate resource group {group.name!r}")
        if group.max_concurrency < 1:
            raise PipelineSpecError(f"resource group {group.name!r} has max_concurrency {group.max_concurrency} < 1")
        groups[group.name] = group

    producer: dict[str, int] = {}
    for i, stage in enumerate(spec.stages):
        _check_stage(stage, groups)
        for artifact in stage.produces:
            if artifact in producer:
                other = spec.stages[producer[artifact]].stage_id
                raise PipelineSpecError(
                    f"artifact {artifact!r} has two producers: stages {other!r} and {stage.stage_id!r}"
                )
            producer[artifact] = i

    if spec.output_capacity < 1:
        raise PipelineSpecError(f"output_capacity {spec.output_capacity} < 1")
    if not spec.outputs:
        raise PipelineSpecError("the pipeline declares no outputs")
    if len(set(spec.outputs)) != len(spec.outputs):
        raise PipelineSpecError(f"duplicate output artifacts in {spec.outputs!r}")
    for artifact in spec.outputs:
        if artifact not in producer:
            raise PipelineSpecError(f"output {artifact!r} has no producer stage")

    in_edges: list[list[int]] = [[] for _ in spec.stages]
    out_edges: list[dict[str, list[int]]] = [{} for _ in spec.stages]
    ingress: dict[str, list[int]] = {}
    seen_paths: set[tuple[str, str]] = set()
    for e, edge in enumerate(spec.edges):
        where = f"edge #{e} ({edge.artifact!r} -> {edge.target!r})"
        if edge.capacity < 1:
            raise PipelineSpecError(f"{where} has capacity {edge.capacity} < 1")
        if edge.target not in stage_index:
            raise PipelineSpecError(f"{where} targets unknown stage {edge.target!r}")
        target = spec.stages[stage_index[edge.target]]
        if edge.artifact not in target.consumes:
            raise PipelineSpecError(f"{where}: stage {edge.target!r} does not consume {edge.artifact!r}")
        if (edge.artifact, edge.target) in seen_paths:
            raise PipelineSpecError(f"{where} duplicates another edge carrying {edge.artifact!r} to {edge.target!r}")
        seen_paths.add((edge.artifact, edge.target))
        if edge.source is None:
            if edge.artifact in producer:
                owner = spec.stages[producer[edge.artifact]].stage_id
                raise PipelineSpecError(
                    f"{where} is an external ingress, but {edge.artifact!r} is produced by stage {owner!r}"
                )
            ingress.setdefault(edge.artifact, []).append(e)
        else:
            if edge.source not in stage_index:
                raise PipelineSpecError(f"{where} comes from unknown stage {edge.source!r}")
            source = spec.stages[stage_index[edge.source]]
            if edge.artifact not in source.produces:
                raise PipelineSpecError(f"{where}: stage {edge.source!r} does not produce {edge.artifact!r}")
            out_edges[stage_index[edge.source]].setdefault(edge.artifact, []).append(e)
        in_edges[stage_index[edge.target]].append(e)

    outputs = frozenset(spec.outputs)
    for i, stage in enumerate(spec.stages):
        delivered = {spec.edges[e].artifact for e in in_edges[i]}
        for artifact in stage.consumes:
            if artifact not in delivered:
                raise PipelineSpecError(f"stage {stage.stage_id!r} consumes {artifact!r} but no edge delivers it")
        for artifact in stage.produces:
            if artifact not in out_edges[i] and artifact not in outputs:
                raise PipelineSpecError(
                    f"stage {stage.stage_id!r} produces {artifact!r}, which goes nowhere (no edge, not an output)"
                )

    topo = _topological_order(spec, stage_index, in_edges)
    _check_reachable(spec, topo, in_edges, producer, stage_index)

    if spec.latency_anchor_artifact is not None and spec.latency_anchor_artifact not in ingress:
        raise PipelineSpecError(
            f"latency_anchor_artifact {spec.latency_anchor_artifact!r} is not an external input "
            f"(external inputs: {sorted(ingress)})"
        )

    return PipelineGraph(
        spec=spec,
        stage_index=stage_index,
        topo_order=topo,
        external_artifacts=tuple(sorted(ingress)),
        ingress_edges={a: tuple(es) for a, es in ingress.items()},
        in_edges=tuple(tuple(es) for es in in_edges),
        out_edges=tuple({a: tuple(es) for a, es in outs.items()} for outs in out_edges),
        producer=producer,
        output_set=outputs,
    )


def _check_stage(stage: StreamingStageSpec, groups: Mapping[str, StreamingResourceGroupSpec]) -> None:
    name = stage.stage_id
    if not stage.consumes:
        raise PipelineSpecError(f"stage {name!r} consumes nothing; every stage needs at least one input")
    if not stage.produces:
        raise PipelineSpecError(f"stage {name!r} produces nothing")
    for label, artifacts in (("consumes", stage.consumes), ("produces", stage.produces)):
        if len(set(artifacts)) != len(artifacts):
            raise PipelineSpecError(f"stage {name!r} {label} an artifact twice: {artifacts!r}")
    both = set(stage.consumes) & set(stage.produces)
    if both:
        raise PipelineSpecError(f"stage {name!r} consumes and produces {sorted(both)}: a cycle")
    if stage.max_in_flight_per_session < 1:
        raise PipelineSpecError(f"stage {name!r} has max_in_flight_per_session {stage.max_in_flight_per_session} < 1")
    if stage.max_in_flight is not None and stage.max_in_flight < 1:
        raise PipelineSpecError(f"stage {name!r} has max_in_flight {stage.max_in_flight} < 1")
    if stage.ordering is StageOrdering.PER_SESSION_STRICT and stage.max_in_flight_per_session != 1:
        raise PipelineSpecError(
            f"stage {name!r} uses PER_SESSION_STRICT ordering with max_in_flight_per_session "
            f"{stage.max_in_flight_per_session}; strict ordering runs one sequence per session at a time"
        )
    if stage.resource_group is not None and stage.resource_group not in groups:
        raise PipelineSpecError(f"stage {name!r} names undeclared resource group {stage.resource_group!r}")


def _topological_order(
    spec: StreamingPipelineSpec, stage_index: Mapping[str, int], in_edges: list[list[int]]
) -> tuple[int, ...]:
    # Kahn's algorithm, iterative; ties broken by declaration order so the order is deterministic.
    indegree = [0] * len(spec.stages)
    children: list[list[int]] = [[] for _ in spec.stages]
    for i, edges in enumerate(in_edges):
        for e in edges:
            source = spec.edges[e].source
            if source is not None:
                indegree[i] += 1
                children[stage_index[source]].append(i)
    ready = [i for i, d in enumerate(indegree) if d == 0]
    order: list[int] = []
    while ready:
        ready.sort()
        i = ready.pop(0)
        order.append(i)
        for child in children[i]:
            indegree[child] -= 1
            if indegree[child] == 0:
                ready.append(child)
    if len(order) != len(spec.stages):
        stuck = sorted(spec.stages[i].stage_id for i, d in enumerate(indegree) if d > 0)
        raise PipelineSpecError(f"the graph has a cycle through stages {stuck}")
    return tuple(order)


def _check_reachable(
    spec: StreamingPipelineSpec,
    topo: tuple[int, ...],
    in_edges: list[list[int]],
    producer: Mapping[str, int],
    stage_index: Mapping[str, int],
) -> None:
    # A stage can run only when all its inputs can arrive: from outside or from a stage that can run.
    runnable = [False] * len(spec.stages)
    for i in topo:
        sources = (spec.edges[e].source for e in in_edges[i])
        runnable[i] = all(source is None or runnable[stage_index[source]] for source in sources)
    for artifact in spec.outputs:
        if not runnable[producer[artifact]]:
            raise PipelineSpecError(
                f"output {artifact!r} is unreachable: stage {spec.stages[producer[artifact]].stage_id!r} "
                "can never receive all its inputs"
            )
