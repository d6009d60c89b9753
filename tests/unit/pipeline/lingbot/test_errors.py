from __future__ import annotations

import inspect

import pytest

import pipeline.lingbot.errors as errors
from pipeline.errors import PipelineError


def public_errors() -> list[type[Exception]]:
    return [getattr(errors, name) for name in errors.__all__]


def test_every_error_descends_from_the_package_root() -> None:
    for error in public_errors():
        assert issubclass(error, errors.LingBotError)
        assert issubclass(error, PipelineError)


def test_the_docstring_draws_every_error() -> None:
    doc = inspect.getdoc(errors) or ""
    for error in public_errors():
        assert error.__name__ in doc


@pytest.mark.parametrize(
    "error",
    [
        errors.ChunkContractError,
        errors.ControlError,
        errors.SessionConfigError,
        errors.ImageInputError,
        errors.PlacementError,
        errors.ModelInputError,
    ],
)
def test_input_errors_are_value_errors(error: type[Exception]) -> None:
    assert issubclass(error, ValueError)


def test_session_misuse_is_not_a_value_error() -> None:
    assert not issubclass(errors.ModelSessionError, ValueError)
