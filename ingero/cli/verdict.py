"""``ingero verdict``: a job's ingero verdict in its Slurm AdminComment: read one, decode
one, and fill in those Fleet missed, from Echo (docs/slurm.md, "The job's verdict in sacct")."""

from __future__ import annotations

import json
import sys
import time

import click

from ingero.cli.drain import BACKEND_OPTION, TIMEOUT_OPTION
from ingero.cli.mcp import ECHO_OPTION, TOKEN_FILE_OPTION, echo_token
from ingero.runtime.config import parse_duration
from ingero.runtime.errors import UnavailableError, UsageError
from ingero.slurm.factory import make_backend
from ingero.slurm.verdict import (
    DEFAULT_MAX_BYTES,
    MAX_MAX_BYTES,
    MIN_MAX_BYTES,
    VerdictError,
    decode_part,
    human_line,
    split_admin_comment,
)


@click.group()
def verdict() -> None:
    """The ingero verdict of Slurm jobs, kept in their AdminComment."""


def _show(text: str | None, as_json: bool, what: str) -> None:
    site, part = split_admin_comment(text)
    if part is None:
        raise UsageError(f"{what}: no ingero verdict (no INGERO1: part in the AdminComment)")
    try:
        data = decode_part(part)
    except VerdictError as exc:
        raise UsageError(f"{what}: {exc}") from None
    if as_json:
        click.echo(json.dumps({"verdict": data, "site_text": site or None}, indent=2))
    else:
        click.echo(f"{what}: {human_line(data)}")


@verdict.command("show")
@click.argument("job_id")
@BACKEND_OPTION
@TIMEOUT_OPTION
@click.option("--json", "as_json", is_flag=True, help="The verdict's JSON (and the site's text).")
def show_cmd(job_id: str, backend: str, timeout: float, as_json: bool) -> None:
    """JOB_ID's verdict, from Slurm's accounting (exit 2 when it has none)."""
    try:
        record = make_backend(backend, timeout).job_record(job_id)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if record is None:
        raise UsageError(f"job {job_id}: not in Slurm's accounting")
    _show(record.admin_comment, as_json, f"job {job_id}")


@verdict.command("decode")
@click.argument("text", default="-")
@click.option("--json", "as_json", is_flag=True, help="The verdict's JSON (and the site's text).")
def decode_cmd(text: str, as_json: bool) -> None:
    """Decode an AdminComment (TEXT, or stdin with '-': `sacct -n -X -j J -o AdminComment%4000
    | ingero verdict decode`)."""
    _show(sys.stdin.read().strip() if text == "-" else text, as_json, "AdminComment")


@verdict.command("backfill")
@ECHO_OPTION
@TOKEN_FILE_OPTION
@click.option(
    "--since",
    "since_text",
    default="7d",
    show_default=True,
    help="How far back: jobs that ended since then.",
)
@click.option(
    "--until", "until", type=float, default=None, help="Window end, Unix seconds (default: now)."
)
@click.option(
    "--max-bytes",
    type=click.IntRange(MIN_MAX_BYTES, MAX_MAX_BYTES),
    default=DEFAULT_MAX_BYTES,
    show_default=True,
    help="Most bytes of ingero's part of an AdminComment.",
)
@click.option("--replace", is_flag=True, help="Also rewrite jobs that hold a verdict already.")
@click.option("--dry-run", is_flag=True, help="Say what would be written, write nothing.")
@BACKEND_OPTION
@TIMEOUT_OPTION
def backfill_cmd(
    echo_url: str,
    token_file: str | None,
    since_text: str,
    until: float | None,
    max_bytes: int,
    replace: bool,
    dry_run: bool,
    backend: str,
    timeout: float,
) -> None:
    """Write the verdicts of ended jobs that have none (Fleet was away), from Echo's events.

    One line per job; jobs Echo knows nothing of get nothing. Idempotent: run it from a
    timer as often as you like."""
    from ingero.echo.mcp_server import RemoteBackend, ToolFailure
    from ingero.slurm.verdict_backfill import backfill

    try:
        window = float(parse_duration(since_text))
    except ValueError as exc:
        raise UsageError(f"--since: {exc}") from None
    echo = RemoteBackend(echo_url, echo_token(token_file))
    end = until if until is not None else time.time()
    counts: dict[str, int] = {}
    try:
        for result in backfill(
            make_backend(backend, timeout),
            echo.call,
            end - window,
            end,
            max_bytes,
            replace,
            dry_run,
        ):
            counts[result.outcome] = counts.get(result.outcome, 0) + 1
            click.echo(f"job {result.job_id}: {result.outcome}: {result.words}")
    except ToolFailure as exc:
        raise UnavailableError(f"verdict backfill: {exc}") from None
    summary = ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no ended job"
    click.echo(f"verdict backfill: {summary}")
