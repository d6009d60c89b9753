"""`create_app`: the FastAPI application, its lifespan, middleware and error handlers.

The app owns one `ServiceRuntime`. Its lifespan starts the runtime (admission, transport, model workers in the
background) and, on shutdown, closes every session and awaits every task, so nothing outlives the app. Tests call
`create_app` with a fake model worker (`worker_factory`) and a fake or no transport; `lingstream serve` calls it
with the real ones.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from admission import AdmissionError, Clock
from pipeline.bidirectional import BidirectionalService
from pipeline.errors import PipelineError
from service.api import describe_validation_errors, health_router, internal_router, v1_router
from service.auth import ApiKeyAuth
from service.errors import (
    ErrorSpec,
    QueueFullError,
    ServiceError,
    UnauthorizedError,
    error_body,
    error_table,
    http_status_spec,
    lookup,
    public_message,
)
from service.middleware import BodyLimitMiddleware
from service.runtime import RuntimeTuning, ServiceRuntime
from service.settings import ServiceConfig, Settings
from service.workers import build_workers
from transport.base import Transport

__all__ = ["WorkerFactory", "create_app", "runtime_of"]

logger = logging.getLogger(__name__)

WorkerFactory = Callable[[Settings], Sequence[BidirectionalService]]
"""Builds the model workers (one per `NUM_WORKERS`) from the settings; `service.workers.build_workers` by default."""


def _version() -> str:
    try:
        return version("lingstream")
    except PackageNotFoundError:  # pragma: no cover - running from a checkout without installing
        return "0.0.0"


def create_app(
    settings: Settings,
    *,
    worker_factory: WorkerFactory | None = None,
    transport: Transport | None = None,
    clock: Clock | None = None,
    tuning: RuntimeTuning | None = None,
) -> FastAPI:
    """The application for `settings`. `worker_factory` replaces `build_workers` (tests inject fakes); `transport`
    None means no transport (session bodies carry `transport: null`); `clock` is the admission clock (tests inject
    a fake); `tuning` shortens the runtime's waits (tests)."""
    config = ServiceConfig.from_settings(settings)
    error_table()  # import the lazily-listed error classes now, not during the first failing request
    workers = list((worker_factory or build_workers)(settings))
    runtime = ServiceRuntime(config, workers, transport, clock=clock, tuning=tuning)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        try:
            yield
        finally:
            await runtime.aclose()

    app = FastAPI(
        title="lingstream",
        version=_version(),
        description='Interactive world-model video sessions. Errors: `{"error": {"code", "message"}}`.',
        lifespan=lifespan,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
    )
    app.state.runtime = runtime
    app.state.auth = ApiKeyAuth(config.api_key_digests)
    _install_error_handlers(app)
    app.include_router(v1_router)
    app.include_router(health_router)
    app.include_router(internal_router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.limits.max_request_bytes)
    if config.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=["Location", "Retry-After"],
            allow_credentials=False,
            max_age=600,
        )
    return app


def runtime_of(app: FastAPI) -> ServiceRuntime:
    """The runtime behind an app made by `create_app`."""
    runtime: ServiceRuntime = app.state.runtime
    return runtime


def _respond(spec: ErrorSpec, message: str, error: BaseException | None = None) -> JSONResponse:
    headers: dict[str, str] = {}
    if isinstance(error, QueueFullError):
        headers["Retry-After"] = str(error.retry_after_s)
    if isinstance(error, UnauthorizedError) or spec.status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="lingstream"'
    return JSONResponse(error_body(spec.code, message), status_code=spec.status, headers=headers)


def _install_error_handlers(app: FastAPI) -> None:
    async def known(request: Request, error: Exception) -> JSONResponse:
        spec = lookup(error) or ErrorSpec(500, "internal", expose=False)
        if spec.status >= 500 and spec.status != 503:  # 503s (draining, not ready) are expected answers
            logger.error("%s %s failed: %s", request.method, request.url.path, spec.code, exc_info=error)
        else:
            logger.debug("%s %s -> %d %s: %s", request.method, request.url.path, spec.status, spec.code, error)
        return _respond(spec, public_message(spec, error), error)

    async def validation(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        spec = http_status_spec(422)
        return _respond(spec, describe_validation_errors(error.errors()))

    async def http_error(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, StarletteHTTPException)
        spec = http_status_spec(error.status_code)
        message = str(error.detail) if error.detail else "request failed"
        response = _respond(spec, message)
        for name, value in (error.headers or {}).items():
            response.headers[name] = value
        return response

    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        logger.error("%s %s raised an unexpected error", request.method, request.url.path, exc_info=error)
        spec = lookup(error) or ErrorSpec(500, "internal", expose=False)
        return _respond(spec, public_message(spec, error), error)

    for root in (ServiceError, AdmissionError, PipelineError):
        app.add_exception_handler(root, known)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)
