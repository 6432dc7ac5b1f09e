"""Collectives a rank is still inside: the hang, its line, and the ranks it waits for.

``ingero trace`` writes a sampled collective in flight for a whole interval to
``nccl_calls`` with ``ts_return`` NULL, with the stack it was called from, and completes the
row when the call returns; ``nccl_comms`` says per interval what each rank entered and what
it is inside. So a node DB read during a hang holds, per rank, the collective it waits in
and the line that called it. Pure: the reader gives :class:`InFlight` values.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ingero.explain.analysis import Finding, fmt_ns
from ingero.explain.callsites import where
from ingero.schema.stacks import Stack

# In flight at least this long (host side) at the window's end: longer than a collective
# takes on a healthy job (even a blocking communicator returns within its step), and the
# tracer writes a call in flight only after a whole interval (1 s by default) anyway.
HUNG_MIN_S: Final = 1.0
# Findings at most (the oldest first): one per rank and communicator.
MAX_HUNG: Final = 8


@dataclass(frozen=True)
class RankState:
    """A rank's newest ``nccl_comms`` row of a communicator in the window."""

    pid: int
    rank: int | None  # the Slurm rank tag
    comm_hash: str
    comm_rank: int
    nranks: int
    ts: float  # that interval's end
    entered_seq: int


@dataclass(frozen=True)
class InFlight:
    """A sampled collective still in flight at its rank's newest interval."""

    state: RankState
    seq: int
    op: str
    ts_enter: float
    stack_key: str | None = None
    stack: Stack | None = None

    @property
    def in_flight_s(self) -> float:
        return self.state.ts - self.ts_enter


def _who(state: RankState, names: Mapping[int, str]) -> str:
    """``rank 2 (pid 12, python)``: its rank in the communicator, the process."""
    name = names.get(state.pid)
    return f"rank {state.comm_rank} (pid {state.pid}" + (f", {name})" if name else ")")


def hung_findings(
    calls: Sequence[InFlight], ranks: Sequence[RankState], names: Mapping[int, str]
) -> list[Finding]:
    """One finding per rank inside a collective for ``HUNG_MIN_S`` or more (its oldest such
    call): what, since when, the line it was called from, and the ranks on this node of
    the same communicator that have not entered it."""
    oldest: dict[tuple[int, str], InFlight] = {}
    for c in sorted(calls, key=lambda c: (c.ts_enter, c.seq)):
        if c.in_flight_s >= HUNG_MIN_S:
            oldest.setdefault((c.state.pid, c.state.comm_hash), c)
    out = []
    for c in sorted(oldest.values(), key=lambda c: c.ts_enter)[:MAX_HUNG]:
        s = c.state
        missing = sorted(
            (r for r in ranks if r.comm_hash == s.comm_hash and r.entered_seq < c.seq),
            key=lambda r: r.comm_rank,
        )
        since = time.strftime("%H:%M:%S UTC", time.gmtime(c.ts_enter))
        site = "" if c.stack is None else f", called {where(c.stack)}"
        waits = "; not entered by " + ", ".join(
            f"{_who(r, names)}, at #{r.entered_seq}" for r in missing
        ) if missing else ""  # fmt: skip
        out.append(
            Finding(
                min(9.0, 4.0 + math.log2(1 + c.in_flight_s)),
                "nccl_hung",
                f"pid {s.pid}",
                f"{_who(s, names)} has been inside {c.op} #{c.seq}"
                f" of communicator {s.comm_hash[:8]} for {fmt_ns(c.in_flight_s * 1e9)}"
                f" (since {since}){site}{waits}",
                recent=c.in_flight_s,
                evidence={
                    "pid": s.pid,
                    "rank": s.rank,
                    "comm_hash": s.comm_hash,
                    "comm_rank": s.comm_rank,
                    "nranks": s.nranks,
                    "seq": c.seq,
                    "op": c.op,
                    "ts_enter": c.ts_enter,
                    "in_flight_s": round(c.in_flight_s, 3),
                    "stack_key": c.stack_key,
                    "where": None if c.stack is None else where(c.stack),
                    "stack": None if c.stack is None else c.stack.to_json(),
                    "not_entered_by": [
                        {"pid": r.pid, "comm_rank": r.comm_rank, "entered_seq": r.entered_seq}
                        for r in missing
                    ],
                },
            )
        )
    return out
