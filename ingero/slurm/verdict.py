"""A job's ingero verdict, as it is kept in the job's Slurm ``AdminComment``: the fold of the
job's events into it (pure), and its text form, encoder beside decoder.

``sacct -j J -o JobID,AdminComment%120`` then answers, months later and without Echo, "did
this job straggle, where, why, and how much did it cost". ingero's part of the field is one
short human line and a compact machine form, as Princeton's jobstats keeps its summary (a
versioned prefix, then gzip + base64 JSON)::

    ingero: 1 straggler node (n3 r2 20m), 2 episodes, worst n3 hardware, ... INGERO1:H4sI...

The machine form is ``INGERO1:`` + base64(gzip(JSON)), or ``INGERO1B32:`` + base32 of the
same where the writer knows its path lowercases the text (``sacctmgr`` of Slurm before
23.02 lowercases every AdminComment it sets; base32 decodes whatever the case). The JSON,
version ``v: 1`` (keys in docs/slurm.md, "The job's verdict in sacct"): the job's
``start``/``end`` (Unix s) and node count as Slurm accounts them, ``lost_share`` (the share
of the job's time during which at least one of its nodes straggled: the whole job then ran
at its slowest rank's pace, so an upper bound of the time lost), ``episodes``,
``stragglers`` (per node: rank, seconds in its straggler episodes, episodes, worst score,
cause class), ``straggler_nodes``, ``worst``, ``lag`` (the NCCL rank with the largest
median entry lag), ``hangs``, ``drains``, ``gpu_idle`` (GPU-seconds held and unused, and
the nodes) and ``cut`` (list entries left out to fit the size bound).

A site's own text in the field (jobstats' ``JS1:...``) is kept as it is, first; ingero's
part follows it and is the only part a rewrite replaces (:func:`merge_admin_comment`).
jobstats reads its field as ``JS1:`` and one base64 run up to the end: where that run has
no padding, a lone ``AA==`` token between it and ingero's part ends the run for base64
decoders (one zero byte, which gzip skips), so jobstats' reader still decodes its own part.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ingero.runtime.config import Duration, in_range, positive
from ingero.schema.causes import CAUSE_CLASSES, gravest
from ingero.schema.events import Event

VERSION = 1
PART_PREFIX = "ingero:"
TOKEN_B64 = "INGERO1:"
TOKEN_B32 = "INGERO1B32:"
# The token that ends a site's unpadded base64 run before ingero's part (see the module doc).
GLUE = "AA=="
DEFAULT_MAX_BYTES = 1024
MIN_MAX_BYTES = 256
MAX_MAX_BYTES = 16384
# Bounds of what one job's tally holds, whatever arrives (a 10,000-node job included).
MAX_NODES = 4096
MAX_EPISODES = 65536
MAX_LISTED = 16  # stragglers and idle-GPU nodes listed in the JSON before it is cut to fit

_PART = re.compile(
    r"(?:(?<=\s)" + re.escape(GLUE) + r" )?" + re.escape(PART_PREFIX) + r" [^\n]*?"
    r"INGERO1(?:B32)?:[A-Za-z0-9+/=]+",
    re.IGNORECASE,
)
_TOKEN = re.compile(r"INGERO1(B32)?:([A-Za-z0-9+/=]+)", re.IGNORECASE)
_B64_RUN = re.compile(r"[A-Za-z0-9+/]+$")


@dataclass(frozen=True)
class VerdictConfig:
    """The ``verdict:`` section of Fleet's configuration (opt-in; docs/slurm.md)."""

    enabled: bool = False
    backend: Literal["auto", "scontrol", "pyslurm"] = "auto"
    max_bytes: int = field(
        default=DEFAULT_MAX_BYTES, metadata=in_range(MIN_MAX_BYTES, MAX_MAX_BYTES)
    )
    retry: Duration = Duration(15.0)  # noqa: RUF009 - an immutable float
    give_up: Duration = Duration(6 * 3600.0)  # noqa: RUF009 - an immutable float
    max_jobs: int = field(default=10_000, metadata=positive())


class VerdictError(ValueError):
    """An AdminComment part that is not a verdict this version can read."""


