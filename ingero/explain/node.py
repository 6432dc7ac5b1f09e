"""One node's explanation from its node DB (read-only): the window against the one before
it, the causal chains and where in the job's marked phases they fell, the top call sites and
fleet-push's newest stack snapshot. :mod:`ingero.explain.render` prints it."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from ingero.explain.analysis import Report
from ingero.explain.analysis import explain as analyse
from ingero.explain.callsites import CallSite, call_sites
from ingero.explain.chains import Chain, Signal, explain_chains
from ingero.explain.hung import hung_findings
from ingero.explain.phases import PhaseOverlap, phases_of
from ingero.explain.reader import (
    read_call_sites,
    read_in_flight,
    read_phases,
    read_processes,
    read_timeline,
    read_window_data,
)
from ingero.nodedb import sidefile
from ingero.nodedb.intervals import latest_ts
from ingero.nodedb.schema import open_node_db

# Call sites listed for the window (most CUDA time first), whatever the chains.
TOP_SITES: Final = 5


@dataclass(frozen=True)
class Explanation:
    """What ``ingero explain`` says about one node's window ``(end - window_s, end]``."""

    db_path: Path
    job_id: str | None
    window_s: float
    end: float
    latest: float | None  # the newest row's time; None: the DB holds no intervals
    # Nothing recorded in the window (with a job: none of that job's calls).
    empty: bool
    report: Report
    chains: list[Chain]
    in_phases: list[list[PhaseOverlap]]  # per chain, the marked phases it fell in
    sites: list[CallSite]
    # fleet-push's newest stack snapshot, if taken in the window or the one before it
    stacks: dict[str, Any] | None


def explain_node(
    db_path: Path,
    window_s: float,
    until: float | Literal["latest"] | None,
    job_id: str | None,
    now: Callable[[], float] = time.time,
) -> Explanation:
    """Read and explain the node DB at ``db_path``; the window ends at ``until`` (Unix
    seconds), the newest row ("latest", now when there is none) or now (None)."""
    db = open_node_db(db_path)
    try:
        latest = latest_ts(db)
        if until is None:
            end = now()
        elif until == "latest":
            end = latest if latest is not None else now()
        else:
            end = until
        recent = read_window_data(db, db_path, end, window_s, job_id)
        baseline = read_window_data(db, db_path, end - window_s, window_s, job_id)
        processes = read_processes(db, job_id)
        timeline = read_timeline(db, end, window_s, job_id)
        wall_ns = recent.covered_s * 1e9 * max(1, recent.pids)
        site_data = read_call_sites(db, end, window_s, job_id, wall_ns or None)
        phases = read_phases(db, end - window_s, end, job_id)
        in_flight, ranks = read_in_flight(db, end, window_s, job_id)
    finally:
        db.conn.close()
    names = {p.pid: p.comm for p in processes if p.comm}
    hung = hung_findings(in_flight, ranks, names)
    chains = explain_chains(timeline, sites=site_data)
    return Explanation(
        db_path=db_path,
        job_id=job_id,
        window_s=window_s,
        end=end,
        latest=latest,
        # Host and GPU rows are node-wide: with a job, a window without its calls is empty.
        empty=recent.empty or (job_id is not None and not recent.ops),
        report=analyse(recent, baseline, window_s, job_id, processes, hung),
        chains=chains,
        in_phases=[phases_of(signals(c), phases, end) for c in chains],
        sites=call_sites(site_data, limit=TOP_SITES),
        stacks=sidefile.recent(db_path, end - 2 * window_s, job_id),
    )


def signals(chain: Chain) -> list[Signal]:
    """A chain's steps: its causes, then what it went through and what it did."""
    return [*chain.causes, *(s for s in (chain.via, chain.effect) if s is not None)]
