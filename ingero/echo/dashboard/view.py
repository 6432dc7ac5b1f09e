"""The dashboard's pages as HTML, from the answers of Echo's questions (pure: no I/O).

Every page is whole without JavaScript: tables, the episode and drain timeline (inline
SVG) and the collective-lag heatmap (a table of coloured cells) are rendered here. The one
chart that needs a script, the scores against the threshold over time, reads its data from
a ``<script type="application/json">`` block (data, never run) and falls back to the
nodes' table. Whatever a job's size, a page is bounded: at most ``MAX_ROWS`` rows a table,
the heatmap's ranks grouped by the question (``job_timeline``), the series its lowest nodes.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote

# At most this many rows in any table of a page; the rest is counted, not shown.
MAX_ROWS = 200
# Seconds between a page's reloads while what it shows can change.
REFRESH_S = 15
# The heatmap's colour is full at this lag (ms) or above.
LAG_FULL_MS = 1000.0

STATIC = "/dashboard/static"

# What to look at first for a straggler, by its dominant signal (the score's component that
# fell most); the node's full causal chain is `ingero explain` on the node.
HINTS: Mapping[str, str] = {
    "throughput": "the job's steps run slower here than on its peers: look at the input"
    " pipeline (data loader, storage) and CPU contention on the node",
    "compute": "GPU compute is slower than on the peers: check clocks, power and thermal"
    " throttling (nvidia-smi -q -d PERFORMANCE,CLOCK) and other processes on the GPU",
    "memory": "the host is short of memory: check other tenants, the page cache, swap and"
    " the data loader's workers (free -h, /proc/pressure/memory)",
    "cpu": "the host CPU is the bottleneck: check other tenants, IRQ and NUMA placement",
    "gpu_health": "the GPU reported a fault (XID, ECC, throttling): drain the node and run"
    " the vendor diagnostics",
    "peer_lag": "one rank enters the NCCL collectives late: look at what that rank does"
    " between collectives (its stack snapshot below) and at its network links",
    "stall": "the rank stopped making progress: its stack snapshot shows where it waits",
}


def fmt_time(ts: float | None) -> str:
    if ts is None:
        return "&ndash;"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ts)) + "Z"


def fmt_num(value: Any, digits: int = 3) -> str:
    if value is None:
        return "&ndash;"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return escape(str(value))


def fmt_span(seconds: float | None) -> str:
    if seconds is None:
        return "&ndash;"
    s = int(seconds)
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


def cluster_url(cluster_id: str) -> str:
    return f"/dashboard/clusters/{quote(cluster_id, safe='')}"


def job_url(cluster_id: str, job_id: str) -> str:
    return f"{cluster_url(cluster_id)}/jobs/{quote(job_id, safe='')}"


def embed_json(data: object) -> str:
    """``data`` as JSON that is inert inside an HTML ``<script>`` element: ``<``, ``>`` and
    ``&`` written as JSON escapes (``\\u003c`` …), so no id can open a comment (``<!--``),
    close the element (``</script>``) or start the "double escaped" state (``<!--<script>``)
    that swallowed the rest of the page; ASCII only, so U+2028/2029 are escaped too. The
    text parses back to ``data`` with any JSON parser."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=True)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def shell_command(*argv: str) -> str:
    """A command a reader copies into a shell, as HTML: each word quoted for the shell
    (``shlex``), then the whole escaped for HTML, so an id such as ``n$(touch x)`` is one
    inert word in the shell and text in the page."""
    return escape(shlex.join(argv))


def link(url: str, text: str) -> str:
    return f'<a href="{escape(url)}">{escape(text)}</a>'


def page(
    title: str,
    body: str,
    *,
    crumbs: Sequence[tuple[str, str]] = (),
    refresh: bool = False,
    signed_in: bool = False,
) -> str:
    """A whole HTML document; ``crumbs`` (url, text) lead from the clusters to this page."""
    trail = " / ".join([link("/dashboard/", "clusters"), *(link(u, t) for u, t in crumbs)])
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    logout = (
        '<form method="post" action="/dashboard/logout" class="logout">'
        '<button type="submit">sign out</button></form>'
        if signed_in
        else ""
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"{meta}<title>{escape(title)} · ingero</title>"
        f'<link rel="stylesheet" href="{STATIC}/dashboard.css">'
        f'<link rel="stylesheet" href="{STATIC}/uPlot.min.css">'
        "</head><body>"
        f'<header><span class="brand">ingero</span> <nav>{trail}</nav>{logout}</header>'
        f"<main><h1>{escape(title)}</h1>{body}</main>"
        f"<footer>Echo's questions, read-only{' · refreshes every ' + str(REFRESH_S) + ' s' if refresh else ''}</footer>"
        f'<script src="{STATIC}/uPlot.iife.min.js"></script>'
        f'<script src="{STATIC}/dashboard.js"></script>'
        "</body></html>\n"
    )


