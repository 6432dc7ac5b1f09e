"""Terminal views of the demo: a rich Live table, or plain lines for CI and pipes."""

from __future__ import annotations

import time
from typing import TextIO

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.panel import Panel
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text

from ingero.demo.runner import DemoOptions, DemoResult, DemoState, ExplainOutcome


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class LiveView:
    """A table of nodes refreshed in place, with a warm-up progress bar above it."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.progress = Progress(
            TextColumn("[bold]warm-up[/bold]"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%"),
            TimeRemainingColumn(),
            console=self.console,
        )
        self.task = self.progress.add_task("warm-up", total=1.0)
        self.live = Live(console=self.console, refresh_per_second=4, transient=False)
        self._started = False

    def update(self, state: DemoState) -> None:
        if not self._started:
            self.live.start()
            self._started = True
        self.live.update(self.render(state))

    def close(self) -> None:
        if self._started:
            self.live.stop()
            self._started = False

    def render(self, state: DemoState) -> RenderableType:
        opts = state.options
        parts: list[RenderableType] = []
        if state.phase in ("starting", "warm-up"):
            elapsed = time.time() - state.started_at if state.started_at else 0.0
            self.progress.update(self.task, completed=min(1.0, elapsed / max(opts.warmup, 1e-9)))
            parts.append(self.progress)
        group = state.group
        title = (
            f"cluster {opts.cluster_id} · job {opts.job_id} · threshold {_fmt(group.threshold)}"
            f" · median {_fmt(group.median)} · quorum {'yes' if group.quorum_met else 'no'}"
            f" ({group.active_nodes} active){' · PANIC' if group.panic else ''}"
        )
        table = Table(title=title, expand=False)
        for column in ("node", "state", "score", "threshold", "mode", ""):
            table.add_column(
                column, justify="right" if column in ("score", "threshold") else "left"
            )
        for node in opts.node_names():
            status = state.nodes.get(node)
            flagged = node in state.flagged or (status is not None and status.straggling)
            marker = ""
            style = ""
            if flagged:
                marker, style = "STRAGGLER", "bold white on red"
            elif node == state.straggler and state.injected_at is not None:
                marker, style = _injected(opts), "yellow"
            elif status is not None and status.waiting:
                marker, style = f"waiting {status.waiting}", "cyan"
            table.add_row(
                node,
                status.state if status else "starting",
                _fmt(status.score if status else None),
                _fmt(status.threshold if status else None),
                (status.mode or "-") if status else "-",
                Text(marker),
                style=style,
            )
        parts.append(table)
        headline = {
            "starting": "starting Fleet, workloads and agents…",
            "warm-up": "agents calibrating; Fleet gathering a quorum…",
            "injected": f"{_injected(opts)} on {state.straggler}; waiting for detection…",
            "detected": f"{state.straggler} detected as a straggler",
            "done": f"{state.straggler} detected as a straggler",
        }[state.phase]
        parts.append(Text(headline, style="bold green" if state.detected_at else "bold"))
        parts.append(Text("\n".join(state.log[-6:]), style="dim"))
        return Panel(Group(*parts), title="ingero demo", border_style="cyan")


class PlainView:
    """One line per change (node state, mode, event, phase), for logs and CI."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self._logged = 0
        self._seen: dict[str, tuple[str, str | None, bool, str | None]] = {}
        self._last_table = 0.0

    def update(self, state: DemoState) -> None:
        for line in state.log[self._logged :]:
            self.out.write(line + "\n")
        self._logged = len(state.log)
        for node, status in sorted(state.nodes.items()):
            key = (status.state, status.mode, status.straggling, status.waiting)
            if self._seen.get(node) != key:
                self._seen[node] = key
                waiting = f" WAITING {status.waiting}" if status.waiting else ""
                self.out.write(
                    f"  {node}: {status.state} score={_fmt(status.score)} mode={status.mode} "
                    f"threshold={_fmt(status.threshold)}{' STRAGGLER' if status.straggling else ''}"
                    f"{waiting}\n"
                )
        now = time.time()
        if now - self._last_table >= 5 * state.options.push_interval and state.nodes:
            self._last_table = now
            scores = " ".join(
                f"{n[-2:]}={_fmt(s.score, 2)}" for n, s in sorted(state.nodes.items())
            )
            self.out.write(
                f"  scores {scores} | threshold {_fmt(state.group.threshold)} "
                f"quorum={state.group.quorum_met}\n"
            )
        self.out.flush()

    def close(self) -> None:
        self.out.flush()


