"""``ingero explain``'s report of one node, as text (rich tables, the chains as plain lines
never wrapped) or as the JSON ``--json`` prints."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ingero.explain.analysis import TIMES, Report, fmt_ns, fmt_pct, fmt_window
from ingero.explain.callsites import CallSite
from ingero.explain.chains import Chain
from ingero.explain.node import Explanation
from ingero.explain.phases import PhaseOverlap
from ingero.nodedb.sidefile import describe

# Traced ops listed, most time first.
TOP_OPS: Final = 12


def utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def print_text(x: Explanation) -> None:
    """The report as ``ingero explain`` prints it, on standard output."""
    if x.empty:
        job = f" for job {x.job_id}" if x.job_id else ""
        hint = (
            f"; the newest row is from {utc(x.latest)} (try --until latest)"
            if x.latest is not None
            else "; the DB holds no intervals yet"
        )
        click.echo(
            f"nothing recorded{job} in {x.db_path} between {utc(x.end - x.window_s)}"
            f" and {utc(x.end)}{hint}"
        )
    else:
        _print(x.report, x.chains, x.sites, x.db_path, x.in_phases)
    if x.stacks is not None:
        click.echo(f"Stack snapshot ({utc(float(x.stacks['timestamp']))}): {describe(x.stacks)}")


def as_json(x: Explanation) -> dict[str, Any]:
    """The explanation as ``ingero explain --json`` prints it (what ``--nodes`` reads back)."""
    report, chains, sites, empty = x.report, x.chains, x.sites, x.empty
    answer: dict[str, Any] = {
        "db": str(x.db_path),
        "job_id": report.job_id,
        "window_s": report.window_s,
        "recent": {"start": report.recent.start, "end": report.recent.end},
        "baseline": {"start": report.baseline.start, "end": report.baseline.end},
        "latest_ts": x.latest,
        "empty": empty,
        "summary": report.summary,
        "chains": [] if empty else [c.as_dict() for c in chains],
        "call_sites": [] if empty else [c.as_dict() for c in sites],
        "findings": [f.as_dict() for f in report.findings],
        "ops": [
            {
                "source": o.source,
                "op": o.op,
                "count": o.count,
                "p50_ns": o.p50_ns,
                "p95_ns": o.p95_ns,
                "p99_ns": o.p99_ns,
                "share": o.share,
                "errors": o.errors,
                "baseline_p95_ns": o.baseline_p95_ns,
                "baseline_share": o.baseline_share,
                "p95_ratio": o.p95_ratio,
            }
            for o in report.ops
        ],
        "gpus": [g.__dict__ for g in report.recent.gpus],
        "host": None if report.recent.host is None else report.recent.host.__dict__,
        "processes": [p.__dict__ for p in report.processes],
    }
    for chain, found in zip(answer["chains"], x.in_phases, strict=False):
        chain["phases"] = [p.as_dict() for p in found]
    answer["stack_snapshot"] = x.stacks
    return answer


def _print(
    report: Report,
    chains: list[Chain],
    sites: list[CallSite],
    db_path: Path,
    in_phases: Sequence[Sequence[PhaseOverlap]] = (),
) -> None:
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    scope = f", job {report.job_id}" if report.job_id else ""
    console.print(
        f"{db_path}{scope}: {fmt_window(report.window_s)} to {utc(report.recent.end)}"
        f" vs the {fmt_window(report.window_s)} before",
        markup=False,
    )
    s = report.summary
    parts = []
    # A job replaying CUDA graphs may launch no kernel outside them: its kernel rate of 0
    # says nothing there.
    graphs = s.get("graph_launch_rate") is not None
    if s["kernel_launch_rate"] is not None and (s["kernel_launch_rate"] or not graphs):
        was = s["kernel_launch_rate_baseline"]
        parts.append(
            f"kernel launches {s['kernel_launch_rate']:,.0f}/s"
            + (f" (was {was:,.0f}/s)" if was is not None else "")
        )
    if graphs:
        was = s["graph_launch_rate_baseline"]
        parts.append(
            f"graph launches {s['graph_launch_rate']:,.0f}/s"
            + (f" (was {was:,.0f}/s)" if was is not None else "")
        )
    if s["gpu_busy_fraction"] is not None:
        parts.append(f"GPU busy {fmt_pct(float(s['gpu_busy_fraction']))}")
    elif s["gpu_busy_estimate_sync"] is not None:
        estimate = fmt_pct(float(s["gpu_busy_estimate_sync"]))
        parts.append(f"GPU busy not measured (sync-time estimate ≥ {estimate})")
    if s["sync_memcpy_share"] is not None:
        parts.append(f"sync/memcpy {fmt_pct(float(s['sync_memcpy_share']))} of wall")
    if s["offcpu_fraction"] is not None:
        parts.append(f"off-CPU {fmt_pct(float(s['offcpu_fraction']))} of wall")
    if parts:
        console.print(" · ".join(parts), markup=False)
    if s["not_measured"]:
        console.print(f"not measured (left out of the score): {s['not_measured']}", markup=False)

    if chains:
        # Plain lines, never wrapped: a chain is read (and pasted) as one line.
        click.echo("Causal chains, most likely first:")
        for i, chain in enumerate(chains, 1):
            click.echo(
                f"{i}. {chain.name} ({chain.level} confidence, {chain.confidence:.2f}):"
                f" {chain.headline()}"
            )
            for lk in chain.links:
                click.echo(
                    f"   {lk.cause} → {lk.effect} ({lk.confidence:.2f}): {lk.time}; {lk.process}"
                )
            for step in (*chain.causes, *([chain.via] if chain.via is not None else [])):
                for site in step.sites:
                    click.echo(
                        f"   {step.id} from: {site.text()} ({fmt_pct(site.share)} of {site.op})"
                    )
            for found in in_phases[i - 1] if i <= len(in_phases) else ():
                click.echo(f"   {found.line()}")
            if chain.missing:
                click.echo(f"   not found: {', '.join(chain.missing)} layer")
            click.echo(f"   fix: {chain.fix}")

    if sites:
        # One line each, never wrapped, like the chains: where the window's call time went.
        click.echo("Top call sites, most CUDA time first:")
        for i, site in enumerate(sites, 1):
            wall = site.wall_share
            of_wall = (
                "" if not wall else f", {fmt_pct(wall) if wall >= 0.005 else '<1%'} of traced wall"
            )
            click.echo(
                f"{i}. {site.op}: {fmt_ns(site.time_ns)} in {site.calls:,} calls"
                f" ({fmt_pct(site.share)} of {site.op}{of_wall}) {site.where()}"
            )

    if report.findings:
        table = Table(title="Findings, most likely cause first", title_justify="left")
        table.add_column("#", justify="right")
        table.add_column("finding")
        table.add_column("kind")
        for i, f in enumerate(report.findings, 1):
            table.add_row(str(i), Text(f.message), Text(f.kind))
        console.print(table)
    else:
        console.print(
            f"nothing stands out against the previous {fmt_window(report.window_s)}", markup=False
        )

    if report.ops:
        ops = Table(title="Traced calls, most time first", title_justify="left")
        for name in ("source", "op", "calls", "p50", "p95", "p99", "p95 vs before", "wall", "err"):
            ops.add_column(name, justify="left" if name in ("source", "op") else "right")
        for o in report.ops[:TOP_OPS]:
            ratio = o.p95_ratio
            ops.add_row(
                Text(o.source),
                Text(o.op),
                f"{o.count:,}",
                fmt_ns(o.p50_ns),
                fmt_ns(o.p95_ns),
                fmt_ns(o.p99_ns),
                f"{ratio:.2f}{TIMES}" if ratio is not None else "-",
                fmt_pct(o.share) if o.share is not None else "-",
                str(o.errors) if o.errors else "",
            )
        console.print(ops)

    if report.processes:
        procs = Table(title="Traced processes", title_justify="left")
        for name in ("pid", "comm", "job", "rank", "last seen"):
            procs.add_column(name)
        for p in report.processes:
            procs.add_row(
                str(p.pid),
                Text(p.comm or "-"),
                Text(p.job_id or "-"),
                "-" if p.rank is None else str(p.rank),
                "-" if p.last_seen is None else utc(p.last_seen),
            )
        console.print(procs)