# -- the fold --------------------------------------------------------------------------


@dataclass
class _Span:
    start: float
    end: float | None = None


@dataclass
class _NodeTally:
    rank: int | None = None
    episodes: dict[str, _Span] = field(default_factory=dict)
    min_score: float | None = None
    cause_class: str | None = None
    signal: str | None = None


@dataclass
class _Idle:
    node: str
    gpus: tuple[int, ...]
    start: float
    reason: str | None
    idle_s: float | None = None  # set by the episode's end


@dataclass
class JobTally:
    """Everything the verdict needs of one job, folded from its events as they come (in any
    order, repeated or not: episodes are keyed by ``event_id``); bounded by ``MAX_NODES``
    nodes and ``MAX_EPISODES`` episodes (``dropped`` counts what did not fit)."""

    cluster_id: str
    job_id: str
    nodes: dict[str, _NodeTally] = field(default_factory=dict)
    lag: dict[tuple[str, int], tuple[float, str]] = field(default_factory=dict)
    hangs: set[str] = field(default_factory=set)
    drains: set[str] = field(default_factory=set)
    idle: dict[str, _Idle] = field(default_factory=dict)
    first_ts: float | None = None
    last_ts: float | None = None
    events: int = 0
    dropped: int = 0

    def add(self, event: Event) -> None:
        """Fold one event of this job in (events of other jobs are the caller's to sort)."""
        self.events += 1
        ts = event.timestamp
        self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
        self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
        kind = event.type
        if kind in ("straggler_state", "straggler_resolved"):
            self._straggler(event)
        elif kind == "peer_lag":
            self._peer_lag(event)
        elif kind == "collective_hang":
            if event.extra.get("state") != "end" and len(self.hangs) < MAX_EPISODES:
                self.hangs.add(event.event_id)
        elif kind == "node_drained":
            if not event.extra.get("dry_run") and len(self.drains) < MAX_NODES:
                self.drains.add(event.node_id)
        elif kind == "gpu_idle":
            self._gpu_idle(event)

    def _node(self, node_id: str) -> _NodeTally | None:
        tally = self.nodes.get(node_id)
        if tally is None:
            if len(self.nodes) >= MAX_NODES:
                self.dropped += 1
                return None
            tally = self.nodes[node_id] = _NodeTally()
        return tally

    def _straggler(self, event: Event) -> None:
        tally = self._node(event.node_id)
        if tally is None:
            return
        if event.rank is not None:
            tally.rank = event.rank
        span = tally.episodes.get(event.event_id)
        if span is None:
            if sum(len(t.episodes) for t in self.nodes.values()) >= MAX_EPISODES:
                self.dropped += 1
                return
            span = tally.episodes[event.event_id] = _Span(event.timestamp)
        if event.type == "straggler_resolved":
            since = _number(event.extra.get("since"))
            if since is not None:
                span.start = min(span.start, since)
            span.end = event.timestamp if span.end is None else max(span.end, event.timestamp)
            return
        span.start = min(span.start, event.timestamp)
        if event.score is not None and (tally.min_score is None or event.score < tally.min_score):
            tally.min_score = event.score
            tally.signal = event.dominant_signal or tally.signal
        elif tally.signal is None:  # the worst event named none: any other's, in any order
            tally.signal = event.dominant_signal
        cause = event.extra.get("cause_class")
        if isinstance(cause, str) and cause in CAUSE_CLASSES:
            tally.cause_class = gravest(tally.cause_class, cause)

    def _peer_lag(self, event: Event) -> None:
        rank, lag = event.extra.get("comm_rank"), _number(event.extra.get("lag_p50_ms"))
        comm = event.extra.get("comm_hash")
        if not (isinstance(rank, int) and lag is not None and isinstance(comm, str)):
            return
        key = (comm, rank)
        if key not in self.lag and len(self.lag) >= MAX_NODES:
            self.dropped += 1
            return
        if key not in self.lag or lag > self.lag[key][0]:
            self.lag[key] = (lag, event.node_id)

    def _gpu_idle(self, event: Event) -> None:
        extra = event.extra
        idle = self.idle.get(event.event_id)
        gpus = extra.get("gpus")
        held = tuple(g for g in gpus if isinstance(g, int)) if isinstance(gpus, list) else ()
        since = _number(extra.get("since"))
        start = since if since is not None else event.timestamp
        reason = extra.get("reason") if isinstance(extra.get("reason"), str) else None
        if idle is None:
            if len(self.idle) >= MAX_EPISODES:
                self.dropped += 1
                return
            idle = self.idle[event.event_id] = _Idle(event.node_id, held, start, reason)
        else:  # what an earlier-folded event of the episode did not say
            idle.gpus = idle.gpus or held
            idle.start = min(idle.start, start)
            idle.reason = idle.reason or reason
        idle_s = _number(extra.get("idle_s"))
        if extra.get("state") == "end" and idle_s is not None:
            idle.idle_s = idle_s

    # -- the verdict --------------------------------------------------------------

    def verdict(
        self, start: float | None = None, end: float | None = None, nodes: int | None = None
    ) -> dict[str, Any]:
        """The verdict JSON (before any cut), the job's ``start``/``end`` and node count as
        Slurm accounts them (else the span of its events). Episodes still open at the end
        are counted to it; everything is clipped to [start, end]."""
        t0 = start if start is not None else (self.first_ts or 0.0)
        t1 = end if end is not None else (self.last_ts or t0)
        t1 = max(t1, t0)
        job_spans: list[tuple[float, float]] = []
        rows = []
        episodes = 0
        for node_id, tally in self.nodes.items():
            spans = [
                (max(t0, s.start), min(t1, s.end if s.end is not None else t1))
                for s in tally.episodes.values()
            ]
            spans = [(a, b) for a, b in spans if b > a]
            episodes += len(tally.episodes)
            seconds = _union_length(spans)
            job_spans.extend(spans)
            rows.append((node_id, tally, seconds))
        rows.sort(key=lambda r: (-r[2], r[1].min_score if r[1].min_score is not None else 2.0))
        stragglers = [
            _compact(
                {
                    "node": node_id,
                    "rank": tally.rank,
                    "s": round(seconds, 1),
                    "episodes": len(tally.episodes),
                    "min_score": _round(tally.min_score, 3),
                    "class": tally.cause_class,
                }
            )
            for node_id, tally, seconds in rows
            if tally.episodes
        ]
        out: dict[str, Any] = {
            "v": VERSION,
            "cluster": self.cluster_id,
            "job": self.job_id,
            "start": round(t0),
            "end": round(t1),
            "lost_share": round(_union_length(job_spans) / (t1 - t0), 4) if t1 > t0 else 0.0,
            "episodes": episodes,
            "straggler_nodes": len(stragglers),
            "stragglers": stragglers,
        }
        if nodes is not None:
            out["nodes"] = nodes
        if rows and rows[0][1].episodes:
            node_id, tally, _ = rows[0]
            out["worst"] = _compact(
                {
                    "node": node_id,
                    "rank": tally.rank,
                    "class": tally.cause_class,
                    "signal": tally.signal,
                }
            )
        if self.lag:
            (comm, rank), (lag, node_id) = max(self.lag.items(), key=lambda kv: kv[1][0])
            out["lag"] = {"node": node_id, "rank": rank, "comm": comm, "p50_ms": round(lag, 1)}
        out["hangs"] = len(self.hangs)
        out["drains"] = sorted(self.drains)
        idle_nodes: dict[str, dict[str, Any]] = {}
        gpu_s = 0.0
        for idle in self.idle.values():
            begin = max(t0, idle.start)
            length = idle.idle_s if idle.idle_s is not None else t1 - idle.start
            length = max(0.0, min(begin + length, t1) - begin)
            held = length * max(1, len(idle.gpus))
            gpu_s += held
            row = idle_nodes.setdefault(idle.node, {"node": idle.node, "gpus": [], "gpu_s": 0.0})
            row["gpus"] = sorted(set(row["gpus"]) | set(idle.gpus))
            row["gpu_s"] += held
            if idle.reason:
                row["reason"] = idle.reason
        if idle_nodes:
            listed = sorted(idle_nodes.values(), key=lambda r: -r["gpu_s"])
            for row in listed:
                row["gpu_s"] = round(row["gpu_s"], 1)
            out["gpu_idle"] = {"gpu_s": round(gpu_s, 1), "nodes": listed}
        if self.dropped:
            out["dropped_events"] = self.dropped
        return out


