"""Pipeline specs shared by the orchestrator tests."""

from __future__ import annotations

from pipeline.spec import (
    StageOrdering,
    StreamingEdgeSpec,
    StreamingPipelineSpec,
    StreamingResourceGroupSpec,
    StreamingStageSpec,
)


def linear_spec(
    *stage_ids: str, capacity: int = 2, output_capacity: int = 2, anchor: str | None = "input"
) -> StreamingPipelineSpec:
    """input -> s0 -> a0 -> s1 -> a1 -> ... -> out."""
    ids = stage_ids or ("encode", "denoise", "decode")
    stages = []
    edges = []
    previous = "input"
    for i, stage_id in enumerate(ids):
        produced = "out" if i == len(ids) - 1 else f"a{i}"
        stages.append(StreamingStageSpec(stage_id, consumes=(previous,), produces=(produced,)))
        edges.append(
            StreamingEdgeSpec(previous, target=stage_id, source=None if i == 0 else ids[i - 1], capacity=capacity)
        )
        previous = produced
    return StreamingPipelineSpec(
        stages=tuple(stages),
        edges=tuple(edges),
        outputs=("out",),
        output_capacity=output_capacity,
        latency_anchor_artifact=anchor,
    )


def join_spec(capacity: int = 2) -> StreamingPipelineSpec:
    """The LingBot shape: condition -> encode -> cond; denoise joins cond with external control -> decode -> frames."""
    return StreamingPipelineSpec(
        stages=(
            StreamingStageSpec("encode", consumes=("condition",), produces=("cond",)),
            StreamingStageSpec("denoise", consumes=("cond", "control"), produces=("latent",)),
            StreamingStageSpec("decode", consumes=("latent",), produces=("frames",)),
        ),
        edges=(
            StreamingEdgeSpec("condition", target="encode", capacity=capacity),
            StreamingEdgeSpec("cond", target="denoise", source="encode", capacity=capacity),
            StreamingEdgeSpec("control", target="denoise", capacity=capacity),
            StreamingEdgeSpec("latent", target="decode", source="denoise", capacity=capacity),
        ),
        outputs=("frames",),
        latency_anchor_artifact="control",
    )


def grouped_spec(group_size: int = 1) -> StreamingPipelineSpec:
    """Two independent single-stage branches that share one resource group."""
    return StreamingPipelineSpec(
        stages=(
            StreamingStageSpec("left", consumes=("x",), produces=("lx",), resource_group="gpu0"),
            StreamingStageSpec("right", consumes=("y",), produces=("ry",), resource_group="gpu0"),
        ),
        edges=(StreamingEdgeSpec("x", target="left"), StreamingEdgeSpec("y", target="right")),
        outputs=("lx", "ry"),
        resource_groups=(StreamingResourceGroupSpec("gpu0", group_size),),
    )


def unordered_spec(per_session: int = 3) -> StreamingPipelineSpec:
    return StreamingPipelineSpec(
        stages=(
            StreamingStageSpec(
                "work",
                consumes=("x",),
                produces=("y",),
                ordering=StageOrdering.NONE,
                max_in_flight_per_session=per_session,
            ),
        ),
        edges=(StreamingEdgeSpec("x", target="work", capacity=8),),
        outputs=("y",),
        output_capacity=8,
    )
