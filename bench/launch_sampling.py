"""Sampled launch durations on recorded workloads: the same detections as every launch timed.

The H200 node DBs (tests/fixtures/h200/) hold, per interval and launch-class op, a count
and p50/p95/p99 of every launch's duration (recorded with every launch timed). For each such
row a population of that many launches is drawn with those percentiles (a log-linear
quantile function through them). Each DB is then written twice: ``full``, the population's
own percentiles and total (what the tracer writes with --launch-returns all), and
``sampled``, what it writes with launches counted at entry: the count exact, the launches
picked as bpf/ingero.bpf.c picks them (1 in 2^shift by the Fibonacci hash of the launch's
number, the shift from the row's launch rate and ``--launch-timed-per-s``, all of a
process's launches of the op on one CPU and stream: the fewest timed), the percentiles of
the weighted sample, the total and errors scaled. Both copies are read by what reads a node
DB: fleet-push's sampler (bench/node_replay.py: score, state, signals) and ``ingero
explain`` (findings, causal chains with their signals) at every ``--step`` seconds; the
script prints whether the detections differ, and how far each sampled percentile lies from
the population's, against the sample's own error (the rank error of a sample of its size,
2.5 standard errors, widened by one histogram bucket).

    python -m bench.launch_sampling [--timed-per-s 1024] [--window 10] [--step 2]
"""

from __future__ import annotations

import argparse
import math
import shutil
import sqlite3
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from bench import node_replay
from ingero.collectors.procfs import MemInfo
from ingero.trace.aggregate import percentile, slot_bounds, slot_of
from ingero.trace.ops import LAUNCH_OP_NAMES
from ingero.trace.probes import DEFAULT_LAUNCH_TIMED_PER_S as DEFAULT_TIMED_PER_S

H200 = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "h200"
MAX_SHIFT = 12  # LAUNCH_MAX_SHIFT in bpf/ingero.bpf.c
GOLDEN = 0x9E3779B97F4A7C15


def population(count: int, p50: float, p95: float, p99: float, seed: int) -> npt.NDArray[np.int64]:
    """``count`` durations with these percentiles: a log-linear quantile function through
    (0, p50/2), (0.5, p50), (0.95, p95), (0.99, p99), (1, 1.5 p99)."""
    p50, p95, p99 = max(p50, 1.0), max(p95, p50, 1.0), max(p99, p95, p50, 1.0)
    knots_u = [0.0, 0.5, 0.95, 0.99, 1.0]
    knots_q = np.log([p50 / 2, p50, p95, p99, 1.5 * p99])
    u = np.random.default_rng(seed).random(count)
    return np.exp(np.interp(u, knots_u, knots_q)).astype(np.int64)


def shift_for(rate: float, timed_per_s: int) -> int:
    """The shift bpf/ingero.bpf.c settles at for a key launching ``rate`` a second."""
    want = rate / timed_per_s
    return 0 if want <= 1 else min(math.floor(math.log2(want)), MAX_SHIFT)


