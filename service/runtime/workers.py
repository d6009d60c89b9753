"""Choosing and building the model workers: the only place the service names a model implementation.

`build_workers(settings)` returns one `BidirectionalService` per model worker (`NUM_WORKERS`): the LingBot service
from `pipeline.lingbot`, imported only here and only when called; start-up fails with a clear message when it is
not importable. It is the wiring point for the model packages' constructors; the settings are converted into
`WorkerOptions` here, once. `load_factory` resolves the test-only `--worker-factory` hook. The transport is built
in `service.runtime.transports`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from admission import ExecutionLease
from pipeline.bidirectional import BidirectionalService
from service.errors import SettingsError
from service.settings import Settings

__all__ = ["WorkerOptions", "build_workers", "load_factory", "worker_options"]


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """What one model worker is built from, converted once from `Settings` (the model packages never see them)."""

    worker_index: int
    num_workers: int
    max_sessions_per_worker: int
    device: str
    torch_threads: int | None
    max_image_bytes: int
    max_image_pixels: int
    session_history: int = 256


def worker_options(settings: Settings) -> list[WorkerOptions]:
    return [
        WorkerOptions(
            worker_index=index,
            num_workers=settings.num_workers,
            max_sessions_per_worker=settings.max_sessions_per_worker,
            device=settings.device,
            torch_threads=settings.torch_threads,
            max_image_bytes=settings.max_image_bytes,
            max_image_pixels=settings.max_image_pixels,
            session_history=settings.session_history,
        )
        for index in range(settings.num_workers)
    ]


def build_workers(settings: Settings) -> list[BidirectionalService]:
    """One LingBot model worker per `NUM_WORKERS`, each with its own execution lease. Raises `SettingsError` when
    the implementation cannot be imported.

    Wiring point: `LingBotService(ReferenceWorldModel(device), lease=ExecutionLease(), max_image_bytes=...,
    max_image_pixels=..., torch_threads=...)`; on CUDA, worker i uses `cuda:i` (one GPU per worker until the
    placement planner assigns GPU groups). Swap `ReferenceWorldModel` for the real model here.
    """
    try:
        from pipeline.lingbot import LingBotService, ReferenceWorldModel
    except ImportError as exc:
        raise SettingsError(
            f"cannot start: the LingBot model worker (pipeline.lingbot.LingBotService) is not importable: {exc}"
        ) from None
    workers: list[BidirectionalService] = []
    for options in worker_options(settings):
        device = "cpu" if options.device == "cpu" else f"cuda:{options.worker_index}"
        workers.append(
            LingBotService(
                ReferenceWorldModel(device),
                lease=ExecutionLease(),
                max_image_bytes=options.max_image_bytes,
                max_image_pixels=options.max_image_pixels,
                torch_threads=options.torch_threads,
                history=options.session_history,
            )
        )
    return workers


def load_factory(spec: str) -> object:
    """Resolve `module:attribute` (the test-only `--worker-factory` hook of `lingstream serve`)."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise SettingsError(f"invalid worker factory {spec!r}: expected module:callable")
    try:
        module = importlib.import_module(module_name)
        factory: object = getattr(module, attribute)
    except (ImportError, AttributeError) as exc:
        raise SettingsError(f"invalid worker factory {spec!r}: {exc}") from None
    return factory
