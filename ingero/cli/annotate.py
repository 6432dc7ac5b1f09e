"""``ingero annotate``: the socket where a job marks its steps, phases and labels.

``serve`` runs the server and writes the marks to the node DB; ``send`` writes NDJSON mark
lines from stdin (a shell job's client) and prints each refusal the server answers.
"""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ingero.annotate.codec import DEFAULT_SOCKET, SOCKET_ENV, decode_refusal
from ingero.annotate.limits import DRAIN_S, ServerLimits
from ingero.cli.options import DEFAULT_DB
from ingero.runtime.errors import EXIT_DATAERR, UnavailableError, UsageError
from ingero.runtime.hangup import ignore_hangups
from ingero.runtime.signals import stop_on_signals

_SOCKET_OPTION = click.option(
    "--socket", "socket_path", type=click.Path(path_type=Path), default=Path(DEFAULT_SOCKET),
    envvar=SOCKET_ENV, show_default=True, help=f"The annotate socket (or ${SOCKET_ENV}).",
)  # fmt: skip


@click.group("annotate")
def annotate() -> None:
    """Marks from the job: steps, phases and labels on a local socket."""


# ServerLimits fields the command line sets: (option, field, click type, what it bounds).
_LIMIT_OPTIONS = (
    ("--lines-per-s", "lines_per_s", click.FloatRange(min=0.1), "Lines per second per writer pid"),
    ("--burst", "burst", click.IntRange(min=1), "Lines a writer pid may send at once"),
    ("--uid-lines-per-s", "uid_lines_per_s", click.FloatRange(min=0.1),
     "Lines per second per uid, all its processes together"),
    ("--uid-burst", "uid_burst", click.IntRange(min=1), "Lines a uid may send at once"),
    ("--max-clients", "max_clients", click.IntRange(min=1), "Connections at once"),
    ("--max-clients-per-uid", "max_clients_per_uid", click.IntRange(min=1),
     "Connections at once per uid"),
    ("--max-writers", "max_writers", click.IntRange(min=1),
     "Pids and uids whose rate buckets are remembered"),
    ("--idle-s", "idle_s", click.FloatRange(min=0.05),
     "Close a connection silent this long (seconds)"),
    ("--line-timeout-s", "line_timeout_s", click.FloatRange(min=0.05),
     "Close a connection inside one line this long (seconds)"),
)  # fmt: skip


def _limit_options(command: Callable[..., int]) -> Callable[..., int]:
    defaults = ServerLimits()
    for option, name, kind, what in reversed(_LIMIT_OPTIONS):
        text = f"{what} [default: ServerLimits, {getattr(defaults, name):g}]."
        command = click.option(option, name, type=kind, default=None, help=text)(command)
    return command


@annotate.command("serve")
@_SOCKET_OPTION
@click.option("--db", "db_path", type=click.Path(path_type=Path), default=DEFAULT_DB,
              show_default=True, help="Node DB to write.")  # fmt: skip
@click.option("--group", default=None,
              help="Let this group's members write (socket 0660); default owner-only (0600).")  # fmt: skip
@click.option("--max-db", default=None, help="Prune oldest rows beyond this size (e.g. 1G).")
@click.option("--flush", "flush_s", type=click.FloatRange(min=0.05), default=1.0,
              show_default=True, help="Seconds between node DB writes.")  # fmt: skip
@click.option("--drain", "drain_s", type=click.FloatRange(min=0.0), default=None,
              help=f"Seconds a stop goes on reading what writers sent [default: {DRAIN_S:g}].")  # fmt: skip
@_limit_options
def serve(
    socket_path: Path,
    db_path: Path,
    group: str | None,
    max_db: str | None,
    flush_s: float,
    drain_s: float | None,
    **limit_values: float | int | None,
) -> int:
    """Serve the annotate socket and write marks to the node DB (no root needed)."""
    import dataclasses
    import grp

    from ingero.annotate.identity import Identify
    from ingero.annotate.server import Annotations, Take, listen, log_counts
    from ingero.annotate.server import serve as serve_socket
    from ingero.cli.trace import parse_size
    from ingero.nodedb.writer import Batch, NodeDbWriter
    from ingero.runtime.clock import SystemClock

    ignore_hangups("annotate", "nothing to reload")
    given: dict[str, Any] = {k: v for k, v in limit_values.items() if v is not None}
    limits = dataclasses.replace(ServerLimits(), **given)
    if group is not None:
        try:
            grp.getgrnam(group)
        except KeyError:
            raise UsageError(f"--group {group}: no such group") from None
    max_bytes = parse_size(max_db) if max_db else None
    try:
        db_path.parent.mkdir(parents=True, exist_ok=True)
        writer = NodeDbWriter(db_path, max_bytes, command="ingero annotate")
    except Exception as exc:
        raise UnavailableError(f"{db_path}: cannot open the node DB: {exc}") from exc
    try:
        sock = listen(socket_path, group)
    except OSError as exc:
        writer.close()
        raise UnavailableError(f"{socket_path}: cannot listen: {exc}") from exc

    stop, _ = stop_on_signals()
    core = Annotations(SystemClock(), limits)

    def sink(take: Take) -> None:
        if take.marks or take.mark_ends or take.steps:
            writer.submit(Batch(intervals=take.steps, marks=take.marks, mark_ends=take.mark_ends))

    writer.start()
    print(f"ingero annotate: listening on {socket_path}", file=sys.stderr, flush=True)
    try:
        serve_socket(
            sock, core, sink, stop, flush_s, Identify(), DRAIN_S if drain_s is None else drain_s
        )
    finally:
        sock.close()
        socket_path.unlink(missing_ok=True)
        writer.close()
        log_counts(core)
    return 0


@annotate.command("send")
@_SOCKET_OPTION
def send(socket_path: Path) -> int:
    """Write the NDJSON mark lines on stdin; print each refusal; exit 65 if any was refused."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(socket_path))
    except OSError as exc:
        raise UnavailableError(f"{socket_path}: cannot connect: {exc.strerror or exc}") from exc
    replies = b""
    with sock:
        # A server that refuses the connection (too many clients) closes it: what it
        # answered is still read and printed.
        with contextlib.suppress(OSError):
            for line in sys.stdin.buffer:
                sock.sendall(line if line.endswith(b"\n") else line + b"\n")
            sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                replies += chunk
    refused = 0
    for line in replies.splitlines():
        try:
            reason, detail = decode_refusal(line)
        except ValueError:
            continue
        refused += 1
        click.echo(f"ingero annotate: refused ({reason}): {detail}", err=True)
    if refused:
        sys.exit(EXIT_DATAERR)
    return 0
