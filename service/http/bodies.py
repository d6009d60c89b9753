"""What every route module shares about bodies: reading a JSON body as a model (415 unless JSON, 422
`invalid_request` when it does not validate), the one sentence from validation errors, and the error responses of
the OpenAPI document."""

from __future__ import annotations

from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from service.errors import InvalidRequestError, UnsupportedMediaTypeError
from service.http.schemas import ErrorBody

__all__ = ["describe_validation_errors", "errors_of", "is_json", "json_body"]

_Model = TypeVar("_Model", bound=BaseModel)


def errors_of(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The OpenAPI `responses` of a route's error statuses (each the one error body)."""
    return {status: {"model": ErrorBody, "description": "An error (see the code)."} for status in statuses}


def describe_validation_errors(errors: Any) -> str:
    """One sentence from pydantic/FastAPI validation errors: `location: message` for the first few."""
    parts = []
    for error in list(errors)[:5]:
        location = ".".join(str(item) for item in error.get("loc", ()) if item != "body") or "body"
        parts.append(f"{location}: {error.get('msg', 'invalid')}")
    return "; ".join(parts) or "the request is invalid"


async def json_body(request: Request, model: type[_Model]) -> _Model:
    """The request body as `model`: 415 unless JSON, 422 `invalid_request` when it does not validate."""
    if not is_json(request.headers.get("content-type", "")):
        raise UnsupportedMediaTypeError("send the request body as application/json")
    try:
        return model.model_validate_json(await request.body())
    except ValidationError as exc:
        raise InvalidRequestError(describe_validation_errors(exc.errors())) from None


def is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))
