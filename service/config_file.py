"""The optional config file (`LINGSTREAM_CONFIG_FILE` or `--config`): reading it, and the settings source it becomes.

The file is YAML or JSON, a mapping of setting names (without the prefix, in any case) to values; an unknown name
or an unreadable file raises `SettingsError` naming the file. `service.settings.load_settings` reads it with
`read_config_file` and builds `Settings` inside `file_values(...)`, through which `FileSource` (the lowest-priority
source of `Settings`: below the overrides and the environment) answers.
"""

from __future__ import annotations

import contextvars
import importlib
import json
from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import PydanticBaseSettingsSource

from service.errors import SettingsError

__all__ = ["CONFIG_FILE_VARIABLE", "FileSource", "file_values", "read_config_file"]

CONFIG_FILE_VARIABLE = "LINGSTREAM_CONFIG_FILE"

# The values read from the config file, handed to `FileSource` while `load_settings` builds `Settings`.
_FILE_VALUES: contextvars.ContextVar[Mapping[str, object]] = contextvars.ContextVar("lingstream_file_settings")


class FileSource(PydanticBaseSettingsSource):
    """The config file, below the environment: returns what `load_settings` read and checked."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        values = _FILE_VALUES.get({})
        return values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_VALUES.get({}))


@contextmanager
def file_values(values: Mapping[str, object]) -> Iterator[None]:
    """`FileSource` answers from `values` inside the block (settings built elsewhere meanwhile are not affected:
    the values ride in a contextvar)."""
    token = _FILE_VALUES.set(values)
    try:
        yield
    finally:
        _FILE_VALUES.reset(token)


def read_config_file(
    path: Path, known: Collection[str], *, prefix: str, aliases: Mapping[str, str]
) -> dict[str, object]:
    """Read a YAML or JSON mapping of setting names; unknown names are an error (a typo must not pass silently).

    `known` are the setting names; a key may carry the environment `prefix` and any case; a name in `aliases` is
    stored under its alias (the LiveKit variables keep their standard names). Raises `SettingsError`."""
    where = f"{CONFIG_FILE_VARIABLE}={path}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"invalid configuration: cannot read the config file ({where}): {exc.strerror}") from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".json":
            data: object = json.loads(text)
        elif suffix in (".yaml", ".yml"):
            try:
                yaml = importlib.import_module("yaml")
            except ImportError:
                raise SettingsError(
                    f"invalid configuration: {where} is YAML but PyYAML is not installed; use JSON or install pyyaml"
                ) from None
            data = yaml.safe_load(text)
        else:
            raise SettingsError(
                f"invalid configuration: {where} must end in .json, .yaml or .yml (got {suffix or 'no suffix'!r})"
            )
    except (ValueError, ImportError) as exc:
        raise SettingsError(f"invalid configuration: {where} is not valid {suffix[1:].upper()}: {exc}") from None
    except Exception as exc:  # yaml.YAMLError has no common base we can name without importing yaml
        raise SettingsError(f"invalid configuration: {where} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SettingsError(f"invalid configuration: {where} must hold a mapping of setting names to values")
    values: dict[str, object] = {}
    for raw_key, value in data.items():
        key = str(raw_key).strip().lower().removeprefix(prefix.lower())
        if key not in known:
            raise SettingsError(
                f"invalid configuration: {where} has an unknown setting {raw_key!r}; known settings are "
                f"{', '.join(sorted(known))}"
            )
        if isinstance(value, list):  # a YAML list for a comma-separated setting
            value = ",".join(str(item) for item in value)
        values[aliases.get(key, key)] = value
    return values
