"""Daemon configuration: YAML files validated against dataclass schemas.

Each daemon declares its configuration as (nested) frozen dataclasses whose field defaults
are the one source of truth for defaults. ``load_config`` finds the file (``--config``, then
``$INGERO_CONFIG``, then ``/etc/ingero/<daemon>.yaml``), checks every key and value, and
applies CLI overrides last. A bad value raises ``ConfigError`` naming the key and the file.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml

from ingero.runtime.errors import ConfigError

T = TypeVar("T")

log = logging.getLogger(__name__)

DEFAULT_CONFIG_DIR = Path("/etc/ingero")
CONFIG_ENV = "INGERO_CONFIG"

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


class Duration(float):
    """Seconds, written in YAML as ``5s``, ``30m``, ``250ms`` or a bare number of seconds."""


def parse_duration(value: object) -> Duration:
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 5s or 30m, got {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and (m := _DURATION_RE.match(value)):
        seconds = float(m.group(1)) * _DURATION_UNITS[m.group(2)]
    else:
        raise ValueError(f"expected a duration like 5s or 30m, got {value!r}")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"a duration must be finite and not negative, got {value!r}")
    return Duration(seconds)


def check(predicate: Callable[[Any], bool], message: str) -> dict[str, Any]:
    """Field metadata: ``field(default=..., metadata=check(lambda v: v > 0, "must be > 0"))``."""
    return {"check": (predicate, message)}


def formerly(*names: str) -> dict[str, Any]:
    """Field metadata: the key's earlier names, still read from sites' files (with one
    deprecation line each) so a rename that makes one name per idea breaks no config."""
    return {"formerly": names}


def in_range(lo: float, hi: float) -> dict[str, Any]:
    return check(lambda v: lo <= v <= hi, f"must be between {lo} and {hi}")


def positive() -> dict[str, Any]:
    return check(lambda v: v > 0, "must be greater than 0")


def _is_hostport(value: str) -> bool:
    _host, sep, port = value.rpartition(":")
    return bool(sep) and port.isdigit() and 0 <= int(port) <= 65535


HOSTPORT = check(_is_hostport, "must be HOST:PORT")
"""Field metadata for a listen address such as ``0.0.0.0:4317`` (port 0: any free port)."""


def find_config_file(daemon: str, explicit: str | os.PathLike[str] | None) -> Path | None:
    """The file to read, or None when no file exists and none was asked for."""
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ConfigError(f"{path}: configuration file not found")
        return path
    env = os.environ.get(CONFIG_ENV)
    if env:
        path = Path(env)
        if not path.is_file():
            raise ConfigError(f"{path}: configuration file not found (from ${CONFIG_ENV})")
        return path
    default = DEFAULT_CONFIG_DIR / f"{daemon}.yaml"
    return default if default.is_file() else None


def load_config(
    schema: type[T],
    daemon: str,
    explicit: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    flags: Mapping[str, str] | None = None,
    env_defaults: Mapping[str, tuple[str, Any]] | None = None,
) -> T:
    """Read, validate and return the configuration of ``daemon`` as an instance of ``schema``.

    ``overrides`` maps dotted keys (``listen.api``) to values from CLI flags; ``None`` values
    are ignored so unset flags do not clobber the file. A bad override is blamed on its
    flag: ``flags`` names it where it is not ``--`` + the key's last part with dashes.
    ``env_defaults`` maps dotted keys to (environment variable, value): used only where the
    file sets no value, so the order is flag > file > environment > the schema's default;
    a bad one is blamed on its variable.
    """
    path = find_config_file(daemon, explicit)
    source = str(path) if path else "<defaults>"
    raw: Any = {}
    if path is not None:
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: cannot read configuration: {exc}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(raw, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of keys, got {type(raw).__name__}"
        )
    blame: dict[str, str] = {}
    for dotted, (variable, value) in (env_defaults or {}).items():
        if _put(raw, dotted, value, replace=False):
            blame[dotted] = variable
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        _put(raw, dotted, value, replace=True)
        _drop_earlier_names(schema, raw, dotted)  # the flag wins over the file's old key too
        blame[dotted] = (flags or {}).get(dotted) or "--" + dotted.rpartition(".")[2].replace(
            "_", "-"
        )
    try:
        return build(schema, raw, source)
    except ConfigError as exc:
        # A bad flag value is the flag's fault, not the file's (nor "<defaults>"'s): name
        # the flag (--push-interval for push_interval, the CLI's naming rule).
        text = str(exc)
        for dotted, culprit in blame.items():
            blamed = f"{source}: {dotted}: "
            if text.startswith(blamed):
                raise ConfigError(f"{culprit}: {text[len(blamed) :]}") from None
        raise


def _put(raw: dict[str, Any], dotted: str, value: Any, *, replace: bool) -> bool:
    """Set ``raw[a][b]`` for ``a.b`` (creating mappings); without ``replace``, only where
    no value is there yet. True if it was set."""
    node = raw
    *parents, leaf = dotted.split(".")
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    if not replace and node.get(leaf) is not None:
        return False
    node[leaf] = value
    return True


def _drop_earlier_names(schema: Any, raw: dict[str, Any], dotted: str) -> None:
    """Remove from ``raw`` the earlier names (``formerly``) of the key ``dotted``."""
    node: Any = raw
    *parents, leaf = dotted.split(".")
    for part in parents:
        if not dataclasses.is_dataclass(schema) or not isinstance(node.get(part), dict):
            return
        schema, node = typing.get_type_hints(schema).get(part), node[part]
    fields = (
        {f.name: f for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else {}
    )
    for old in fields[leaf].metadata.get("formerly", ()) if leaf in fields else ():
        node.pop(old, None)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """PyYAML's error in one line: what is wrong and where (its str() spans five lines)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}"


