"""``ingero sink``: receive fleet-push events on a Unix socket; count them on /metrics."""

from __future__ import annotations

import sys

import click

from ingero.cli.options import log_level_options, setup_logging
from ingero.runtime.errors import UnavailableError, UsageError
from ingero.runtime.hangup import ignore_hangups
from ingero.runtime.signals import stop_on_signals
from ingero.schema.events import EVENT_SOCKET


@click.command("sink")
@click.option("--socket", "socket_path", default=EVENT_SOCKET, show_default=True)
@click.option(
    "--metrics",
    "metrics_listen",
    default="127.0.0.1:9465",
    show_default=True,
    help="HOST:PORT for /metrics; empty to disable.",
)
@click.option("--print", "print_events", is_flag=True, help="Print each event as one JSON line.")
@log_level_options
def command(
    socket_path: str, metrics_listen: str, print_events: bool, log_level: str, verbose: bool
) -> None:
    """The reference consumer of fleet-push's NDJSON event socket."""
    ignore_hangups("sink", "nothing to reload")
    setup_logging(log_level, verbose, "%(levelname)s %(name)s: %(message)s")
    from ingero.schema.events import Event
    from ingero.sink.server import Sink, serve_metrics

    def show(event: Event) -> None:
        sys.stdout.write(event.to_json() + "\n")
        sys.stdout.flush()

    host, _, port = metrics_listen.rpartition(":")
    if metrics_listen and not port.isdigit():
        raise UsageError(f"--metrics must be HOST:PORT, got {metrics_listen!r}")
    try:
        sink = Sink(socket_path, show if print_events else None)
    except OSError as exc:
        # 69 like fleet and echo: the address is taken or refused, not a usage mistake.
        raise UnavailableError(f"cannot listen on {socket_path}: {exc.strerror or exc}") from None
    http = None
    if metrics_listen:
        try:
            http = serve_metrics(sink.registry, host or "127.0.0.1", int(port))
        except OSError as exc:
            sink.close()
            raise UnavailableError(
                f"cannot listen on {metrics_listen}: {exc.strerror or exc}"
            ) from None
        click.echo(f"ingero sink: /metrics on http://{metrics_listen}/metrics", err=True)
    click.echo(f"ingero sink: listening on {socket_path}", err=True)
    stop, _ = stop_on_signals()
    try:
        sink.serve(stop)
    finally:
        sink.close()
        if http is not None:
            http.shutdown()