def table(
    headers: Sequence[str],
    rows: Iterable[Sequence[str]],
    *,
    cls: str = "",
    total: int | None = None,
) -> str:
    """A table of cells already HTML (at most MAX_ROWS rows; ``total``: rows there are)."""
    shown = []
    for i, row in enumerate(rows):
        if i >= MAX_ROWS:
            break
        shown.append("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>")
    if not shown:
        return '<p class="empty">none</p>'
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    more = ""
    if total is not None and total > len(shown):
        more = f'<p class="more">{len(shown)} of {total} shown</p>'
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(shown)}</tbody></table>{more}'


def error_page(status: int, message: str, *, signed_in: bool = False) -> str:
    titles = {400: "Bad request", 401: "Sign in", 403: "Not allowed", 404: "Not found"}
    body = f'<p class="error" data-status="{status}">{escape(message)}</p>'
    if status == 401:
        body += login_form()
    return page(titles.get(status, f"Error {status}"), body, signed_in=signed_in)


def login_form(message: str = "") -> str:
    said = f'<p class="error">{escape(message)}</p>' if message else ""
    return (
        f"{said}"
        '<form method="post" action="/dashboard/login" class="login">'
        '<label>Echo API token <input type="password" name="token" autocomplete="off"'
        ' required></label> <button type="submit">sign in</button></form>'
        "<p>The token is kept in a cookie of this site only (HttpOnly, SameSite=Strict);"
        " sign out removes it.</p>"
    )


# -- the clusters ----------------------------------------------------------------------------


def clusters_page(summary: Mapping[str, Any], jobs: Mapping[str, Any], signed_in: bool) -> str:
    rows = [
        [
            link(cluster_url(c["cluster_id"]), c["cluster_id"]),
            fmt_num(c["nodes"]),
            _state(c["open_episodes"]),
            fmt_num(c["straggler_nodes"]),
            fmt_num(c["straggler_episodes"]),
            fmt_num(c["drains"]),
            fmt_time(c["last_event"]),
        ]
        for c in summary["clusters"]
    ]
    body = table(
        [
            "cluster",
            "nodes",
            "straggling now",
            "straggler nodes",
            "episodes",
            "drains",
            "last event",
        ],
        rows,
        cls="clusters",
        total=len(summary["clusters"]),
    )
    running = [j for j in jobs["jobs"] if j["running"]]
    body += "<h2>Jobs running now</h2>" + _jobs_table(running)
    return page("Clusters", body, refresh=True, signed_in=signed_in)


def _state(open_episodes: int) -> str:
    if open_episodes:
        return f'<span class="bad">{open_episodes} open</span>'
    return '<span class="ok">none</span>'


def _jobs_table(jobs: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            link(job_url(j["cluster_id"], j["job_id"]), j["job_id"]),
            escape(j["cluster_id"]),
            "running" if j["running"] else "ended",
            fmt_num(j["nodes"]),
            _state(j["open_episodes"]),
            fmt_num(j["straggler_episodes"]),
            fmt_time(j["first_seen"]),
            fmt_time(j["last_seen"]),
        ]
        for j in jobs
    ]
    return table(
        [
            "job",
            "cluster",
            "state",
            "nodes",
            "straggling now",
            "episodes",
            "first seen",
            "last seen",
        ],
        rows,
        cls="jobs",
        total=len(jobs),
    )


def cluster_page(
    cluster_id: str,
    summary: Mapping[str, Any],
    jobs: Mapping[str, Any],
    stragglers: Mapping[str, Any],
    drains: Mapping[str, Any],
    signed_in: bool,
) -> str:
    facts = summary["clusters"][0]
    body = (
        f'<p class="facts">{fmt_num(facts["nodes"])} nodes · {_state(facts["open_episodes"])}'
        f" straggling · {fmt_num(facts['drains'])} drains since"
        f" {fmt_time(summary['window']['since'])}</p>"
    )
    body += "<h2>Jobs, running first</h2>" + _jobs_table(jobs["jobs"])
    rows = [
        [
            escape(s["node_id"]),
            _state(1) if s["open"] else "ended",
            fmt_span(s["seconds_below"]),
            fmt_num(s["max_depth"]),
            fmt_num(s["episodes"]),
            fmt_num(s["peer_lag_ms"]),
            fmt_num(s["collective_hangs"]),
            fmt_time(s["last_seen"]),
        ]
        for s in stragglers["stragglers"]
    ]
    body += "<h2>Stragglers</h2>" + table(
        ["node", "now", "time below", "max depth", "episodes", "peer lag ms", "hangs", "last seen"],
        rows,
        cls="stragglers",
    )
    body += "<h2>Drains</h2>" + _drains_table(drains["drains"])
    return page(
        f"Cluster {cluster_id}",
        body,
        crumbs=[(cluster_url(cluster_id), cluster_id)],
        refresh=True,
        signed_in=signed_in,
    )


