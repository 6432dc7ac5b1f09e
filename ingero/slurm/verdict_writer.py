"""Writes each job's verdict into its Slurm AdminComment, once the job has ended: Fleet's
side (``verdict.enabled``), on its own thread, through the Slurm backend.

Fleet owns the verdict because it holds the evidence: the episodes it opened and closed,
the NCCL lags and hangs it found, the drains it made, and the node events (GPU faults, idle
GPUs) pushed to it. The controller is the only place that may change a job's record (a
node's prolog and epilog never run Slurm commands), and Fleet already talks to Slurm there
with a timeout and a backend; slurmctld's EpilogSlurmctld would have to ask Fleet for the
evidence over the network, per job, on slurmctld's own time. slurmctld refuses to update
a finished job, so the text goes to the job's accounting record (``sacctmgr modify job``,
or pyslurm's slurmdb API): sites need slurmdbd for the verdict.

A job is followed from the first tick that shows its peer group or the first event that
names it ("a job Fleet knew nothing of gets nothing"). When its group is gone (its nodes
push with no job any more), the worker asks accounting for it, every ``verdict.retry``
until the record says it ended (or ``verdict.give_up`` passed), folds the job's events
(:class:`ingero.slurm.verdict.JobTally`) with the record's start and end, and writes the
merged AdminComment (the site's text kept; an unchanged text is not written again). A job
that began before this Fleet started is left to ``ingero verdict backfill`` (its first
events are not here), as is every job Fleet missed while it was away.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ingero.runtime.clock import Clock, SystemClock
from ingero.schema.events import Event
from ingero.slurm.backend import AccountingBackend, JobRecord, SlurmError
from ingero.slurm.drain import FleetDaemonHooks
from ingero.slurm.factory import make_backend
from ingero.slurm.verdict import (
    JobTally,
    VerdictConfig,
    encode_part,
    merge_admin_comment,
    split_admin_comment,
)

log = logging.getLogger(__name__)

JobKey = tuple[str, str]  # (cluster_id, job_id)

# What became of a job's verdict; the label values of ingero_fleet_verdicts_total.
WRITTEN = "written"
UNCHANGED = "unchanged"  # the record already holds this verdict
PARTIAL = "partial"  # the job began before this Fleet: left to the backfill
REFUSED = "refused"  # the site's text could not be kept through this backend
GIVEN_UP = "given_up"  # no ended record within verdict.give_up
NOT_THIS_CLUSTER = "other_cluster"  # a job of a cluster this Slurm is not
OUTCOMES = (WRITTEN, UNCHANGED, PARTIAL, REFUSED, GIVEN_UP, NOT_THIS_CLUSTER)


def write_verdict(
    backend: AccountingBackend, tally: JobTally, record: JobRecord, max_bytes: int
) -> tuple[str, str]:
    """Write the ended job's verdict into its AdminComment; (outcome, what was done in
    words). The one write path of Fleet and of the backfill; raises SlurmError."""
    verdict = tally.verdict(record.start, record.end, record.nodes)
    lowered = backend.admin_comment_lowercased
    site, _ = split_admin_comment(record.admin_comment)
    if lowered and site != site.lower():
        return REFUSED, (
            "this Slurm's sacctmgr stores an AdminComment in lower case, which would destroy "
            f"the site's text ({site[:40]!r}...): not written"
        )
    if any(c in site for c in "\"'\n\r"):
        return REFUSED, "the site's AdminComment holds quotes or a newline: not written"
    text = merge_admin_comment(record.admin_comment, encode_part(verdict, max_bytes, lowered))
    stored = text.lower() if lowered else text
    if stored == record.admin_comment:
        return UNCHANGED, "the record already holds this verdict"
    backend.set_admin_comment(record.job_id, text)
    return WRITTEN, f"{len(text.encode())} bytes"


@dataclass
class _Followed:
    tally: JobTally
    left: float | None = None  # monotonic time its group was last gone, None while live
    next_check: float = 0.0


class Tick(Protocol):
    """What the writer needs of a Fleet tick (Fleet's ``TickResult`` has it)."""

    @property
    def groups(self) -> Sequence[Any]: ...  # each with .cluster_id and .job_id


class VerdictWriter:
    def __init__(
        self,
        config: VerdictConfig,
        backend: AccountingBackend,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self._backend = backend
        self._clock = clock or SystemClock()
        self.started_at = self._clock.now()
        self._cond = threading.Condition()
        self._jobs: dict[JobKey, _Followed] = {}
        # Jobs whose verdict is done (newest last, at most max_jobs): a late event of one
        # must not start a second, poorer verdict of it.
        self._finished: OrderedDict[JobKey, None] = OrderedDict()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.outcomes: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.failures = 0
        self.dropped = 0  # jobs not followed: verdict.max_jobs reached

    # -- Fleet's tick thread: O(events + groups), never waits on Slurm --------------------

    def _follow(self, key: JobKey) -> _Followed | None:
        followed = self._jobs.get(key)
        if followed is None:
            if key in self._finished:
                return None
            if len(self._jobs) >= self.config.max_jobs:
                self.dropped += 1
                return None
            followed = self._jobs[key] = _Followed(JobTally(*key))
        return followed

    def on_events(self, events: Sequence[Event]) -> None:
        with self._cond:
            for event in events:
                if event.job_id:
                    followed = self._follow((event.cluster_id, event.job_id))
                    if followed is not None:
                        followed.tally.add(event)

    def on_tick(self, tick: Tick) -> None:
        live = {(g.cluster_id, g.job_id) for g in tick.groups if g.job_id}
        mono = self._clock.monotonic()
        with self._cond:
            for key in live:
                followed = self._follow(key)
                if followed is not None:
                    followed.left = None
            due = False
            for key, followed in self._jobs.items():
                if key not in live and followed.left is None:
                    followed.left = mono
                    # Not at once: the tick's own last events of the job (its episodes'
                    # endings) are delivered after this, and the nodes' come as they come.
                    followed.next_check = mono + float(self.config.retry)
                    due = True
            if due:
                self._cond.notify_all()

    # -- the worker -------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="ingero-verdict", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def pending(self) -> int:
        """Jobs whose group is gone and whose verdict is not written yet."""
        with self._cond:
            return sum(1 for f in self._jobs.values() if f.left is not None)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                mono = self._clock.monotonic()
                due = [
                    (key, f)
                    for key, f in self._jobs.items()
                    if f.left is not None and f.next_check <= mono
                ]
                if not due:
                    waits = [f.next_check - mono for f in self._jobs.values() if f.left is not None]
                    self._cond.wait(min(waits) if waits else None)
                    continue
            for key, followed in due:
                if self._stopping:
                    return
                self.check(key, followed)

    def check(self, key: JobKey, followed: _Followed) -> str | None:
        """One look at a job whose group is gone; its outcome once it has one (the job is
        then forgotten), None while it waits for its record to end."""
        cluster, job_id = key
        mono = self._clock.monotonic()
        try:
            if self._backend.cluster_name() != cluster:
                return self._done(key, NOT_THIS_CLUSTER, "not this Slurm's cluster")
            record = self._backend.job_record(job_id)
            if record is None or not record.ended:
                if followed.left is not None and mono - followed.left >= self.config.give_up:
                    state = record.state if record else "no record"
                    return self._done(key, GIVEN_UP, f"accounting shows no end ({state})")
                self._retry(followed, mono, float(self.config.retry))
                return None
            # Slurm keeps whole seconds: a job that started in Fleet's own first second
            # is not one Fleet missed the start of.
            if record.start is not None and record.start < math.floor(self.started_at):
                return self._done(
                    key,
                    PARTIAL,
                    f"it began at {record.start:.0f}, before this Fleet started "
                    f"({self.started_at:.0f}): left to the backfill",
                )
            with self._cond:  # the tick thread may fold a late event into it meanwhile
                tally = copy.deepcopy(followed.tally)
            outcome, words = write_verdict(self._backend, tally, record, self.config.max_bytes)
            return self._done(key, outcome, words)
        except SlurmError as exc:
            self.failures += 1
            log.warning("verdict of job %s: %s; retrying in %gs", job_id, exc, self.config.retry)
            self._retry(followed, mono, float(self.config.retry))
            return None
        except Exception:  # a bug must not end the worker for good
            self.failures += 1
            log.exception("verdict of job %s: unexpected error", job_id)
            return self._done(key, REFUSED, "unexpected error")

    def _retry(self, followed: _Followed, mono: float, after: float) -> None:
        with self._cond:
            followed.next_check = mono + after

    def _done(self, key: JobKey, outcome: str, words: str) -> str:
        with self._cond:
            followed = self._jobs.get(key)
            # The group came back (a requeued job runs again): keep following it.
            if followed is not None and followed.left is not None:
                del self._jobs[key]
                self._finished[key] = None
                while len(self._finished) > self.config.max_jobs:
                    self._finished.popitem(last=False)
            self.outcomes[outcome] += 1
        level = logging.WARNING if outcome in (REFUSED, GIVEN_UP) else logging.INFO
        log.log(level, "verdict of job %s (%s): %s: %s", key[1], key[0], outcome, words)
        return outcome


def attach(daemon: FleetDaemonHooks, config: VerdictConfig) -> VerdictWriter:
    """Build the writer for ``ingero fleet`` (``verdict.enabled``): every event Fleet
    publishes is folded, every tick says which jobs are still live; start the worker."""
    writer = VerdictWriter(config, make_backend(config.backend))
    daemon.add_event_sink(writer.on_events, "verdict")
    daemon.add_tick_listener(writer.on_tick, "verdict")
    writer.start()
    log.warning(
        "job verdicts enabled (backend %s, max_bytes %d)", writer._backend.name, config.max_bytes
    )
    return writer
