from __future__ import annotations

import dataclasses

import pytest

from pipeline.errors import PipelineSpecError
from pipeline.spec import (
    StageOrdering,
    StreamingEdgeSpec,
    StreamingPipelineSpec,
    StreamingResourceGroupSpec,
    StreamingStageSpec,
    validate_pipeline,
)
from tests.support.graphs import join_spec, linear_spec

A = StreamingStageSpec("a", consumes=("x",), produces=("y",))
B = StreamingStageSpec("b", consumes=("y",), produces=("z",))
X_TO_A = StreamingEdgeSpec("x", target="a")
Y_TO_B = StreamingEdgeSpec("y", target="b", source="a")


def spec(**changes: object) -> StreamingPipelineSpec:
    base = StreamingPipelineSpec(stages=(A, B), edges=(X_TO_A, Y_TO_B), outputs=("z",))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_valid_graphs_compile_with_topological_release_order() -> None:
    graph = validate_pipeline(join_spec())
    assert graph.release_order() == ("decode", "denoise", "encode")
    assert graph.external_artifacts == ("condition", "control")
    assert validate_pipeline(linear_spec("p", "q")).release_order() == ("q", "p")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"stages": ()}, "the pipeline has no stages"),
        ({"stages": (A, A)}, "duplicate stage id 'a'"),
        (
            {"stages": (A, B, StreamingStageSpec("c", consumes=("x",), produces=("y",)))},
            "artifact 'y' has two producers: stages 'a' and 'c'",
        ),
        ({"edges": (X_TO_A, StreamingEdgeSpec("q", target="b", source="a"))}, "stage 'b' does not consume 'q'"),
        ({"edges": (X_TO_A, StreamingEdgeSpec("y", target="b", source="b"))}, "stage 'b' does not produce 'y'"),
        ({"edges": (X_TO_A, StreamingEdgeSpec("y", target="nope", source="a"))}, "targets unknown stage 'nope'"),
        (
            {"stages": (A, dataclasses.replace(B, consumes=("y", "w")))},
            "stage 'b' consumes 'w' but no edge delivers it",
        ),
        (
            {"stages": (dataclasses.replace(A, produces=("y", "w")), B)},
            "stage 'a' produces 'w', which goes nowhere",
        ),
        ({"outputs": ("nothing",)}, "output 'nothing' has no producer stage"),
        ({"outputs": ()}, "declares no outputs"),
        ({"edges": (dataclasses.replace(X_TO_A, capacity=0), Y_TO_B)}, "has capacity 0 < 1"),
        ({"output_capacity": 0}, "output_capacity 0 < 1"),
        ({"stages": (dataclasses.replace(A, resource_group="gpu"), B)}, "names undeclared resource group 'gpu'"),
        ({"resource_groups": (StreamingResourceGroupSpec("g", 0),)}, "resource group 'g' has max_concurrency 0"),
        ({"latency_anchor_artifact": "y"}, "latency_anchor_artifact 'y' is not an external input"),
        (
            {"stages": (dataclasses.replace(A, max_in_flight_per_session=2), B)},
            "stage 'a' uses PER_SESSION_STRICT ordering with max_in_flight_per_session 2",
        ),
        ({"stages": (dataclasses.replace(A, consumes=()), B)}, "stage 'a' consumes nothing"),
        (
            {"edges": (X_TO_A, StreamingEdgeSpec("y", target="b"))},
            "is an external ingress, but 'y' is produced by stage 'a'",
        ),
        ({"edges": (X_TO_A, Y_TO_B, Y_TO_B)}, "duplicates another edge carrying 'y' to 'b'"),
    ],
)
def test_invalid_graphs_are_rejected_naming_the_culprit(changes: dict[str, object], message: str) -> None:
    with pytest.raises(PipelineSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_pipeline(spec(**changes))


def test_a_cycle_is_rejected_naming_its_stages() -> None:
    a = StreamingStageSpec("a", consumes=("x", "z"), produces=("y",))
    b = StreamingStageSpec("b", consumes=("y",), produces=("z", "out"))
    cyclic = StreamingPipelineSpec(
        stages=(a, b),
        edges=(X_TO_A, Y_TO_B, StreamingEdgeSpec("z", target="a", source="b")),
        outputs=("out",),
    )
    with pytest.raises(PipelineSpecError, match=r"cycle through stages \['a', 'b'\]"):
        validate_pipeline(cyclic)


def test_unordered_stages_may_run_several_sequences_per_session() -> None:
    relaxed = dataclasses.replace(A, ordering=StageOrdering.NONE, max_in_flight_per_session=4)
    assert validate_pipeline(spec(stages=(relaxed, B))).stages[0].max_in_flight_per_session == 4
