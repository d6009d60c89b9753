"""The typed contract of the OpenAPI document: no untyped object in any answer, and the control protocol's messages
(both ways) in its components, from the codec's one table, matching what the codec writes and reads."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from pipeline.bidirectional import ControlMessage, ControlState, Pause, ResetPose, Resume, SetPrompt, Stop
from service.app import create_app
from service.http.schemas import SessionBody
from service.settings import load_settings
from tests.support.fakes.world import FakeWorld
from transport.base import ChunkStatus, DoneStatus, ErrorStatus, StateStatus, StatusMessage, WarningStatus
from transport.protocol import decode_control, decode_status, encode_control, encode_status
from transport.protocol_schema import CONTROL_MESSAGES, STATUS_MESSAGES, WireMessage


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    app = create_app(load_settings(), worker_factory=lambda settings: [FakeWorld()])
    return app.openapi()


def untyped_objects(document: dict[str, Any]) -> Iterator[str]:
    """Where a 2xx JSON answer of `document` holds an object schema that names no property and no value type (what
    a generated client can only type as `Record<string, unknown>` / `dict[str, Any]`)."""
    schemas = document.get("components", {}).get("schemas", {})

    def walk(schema: dict[str, Any], where: str, seen: frozenset[str]) -> Iterator[str]:
        ref = schema.get("$ref")
        if ref is not None:
            name = ref.rsplit("/", 1)[-1]
            if name not in seen:
                yield from walk(schemas[name], f"{where} → {name}", seen | {name})
            return
        for key in ("anyOf", "oneOf", "allOf"):
            for index, option in enumerate(schema.get(key, [])):
                yield from walk(option, f"{where}.{key}[{index}]", seen)
        if schema.get("type") == "array":
            yield from walk(schema.get("items", {}), f"{where}[]", seen)
        composite = any(key in schema for key in ("anyOf", "oneOf", "allOf", "enum", "const"))
        if schema.get("type") == "object" or "properties" in schema or not (schema.get("type") or composite):
            properties = schema.get("properties") or {}
            extra = schema.get("additionalProperties")
            if not properties and (extra is None or extra is True or extra == {}):
                yield where
            for name, value in properties.items():
                yield from walk(value, f"{where}.{name}", seen)
            if isinstance(extra, dict) and extra:
                yield from walk(extra, f"{where}.*", seen)

    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            for code, answer in operation["responses"].items():
                if not code.startswith("2"):
                    continue
                for media, content in answer.get("content", {}).items():
                    if media == "application/json" or media.endswith("+json"):
                        yield from walk(content.get("schema", {}), f"{method.upper()} {path} {code}", frozenset())


def test_no_answer_holds_an_untyped_object(document: dict[str, Any]) -> None:
    found = sorted(set(untyped_objects(document)))
    assert not found, f"type these answers (a pydantic model, or a typed dict's values): {found}"


def test_the_untyped_object_check_finds_one() -> None:
    # The check above can fail: an answer with a bare `dict[str, Any]` deep inside a referenced model is found.
    untyped = {
        "paths": {
            "/x": {
                "get": {
                    "responses": {
                        "200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Outer"}}}},
                        "404": {"content": {"application/json": {"schema": {"type": "object"}}}},
                    }
                }
            }
        },
        "components": {
            "schemas": {
                "Outer": {"type": "object", "properties": {"items": {"type": "array", "items": {"$ref": "#/c/Inner"}}}},
                "Inner": {"anyOf": [{"type": "object", "additionalProperties": True}, {"type": "null"}]},
            }
        },
    }
    assert list(untyped_objects(untyped)) == ["GET /x 200 → Outer.items[] → Inner.anyOf[0]"]


def _validator(document: dict[str, Any], name: str) -> Draft202012Validator:
    """A validator of the document's component `name`, its `$ref`s resolved inside the document."""
    registry: Registry[Any] = Registry().with_resource("urn:openapi", Resource.opaque(document))
    return Draft202012Validator({"$ref": f"urn:openapi#/components/schemas/{name}"}, registry=registry)


