"""Logging: the session id rides on every record of a session; JSON lines on request."""

from __future__ import annotations

import json
import logging

import pytest

from service.logs import JsonFormatter, SessionIdFilter, session_context
from tests.unit.service.helpers import running_service


def _record(message: str) -> logging.LogRecord:
    record = logging.LogRecord("service.test", logging.INFO, __file__, 1, message, ("x",), None)
    SessionIdFilter().filter(record)
    return record


def test_the_filter_adds_the_context_session_id() -> None:
    assert _record("plain %s").session_id == "-"  # type: ignore[attr-defined]
    with session_context("abc"):
        assert _record("bound %s").session_id == "abc"  # type: ignore[attr-defined]


def test_json_lines_carry_the_message_and_session_id() -> None:
    with session_context("s-42"):
        line = JsonFormatter().format(_record("hello %s"))
    entry = json.loads(line)
    assert entry["message"] == "hello x"
    assert entry["session_id"] == "s-42"
    assert entry["level"] == "INFO"


async def test_every_line_of_a_session_names_it(caplog: pytest.LogCaptureFixture) -> None:
    caplog.handler.addFilter(SessionIdFilter())
    with caplog.at_level(logging.INFO, logger="service"):
        async with running_service() as svc:
            session = (await svc.create()).json()["id"]
            await svc.client.delete(f"/v1/sessions/{session}")
    lines = [record for record in caplog.records if session in record.getMessage()]
    assert lines
    assert all(record.session_id == session for record in lines)  # type: ignore[attr-defined]