def _injected(opts: DemoOptions) -> str:
    if opts.stall is not None:
        return "hung before a collective" if opts.lockstep else "stalled"
    return f"slowed {opts.slowdown:.0%}" + (f" ({opts.cause})" if opts.cause else "")


def explain_lines(outcome: ExplainOutcome, workdir_kept: bool) -> list[str]:
    """The injected node's top causal chain, as ``ingero explain`` prints it, and whether it
    names the injected cause."""
    kept = "" if workdir_kept else " (the demo's files are removed at exit; --workdir keeps them)"
    lines = [f"explain: {' '.join(outcome.command)}{kept}"]
    chain = outcome.chain
    if chain is None:
        lines.append(f"  {outcome.error or 'no causal chain'}")
    else:
        lines.append(
            f"  1. {chain['name']} ({chain['level']} confidence, {chain['confidence']:.2f}):"
            f" {chain['headline']}"
        )
        for lk in chain.get("links") or []:
            lines.append(
                f"     {lk['cause']} → {lk['effect']} ({lk['confidence']:.2f}): {lk['time']};"
                f" {lk['process']}"
            )
        if chain.get("missing"):
            lines.append(f"     not found: {', '.join(chain['missing'])} layer")
        lines.append(f"     fix: {chain['fix']}")
    verdict = "yes" if outcome.named else "no"
    lines.append(
        f"explain names the injected cause ({outcome.cause}: {outcome.expected}): {verdict}"
    )
    return lines


def summary(state: DemoState, result: DemoResult) -> str:
    """The closing lines: outcome, latency, events and where to look next."""
    opts = state.options
    cause = f", cause {opts.cause}" if opts.cause else ""
    lines = [
        f"straggler injected: {result.straggler} "
        + (
            f"({_injected(opts)})"
            if opts.stall is not None
            else f"({opts.slowdown:.0%} slower{cause})"
        )
        + (
            f", rank {opts.node_names().index(result.straggler)} of a lock-step job of {opts.nodes}"
            if opts.lockstep
            else ""
        ),
    ]
    if result.detection_s is not None and result.detection_intervals is not None:
        lines.append(
            f"detected: {result.straggler} after {result.detection_s:.1f} s "
            f"= {result.detection_intervals:.1f} push intervals of {opts.push_interval:g} s"
        )
    else:
        lines.append("detected: no")
    if result.false_positives:
        lines.append(f"also flagged (false positives): {', '.join(result.false_positives)}")
    if result.explain is not None:
        lines += explain_lines(result.explain, opts.workdir is not None)
    lines += state.story
    events = ", ".join(f"{k}={v}" for k, v in sorted(result.events.items())) or "none"
    lines.append(f"events written (UDS sink; also OTLP logs to Fleet): {events}")
    lines.append("where to look:")
    if state.journald:
        lines.append(
            "  journalctl -o json-pretty MESSAGE_ID=6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e51 "
            "INGERO_CLUSTER=" + opts.cluster_id
        )
    else:
        lines.append("  journalctl: no journald on this host, so events went to the UDS sink only")
    running = " (while running; --hold keeps it up)" if not opts.hold else ""
    lines.append(f"  Fleet /metrics: {state.api_url}/metrics{running}")
    lines.append(
        f"  threshold API: {state.api_url}/api/v1/threshold?cluster_id={opts.cluster_id}"
        f"&job_id={opts.job_id}"
    )
    lines.append(f"  sink /metrics: {state.sink_metrics_url} (ingero_sink_events_total)")
    if state.echo_url:
        lines.append(
            f"  Echo: {state.echo_url}/api/v1/collective_lag?cluster_id={opts.cluster_id}"
            f"&job_id={opts.job_id}&since=0, dashboard {state.echo_url}/dashboard/"
        )
    if opts.workdir is not None:
        lines.append(f"  files and logs: {state.workdir}")
    return "\n".join(lines)