def picked(count: int, shift: int, first: int = 0) -> npt.NDArray[np.bool_]:
    """Which of ``count`` launches, numbered from ``first``, the program times: those whose
    number's Fibonacci hash has its top ``shift`` bits clear (bpf/ingero.bpf.c)."""
    if shift == 0:
        return np.ones(count, dtype=bool)
    n = np.arange(first, first + count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return (n * np.uint64(GOLDEN)) >> np.uint64(64 - shift) == 0


def histogram(durations: Iterable[int], weight: int = 1) -> dict[int, int]:
    hist: dict[int, int] = {}
    for d in durations:
        slot = slot_of(int(d))
        hist[slot] = hist.get(slot, 0) + weight
    return hist


@dataclass
class Errors:
    """Sampled percentiles beside the population's, against the sample's error."""

    rows: int = 0
    within: int = 0
    worst_ratio: float = 1.0
    timed: list[int] = field(default_factory=list)
    log_ratios: dict[float, list[float]] = field(default_factory=dict)  # by quantile

    def add(self, durations: npt.NDArray[np.int64], sampled: npt.NDArray[np.int64],
            hist: dict[int, int], q: float, got: int) -> None:  # fmt: skip
        n = len(sampled)
        delta = 2.5 * math.sqrt(q * (1 - q) / n)
        lo = np.quantile(durations, max(0.0, q - delta))
        hi = np.quantile(durations, min(1.0, q + delta))
        lo_b, hi_b = slot_bounds(slot_of(int(lo)))[0], slot_bounds(slot_of(int(hi)))[1]
        self.rows += 1
        self.within += lo_b <= got <= hi_b
        exact = percentile(histogram(durations), q)
        if exact > 0 and got > 0:
            self.worst_ratio = max(self.worst_ratio, got / exact, exact / got)
            self.log_ratios.setdefault(q, []).append(math.log(got / exact))

    def bias(self, q: float) -> float:
        """The geometric mean of sampled / population at quantile ``q``, minus 1."""
        found = self.log_ratios.get(q, [])
        return math.exp(sum(found) / len(found)) - 1 if found else 0.0


def rewrite(
    db: Path, sampled: bool, timed_per_s: int, errors: Errors | None = None, seed: int = 0
) -> None:
    """Each launch-class row of ``db`` (a copy) as the tracer would write its population,
    with every launch timed or a sample (the module's docstring). ``seed``: another draw of
    the populations, and the launches' numbers start elsewhere."""
    con = sqlite3.connect(db)
    try:
        rows = con.execute(
            "SELECT rowid, ts_start, ts_end, count, p50_ns, p95_ns, p99_ns, errors FROM intervals"
            f" WHERE op IN ({','.join('?' * len(LAUNCH_OP_NAMES))})",
            sorted(LAUNCH_OP_NAMES),
        ).fetchall()
        for rowid, start, end, count, p50, p95, p99, errs in rows:
            d = population(int(count), p50 or 0, p95 or 0, p99 or 0, seed=int(rowid) + 7919 * seed)
            if not sampled:
                hist, total = histogram(d), int(d.sum())
                out_errors = errs
            else:
                shift = shift_for(count / max(end - start, 1e-3), timed_per_s)
                timed = d[picked(len(d), shift, first=int(rowid) * 104729 + seed * 15485863)]
                if len(timed) == 0:
                    hist, total = {}, 0
                else:
                    w = 1 << shift
                    hist = histogram(timed, w)
                    total = round(int(timed.sum()) * w * count / (len(timed) * w))
                    if errors is not None:
                        errors.timed.append(len(timed))
                        for q, col in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
                            errors.add(d, timed, hist, q, percentile(hist, q))
                            del col
                out_errors = errs  # every launch failed or none did in these recordings
            con.execute(
                "UPDATE intervals SET total_ns = ?, p50_ns = ?, p95_ns = ?, p99_ns = ?,"
                " errors = ? WHERE rowid = ?",
                (total, percentile(hist, 0.5), percentile(hist, 0.95), percentile(hist, 0.99),
                 out_errors, rowid),
            )  # fmt: skip
        con.commit()
    finally:
        con.close()


def detections(db: Path, until: float, window_s: float) -> list[str]:
    """What ``ingero explain`` finds in the window ending at ``until``: its findings (kind,
    subject) and its chains (their signals), as sorted lines."""
    from ingero.explain.analysis import explain as analyse
    from ingero.explain.chains import explain_chains
    from ingero.explain.reader import read_processes, read_timeline, read_window_data
    from ingero.nodedb.schema import open_node_db

    handle = open_node_db(db)
    try:
        recent = read_window_data(handle, db, until, window_s, None)
        baseline = read_window_data(handle, db, until - window_s, window_s, None)
        processes = read_processes(handle, None)
        timeline = read_timeline(handle, until, window_s, None)
    finally:
        handle.conn.close()
    report = analyse(recent, baseline, window_s, None, processes, [])
    out = [f"finding {f.kind} {f.subject}" for f in report.findings]
    for chain in explain_chains(timeline):
        parts = [*chain.causes, *(s for s in (chain.via, chain.effect) if s is not None)]
        out.append("chain " + " > ".join(s.id for s in parts))
    return sorted(out)


class FixedHost(node_replay.UnrecordedCpu):
    """The recorded node's host, the same for every replay: no CPU reading (unrecorded) and
    half its memory free (this machine's would change from one replay to the next)."""

    def meminfo(self) -> MemInfo:
        return MemInfo(total_kib=64 << 20, available_kib=32 << 20)


def scores(db: Path) -> list[tuple[float, str, float | None, dict[str, float]]]:
    """fleet-push's samples of the DB: time, state, score, signals."""
    return [
        (s.timestamp, s.state, None if s.result is None else round(s.result.score, 9),
         {} if s.result is None else {k: round(v, 9) for k, v in s.result.signals.items()})
        for s in node_replay.replay(db, 1.0, FixedHost())
    ]  # fmt: skip


@dataclass
class Compared:
    name: str
    launch_rows: int
    window_s: float
    untils: int
    # (window end, with every launch timed, sampled): where the detections differ
    differing: list[tuple[float, list[str], list[str]]]
    # where two draws of the populations, every launch timed in both, differ: the noise of
    # the recording itself (the same job traced twice), beside which sampling is judged
    redrawn: list[tuple[float, list[str], list[str]]]
    scores_equal: bool
    errors: Errors


def compare(
    src: Path,
    tmp: Path,
    timed_per_s: int,
    window_s: float,
    step_s: float,
    seed: int = 0,
    redraw: bool = True,
) -> Compared:
    """``src`` with every launch timed and sampled (and, with ``redraw``, a second draw with
    every launch timed), explained every ``step_s`` and replayed through fleet-push."""
    full, sampled = tmp / f"full-{seed}-{src.name}", tmp / f"sampled-{seed}-{src.name}"
    other = tmp / f"redrawn-{seed}-{src.name}"
    for copy in (full, sampled, *((other,) if redraw else ())):
        shutil.copy(src, copy)
    errors = Errors()
    rewrite(full, False, timed_per_s, seed=seed)
    rewrite(sampled, True, timed_per_s, errors, seed=seed)
    if redraw:
        rewrite(other, False, timed_per_s, seed=seed + 1000)
    with sqlite3.connect(f"file:{src}?mode=ro", uri=True) as con:
        first, last = con.execute("SELECT MIN(ts_start), MAX(ts_end) FROM intervals").fetchone()
        rows = con.execute(
            f"SELECT COUNT(*) FROM intervals WHERE op IN ({','.join('?' * len(LAUNCH_OP_NAMES))})",
            sorted(LAUNCH_OP_NAMES),
        ).fetchone()[0]
    # A recording shorter than two windows is explained with windows of a third of it.
    window_s = min(window_s, (last - first) / 3)
    differing, redrawn = [], []
    untils = 0
    until = first + 2 * window_s
    while until <= last + 1e-6:
        a = detections(full, until, window_s)
        b = detections(sampled, until, window_s)
        untils += 1
        if a != b:
            differing.append((until, a, b))
        if redraw and a != (c := detections(other, until, window_s)):
            redrawn.append((until, a, c))
        until += step_s
    same = scores(full) == scores(sampled)
    return Compared(src.name, rows, window_s, untils, differing, redrawn, same, errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timed-per-s", type=int, default=DEFAULT_TIMED_PER_S)
    parser.add_argument("--window", type=float, default=10.0, help="explain's window (s)")
    parser.add_argument("--step", type=float, default=2.0, help="seconds between explains")
    parser.add_argument("--seeds", type=int, default=5, help="draws of the populations")
    parser.add_argument("-v", "--verbose", action="store_true", help="print what differs")
    parser.add_argument("dbs", nargs="*", type=Path, default=sorted(H200.glob("*.db")))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for db in args.dbs:
            runs = [compare(db, Path(tmp), args.timed_per_s, args.window, args.step, seed)
                    for seed in range(args.seeds)]  # fmt: skip
            c = runs[0]
            merged = Errors()
            for r in runs:
                for q, found in r.errors.log_ratios.items():
                    merged.log_ratios.setdefault(q, []).extend(found)
            within = sum(r.errors.within for r in runs)
            rows = sum(r.errors.rows for r in runs)
            timed = [t for r in runs for t in r.errors.timed]
            print(
                f"{c.name}: {c.launch_rows} launch rows, {args.seeds} draws (timed per row "
                f"{min(timed) if timed else 0}-{max(timed) if timed else 0}); explain at "
                f"{sum(r.untils for r in runs)} window ends: sampled differs from every launch "
                f"timed at {sum(len(r.differing) for r in runs)}, a second draw with every "
                f"launch timed at {sum(len(r.redrawn) for r in runs)}; fleet-push samples "
                f"identical: {all(r.scores_equal for r in runs)}; sampled p50/p95/p99 within "
                f"the sample's error: {within}/{rows}, worst ratio to the population's "
                f"{max(r.errors.worst_ratio for r in runs):.3f}, mean bias "
                + " ".join(
                    f"p{round(q * 100)} {100 * merged.bias(q):+.2f}%" for q in (0.5, 0.95, 0.99)
                )
            )
            if args.verbose:
                for r in runs:
                    for until, a, b in r.differing:
                        print(f"  until {until:.2f}: timed {a}\n    sampled {b}")


if __name__ == "__main__":
    main()
