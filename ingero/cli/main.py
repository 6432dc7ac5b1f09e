"""Entry point: a click group that imports each command's module only when it runs.

Lazy loading keeps ``ingero --help`` and the Slurm hooks fast and lets a node without
numpy/grpc extras still run the commands that do not need them.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from ingero import __version__
from ingero.runtime.errors import EXIT_SOFTWARE, IngeroError

# command name -> "module:attribute"; one module per command under ingero.cli.
COMMANDS: dict[str, str] = {
    "fleet": "ingero.cli.fleet:command",
    "trace": "ingero.cli.trace:trace",
    "gpu-sample": "ingero.cli.gpu_sample:gpu_sample",
    "check": "ingero.cli.check:check",
    "fleet-push": "ingero.cli.fleet_push:command",
    "sink": "ingero.cli.sink:command",
    "events": "ingero.cli.events:events",
    "drain": "ingero.cli.drain:drain",
    "verdict": "ingero.cli.verdict:verdict",
    "slurm-conf": "ingero.cli.slurm_conf:command",
    "workload": "ingero.cli.workload:workload",
    "demo": "ingero.cli.demo:demo",
    "echo": "ingero.cli.echo:echo",
    "mcp": "ingero.cli.mcp:mcp",
    "explain": "ingero.cli.explain:explain",
    "query": "ingero.cli.query:query",
    "merge": "ingero.cli.merge:merge",
    "export": "ingero.cli.export:export",
    "annotate": "ingero.cli.annotate:annotate",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        command = getattr(importlib.import_module(module_name), attr)
        if not isinstance(command, click.Command):
            raise TypeError(f"{target} is not a click command")
        return command


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ingero")
def cli() -> None:
    """GPU-cluster straggler detection and GPU observability."""


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and exit; an IngeroError becomes one line on stderr and its exit code."""
    try:
        result: Any = cli.main(args=argv, prog_name="ingero", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("ingero: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except IngeroError as exc:
        click.echo(f"ingero: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # last resort: one line, not a traceback
        click.echo(f"ingero: internal error: {type(exc).__name__}: {exc}", err=True)
        sys.exit(EXIT_SOFTWARE)
    sys.exit(result if isinstance(result, int) else 0)


if __name__ == "__main__":
    main()
