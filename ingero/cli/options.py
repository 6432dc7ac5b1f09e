"""Options and value parsing shared by several commands."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ingero import nodedb
from ingero.fanout import ssh as f
from ingero.fanout.ssh import Fanout, FanoutOptions
from ingero.runtime.config import parse_duration
from ingero.runtime.errors import UsageError

# nodedb.DEFAULT_PATH, not ingero.explain.reader.DEFAULT_DB: every daemon imports this module
# for its shared options, and the explain package costs ~0.5 s to import.
DEFAULT_DB = Path(nodedb.DEFAULT_PATH)

F = TypeVar("F", bound=Callable[..., Any])

node_db_option = click.option(
    "--db",
    "db_path",
    type=click.Path(path_type=Path),
    envvar="INGERO_DB",
    default=DEFAULT_DB,
    show_default=True,
    help="Node DB written by `ingero trace --record` [env INGERO_DB]; with --nodes, the path"
    " on the nodes (default: each node's own).",
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


def fanout_options(func: F) -> F:
    """``--nodes``/``--job-nodes`` and the SSH fan-out settings (ingero.fanout.ssh)."""
    for option in reversed(
        [
            click.option(
                "--nodes",
                "nodes",
                default=None,
                help="Run on these nodes over SSH (ClusterShell node set: 'gpu[01-64]').",
            ),
            click.option(
                "--job-nodes",
                "job_nodes",
                default=None,
                metavar="JOB",
                help="Run on the nodes of this Slurm job (squeue / scontrol show hostnames).",
            ),
            click.option(
                "--fanout",
                type=click.IntRange(min=1),
                default=f.DEFAULT_FANOUT,
                show_default=True,
                help="With --nodes: nodes reached at once.",
            ),
            click.option(
                "--node-timeout",
                default=f"{f.DEFAULT_NODE_TIMEOUT_S:g}s",
                show_default=True,
                help="With --nodes: give up on a node after this long.",
            ),
            click.option(
                "--ssh-options",
                envvar="INGERO_SSH_OPTIONS",
                default=None,
                help="With --nodes: ssh options, e.g. '-F ~/.ssh/cluster -p 2222 -i KEY'"
                " [env INGERO_SSH_OPTIONS].",
            ),
            click.option(
                "--remote-ingero",
                envvar="INGERO_REMOTE_INGERO",
                default=f.DEFAULT_REMOTE_INGERO,
                show_default=True,
                help="With --nodes: the ingero command on the nodes [env INGERO_REMOTE_INGERO].",
            ),
        ]
    ):
        func = option(func)
    return func


def fanout_from(
    nodes: str | None,
    job_nodes: str | None,
    fanout: int,
    node_timeout: str,
    ssh_options: str | None,
    remote_ingero: str,
) -> Fanout | None:
    """The nodes to run on and how, or None to run here; UsageError for a bad combination."""
    from ingero.fanout.ssh import expand_nodes

    if nodes is not None and job_nodes is not None:
        raise UsageError("--nodes and --job-nodes: pick one")
    if nodes is None and job_nodes is None:
        return None
    if nodes is not None:
        names = expand_nodes(nodes)
    else:
        from ingero.slurm.jobnodes import make_job_nodes

        assert job_nodes is not None
        names = make_job_nodes("auto").nodes(job_nodes)
    return Fanout(
        names,
        FanoutOptions(
            fanout=fanout,
            node_timeout_s=seconds("--node-timeout", node_timeout, positive=True),
            ssh_options=ssh_options,
            remote_ingero=remote_ingero,
        ),
    )


def explicit(ctx: click.Context, name: str) -> bool:
    """The option was given on the command line (so it is passed on to the nodes)."""
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


LOG_LEVELS = ("debug", "info", "warning", "error")


def log_level_options(func: F) -> F:
    """The one verbosity option every daemon takes: ``--log-level LEVEL``, ``-v`` for debug.

    Defined once here so ``fleet``, ``fleet-push``, ``echo`` and ``sink`` accept the same
    spelling (a unit file or runbook can say ``--log-level debug`` to any of them).
    """
    func = click.option(
        "-v",
        "--verbose",
        is_flag=True,
        help="Shorthand for --log-level debug.",
    )(func)
    return click.option(
        "--log-level",
        type=click.Choice(LOG_LEVELS, case_sensitive=False),
        default="info",
        show_default=True,
        help="Least severe log record written to stderr.",
    )(func)


def setup_logging(log_level: str, verbose: bool, fmt: str) -> None:
    """Configure the root logger from ``log_level_options``; -v wins over --log-level."""
    import logging

    level = logging.DEBUG if verbose else getattr(logging, log_level.upper())
    logging.basicConfig(level=level, format=fmt, force=True)


print_config_option = click.option(
    "--print-config",
    is_flag=True,
    help="Print the effective configuration (file, env and flags applied) as JSON and exit.",
)


def print_config(config: object) -> None:
    """``--print-config``: the validated configuration as JSON. That is what fleet-push and
    Echo printed before (scripts parse it), and JSON is YAML too, so the output loads back as
    a config file."""
    import json

    from ingero.runtime.config import to_dict

    click.echo(json.dumps(to_dict(config), indent=2))
