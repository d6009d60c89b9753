"""An OpenAPI-driven fuzz run (schemathesis) against the ASGI app: no input makes the service answer 5xx.

Bounded: at most 12 examples for each of the 8 documented operations, derandomized, no example database.
Schemathesis ends an app's lifespan after each test item and an app runs its lifespan once, so every operation
gets a fresh app (the schema is read from one more).
"""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import FastAPI
from hypothesis import HealthCheck, settings

from service.app import create_app
from service.settings import load_settings
from tests.support.fakes.world import FakeWorld
from tests.support.service_harness import FAST

schemathesis = pytest.importorskip("schemathesis", reason="the OpenAPI fuzz run needs schemathesis (dev extra)")


def _app() -> FastAPI:
    return create_app(
        load_settings(queue_size=4, max_request_bytes=64 * 1024, max_image_bytes=16 * 1024),
        worker_factory=lambda s: [FakeWorld() for _ in range(s.num_workers)],
        tuning=FAST,
    )


schema = schemathesis.openapi.from_asgi("/openapi.json", _app())


@pytest.fixture
def fresh_app() -> FastAPI:
    return _app()


@schema.parametrize()  # type: ignore[untyped-decorator]  # schemathesis types it as a bare Callable
@settings(max_examples=12, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
def test_no_generated_request_gets_a_server_error(case: Any, fresh_app: FastAPI) -> None:
    checks = [schemathesis.checks.not_a_server_error, schemathesis.specs.openapi.checks.response_schema_conformance]
    case.call_and_validate(app=fresh_app, checks=checks)
