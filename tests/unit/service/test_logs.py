"""Logging: the session id rides on every record of a session; JSON lines on request."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from service.logs import JsonFormatter, SessionIdFilter, session_context
from tests.support.service_harness import running_service


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


class _TaskName(logging.Filter):
    """Notes on each record the asyncio task that logged it (None outside a task, e.g. in a worker thread)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        record.task_name = task.get_name() if task is not None else None
        return True


async def test_every_line_of_a_session_names_it(caplog: pytest.LogCaptureFixture) -> None:
    """All of a session's lines carry its id, not only those whose text already names it; and no other line does.

    A session's lines are those its requests log (each request runs in its own task, as under a server), those its
    own tasks log (named after it: session-, outputs-, close-, ...), and any line that names it. The runtime's own
    lines (start, health, stop) are not the session's and must not carry its id."""
    caplog.handler.addFilter(SessionIdFilter())
    caplog.handler.addFilter(_TaskName())
    with caplog.at_level(logging.DEBUG):
        async with running_service() as svc:
            created = await asyncio.create_task(svc.create(), name="request-create")
            session = created.json()["id"]
            deleted = await asyncio.create_task(svc.client.delete(f"/v1/sessions/{session}"), name="request-delete")
            assert deleted.status_code == 200
    requests = {"request-create", "request-delete"}

    def of_session(record: logging.LogRecord) -> bool:
        task = getattr(record, "task_name", None) or ""
        return task in requests or task.endswith(f"-{session}") or session in record.getMessage()

    def describe(record: logging.LogRecord) -> str:
        task = getattr(record, "task_name", None)
        return f"{record.name} [{record.session_id}] in {task}: {record.getMessage()}"  # type: ignore[attr-defined]

    mine = [record for record in caplog.records if of_session(record)]
    # Lines from worker threads (no task) are left out of the other direction: a thread inherits the context of
    # whoever started it, which may be the session's.
    others = [r for r in caplog.records if not of_session(r) and getattr(r, "task_name", None) is not None]
    assert len(mine) >= 3  # admitted, the requests, closed
    assert others  # the runtime's own lines
    unnamed = [describe(r) for r in mine if r.session_id != session]  # type: ignore[attr-defined]
    assert unnamed == [], "lines of the session without its id"
    leaked = [describe(r) for r in others if r.session_id == session]  # type: ignore[attr-defined]
    assert leaked == [], "lines that are not the session's but carry its id"
