"""The demo's lock-step training job: its control words, and the story Echo tells of it.

Fleet forwards its NCCL events (``peer_lag``, ``collective_wait``, ``collective_hang``) to a
real ``ingero echo``; the demo asks Echo what a person would: the job's ``collective_lag``
(which rank enters late, by how much, how often, and how long its peers wait for it) and,
for a hang, the ``collective_wait`` that names the rank its peers wait for.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

ECHO_TIMEOUT_S = 2.0


def control_line(rank: int, slowdown: float, cause: str | None, stall: bool) -> str:
    """The job control file's line for the injection (ingero.workload.jobrunner)."""
    if stall:
        return f"rank {rank} hang\n"
    return f"rank {rank} {slowdown:g}" + (f" {cause}" if cause else "") + "\n"


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=ECHO_TIMEOUT_S) as response:
        return json.loads(response.read())


def _sql(echo: str, query: str) -> list[dict[str, Any]]:
    request = urllib.request.Request(
        f"{echo}/api/v1/sql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=ECHO_TIMEOUT_S) as response:
        body = json.loads(response.read())
    return [dict(zip(body["columns"], row, strict=True)) for row in body["rows"]]


def story(echo: str, cluster_id: str, job_id: str, nranks: int, stall: bool) -> list[str]:
    """What Echo says of the job: the late rank and its waiting peers, or, for a stall,
    the rank its peers wait for. Empty when Echo has nothing (yet) or cannot be asked."""
    try:
        if stall:
            return _wait_story(echo, job_id)
        query = urllib.parse.urlencode({"cluster_id": cluster_id, "job_id": job_id, "since": 0})
        ranks = _get(f"{echo}/api/v1/collective_lag?{query}").get("ranks") or []
    except (OSError, ValueError, KeyError, urllib.error.URLError):
        return []
    late = [r for r in ranks if r.get("times_late")]
    if not late:
        return []
    r = late[0]
    peers = (r.get("nranks") or nranks) - 1
    wait = r.get("peers_wait_p50_ms")
    waited = f" {wait:.0f} ms" if isinstance(wait, int | float) else ""
    return [
        f"Echo: rank {r.get('comm_rank')} ({r.get('node_id')}) enters {r.get('op')} "
        f"{r.get('lag_p50_ms') or 0:.0f} ms late in {r.get('times_late')} of the last "
        f"{r.get('collectives')}; its {peers} peers wait{waited} for it"
    ]


def _wait_story(echo: str, job_id: str) -> list[str]:
    rows = _sql(
        echo,
        "SELECT node_id, extra FROM events WHERE type = 'collective_wait' AND job_id = "
        f"'{job_id.replace(chr(39), '')}' ORDER BY ts LIMIT 1",
    )
    if not rows:
        return []
    extra = json.loads(rows[0]["extra"]) if isinstance(rows[0]["extra"], str) else {}
    missing = extra.get("missing_ranks") or []
    who = (
        f"rank {', '.join(str(m) for m in missing)} ({', '.join(extra.get('missing_nodes', []))})"
        if missing
        else "no rank: every rank stopped there"
    )
    return [
        f"Echo: the job waits in {extra.get('op')} #{extra.get('seq')} for {who}; its "
        f"{extra.get('waiting_count')} peers entered it and wait, not stragglers"
    ]