def _number(value: object) -> float | None:
    """A finite number as a float; None for anything else (a bool included)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _compact(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if v is not None}


def _union_length(spans: Iterable[tuple[float, float]]) -> float:
    total, reach = 0.0, -math.inf
    for a, b in sorted(spans):
        if b <= reach:
            continue
        total += b - max(a, reach)
        reach = b
    return total


def tally_events(cluster_id: str, job_id: str, events: Iterable[Event]) -> JobTally:
    """A job's tally from a batch of events (Echo's, for the backfill); others are skipped."""
    tally = JobTally(cluster_id, job_id)
    for event in events:
        if event.job_id == job_id and event.cluster_id == cluster_id:
            tally.add(event)
    return tally


# -- the text --------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """``45s``, ``20m``, ``3h05m``, ``2d04h``: short, for the human line."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def human_line(verdict: Mapping[str, Any], listed: int = 3) -> str:
    """The short line a person reads first in ``sacct``, without the ``ingero:`` prefix."""
    elapsed = max(0, verdict.get("end", 0) - verdict.get("start", 0))
    words: list[str] = []
    stragglers = verdict.get("stragglers") or []
    n = verdict.get("straggler_nodes", len(stragglers))
    if n:
        shown = ", ".join(
            f"{r['node']}" + (f" r{r['rank']}" if "rank" in r else "") + f" {duration(r['s'])}"
            for r in stragglers[:listed]
        )
        more = ", ..." if n > min(listed, len(stragglers)) else ""
        words.append(f"{n} straggler node{'s' if n != 1 else ''} ({shown}{more})")
        episodes = verdict.get("episodes", 0)
        words.append(f"{episodes} episode{'s' if episodes != 1 else ''}")
        worst = verdict.get("worst") or {}
        if worst.get("class"):
            words.append(f"worst {worst['node']} {worst['class']}")
    else:
        words.append("no straggler")
    lag = verdict.get("lag")
    if lag:
        words.append(f"NCCL lag p50 {lag['p50_ms']:g} ms r{lag['rank']}")
    if verdict.get("hangs"):
        words.append(f"{verdict['hangs']} hang{'s' if verdict['hangs'] != 1 else ''}")
    drains = verdict.get("drains") or []
    if drains:
        words.append(
            "drained " + ",".join(drains[:listed]) + (",..." if len(drains) > listed else "")
        )
    idle = verdict.get("gpu_idle")
    if idle and idle.get("gpu_s"):
        words.append(f"GPU idle {idle['gpu_s'] / 3600:.1f} GPU-h")
    share = verdict.get("lost_share", 0.0)
    words.append(f"lost<={share * 100:.0f}% of {duration(elapsed)}" if n else duration(elapsed))
    return ", ".join(words)


