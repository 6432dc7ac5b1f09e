"""Options and value parsing shared by several commands."""

from __future__ import annotations

from pathlib import Path

import click

from ingero.config import parse_duration
from ingero.errors import UsageError
from ingero.explain.reader import DEFAULT_DB

node_db_option = click.option(
    "--db",
    "db_path",
    type=click.Path(path_type=Path),
    default=DEFAULT_DB,
    show_default=True,
    help="Node DB written by `ingero trace --record`.",
)


def seconds(option: str, value: str, *, positive: bool = False) -> float:
    """A duration option (``30s``, ``5m``, ``1h``) in seconds; a bad one is a usage error."""
    try:
        result = float(parse_duration(value))
    except ValueError as exc:
        raise UsageError(f"{option}: {exc}") from None
    if positive and result <= 0:
        raise UsageError(f"{option}: must be longer than 0s")
    return result
