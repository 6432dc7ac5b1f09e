"""Slurm Prolog, Epilog and TaskProlog logic: ``python -m ingero.slurm.hooks prolog|epilog|taskprolog``.

Rules every hook keeps: it never runs a Slurm command (slurmd waits on the prolog, and a
slurmctld round trip from every node of a large job at once is a storm); it imports only
the standard library, python-hostlist and small ingero modules, so it starts fast; and it
always exits 0, because a failing prolog or epilog drains the node. Problems are reported to
the journal (native socket) and stderr.

- prolog (root, every allocated node, ``PrologFlags=Alloc``): writes the job file.
- taskprolog (job user, every task): prints ``export INGERO_...=...`` lines, which Slurm adds
  to the task's environment.
- epilog (root): writes a ``job_summary`` event (time spent as straggler, worst score) from
  the node's events (the NDJSON event log, and the journal where journald runs: fleet-push
  journals its straggler events), then removes the job file.

Environment (besides Slurm's): ``INGERO_JOBS_DIR`` (default ``/run/ingero/jobs``),
``INGERO_EVENT_LOG`` (NDJSON event log, default ``/var/lib/ingero/events.ndjson``),
``INGERO_JOURNAL_SOCKET`` (default ``/run/systemd/journal/socket``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ingero.runtime.journald import journal_send
from ingero.runtime.systemd import JOURNAL_SOCKET
from ingero.schema.episodes import RESOLVED, STATE, TYPES, EpisodeFold, Mark, identity
from ingero.slurm.jobfile import JobInfo, check_job_id, jobs_dir, read_job, remove_job, write_job

EVENT_LOG = "/var/lib/ingero/events.ndjson"
# The epilog reads at most this much of the end of the event log, so a huge log stays fast.
EVENT_LOG_TAIL_BYTES = 4 << 20
JOURNALCTL_TIMEOUT = 5.0
# Stable journald MESSAGE_ID for hook problems (not an event type: nothing downstream parses it).
HOOK_PROBLEM_MESSAGE_ID = "6f3c2a1e9b8d4c7a8e5f0a1b2c3d4e60"


def _env_job_id(env: Mapping[str, str]) -> str:
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
    return check_job_id(job)


def _split_gpus(value: str | None) -> list[str]:
    if not value or value in ("NoDevFiles", "(null)"):
        return []
    return [part.strip() for part in value.split(",") if part.strip()]


def _expand(nodelist: str) -> list[str]:
    import hostlist  # python-hostlist: a single pure-Python module, cheap to import

    try:
        names: list[str] = hostlist.expand_hostlist(nodelist)
    except hostlist.BadHostlist as exc:
        raise ValueError(f"cannot expand the job's node list {nodelist!r}: {exc}") from None
    return names


def job_info_from_env(env: Mapping[str, str], now: float) -> JobInfo:
    """The job file's content from a prolog's (or task's) environment; ValueError if unusable."""
    job_id = _env_job_id(env)
    node = env.get("SLURMD_NODENAME") or ""
    if not node:
        raise ValueError("SLURMD_NODENAME is not set")
    # The prolog sees SLURM_NODELIST; tasks see SLURM_JOB_NODELIST (the step's list differs).
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    nodes = _expand(nodelist) if nodelist else []
    rank = nodes.index(node) if node in nodes else None
    count = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    world_size = int(count) if count and count.isdigit() else (len(nodes) or None)
    uid = env.get("SLURM_JOB_UID")
    gpus = _split_gpus(env.get("SLURM_JOB_GPUS")) or _split_gpus(env.get("CUDA_VISIBLE_DEVICES"))
    return JobInfo(
        job_id=job_id,
        cluster_id=env.get("SLURM_CLUSTER_NAME") or "default",
        node_id=node,
        rank=rank,
        world_size=world_size,
        nodes=nodes,
        user=env.get("SLURM_JOB_USER") or None,
        uid=int(uid) if uid and uid.isdigit() else None,
        partition=env.get("SLURM_JOB_PARTITION") or None,
        gpus=gpus,
        started_at=now,
    )


def task_exports(info: JobInfo, env: Mapping[str, str]) -> list[str]:
    """TaskProlog output: one ``export NAME=value`` line per variable (Slurm's protocol)."""
    values: dict[str, str | int | None] = {
        "INGERO_CLUSTER_ID": info.cluster_id,
        "INGERO_JOB_ID": info.job_id,
        "INGERO_NODE_ID": info.node_id,
        "INGERO_RANK": info.rank,
        "INGERO_WORLD_SIZE": info.world_size,
        "INGERO_TASK_RANK": env.get("SLURM_PROCID"),
    }
    lines = []
    for name, value in values.items():
        text = "" if value is None else str(value)
        # Slurm takes the rest of the line verbatim; a newline or NUL would start a new line.
        if text and not any(c in text for c in "\n\r\0"):
            lines.append(f"export {name}={text}")
    return lines


def read_events(path: Path, tail_bytes: int = EVENT_LOG_TAIL_BYTES) -> list[dict[str, Any]]:
    """Events from the end of an NDJSON log; unreadable lines are skipped, a missing file is []."""
    try:
        with path.open("rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - tail_bytes))
            data = f.read()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return []
    lines = data.split(b"\n")
    if len(data) >= tail_bytes:
        lines = lines[1:]  # the first line was cut by the seek
    events = []
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            events.append(item)
    return events


def read_journal_events(
    job_id: str, node_id: str, start: float, timeout: float = JOURNALCTL_TIMEOUT
) -> list[dict[str, Any]]:
    """This node's straggler events of the job from the journal (fleet-push journals them).

    Runs ``journalctl`` with field matches (indexed, fast) and a timeout; a journal that
    cannot be read gives [] (the summary then says so: no episodes).
    """
    import shutil
    import subprocess

    from ingero.journal.journalctl import Query
    from ingero.journal.records import RecordError, parse_line

    binary = shutil.which("journalctl")  # hooks run without PATH: which() falls back to /bin
    if binary is None:
        return []
    query = Query(
        types=(STATE, RESOLVED),
        node=node_id,
        job=job_id,
        since=f"@{int(start)}",
    )
    try:
        proc = subprocess.run(
            [binary, *query.args()],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    events = []
    for line in proc.stdout.splitlines():
        try:
            parsed = parse_line(line)
        except RecordError:
            continue
        if parsed is not None:
            events.append(parsed.event.to_dict())
    return events


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def summarize(
    events: Iterable[Mapping[str, Any]], job_id: str, node_id: str, start: float, end: float
) -> dict[str, Any]:
    """Time spent as straggler and worst score for one job on one node, from its events.

    A straggler episode runs from a ``straggler_state`` event to the next
    ``straggler_resolved`` (or the job's end); re-sent ``straggler_state`` events inside an
    episode do not restart it (``ingero.schema.episodes`` folds them). A resolution whose episode
    began before the job is not an episode of it. Lower scores are worse.
    """
    relevant = []
    for event in events:
        ts = _number(event.get("timestamp"))
        if (
            ts is not None
            and event.get("node_id") == node_id
            and str(event.get("job_id")) == job_id
            and start <= ts <= end
            and event.get("type") in TYPES
        ):
            relevant.append((ts, event))
    relevant.sort(key=lambda item: item[0])
    fold = EpisodeFold()
    opened = {}  # the episodes a straggler_state of this job opened or extended, by id
    for ts, event in relevant:
        kind = str(event["type"])
        event_id = str(event.get("event_id") or "")
        # one node, one job: the cluster does not matter here
        score = _number(event.get("score"))
        episode = fold.add(Mark(event_id, kind, "", node_id, job_id, ts, score))
        if kind == STATE:
            opened[episode.id] = episode
    straggler_seconds = sum(
        (ep.end_ts if ep.end_ts is not None else end) - ep.start_ts for ep in opened.values()
    )
    scores = [ep.min_score for ep in opened.values() if ep.min_score is not None]
    return {
        "straggler_seconds": round(straggler_seconds, 3),
        "straggler_episodes": len(opened),
        "worst_score": min(scores) if scores else None,
        "job_seconds": round(max(0.0, end - start), 3),
    }


def _distinct(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each event once (read from the log and the journal); an event without an id (not
    written by ingero) is kept as it is."""
    unique: dict[object, dict[str, Any]] = {}
    for event in events:
        event_id = event.get("event_id")
        key = identity(str(event_id), str(event.get("type")), event.get("timestamp"))
        unique[key if event_id else id(event)] = event
    return list(unique.values())


def report_problem(hook: str, message: str, env: Mapping[str, str]) -> None:
    """A hook problem: to the journal (priority warning) and to stderr; never raises."""
    text = f"ingero slurm {hook}: {message}"
    with contextlib.suppress(OSError):
        print(text, file=sys.stderr)
    journal_send(
        {
            "MESSAGE": text,
            "MESSAGE_ID": HOOK_PROBLEM_MESSAGE_ID,
            "PRIORITY": "4",
            "SYSLOG_IDENTIFIER": "ingero-slurm",
            "INGERO_HOOK": hook,
            "INGERO_JOB": env.get("SLURM_JOB_ID", ""),
            "INGERO_NODE": env.get("SLURMD_NODENAME", ""),
        },
        env.get("INGERO_JOURNAL_SOCKET") or JOURNAL_SOCKET,
    )


def run_prolog(env: Mapping[str, str], now: float) -> Path:
    info = job_info_from_env(env, now)
    return write_job(jobs_dir(dict(env)), info)


def run_taskprolog(env: Mapping[str, str], now: float) -> list[str]:
    directory = jobs_dir(dict(env))
    info: JobInfo | None = None
    try:
        info = read_job(directory, _env_job_id(env))
    except (OSError, ValueError):
        info = None
    # Without a job file (prolog not configured or it failed) the task's env says the same.
    if info is None or info.node_id != env.get("SLURMD_NODENAME", info.node_id):
        info = job_info_from_env(env, now)
    lines = task_exports(info, env)
    sys.stdout.write("".join(line + "\n" for line in lines))
    sys.stdout.flush()
    return lines


def run_epilog(env: Mapping[str, str], now: float) -> dict[str, Any]:
    """Emit the job summary event, then remove the job file (also when the summary fails)."""
    directory = jobs_dir(dict(env))
    job_id = _env_job_id(env)
    try:
        return _summarise(env, directory, job_id, now)
    finally:
        remove_job(directory, job_id)


def _summarise(env: Mapping[str, str], directory: Path, job_id: str, now: float) -> dict[str, Any]:
    from ingero.schema.events import Event

    info: JobInfo | None
    try:
        info = read_job(directory, job_id)
    except ValueError as exc:
        report_problem("epilog", f"{exc}; summarising from the environment", env)
        info = None
    if info is None:
        info = job_info_from_env(env, now)
    start = info.started_at if info.started_at is not None else now
    log_path = Path(env.get("INGERO_EVENT_LOG") or EVENT_LOG)
    journal_socket = env.get("INGERO_JOURNAL_SOCKET") or JOURNAL_SOCKET
    events = read_events(log_path)
    if Path(journal_socket).exists():  # journald runs here: fleet-push journals its events
        events += read_journal_events(job_id, info.node_id, start)
    summary = summarize(_distinct(events), job_id, info.node_id, start, now)
    event = Event(
        type="job_summary",
        node_id=info.node_id,
        cluster_id=info.cluster_id,
        timestamp=now,
        job_id=job_id,
        rank=info.rank,
        score=summary["worst_score"],
        extra={**summary, "world_size": info.world_size, "user": info.user},
    )
    journal_send(event.journal_fields(), journal_socket)
    if log_path.parent.is_dir():
        try:
            with log_path.open("a") as out:
                out.write(event.to_json() + "\n")
        except OSError as exc:
            report_problem("epilog", f"cannot append the job summary to {log_path}: {exc}", env)
    return event.to_dict()


def main(argv: list[str] | None = None, env: Mapping[str, str] | None = None) -> int:
    """Run one hook; always returns 0 (a non-zero prolog/epilog exit drains the node)."""
    args = sys.argv[1:] if argv is None else argv
    environ = os.environ if env is None else env
    hook = args[0] if args else ""
    try:
        if hook == "prolog":
            run_prolog(environ, time.time())
        elif hook == "epilog":
            run_epilog(environ, time.time())
        elif hook == "taskprolog":
            run_taskprolog(environ, time.time())
        else:
            report_problem(hook or "?", "usage: hooks prolog|epilog|taskprolog", environ)
    except Exception as exc:  # never fail a Slurm hook: report and carry on
        report_problem(hook, f"{type(exc).__name__}: {exc}", environ)
    return 0


if __name__ == "__main__":
    sys.exit(main())
