"""Configuration: one dataclass per component, loaded from YAML plus ``--set key=value`` overrides.

A config file mirrors the dataclass nesting, e.g. for ``dg-agents eval``::

    env:
      max_steps: 20
    llm:
      temperature: 0.2
      max_concurrency: 8

and ``--set llm.temperature=0.2`` overrides one field (the value is read as YAML, so ``true``,
``3`` and ``[a, b]`` become bool, int and list). Unknown keys are errors that list the valid ones.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from dreamgym_agents.errors import ConfigError


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _is_dataclass_type(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


EXTRA_KEYS = "__extra_keys__"
"""A config dataclass whose class attribute of this name names one of its ``dict`` fields
keeps keys that are not its fields there, as given, for another part to check (the
environment's family-specific settings: :class:`~dreamgym_agents.episodes.env.EnvConfig`)."""


def apply_mapping(obj: Any, mapping: dict[str, Any], prefix: str = "") -> None:
    """Set fields of a (nested) dataclass instance from a mapping, validating the keys."""
    types = _field_types(type(obj))
    extra = getattr(type(obj), EXTRA_KEYS, None)
    for key, value in mapping.items():
        path = f"{prefix}{key}"
        if key not in types and extra is not None:
            getattr(obj, extra)[key] = value
            continue
        if key not in types:
            valid = ", ".join(f"{prefix}{k}" for k in types)
            raise ConfigError(f"unknown config key {path!r}; valid keys: {valid}")
        current = getattr(obj, key)
        if dataclasses.is_dataclass(current) and not isinstance(current, type):
            if not isinstance(value, dict):
                raise ConfigError(f"config key {path!r} needs a mapping of its fields")
            apply_mapping(current, value, prefix=f"{path}.")
        else:
            value = coerce_value(value, types[key], path)
            if isinstance(current, dict) and isinstance(value, dict):
                value = {**current, **value}  # a mapping's keys merge, as a section's fields do
            setattr(obj, key, value)
    if hasattr(obj, "__post_init__"):
        obj.__post_init__()


class RawText(str):
    """A ``--set`` value as typed: read as YAML unless the field is a string."""


def coerce_value(value: Any, tp: Any, path: str) -> Any:
    """``value`` (from YAML or ``--set``) as the type ``tp`` of the field ``path``.

    Raises:
        ConfigError: It cannot be one.
    """
    origin = typing.get_origin(tp)
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if origin in (typing.Union, types.UnionType) and args:
        tp = args[0]
        origin = typing.get_origin(tp)
    if origin is dict and isinstance(value, dict):  # each --set value typed as the dict's
        inner = typing.get_args(tp)[1] if len(typing.get_args(tp)) == 2 else Any
        return {k: coerce_value(v, inner, f"{path}.{k}") for k, v in value.items()}
    if isinstance(value, RawText):
        if tp is str:
            return str(value)
        try:
            value = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            value = str(value)
    if value is None:
        return None
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):
        try:  # YAML 1.1 reads 1e-3 (no dot) as a string
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool) and not isinstance(value, tp):
        raise ConfigError(f"config key {path!r} expects {tp.__name__}, got {value!r}")
    return value


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``a.b=value`` into (["a", "b"], the value as typed).

    The value is read as YAML when applied to a non-string field (``true``, ``3``, ``[a, b]``),
    and kept verbatim for a string field (a mock answer may contain ``: ``).
    """
    if "=" not in text:
        raise ConfigError(f"--set expects key=value, got {text!r}")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"--set expects key=value, got {text!r}")
    return key.strip().split("."), RawText(raw)


def read_yaml_mapping(path: str | Path) -> dict[str, Any]:
    """A YAML file whose top level is a mapping (an empty file is an empty mapping).

    Raises:
        ConfigError: The file is missing, not YAML, or not a mapping at the top.
    """
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of config sections")
    return data


def load_config(
    obj: Any, path: str | Path | None = None, overrides: list[str] | None = None, prefix: str = ""
) -> Any:
    """Apply a YAML file and ``--set`` overrides to a config dataclass instance; return it.

    ``prefix`` (e.g. ``"env."``) is how the keys are named in error messages.
    """
    if path is not None:
        apply_mapping(obj, read_yaml_mapping(path), prefix)
    merged: dict[str, Any] = {}
    for text in overrides or []:
        keys, value = parse_override(text)
        level = merged
        for key in keys[:-1]:
            if not isinstance(level.get(key), dict):
                level[key] = {}
            level = level[key]
        level[keys[-1]] = value
    if merged:  # all at once: checks that join fields see every override, not the first
        apply_mapping(obj, merged, prefix)
    return obj


def to_dict(obj: Any) -> dict[str, Any]:
    """A config as plain data (for ``run.json``)."""
    return dataclasses.asdict(obj)