def _payload(verdict: Mapping[str, Any], base32: bool) -> str:
    raw = json.dumps(verdict, separators=(",", ":"), sort_keys=True, allow_nan=False)
    # mtime=0: the same verdict is the same text, so an unchanged rewrite is skipped.
    packed = gzip.compress(raw.encode(), compresslevel=9, mtime=0)
    if base32:
        return TOKEN_B32 + base64.b32encode(packed).decode("ascii")
    return TOKEN_B64 + base64.b64encode(packed).decode("ascii")


def encode_part(
    verdict: Mapping[str, Any], max_bytes: int = DEFAULT_MAX_BYTES, base32: bool = False
) -> str:
    """ingero's part of the AdminComment: ``ingero: <human line> <token>``, at most
    ``max_bytes`` (UTF-8). What does not fit is cut, largest lists first, and counted in
    ``cut``; the human line is shortened before the figures are."""
    if not MIN_MAX_BYTES <= max_bytes <= MAX_MAX_BYTES:
        raise ValueError(f"max_bytes must be in [{MIN_MAX_BYTES}, {MAX_MAX_BYTES}]")
    data = json.loads(json.dumps(verdict))  # a copy to cut
    cut = 0
    for key in ("stragglers", "drains"):
        if len(data.get(key) or ()) > MAX_LISTED:
            cut += len(data[key]) - MAX_LISTED
            data[key] = data[key][:MAX_LISTED]
    idle = data.get("gpu_idle")
    if idle and len(idle["nodes"]) > MAX_LISTED:
        cut += len(idle["nodes"]) - MAX_LISTED
        idle["nodes"] = idle["nodes"][:MAX_LISTED]
    listed = 3
    while True:
        if cut:
            data["cut"] = cut
        line = human_line(data, listed)
        text = f"{PART_PREFIX} {line} {_payload(data, base32)}"
        if len(text.encode()) <= max_bytes:
            return text
        if listed > 1:
            listed -= 1
            continue
        for key in ("stragglers", "drains"):
            if data.get(key):
                data[key].pop()
                cut += 1
                break
        else:
            if idle and idle["nodes"]:
                idle["nodes"].pop()
                cut += 1
            else:
                # Nothing left to cut but the figures themselves: the bare counts.
                keep = ("v", "cluster", "job", "start", "end", "lost_share", "episodes")
                data = {k: data[k] for k in keep if k in data}
                data["cut"] = cut + 1
                text = f"{PART_PREFIX} {human_line(data, 0)} {_payload(data, base32)}"
                if len(text.encode()) > max_bytes:
                    data = {"v": VERSION, "cut": cut + 1}
                    text = f"{PART_PREFIX} cut {_payload(data, base32)}"
                return text