def build(schema: type[T], raw: Mapping[str, Any], source: str, prefix: str = "") -> T:
    """Validate ``raw`` against the dataclass ``schema``; unknown keys are errors."""
    if not dataclasses.is_dataclass(schema):
        raise TypeError(f"{schema!r} is not a dataclass")
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema)}
    raw = _renamed(fields, raw, source, prefix)
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        key = prefix + str(unknown[0])
        raise ConfigError(f"{source}: unknown key '{key}' (known: {', '.join(sorted(fields))})")
    values: dict[str, Any] = {}
    for name, field in fields.items():
        key = prefix + name
        if name not in raw:
            continue
        try:
            value = _coerce(hints[name], raw[name], source, key)
        except ValueError as exc:
            raise ConfigError(f"{source}: {key}: {exc}") from None
        checker = field.metadata.get("check")
        if checker is not None and value is not None:
            predicate, message = checker
            if not predicate(value):
                raise ConfigError(f"{source}: {key}: {message}, got {raw[name]!r}")
        values[name] = value
    instance = schema(**values)
    validate = getattr(instance, "validate", None)
    if callable(validate):
        try:
            validate()
        except ValueError as exc:
            raise ConfigError(f"{source}: {prefix}{exc}") from None
    return typing.cast(T, instance)


def _renamed(
    fields: Mapping[str, dataclasses.Field[Any]], raw: Mapping[str, Any], source: str, prefix: str
) -> Mapping[str, Any]:
    """``raw`` with each key's earlier name (``formerly``) read as the key, one warning line
    per earlier name used; both names set is an error (which one would win is a guess)."""
    out = dict(raw)
    for name, field in fields.items():
        for old in field.metadata.get("formerly", ()):
            if old not in out:
                continue
            if name in out:
                raise ConfigError(
                    f"{source}: {prefix}{old} and {prefix}{name} are one setting; keep {name}"
                )
            log.warning("%s: %s%s is deprecated; it is %s%s now", source, prefix, old, prefix, name)
            out[name] = out.pop(old)
    return out


def _coerce(hint: Any, value: Any, source: str, key: str) -> Any:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        # ``str | list[str]``: the first form the value fits; the error is the last form's.
        for arg in args[:-1]:
            try:
                return _coerce(arg, value, source, key)
            except ValueError:
                continue
        return _coerce(args[-1], value, source, key)
    if dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping, got {value!r}")
        return build(typing.cast(type, hint), value, source, prefix=key + ".")
    if hint is Duration:
        return parse_duration(value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"expected an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"expected a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"expected a finite number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"expected a string, got {value!r}")
        return value
    if origin is dict:
        key_type, value_type = typing.get_args(hint)
        if not isinstance(value, dict):
            raise ValueError(f"expected a mapping, got {value!r}")
        return {
            _coerce(key_type, k, source, key): _coerce(value_type, v, source, f"{key}.{k}")
            for k, v in value.items()
        }
    if origin is list:
        (item_type,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ValueError(f"expected a list, got {value!r}")
        return [_coerce(item_type, v, source, key) for v in value]
    if origin is typing.Literal:
        allowed = typing.get_args(hint)
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(map(str, allowed))}, got {value!r}")
        return value
    raise TypeError(f"unsupported configuration type {hint!r} for {key}")


def to_dict(config: object) -> dict[str, Any]:
    """The effective configuration as plain data (for ``--print-config`` and docs)."""
    if not dataclasses.is_dataclass(config) or isinstance(config, type):
        raise TypeError("expected a dataclass instance")
    return dataclasses.asdict(config)
