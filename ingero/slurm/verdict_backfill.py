"""The verdicts Fleet did not write (it was away, or restarted during the job), filled in
later from Echo, which holds the events: ``ingero verdict backfill``.

For every job of this cluster that ended in the window (Slurm's accounting says so) and
has no ingero part in its AdminComment yet (``replace``: also those that have one), Echo is
asked for the job's events (question ``events``, the job's start to its end plus
``LATE_S``); a job Echo knows nothing of (no events, and not among the ``jobs`` it saw in
that window) gets nothing. The events are folded and written exactly as Fleet does
(:func:`ingero.slurm.verdict_writer.write_verdict`). Echo is reached through ``ask`` (the
CLI passes Echo's HTTP client), so this module knows no daemon.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ingero.schema.events import Event
from ingero.slurm.backend import AccountingBackend, JobRecord, SlurmError
from ingero.slurm.verdict import split_admin_comment, tally_events
from ingero.slurm.verdict_writer import write_verdict

log = logging.getLogger(__name__)

Ask = Callable[[str, dict[str, Any]], dict[str, Any]]
# Node events of a job (a gpu_idle's end, a last straggler_resolved) may be stamped a little
# after the job's end as accounting has it.
LATE_S = 300.0
EVENTS_LIMIT = 10_000  # Echo's most rows per answer


@dataclass(frozen=True)
class BackfillResult:
    job_id: str
    outcome: str  # an OUTCOMES value of verdict_writer, or "unknown", "has_verdict", "failed"
    words: str


def job_events(ask: Ask, cluster: str, record: JobRecord) -> tuple[list[Event], bool]:
    """The job's events as Echo holds them, and whether Echo cut the answer."""
    start = record.start if record.start is not None else (record.end or 0.0) - 86400.0
    answer = ask(
        "events",
        {
            "cluster_id": cluster,
            "job_id": record.job_id,
            "since": start - 60.0,
            "until": (record.end or start) + LATE_S,
            "limit": EVENTS_LIMIT,
        },
    )
    events = []
    for row in answer.get("events") or []:
        extra = row.get("extra") if isinstance(row.get("extra"), dict) else {}
        fields = {k: v for k, v in row.items() if k != "extra" and v is not None}
        try:
            events.append(Event.from_dict({**extra, **fields}))
        except ValueError as exc:
            log.warning("job %s: an event from Echo is not readable: %s", record.job_id, exc)
    return events, bool(answer.get("truncated"))


def known_to_echo(ask: Ask, cluster: str, record: JobRecord) -> bool:
    """Whether Echo saw the job at all (its scores, where it has no event of it)."""
    start = record.start if record.start is not None else (record.end or 0.0) - 86400.0
    answer = ask(
        "jobs",
        {"cluster_id": cluster, "since": start, "until": (record.end or start) + LATE_S,
         "limit": EVENTS_LIMIT},
    )  # fmt: skip
    return any(j.get("job_id") == record.job_id for j in answer.get("jobs") or [])


def backfill(
    backend: AccountingBackend,
    ask: Ask,
    since: float,
    until: float,
    max_bytes: int,
    replace: bool = False,
    dry_run: bool = False,
) -> Iterator[BackfillResult]:
    """One result per ended job of the window, as it is settled; raises SlurmError when
    Slurm cannot list the jobs (a job's own failure is its result)."""
    cluster = backend.cluster_name()
    for record in backend.ended_jobs(since, until):
        if not replace and split_admin_comment(record.admin_comment)[1] is not None:
            yield BackfillResult(record.job_id, "has_verdict", "already holds a verdict")
            continue
        events, cut = job_events(ask, cluster, record)
        if not events and not known_to_echo(ask, cluster, record):
            yield BackfillResult(record.job_id, "unknown", "Echo knows nothing of the job")
            continue
        tally = tally_events(cluster, record.job_id, events)
        note = f" (Echo cut its answer at {len(events)} events)" if cut else ""
        if dry_run:
            yield BackfillResult(record.job_id, "dry_run", f"{tally.events} events{note}")
            continue
        try:
            outcome, words = write_verdict(backend, tally, record, max_bytes)
        except SlurmError as exc:
            yield BackfillResult(record.job_id, "failed", str(exc))
            continue
        yield BackfillResult(record.job_id, outcome, f"{words}, {tally.events} events{note}")