def decode_part(text: str) -> dict[str, Any]:
    """The verdict JSON of an AdminComment holding ingero's part (any case: a lowercased
    base32 token decodes too); VerdictError when there is none or it is not readable."""
    match = _TOKEN.search(text)
    if match is None:
        raise VerdictError("no ingero verdict (INGERO1: token) in the text")
    try:
        if match[1]:
            packed = base64.b32decode(match[2].upper(), casefold=True)
        else:
            packed = base64.b64decode(match[2], validate=True)
        raw = gzip.decompress(packed)
        if len(raw) > 1 << 20:
            raise VerdictError("verdict JSON larger than 1 MiB")
        data = json.loads(raw)
    except (binascii.Error, OSError, EOFError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, VerdictError):
            raise
        raise VerdictError(f"unreadable ingero verdict: {exc}") from None
    if not isinstance(data, dict) or data.get("v") != VERSION:
        version = data.get("v") if isinstance(data, dict) else None
        raise VerdictError(f"not a version {VERSION} verdict (v={version!r})")
    return data


def split_admin_comment(text: str | None) -> tuple[str, str | None]:
    """(the site's text, ingero's part or None): ingero's part removed, with the glue token
    and the space before it; the site's text otherwise byte for byte."""
    if not text:
        return "", None
    match = _PART.search(text)
    if match is None:
        return text, None
    before, after = text[: match.start()], text[match.end() :]
    part = match.group(0)
    if part.upper().startswith(GLUE):
        part = part[len(GLUE) + 1 :]
    before = before[:-1] if before.endswith(" ") else before
    after = after[1:] if after.startswith(" ") else after
    return " ".join(t for t in (before, after) if t), part


def needs_glue(site: str) -> bool:
    """The site's text ends in an unpadded base64 run of whole quads (jobstats' ``JS1:``
    payload): a base64 decoder would read on into ingero's part."""
    run = _B64_RUN.search(site)
    return run is not None and len(run.group(0)) % 4 == 0


def merge_admin_comment(existing: str | None, part: str) -> str:
    """The AdminComment with ``part`` as ingero's: the site's text first, kept as it is,
    then ingero's part (an older one of ingero's replaced, never added twice)."""
    site, _ = split_admin_comment(existing)
    if not site:
        return part
    glue = f" {GLUE}" if needs_glue(site) else ""
    return f"{site}{glue} {part}"