def _drains_table(drains: Sequence[Mapping[str, Any]]) -> str:
    rows = [
        [
            fmt_time(d["timestamp"]),
            escape(d["node_id"]),
            escape(d["type"]),
            escape(str(d["extra"].get("reason") or "")),
            escape(str(d["extra"].get("backend") or "")),
        ]
        for d in drains
    ]
    return table(["time", "node", "what", "reason", "backend"], rows, cls="drains")


# -- one job ---------------------------------------------------------------------------------


def job_page(
    cluster_id: str,
    timeline: Mapping[str, Any],
    report: Mapping[str, Any],
    *,
    running: bool,
    signed_in: bool,
) -> str:
    job = str(timeline["job_id"])
    window = timeline["window"]
    nodes = timeline["nodes"]
    straggling = [n for n in nodes if n["straggling"]]
    state = "running" if running else "ended"
    body = (
        f'<p class="facts" data-job-state="{state}">{state} · {timeline["node_count"]} nodes ·'
        f" {_state(len(straggling))} straggling · {fmt_time(window['since'])} to"
        f" {fmt_time(window['until'])}</p>"
    )
    body += "<h2>Why: the stragglers' causal chain</h2>" + _chains(report, timeline)
    body += "<h2>Scores against the threshold</h2>" + _score_chart(timeline)
    body += "<h2>Episodes and drains</h2>" + _timeline_svg(timeline)
    body += "<h2>NCCL entry lag by rank</h2>" + _heatmap(timeline["lag_heatmap"])
    body += "<h2>Nodes and ranks</h2>" + _nodes_table(nodes, timeline["node_count"])
    body += "<h2>Stack snapshots</h2>" + _snapshots(report.get("stack_snapshots", []))
    body += "<h2>Drains</h2>" + _drains_table(timeline["drains"])
    trace = f"{job_url(cluster_id, job)}/trace.json"
    body += (
        "<h2>Perfetto</h2><p>"
        + link(trace, "this job's episodes, drains and hangs as a trace")
        + " (Trace Event Format: open it in ui.perfetto.dev or chrome://tracing). The nodes'"
        f" own calls: <code>{shell_command('ingero', 'export', '--job-nodes', job)}</code>.</p>"
    )
    return page(
        f"Job {job}",
        body,
        crumbs=[(cluster_url(cluster_id), cluster_id), (job_url(cluster_id, job), f"job {job}")],
        refresh=running,
        signed_in=signed_in,
    )


def _chains(report: Mapping[str, Any], timeline: Mapping[str, Any]) -> str:
    """One chain per straggler of the job (at most five, the worst first): the node and its
    rank, how far below the threshold since when, the signal or reason, where its code was
    (a hang's answer or the node's stack snapshot) and the fix hint."""
    ranks = {(n["cluster_id"], n["node_id"]): n for n in timeline["nodes"]}
    snaps: dict[tuple[str, str], Mapping[str, Any]] = {}
    for s in report.get("stack_snapshots", []):
        snaps.setdefault((s["cluster_id"], s["node_id"]), s)
    lag = {(r["cluster_id"], r["node_id"]): r for r in report.get("lagging_ranks", [])}
    since: dict[tuple[str, str], float] = {}
    for e in timeline["episodes"]:  # in start order: the last one's start is "since"
        since[(e["cluster_id"], e["node_id"])] = e["start"]
    out = []
    for s in report.get("stragglers", [])[:5]:
        key = (s["cluster_id"], s["node_id"])
        node = ranks.get(key, {})
        # a stall or peer lag says more than the score component that fell most
        signal = node.get("reason") or node.get("signal") or "throughput"
        if signal not in HINTS:
            signal = node.get("signal") or "throughput"
        steps = [
            f'<li>node <b class="node">{escape(s["node_id"])}</b>'
            + (f" (rank {node['rank']})" if node.get("rank") is not None else "")
            + f" {'is' if s['open'] else 'was'} a straggler"
            + (f" since {fmt_time(since[key])}" if key in since else "")
            + f" for {fmt_span(s['seconds_below'])}"
            f" over {s['episodes']} episode(s), at most {fmt_num(s['max_depth'])} below the"
            " threshold</li>",
        ]
        if node.get("score") is not None:
            steps.append(
                f"<li>score {fmt_num(node['score'])} against a threshold of"
                f" {fmt_num(node.get('threshold'))}</li>"
            )
        steps.append(f"<li>dominant signal: <b>{escape(signal)}</b></li>")
        if key in lag:
            r = lag[key]
            steps.append(
                f"<li>rank {fmt_num(r['rank'])} enters {escape(str(r['op'] or 'collectives'))}"
                f" {fmt_num(r['max_lag_p50_ms'])} ms after its peers (median)</li>"
            )
        if key in snaps and snaps[key]["stacks"]:
            steps.append(
                f"<li>where: <code>{escape(snaps[key]['stacks'][0]['summary'])}</code></li>"
            )
        hint = HINTS.get(signal, HINTS["throughput"])
        steps.append(
            f'<li class="hint">fix hint: {escape(hint)}. The full causal chain:'
            " <code>"
            + shell_command(
                "ingero", "explain", "--nodes", s["node_id"], "--job", str(report["job_id"])
            )
            + "</code></li>"
        )
        out.append(f'<ol class="chain">{"".join(steps)}</ol>')
    for answer in report.get("answers", [])[:5]:
        out.append(f'<p class="answer">{escape(answer)}</p>')
    return "".join(out) or '<p class="empty">no straggler in this job</p>'


