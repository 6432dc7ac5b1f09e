"""``ingero slurm-conf``: merge ingero's hook settings into slurm.conf, or name the conflict."""

from __future__ import annotations

import os
from pathlib import Path

import click

from ingero.runtime.atomicfile import write_atomic
from ingero.runtime.errors import EXIT_DATAERR, IngeroError
from ingero.slurm import slurmconf


class SlurmConfError(IngeroError):
    exit_code = EXIT_DATAERR


@click.command("slurm-conf")
@click.option(
    "--file",
    "path",
    type=click.Path(dir_okay=False, exists=True),
    default=lambda: os.environ.get("SLURM_CONF", "/etc/slurm/slurm.conf"),
    show_default="$SLURM_CONF, else /etc/slurm/slurm.conf",
    help="The slurm.conf to merge into.",
)
@click.option(
    "--hooks-dir",
    default=slurmconf.HOOKS_DIR,
    show_default=True,
    help="Where ingero's prolog, epilog and taskprolog are installed.",
)
@click.option("--write", is_flag=True, help="Rewrite the file (and place links) in place.")
@click.option(
    "--check", is_flag=True, help="Change nothing; exit 1 when a merge would change something."
)
def command(path: str, hooks_dir: str, write: bool, check: bool) -> int:
    """Merge PrologFlags=Alloc and ingero's Prolog, Epilog and TaskProlog into slurm.conf.

    Keeps the site's flags and hooks: Alloc joins the existing PrologFlags, a Prolog or
    Epilog glob (prolog.d/*) gets a link to ingero's hook, and a setting ingero cannot
    merge stops the command (exit 65) with one line naming it. Without --write the merged
    file goes to stdout; the changes always go to stderr. Run it with the same arguments
    on the controller and every node (slurm.conf must match), then `scontrol reconfigure`.
    """
    if write and check:
        raise click.UsageError("--write and --check exclude each other")
    text = Path(path).read_text(encoding="utf-8")
    try:
        hooks = slurmconf.Hooks.in_dir(hooks_dir)
        result = slurmconf.merge(text, hooks, os.path.abspath(path), slurmconf.read_text)
        links = slurmconf.missing_links(result.links)
    except slurmconf.SlurmConfConflict as exc:
        raise SlurmConfError(f"{path}: {exc}") from None
    for line in result.changes:
        click.echo(f"ingero slurm-conf: {path}: {line}", err=True)
    for link in links:
        click.echo(f"ingero slurm-conf: link {link.path} -> {link.target}", err=True)
    pending = result.text != text or bool(links)
    if check:
        if not pending:
            click.echo(f"ingero slurm-conf: {path} has ingero's settings", err=True)
        return 1 if pending else 0
    if not write:
        click.echo(result.text, nl=False)
        return 0
    if result.text != text:
        # same mode and owner as before: slurm.conf must stay readable by every Slurm user
        stat = os.stat(path)
        target = Path(os.path.realpath(path))
        write_atomic(target, result.text.encode(), mode=stat.st_mode & 0o7777)
        os.chown(target, stat.st_uid, stat.st_gid)
    for link in links:
        os.symlink(link.target, link.path)
    if pending:
        click.echo(
            "ingero slurm-conf: done; apply the same on every Slurm host, then "
            "`scontrol reconfigure`",
            err=True,
        )
    else:
        click.echo(f"ingero slurm-conf: {path} has ingero's settings already", err=True)
    return 0
