"""`create_app`: the FastAPI application, its lifespan, middleware and error handlers.

The app owns one `ServiceRuntime`. Its lifespan starts the runtime (admission, transport, model workers in the
background) and, on shutdown, closes every session and awaits every task, so nothing outlives the app. Tests call
`create_app` with a fake model worker (`worker_factory`) and a fake or no transport; `lingstream serve` calls it
with the real ones.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from admission import AdmissionError, Clock
from pipeline.bidirectional import BidirectionalService
from pipeline.errors import PipelineError
from service.config_records import ServiceConfig, SharedAdmissionConfig
from service.errors import (
    ErrorSpec,
    QueueFullError,
    ServiceError,
    SessionElsewhereError,
    UnauthorizedError,
    error_body,
    error_table,
    http_status_spec,
    lookup,
    public_message,
)
from service.http.auth import ApiKeyAuth, Authenticator
from service.http.bodies import describe_validation_errors
from service.http.contract import add_components
from service.http.docs import install_docs
from service.http.middleware import BodyLimitMiddleware, StrictCORSMiddleware
from service.http.page import install_page
from service.http.routes import health_router, internal_router, operation_id, v1_router
from service.http.token_routes import tokens_router
from service.runtime.recording_catalog import MemoryRecordingCatalog, RecordingCatalog
from service.runtime.recording_objects import RecordingObjects
from service.runtime.recordings import WriterFactory
from service.runtime.runtime import RuntimeTuning, ServiceRuntime, SessionEvents
from service.scaleout.backend import RedisAdmissionBackend
from service.scaleout.forwarding import Forwarder
from service.scaleout.recording_catalog import RedisRecordingCatalog
from service.settings import Settings
from service.storage import Credentials, ObjectStoreConfig, S3Client
from service.telemetry.forward_series import forward_results
from service.telemetry.otel import Telemetry, TelemetryMiddleware
from service.telemetry.webhook_series import webhook_results
from service.tokens import MemoryTokenStore, TokenCodec, TokenPolicy, TokenStore
from service.webhooks.setup import build_webhooks, webhook_targets
from service.workers import build_workers, model_memory, model_start
from transport.base import Transport
from transport.errors import TransportError
from transport.session.timers import Timers

__all__ = ["WorkerFactory", "create_app", "runtime_of"]

logger = logging.getLogger(__name__)

_WEBHOOK_GRACE_S = 2.0  # at shutdown, how long the last deliveries may take before the dispatcher stops

WorkerFactory = Callable[[Settings], Sequence[BidirectionalService]]
"""Builds the model workers (one per `NUM_WORKERS`) from the settings; `service.workers.build_workers` by
default."""


def _version() -> str:
    try:
        return version("lingstream")
    except PackageNotFoundError:  # pragma: no cover - running from a checkout without installing
        return "0.0.0"


def _recording_storage(
    settings: Settings, config: ServiceConfig
) -> tuple[RecordingObjects | None, RecordingCatalog | None]:
    """The object store of recordings (`LINGSTREAM_RECORDINGS_S3_*`; None: they stay on disk) and their catalog
    (in Redis with the redis backend, so every replica answers for them; else in process)."""
    limits = config.recordings
    if limits is None:
        return None, None
    objects = None
    if settings.recordings_s3_endpoint and settings.recordings_s3_bucket and settings.recordings_s3_access_key_id:
        secret = settings.recordings_s3_secret_access_key
        store = ObjectStoreConfig(
            endpoint=settings.recordings_s3_endpoint,
            bucket=settings.recordings_s3_bucket,
            credentials=Credentials(
                settings.recordings_s3_access_key_id,
                secret.get_secret_value() if secret is not None else "",
                settings.recordings_s3_region,
            ),
            prefix=settings.recordings_s3_prefix,
            public_endpoint=settings.recordings_s3_public_endpoint,
            url_ttl_s=settings.recordings_s3_url_ttl,
        )
        objects = RecordingObjects(S3Client(store), max_count=limits.max_count, max_bytes=limits.max_bytes)
        logger.info("recordings: uploaded to %s, bucket %s, prefix %r", store.endpoint, store.bucket, store.prefix)
    catalog: RecordingCatalog = MemoryRecordingCatalog()
    if config.shared_admission is not None and settings.redis_url is not None:
        catalog = RedisRecordingCatalog(
            settings.redis_url.get_secret_value(), replica_id=config.shared_admission.replica_id
        )
    return objects, catalog


def create_app(
    settings: Settings,
    *,
    worker_factory: WorkerFactory | None = None,
    transport: Transport | None = None,
    clock: Clock | None = None,
    tuning: RuntimeTuning | None = None,
    telemetry: Telemetry | None = None,
    recording_writer: WriterFactory | None = None,
    timers: Timers | None = None,
    events: SessionEvents | None = None,
    wall_clock: Callable[[], float] | None = None,
) -> FastAPI:
    """The application for `settings`. `worker_factory` replaces `build_workers` (tests inject fakes); `transport`
    None means no transport (session bodies carry `transport: null`); `clock` is the admission clock (tests inject
    a fake); `tuning` shortens the runtime's waits (tests); `telemetry` defaults to one configured from the OTEL_*
    environment variables (the app shuts it down at the end of its lifespan); `recording_writer` replaces the MP4
    writer of recordings (tests inject failing ones); `timers` runs the sessions' deadlines (time limits, the
    longest pause; tests inject fake timers); `events` is told of each session's webhook moments (tests inject a
    recorder; default: the webhooks the settings configure, else nowhere); `wall_clock` is the time tokens are
    minted and checked on (Unix seconds; tests move it)."""
    config = ServiceConfig.from_settings(settings)
    error_table()  # import the lazily-listed error classes now, not during the first failing request
    if telemetry is None:
        telemetry = Telemetry.from_environ(os.environ, service_version=_version())
    if settings.api_key_list:
        logger.info("API keys: %d; quotas and usage name them by key id: %s", len(settings.key_ids), _ids(settings))
    webhooks = None
    if events is None:
        webhooks = build_webhooks(
            settings,
            replica_id=config.shared_admission.replica_id if config.shared_admission is not None else None,
            replica_ttl_s=settings.replica_ttl,
            on_result=webhook_results(telemetry.meter),
        )
        events = webhooks
    factory = worker_factory or build_workers
    workers = list(factory(settings))
    # The real workers checked the model at start (cached); a test's fake workers have no model to estimate.
    memory = model_memory(settings) if factory is build_workers else None
    start = model_start(settings, workers) if factory is build_workers else None
    objects, catalog = _recording_storage(settings, config)
    forwarder: Forwarder | None = None
    if config.shared_admission is None:
        runtime = ServiceRuntime(
            config,
            workers,
            transport,
            clock=clock,
            tuning=tuning,
            observer=telemetry.sessions,
            recording_writer=recording_writer,
            recording_objects=objects,
            recording_catalog=catalog,
            timers=timers,
            events=events,
        )
    else:
        redis_url = settings.redis_url.get_secret_value() if settings.redis_url is not None else ""
        backend = RedisAdmissionBackend(redis_url, config.shared_admission, config.admission, clock=clock)
        forwarder = _forwarder(config.shared_admission, backend, telemetry)
        runtime = ServiceRuntime(
            config,
            workers,
            transport,
            backend=backend,
            tuning=tuning,
            observer=telemetry.sessions,
            recording_writer=recording_writer,
            recording_objects=objects,
            recording_catalog=catalog,
            timers=timers,
            events=events,
        )
    telemetry.instrument(runtime, workers, transport)
    authenticator = _authenticator(settings, config, wall_clock or time.time)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        telemetry.start()
        if webhooks is not None:
            await webhooks.dispatcher.start()
        await runtime.start()
        try:
            yield
        finally:
            try:
                await runtime.aclose()
                if webhooks is not None:  # after the sessions ended: their last events get a moment to go out
                    await webhooks.dispatcher.aclose(grace_s=_WEBHOOK_GRACE_S)
            finally:
                if forwarder is not None:
                    await forwarder.aclose()
                await authenticator.store.aclose()
                await telemetry.aclose()

    app = FastAPI(
        title="lingstream",
        version=_version(),
        description='Interactive world-model video sessions. Errors: `{"error": {"code", "message"}}`.',
        lifespan=lifespan,
        docs_url=None,  # service.http.docs serves /docs with Swagger UI from the installed swagger-ui-dist
        redoc_url=None,
        openapi_url="/openapi.json",
        generate_unique_id_function=operation_id,
    )
    app.state.runtime = runtime
    app.state.webhook_targets = webhook_targets(settings)
    app.state.webhooks = webhooks
    _add_contract_components(app)
    app.state.model_memory = memory.to_mapping() if memory is not None else None
    app.state.model_start = start
    app.state.telemetry = telemetry
    app.state.transport = transport
    app.state.forwarder = forwarder
    app.state.authenticator = authenticator
    _install_error_handlers(app)
    app.include_router(v1_router)
    app.include_router(tokens_router)
    # `/metrics`: every instrument, through the OpenTelemetry Prometheus exporter on this app's own registry.
    app.add_api_route(
        "/metrics",
        telemetry.metrics_endpoint,
        methods=["GET"],
        name="metrics",
        summary="Prometheus text exposition",
        tags=["health"],
        response_class=PlainTextResponse,
        responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "The metrics."}},
    )
    app.include_router(health_router)
    app.include_router(internal_router)
    install_page(
        app,
        transport=transport,
        vendor_dir=settings.web_vendor_dir,
        api_keys=bool(config.api_key_digests),
        token_url=settings.page_token_url,
    )
    install_docs(app, vendor_dir=settings.docs_vendor_dir, openapi_url=app.openapi_url)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.limits.max_request_bytes)
    if config.cors_origins:
        app.add_middleware(
            StrictCORSMiddleware,
            allow_origins=list(config.cors_origins),
            allow_methods=["GET", "POST", "DELETE"],
            allow_headers=["Authorization", "Content-Type"],
            expose_headers=["Location", "Retry-After"],
            allow_credentials=False,
            max_age=600,
        )
    app.add_middleware(TelemetryMiddleware, telemetry=telemetry)  # added last: outermost, so every answer counts
    return app


def _forwarder(shared: SharedAdmissionConfig, backend: RedisAdmissionBackend, telemetry: Telemetry) -> Forwarder | None:
    """The forwarder of transport routes to the replica that runs the session, when this replica advertises an
    address (the others then do too, in a deployment configured alike); without one those routes answer 409."""
    if shared.replica_url is None:
        logger.info(
            "LINGSTREAM_REPLICA_URL is not set: a transport route (WebRTC offer, viewers) of a session another replica "
            "runs answers 409 session_on_other_replica here instead of being forwarded"
        )
        return None
    logger.info("replica address for the other replicas: %s (transport routes are forwarded)", shared.replica_url)
    return Forwarder(shared.replica_id, backend, on_result=forward_results(telemetry.meter))


def _authenticator(settings: Settings, config: ServiceConfig, wall_clock: Callable[[], float]) -> Authenticator:
    """API keys, and tokens when LINGSTREAM_TOKEN_SECRET is set: their creates counted and shares revoked in this
    process, or in Redis with the redis backend (every replica sees them)."""
    codec = TokenCodec(settings.token_secrets, clock=wall_clock) if settings.token_secrets else None
    store: TokenStore = MemoryTokenStore(clock=wall_clock)
    if codec is not None and config.shared_admission is not None and settings.redis_url is not None:
        from service.tokens.redis_store import RedisTokenStore  # Redis only with the redis backend

        store = RedisTokenStore(settings.redis_url.get_secret_value())
    policy = TokenPolicy(reconnect_grace_s=settings.reconnect_grace, queue_timeout_s=settings.queue_timeout)
    if codec is not None:
        logger.info(
            "tokens: on (%d secret(s) accepted, creates counted %s)", len(settings.token_secrets), _where(store)
        )
    return Authenticator(ApiKeyAuth(config.api_key_digests), codec, store, policy)


def _where(store: TokenStore) -> str:
    return "in this process" if isinstance(store, MemoryTokenStore) else "in Redis, on every replica"


def _ids(settings: Settings) -> str:
    return ", ".join(sorted(settings.key_ids))


def runtime_of(app: FastAPI) -> ServiceRuntime:
    """The runtime behind an app made by `create_app`."""
    runtime: ServiceRuntime = app.state.runtime
    return runtime


def _respond(spec: ErrorSpec, message: str, error: BaseException | None = None) -> JSONResponse:
    headers: dict[str, str] = {}
    if isinstance(error, QueueFullError):
        headers["Retry-After"] = str(error.retry_after_s)
    if isinstance(error, SessionElsewhereError):
        headers["Lingstream-Replica"] = error.replica
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

    for root in (ServiceError, AdmissionError, PipelineError, TransportError):
        app.add_exception_handler(root, known)
    app.add_exception_handler(RequestValidationError, validation)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(Exception, unexpected)


def _add_contract_components(app: FastAPI) -> None:
    """The document FastAPI builds from the routes, plus the contract's models (`service.http.contract`): the join
    and viewer details the bodies point at, and the control protocol's status messages, which no route returns."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = add_components(build())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]  # FastAPI's documented way to extend its document
