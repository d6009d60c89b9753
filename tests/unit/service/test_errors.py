"""The one error table and the one error body shape."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import pytest

import service.errors as service_errors
from service.errors import error_table, lookup
from tests.support.service_harness import running_service

ROOT = Path(__file__).resolve().parents[3]


# The Python client's exceptions are raised in a client's process from the service's answers, never by the service.
CLIENT_SIDE = frozenset({"transport.client.errors"})


def _errors_modules() -> list[str]:
    modules = ["service.errors"]
    for package in ("admission", "pipeline", "transport"):
        for path in sorted((ROOT / package).rglob("errors.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if name not in CLIENT_SIDE:
                modules.append(name)
    return modules


def _public_exceptions(module_name: str) -> list[type[BaseException]]:
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", [name for name in dir(module) if not name.startswith("_")])
    return [
        value for name in names if inspect.isclass(value := getattr(module, name)) and issubclass(value, BaseException)
    ]


@pytest.mark.parametrize("module_name", _errors_modules())
def test_every_public_exception_has_an_entry_in_the_table(module_name: str) -> None:
    exceptions = _public_exceptions(module_name)
    assert exceptions, f"{module_name} exports no exceptions"
    table = error_table()
    missing = [cls.__qualname__ for cls in exceptions if cls not in table]
    assert not missing, f"{module_name}: no entry in service.errors for {', '.join(missing)}"


def test_codes_are_stable_snake_case_and_statuses_are_http_errors() -> None:
    for cls, spec in error_table().items():
        assert 400 <= spec.status <= 599, cls
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", spec.code), cls


def test_the_required_codes_exist_with_their_statuses() -> None:
    pairs = {(spec.code, spec.status) for spec in error_table().values()}
    for pair in [
        ("queue_full", 429),
        ("draining", 503),
        ("not_ready", 503),
        ("session_not_found", 404),
        ("invalid_config", 422),
        ("invalid_request", 422),
        ("payload_too_large", 413),
        ("image_too_large", 413),
        ("unsupported_media_type", 415),
        ("unauthorized", 401),
        ("admission_unavailable", 503),
        ("internal", 500),
    ]:
        assert pair in pairs


def test_lookup_uses_the_nearest_listed_ancestor() -> None:
    class Custom(service_errors.QueueFullError):
        pass

    spec = lookup(Custom(3))
    assert spec is not None
    assert spec.code == "queue_full"
    assert lookup(KeyError("x")) is None


async def test_errors_of_every_origin_share_one_body_shape() -> None:
    async with running_service(max_request_bytes=8192, max_image_bytes=1024) as svc:
        client = svc.client
        answers = {
            "route 404": await client.get("/nowhere"),
            "405": await client.put("/v1/sessions"),
            "validation 422": await client.delete("/v1/sessions/x?mode=later"),
            "invalid json": await client.post(
                "/v1/sessions", content=b"{", headers={"content-type": "application/json"}
            ),
            "unknown field": await client.post("/v1/sessions", json={"config": {}, "colour": "red"}),
            "invalid config": await client.post("/v1/sessions", json={"config": {"fps": 99}}),
            "unknown config field": await client.post("/v1/sessions", json={"config": {"speed": 1}}),
            "wrong content type": await client.post(
                "/v1/sessions", content=b"config=1", headers={"content-type": "application/x-www-form-urlencoded"}
            ),
            "too large": await client.post("/v1/sessions", content=b"x" * 9000),
            "session 404": await client.get("/v1/sessions/nope"),
        }
    expected = {
        "route 404": (404, "not_found"),
        "405": (405, "method_not_allowed"),
        "validation 422": (422, "invalid_request"),
        "invalid json": (422, "invalid_request"),
        "unknown field": (422, "invalid_request"),
        "invalid config": (422, "invalid_config"),
        "unknown config field": (422, "invalid_config"),
        "wrong content type": (415, "unsupported_media_type"),
        "too large": (413, "payload_too_large"),
        "session 404": (404, "session_not_found"),
    }
    for name, response in answers.items():
        body = response.json()
        assert (response.status_code, body["error"]["code"]) == expected[name], name
        assert set(body) == {"error"}, name
        assert set(body["error"]) == {"code", "message"}, name
        assert body["error"]["message"], name
    assert "fps" in answers["invalid config"].json()["error"]["message"]
    assert "colour" in answers["unknown field"].json()["error"]["message"]
