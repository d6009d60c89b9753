"""A session's resolved config as JSON-able data: what its snapshot shows (`Session.config_view`).

A model worker's `prepare` resolves the client's config into its own type (a dataclass, a mapping or a pydantic
model). `config_view` turns it into plain JSON data: enums become their values, sets sorted lists, paths strings,
nested dataclasses mappings, and anything else its `repr`. `ServiceRuntime` calls it once per session, when the
session is registered.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from pathlib import PurePath

__all__ = ["config_view"]


def config_view(config: object) -> dict[str, object]:
    """The resolved session config as JSON-able data (a dataclass, a mapping or a pydantic model)."""
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        data: object = {field.name: getattr(config, field.name) for field in dataclasses.fields(config)}
    elif isinstance(config, Mapping):
        data = dict(config)
    elif hasattr(config, "model_dump"):
        data = config.model_dump()
    else:
        data = {"value": repr(config)}
    converted = _jsonable(data)
    return converted if isinstance(converted, dict) else {"value": converted}


def _jsonable(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if isinstance(value, Mapping):
        return {str(key): _jsonable(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(item) for item in value]
    if isinstance(value, set | frozenset):
        return sorted((_jsonable(item) for item in value), key=repr)
    if isinstance(value, PurePath):
        return str(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)}
    return repr(value)
