"""``ingero explain``: why this node may be slow, from its node DB (read-only)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ingero.cli.options import (
    explicit,
    fanout_from,
    fanout_options,
    node_db_option,
    seconds,
)
from ingero.fanout.ssh import Fanout, MergedRows
from ingero.nodedb import sidefile
from ingero.nodedb.sidefile import describe
from ingero.runtime.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from ingero.explain.analysis import Report
    from ingero.explain.callsites import CallSite
    from ingero.explain.chains import Chain, Signal
    from ingero.explain.phases import PhaseOverlap

_TOP_OPS = 12
# Call sites listed for the window (most CUDA time first), whatever the chains.
_TOP_SITES = 5


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


@click.command("explain")
@node_db_option
@click.option(
    "--window",
    "window",
    default="5m",
    show_default=True,
    help="Recent window, compared with the same length just before it (30s, 5m, 1h).",
)
@click.option("--job", "job_id", default=None, help="Only the calls of this Slurm job.")
@click.option(
    "--until",
    "until",
    default=None,
    help="End of the recent window: Unix seconds or 'latest' (newest row); default now.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@fanout_options
@click.pass_context
def explain(ctx: click.Context, db_path: Path, window: str, job_id: str | None,
            until: str | None, as_json: bool, nodes: str | None, job_nodes: str | None,
            fanout: int, node_timeout: str, ssh_options: str | None,
            remote_ingero: str) -> int:  # fmt: skip
    """Explain why this node may be slow: the last window against the one before it.

    Causal chains first (host, GPU and CUDA/NCCL changes linked to the throughput drop by
    time and process, each with a confidence and a fix hint), then what changed:
    kernel-launch rate, CUDA call latency and time share per op, sync/memcpy waits, NCCL
    collectives, errors, GPU busy and memory, off-CPU time, page allocations, block I/O,
    TCP retransmits, dropped samples. With --nodes or --job-nodes each node explains
    itself over SSH and the nodes' NCCL calls are aligned to find a lagging peer; --job
    still filters the calls (and defaults to --job-nodes' job). Exit 0 (also for an empty
    window), 69 when the node DB is missing, 65 when the file is not a node DB.
    """
    spread = fanout_from(nodes, job_nodes, fanout, node_timeout, ssh_options, remote_ingero)
    if spread is not None:
        args = ["explain", "--json", "--window", window]
        job = job_id if job_id is not None else job_nodes
        args += [*(["--job", job] if job else []), *(["--until", until] if until else [])]
        if explicit(ctx, "db_path"):
            args += ["--db", str(db_path)]
        return _across(spread, args, as_json)
    from ingero.explain.analysis import explain as analyse
    from ingero.explain.callsites import call_sites
    from ingero.explain.chains import explain_chains
    from ingero.explain.hung import hung_findings
    from ingero.explain.phases import phases_of
    from ingero.explain.reader import (
        read_call_sites,
        read_in_flight,
        read_phases,
        read_processes,
        read_timeline,
        read_window_data,
    )
    from ingero.nodedb.intervals import latest_ts
    from ingero.nodedb.schema import open_node_db

    window_s = seconds("--window", window, positive=True)
    db = open_node_db(db_path)
    try:
        latest = latest_ts(db)
        if until is None:
            end = time.time()
        elif until == "latest":
            end = latest if latest is not None else time.time()
        else:
            try:
                end = float(until)
            except ValueError:
                raise UsageError(
                    f"--until: expected Unix seconds or 'latest', got {until!r}"
                ) from None
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
    report = analyse(recent, baseline, window_s, job_id, processes, hung)
    chains = explain_chains(timeline, sites=site_data)
    in_phases = [phases_of(_signals(c), phases, end) for c in chains]
    sites = call_sites(site_data, limit=_TOP_SITES)
    # fleet-push's newest stack snapshot, if taken in the window or the one before it
    stacks = sidefile.recent(db_path, end - 2 * window_s, job_id)
    # Host and GPU rows are node-wide: with --job, a window without that job's calls is empty.
    empty = recent.empty or (job_id is not None and not recent.ops)
    if as_json:
        answer = _as_json(report, chains, sites, db_path, latest, empty)
        for chain, found in zip(answer["chains"], in_phases, strict=False):
            chain["phases"] = [p.as_dict() for p in found]
        answer["stack_snapshot"] = stacks
        click.echo(json.dumps(answer, indent=2))
        return EXIT_OK
    if empty:
        job = f" for job {job_id}" if job_id else ""
        hint = (
            f"; the newest row is from {_utc(latest)} (try --until latest)"
            if latest is not None
            else "; the DB holds no intervals yet"
        )
        click.echo(
            f"nothing recorded{job} in {db_path} between {_utc(end - window_s)}"
            f" and {_utc(end)}{hint}"
        )
    else:
        _print(report, chains, sites, db_path, in_phases)
    if stacks is not None:
        click.echo(f"Stack snapshot ({_utc(float(stacks['timestamp']))}): {describe(stacks)}")
    return EXIT_OK


def _across(spread: Fanout, args: list[str], as_json: bool) -> int:
    from ingero.fanout.across import (
        cross_node_peer_lag,
        recent_window,
        signal_dict,
        top_line,
    )
    from ingero.fanout.ssh import (
        merge_query_results,
        no_node_answered,
        remote_json,
        run_on_nodes,
    )
    from ingero.nodedb.nccl import nccl_calls_sql, nccl_sql

    options = spread.options
    results = run_on_nodes(spread.nodes, [options.remote_ingero, *args], options)
    reports: dict[str, dict[str, Any]] = {}
    failed = []
    for r in results:
        report = remote_json(r) if r.ok else None
        if report is None:
            failure = r.as_failure(options.node_timeout_s)
            if r.ok:
                failure["error"] = "answered something other than ingero explain --json output"
            failed.append(failure)
        else:
            reports[r.node] = report
    peer = None
    window = recent_window(reports)
    if window is not None:
        # The second round reads every node's NCCL calls of the recent window (unbounded
        # by --limit only up to the query's own cap) to align the collectives across nodes.
        db = ["--db", args[args.index("--db") + 1]] if "--db" in args else []

        def nodes_query(sql: str) -> MergedRows:
            argv = [options.remote_ingero, "query", "--json", "--limit", "100000", *db, sql]
            return merge_query_results(run_on_nodes(list(reports), argv, options),
                                       options.node_timeout_s)  # fmt: skip

        # nccl_calls (node DB v3) joins collectives by sequence number; a node whose DB
        # predates it refuses that query and is aligned from its raw events alone.
        rows = nodes_query(nccl_sql(*window))
        peer = cross_node_peer_lag(rows, *window, numbered=nodes_query(nccl_calls_sql(*window)))
    for failure in failed:
        click.echo(f"ingero: {failure['node']}: {failure['error']}", err=True)
    if as_json:
        across = {"peer_lag": signal_dict(peer)}
        click.echo(json.dumps({"nodes": reports, "failed": failed, "across": across}, indent=2))
    else:
        for node, report in reports.items():
            click.echo(top_line(node, report))
            chains = report.get("chains") or []
            if chains:
                click.echo(f"   fix: {chains[0]['fix']}")
            stacks = report.get("stack_snapshot")
            if isinstance(stacks, dict):
                click.echo(f"   stack: {describe(stacks)}")
        if peer is not None:
            click.echo(f"across nodes: {peer.text}")
    if not reports:
        raise no_node_answered(failed)
    return EXIT_OK


def _as_json(
    report: Report,
    chains: list[Chain],
    sites: list[CallSite],
    db_path: Path,
    latest: float | None,
    empty: bool,
) -> dict[str, Any]:
    return {
        "db": str(db_path),
        "job_id": report.job_id,
        "window_s": report.window_s,
        "recent": {"start": report.recent.start, "end": report.recent.end},
        "baseline": {"start": report.baseline.start, "end": report.baseline.end},
        "latest_ts": latest,
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


def _signals(chain: Chain) -> list[Signal]:
    return [*chain.causes, *(s for s in (chain.via, chain.effect) if s is not None)]


def _print(
    report: Report,
    chains: list[Chain],
    sites: list[CallSite],
    db_path: Path,
    in_phases: Sequence[Sequence[PhaseOverlap]] = (),
) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from ingero.explain.analysis import TIMES, fmt_ns, fmt_pct, fmt_window

    console = Console(highlight=False, width=None if sys.stdout.isatty() else 120)
    scope = f", job {report.job_id}" if report.job_id else ""
    console.print(
        f"{db_path}{scope}: {fmt_window(report.window_s)} to {_utc(report.recent.end)}"
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
        for o in report.ops[:_TOP_OPS]:
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
                "-" if p.last_seen is None else _utc(p.last_seen),
            )
        console.print(procs)