def _score_chart(timeline: Mapping[str, Any]) -> str:
    """The uPlot chart's data (band, lowest nodes, threshold), for dashboard.js."""
    data = {
        "band": [[b["t"], b["min"], b["mean"], b["max"]] for b in timeline["band"]],
        "series": timeline["series"],
        "thresholds": timeline["thresholds"],
    }
    if not data["band"] and not data["thresholds"]:
        return '<p class="empty">no score samples for this job</p>'
    return (
        '<div id="scores" class="chart"><noscript>The chart needs JavaScript; the nodes'
        " table below has each node's score and threshold.</noscript></div>"
        f'<script type="application/json" id="scores-data">{embed_json(data)}</script>'
    )


def _timeline_svg(timeline: Mapping[str, Any]) -> str:
    """Episodes as bars on one row per node (at most 40 rows), drains as ticks."""
    since, until = float(timeline["window"]["since"]), float(timeline["window"]["until"])
    span = max(until - since, 1e-6)
    episodes = timeline["episodes"]
    drains = timeline["drains"]
    if not episodes and not drains:
        return '<p class="empty">no episode or drain in this job</p>'
    names: list[str] = []
    for e in [*episodes, *drains]:
        if e["node_id"] not in names and len(names) < 40:
            names.append(e["node_id"])
    width, left, row = 900, 120, 18
    height = row * len(names) + 24

    def x(t: float) -> float:
        return left + (width - left - 10) * min(1.0, max(0.0, (t - since) / span))

    parts = []
    for i, name in enumerate(names):
        y = 4 + i * row
        parts.append(f'<text x="4" y="{y + 12}" class="label">{escape(name[:18])}</text>')
    for e in episodes:
        if e["node_id"] not in names:
            continue
        y = 4 + names.index(e["node_id"]) * row
        x0, x1 = x(e["start"]), x(e["end"] if e["end"] is not None else e["last_seen"])
        cls = "episode open" if e["end"] is None else "episode"
        parts.append(
            f'<rect class="{cls}" x="{x0:.1f}" y="{y + 2}" width="{max(x1 - x0, 2):.1f}"'
            f' height="{row - 6}"><title>{escape(e["node_id"])}: {fmt_time(e["start"])} to'
            f" {fmt_time(e['end'])}, depth {fmt_num(e['max_depth'])}</title></rect>"
        )
    for d in drains:
        if d["node_id"] not in names:
            continue
        y = 4 + names.index(d["node_id"]) * row
        xd = x(d["timestamp"])
        parts.append(
            f'<path class="drain {escape(d["type"])}" d="M{xd:.1f} {y} l5 {row - 4} h-10 z">'
            f"<title>{escape(d['type'])} {fmt_time(d['timestamp'])}</title></path>"
        )
    axis_y = height - 6
    parts.append(f'<text x="{left}" y="{axis_y}" class="axis">{fmt_time(since)}</text>')
    parts.append(
        f'<text x="{width - 10}" y="{axis_y}" class="axis" text-anchor="end">{fmt_time(until)}</text>'
    )
    return (
        f'<svg class="timeline" viewBox="0 0 {width} {height}" width="{width}" height="{height}"'
        f' role="img" aria-label="episodes and drains">{"".join(parts)}</svg>'
        '<p class="legend"><span class="key episode"></span> straggler episode'
        ' <span class="key open"></span> still open <span class="key drain"></span> drain</p>'
    )


