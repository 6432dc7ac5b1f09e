"""Write man pages (section 1) for ingero and each of its commands, from the click tree.

    python packaging/manpages.py OUTDIR [DATE]

One page per command: ingero(1), ingero-fleet(1), ingero-drain(1), ingero-drain-list(1), ...
Each has NAME (the command's short help), SYNOPSIS, DESCRIPTION (its help text), OPTIONS
(as ``--help`` prints them: click's own option signatures and help, defaults included),
COMMANDS for groups, and SEE ALSO. DATE (YYYY-MM-DD) goes in the header so a rebuild of the
same version is byte-identical; default: today.

Written here rather than with click-man: that project has had no release since 2021 and
its pages lack the option defaults --help shows.
"""

from __future__ import annotations

import datetime
import sys
from collections.abc import Iterator
from pathlib import Path

import click

from ingero import __version__
from ingero.cli.main import cli


def escape(text: str) -> str:
    """Text safe in roff: backslashes and hyphens escaped, no line taken for a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(
        f"\\&{line}" if line.startswith((".", "'")) else line for line in text.splitlines()
    )


def paragraphs(help_text: str) -> list[str]:
    """click help as roff paragraphs; a paragraph led by \\b keeps its line breaks."""
    out: list[str] = []
    for block in click.unstyle(help_text).strip().split("\n\n"):
        if block.startswith("\b"):
            lines = block.splitlines()[1:]
            out.append(".nf\n" + escape("\n".join(lines)) + "\n.fi")
        else:
            out.append(escape(" ".join(block.split())))
    return out


def page(path: list[str], command: click.Command, ctx: click.Context) -> str:
    name = "-".join(path)
    short = command.get_short_help_str(limit=200).rstrip(".")
    lines = [
        f'.TH "{name.upper()}" "1" "{{date}}" "ingero {__version__}" "ingero manual"',
        ".SH NAME",
        f"{escape(name)} \\- {escape(short)}",
        ".SH SYNOPSIS",
        f".B {escape(' '.join(path))}",
        escape(" ".join(command.collect_usage_pieces(ctx))),
    ]
    if command.help:
        lines.append(".SH DESCRIPTION")
        lines.extend(f".PP\n{p}" for p in paragraphs(command.help))
    records = [r for p in command.get_params(ctx) if (r := p.get_help_record(ctx)) is not None]
    if records:
        lines.append(".SH OPTIONS")
        for signature, help_text in records:
            lines.append(f".TP\n.B {escape(signature)}\n{escape(' '.join(help_text.split()))}")
    if isinstance(command, click.Group):
        lines.append(".SH COMMANDS")
        for sub in command.list_commands(ctx):
            child = command.get_command(ctx, sub)
            if child is not None:
                lines.append(
                    f".TP\n.B {escape(' '.join([*path, sub]))}\n"
                    f"{escape(child.get_short_help_str(limit=200))}\n"
                    f"See \\fB{escape('-'.join([*path, sub]))}\\fR(1)."
                )
    see = ["ingero"] if len(path) > 1 else []
    if len(path) > 2:
        see.append("-".join(path[:-1]))
    if see:
        lines.append(".SH SEE ALSO")
        lines.append(", ".join(f"\\fB{escape(s)}\\fR(1)" for s in see))
    return "\n".join(lines) + "\n"


def walk(
    path: list[str], command: click.Command, parent: click.Context | None
) -> Iterator[tuple[list[str], click.Command, click.Context]]:
    ctx = click.Context(command, info_name=path[-1], parent=parent)
    yield path, command, ctx
    if isinstance(command, click.Group):
        for sub in command.list_commands(ctx):
            child = command.get_command(ctx, sub)
            if child is not None and not child.hidden:
                yield from walk([*path, sub], child, ctx)


def main() -> None:
    out = Path(sys.argv[1])
    date = sys.argv[2] if len(sys.argv) > 2 else datetime.date.today().isoformat()
    out.mkdir(parents=True, exist_ok=True)
    for path, command, ctx in walk(["ingero"], cli, None):
        text = page(path, command, ctx).replace("{date}", date)
        (out / f"{'-'.join(path)}.1").write_text(text)


if __name__ == "__main__":
    main()