_CHUNK = ChunkStatus(index=3, applied_seq=9, keys=("w",), timings={"dit_ms": 1.5}, prompt="dusk", prompt_seq=2)
STATUSES: list[StatusMessage] = [
    StateStatus("running"),
    StateStatus("draining", "time_limit"),
    _CHUNK,
    dataclasses.replace(_CHUNK, first_frame_pts=9000, stream_base_pts=3000, first_frame_id=27),
    dataclasses.replace(_CHUNK, timings={f"t{index}": 1.0 for index in range(40)}),
    WarningStatus("time_limit", "ends in 30 s", 30.0),
    ErrorStatus("invalid_keys", "unknown key 'q'"),
    DoneStatus("closed"),
]
CONTROLS: list[ControlMessage] = [
    ControlState(seq=4, keys=frozenset({"w", "j"})),
    ControlState(seq=0, keys=frozenset()),
    SetPrompt(seq=2, text="a snowy night"),
    ResetPose(),
    Pause(),
    Resume(),
    Stop(),
]


def test_every_status_message_the_encoder_writes_is_what_the_document_types(document: dict[str, Any]) -> None:
    union = _validator(document, "ControlStatus")
    written = [encode_status(status) for status in STATUSES]
    written.append(encode_status(dataclasses.replace(_CHUNK, timings={f"t{i}": 1.0 for i in range(40)}), max_bytes=300))
    assert json.loads(written[-1])["truncated"] is True
    for data in written:
        message = json.loads(data)
        union.validate(message)
        _validator(document, _name(STATUS_MESSAGES, message["type"])).validate(message)
    assert {json.loads(data)["type"] for data in written} == {message.type for message in STATUS_MESSAGES}


def test_every_client_message_is_what_the_document_types_and_the_decoder_takes(document: dict[str, Any]) -> None:
    union = _validator(document, "ControlMessage")
    for control in CONTROLS:
        message = json.loads(encode_control(control))
        union.validate(message)
        assert decode_control(json.dumps(message)) == control
    assert {json.loads(encode_control(control))["type"] for control in CONTROLS} == {
        message.type for message in CONTROL_MESSAGES
    }


@pytest.mark.parametrize("table", [CONTROL_MESSAGES, STATUS_MESSAGES], ids=["control", "status"])
def test_a_field_outside_the_table_is_refused_by_the_schema_and_the_decoder(
    document: dict[str, Any], table: tuple[Any, ...]
) -> None:
    union = "ControlMessage" if table is CONTROL_MESSAGES else "ControlStatus"
    validator = _validator(document, union)
    samples = [json.loads(encode_control(c)) for c in CONTROLS] + [json.loads(encode_status(s)) for s in STATUSES]
    for message in samples:
        if message["type"] not in {entry.type for entry in table}:
            continue
        extra = {**message, "surplus": 1}
        assert not validator.is_valid(extra)
        decoded = decode_control(json.dumps(extra)) if table is CONTROL_MESSAGES else decode_status(json.dumps(extra))
        assert type(decoded).__name__ == "ProtocolError", decoded


def test_both_unions_map_every_message_of_the_table(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    for union, table in (("ControlStatus", STATUS_MESSAGES), ("ControlMessage", CONTROL_MESSAGES)):
        mapping = schemas[union]["discriminator"]["mapping"]
        assert mapping == {message.type: f"#/components/schemas/{message.name}" for message in table}
        for message in table:
            assert schemas[message.name] == message.json_schema()


def _name(table: tuple[WireMessage, ...], kind: str) -> str:
    return next(message.name for message in table if message.type == kind)


def test_a_nested_config_keeps_its_shape_and_is_what_the_document_types(document: dict[str, Any]) -> None:
    # config_view makes a model's config JSON data (lists and mappings too): the body carries it as it is.
    config = {"fps": 16, "scale": 0.5, "hud": True, "prompt": "", "limit": None, "steps": [1, 2], "camera": {"fov": 60}}
    body = {
        "id": "s1",
        "status": "running",
        "reason": None,
        "queue_position": None,
        "created_at": "2026-12-02T00:00:00Z",
        "updated_at": "2026-12-02T00:00:00Z",
        "transport": None,
        "config": config,
        "video": {"width": 8, "height": 8, "fps": 16.0},
        "error": None,
    }
    written = json.loads(SessionBody.model_validate(body).model_dump_json())
    assert written["config"] == config
    _validator(document, "SessionBody").validate(written)