def _heatmap(heat: Mapping[str, Any]) -> str:
    """A table: one row per rank group, one cell per time column, shaded by lag."""
    if not heat["cells"]:
        return '<p class="empty">no NCCL peer lag recorded for this job</p>'
    rows = []
    for (lo, hi), cells in zip(heat["ranks"], heat["cells"], strict=True):
        label = f"{lo}" if lo == hi else f"{lo}&ndash;{hi}"
        tds = []
        for c in cells:
            if c is None:
                tds.append("<td></td>")
            else:
                alpha = min(1.0, c / LAG_FULL_MS)
                tds.append(
                    f'<td class="lag" style="background:rgba(200,30,30,{0.15 + 0.85 * alpha:.2f})"'
                    f' title="{c:.0f} ms"></td>'
                )
        rows.append(f'<tr><th scope="row">{label}</th>{"".join(tds)}</tr>')
    worst = fmt_num(heat["max_ms"])
    return (
        f'<table class="heatmap"><tbody>{"".join(rows)}</tbody></table>'
        f'<p class="legend">rows: ranks; columns: time; darker: later into the collective'
        f" (worst {worst} ms)</p>"
    )


def _nodes_table(nodes: Sequence[Mapping[str, Any]], total: int) -> str:
    rows = [
        [
            escape(n["node_id"]),
            fmt_num(n["rank"]),
            fmt_num(n["score"]),
            fmt_num(n["threshold"]),
            fmt_num(n["min_score"]),
            '<span class="bad">straggling</span>' if n["straggling"] else "ok",
            fmt_num(n["episodes"]),
            fmt_time(n["last_seen"]),
        ]
        for n in nodes
    ]
    return table(
        ["node", "rank", "score", "threshold", "lowest", "state", "episodes", "last seen"],
        rows,
        cls="nodes",
        total=total,
    )


def _snapshots(snaps: Sequence[Mapping[str, Any]]) -> str:
    if not snaps:
        return '<p class="empty">no stack snapshot for this job</p>'
    out = []
    for s in snaps[:10]:
        lines = "".join(
            f"<li>pid {fmt_num(st['pid'])} {escape(str(st['thread'] or ''))}:"
            f" <code>{escape(st['summary'])}</code></li>"
            for st in s["stacks"][:8]
        )
        out.append(
            f'<div class="snapshot"><p>{escape(s["node_id"])} rank {fmt_num(s["rank"])},'
            f" {escape(str(s['trigger'] or ''))} for {fmt_span(s['for_s'])},"
            f" {fmt_time(s['timestamp'])}</p><ul>{lines}</ul></div>"
        )
    return "".join(out)


def trace_events(timeline: Mapping[str, Any], report: Mapping[str, Any]) -> dict[str, Any]:
    """The job's episodes, drains and hangs in the Trace Event Format: one process per node
    (pid = its row), slices for episodes, instants for drains and hangs."""
    pids: dict[str, int] = {}
    events: list[dict[str, Any]] = []

    def pid(node: str) -> int:
        if node not in pids:
            pids[node] = len(pids) + 1
            events.append(
                {"ph": "M", "name": "process_name", "pid": pids[node], "args": {"name": node}}
            )
        return pids[node]

    for e in timeline["episodes"]:
        end = e["end"] if e["end"] is not None else e["last_seen"]
        events.append(
            {
                "ph": "X",
                "name": "straggler",
                "cat": "episode",
                "pid": pid(e["node_id"]),
                "tid": 1,
                "ts": e["start"] * 1e6,
                "dur": max(end - e["start"], 0.0) * 1e6,
                "args": {"max_depth": e["max_depth"], "min_score": e["min_score"]},
            }
        )
    for d in timeline["drains"]:
        events.append(
            {
                "ph": "i",
                "s": "p",
                "name": d["type"],
                "cat": "drain",
                "pid": pid(d["node_id"]),
                "tid": 1,
                "ts": d["timestamp"] * 1e6,
            }
        )
    for h in report.get("collective_hangs", []):
        events.append(
            {
                "ph": "i",
                "s": "p",
                "name": "collective_hang",
                "cat": "nccl",
                "pid": pid(h["node_id"] or "job"),
                "tid": 1,
                "ts": h["timestamp"] * 1e6,
                "args": {k: h["extra"].get(k) for k in ("op", "seq", "missing_ranks")},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}
