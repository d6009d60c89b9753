"""The committed OpenAPI document and TypeScript types (web/openapi/) are what `scripts.openapi_types` makes of the
service now: an API change that forgets to regenerate them fails here."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from scripts.openapi_types import GeneratorMissingError, differences, document, generator

_REGENERATE = "run `.venv/bin/python -m scripts.openapi_types` and commit web/openapi/"


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    try:
        generator()
    except GeneratorMissingError as exc:
        pytest.skip(f"cannot generate the TypeScript types here: {exc}")
    return document()


def test_the_committed_document_and_types_are_up_to_date(spec: dict[str, Any]) -> None:
    stale = differences(spec=spec)
    assert not stale, f"{', '.join(stale)} differ from the API: {_REGENERATE}"


def test_a_changed_field_is_caught(spec: dict[str, Any]) -> None:
    changed = copy.deepcopy(spec)
    usage = changed["components"]["schemas"]["UsageBody"]
    usage["properties"]["gpu_seconds"] = {"type": "number", "title": "Gpu Seconds"}
    usage["required"].append("gpu_seconds")
    assert [path.rsplit("/", 1)[-1] for path in differences(spec=changed)] == ["openapi.json", "lingstream.d.ts"]
