"""Logging for the service: text or JSON lines, with the session id of the current context on every record.

`session_context(session_id)` binds a session id to the current context (a request handler, or a session's own
tasks, which inherit it when they are created inside the binding). `SessionIdFilter`, installed on the root
handler by `configure_logging`, copies it onto every record as `record.session_id`, so every line of a session can
be found, including lines from the admission and pipeline packages that know nothing about it. The same filter
copies the active OpenTelemetry span's `trace_id` and `span_id` (hex), so a JSON line leads to its trace: a
request's span inside a handler, the session's span inside the session's own tasks (see `service.telemetry.otel`).

`TokenRedactionFilter`, installed beside it, keeps tokens out of every line: uvicorn's access log writes each
request's path with its query, and a share link (`/?watch=…&token=…`) or a browser's event stream
(`…/events?access_token=…`) carries a token there; the filter replaces the values of `token` and `access_token`
and anything shaped like a JWT (client, session, watch and LiveKit tokens: the LiveKit SDK quotes a refused join's
token in its error, and its native library logs that line) with `[redacted]` (`transport.redaction`), in the message
and in the traceback.
"""

from __future__ import annotations

import contextlib
import contextvars
import datetime
import json
import logging
import sys
from collections.abc import Iterator

from opentelemetry import trace

from transport.redaction import redact_tokens

__all__ = [
    "JsonFormatter",
    "SessionIdFilter",
    "TokenRedactionFilter",
    "bind_session_id",
    "configure_logging",
    "current_session_id",
    "redact_tokens",
    "session_context",
]

_SESSION_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("lingstream_session_id", default=None)

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(session_id)s] %(message)s"


def current_session_id() -> str | None:
    return _SESSION_ID.get()


@contextlib.contextmanager
def session_context(session_id: str | None) -> Iterator[None]:
    """Bind `session_id` to the current context for the duration of the block."""
    token = _SESSION_ID.set(session_id)
    try:
        yield
    finally:
        _SESSION_ID.reset(token)


def bind_session_id(session_id: str | None) -> None:
    """Bind `session_id` for the rest of the current context (a task's own context, or one request's)."""
    _SESSION_ID.set(session_id)


class SessionIdFilter(logging.Filter):
    """Adds `session_id` (the context's session id, or "-") to every record that passes through, and `trace_id` /
    `span_id` (hex) while a recording or remote span is active."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "session_id"):
            record.session_id = _SESSION_ID.get() or "-"
        if not hasattr(record, "trace_id"):
            span_context = trace.get_current_span().get_span_context()
            if span_context.is_valid:
                record.trace_id = format(span_context.trace_id, "032x")
                record.span_id = format(span_context.span_id, "016x")
        return True


class TokenRedactionFilter(logging.Filter):
    """Replaces tokens in a record's message, whatever its arguments are (an exception quoting a token, too), and
    in its traceback (see the module docstring); never drops one."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a record that cannot be formatted is the formatter's to report
            return True
        redacted = redact_tokens(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact_tokens(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact_tokens(record.exc_text)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, session_id, trace_id and span_id
    (when set by `SessionIdFilter`), and the traceback."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, tz=datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        session_id = getattr(record, "session_id", "-")
        if session_id != "-":
            entry["session_id"] = session_id
        for name in ("trace_id", "span_id"):
            value = getattr(record, name, None)
            if isinstance(value, str):
                entry[name] = value
        if record.exc_info:
            entry["exception"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(log_format: str, level: str) -> None:
    """Send every logger (uvicorn's included) to one stderr handler in `log_format` ("text" or "json")."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(SessionIdFilter())
    handler.addFilter(TokenRedactionFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(_TEXT_FORMAT))
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        uvicorn_logger = logging.getLogger(name)
        uvicorn_logger.handlers.clear()
        uvicorn_logger.propagate = True
