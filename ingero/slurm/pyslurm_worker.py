"""The child process that holds pyslurm for :class:`ingero.slurm.pyslurm_backend.PyslurmBackend`.

libslurm calls ``exit()`` when it finds no slurm.conf, and a pyslurm built for another Slurm
release fails in its import or in its first call; a Slurm call may also block for as long
as slurmctld does not answer. None of that may reach a daemon, so pyslurm lives here, in one
long-lived child per backend (not one process per call): requests arrive as JSON lines on
stdin, answers leave as JSON lines on stdout, and stdin's end ends the process.

The first line out is ``{"hello": {...}}`` with the versions, once pyslurm has imported
(which also reads slurm.conf). Requests are ``{"op": ..., ...}``; answers are
``{"ok": result}`` or ``{"error": "one line"}``. Only the standard library is imported
here besides pyslurm, so the child starts fast.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
from typing import Any


def _nodes(slurm: Any) -> list[dict[str, Any]]:
    rows = []
    for node in slurm.Nodes.load().values():
        rows.append(
            {
                "name": node.name,
                # The whole state, as scontrol prints it: "IDLE+DRAIN", "DOWN*+REBOOT_ISSUED".
                "state": node.state,
                "reason": node.reason,
                "reason_user": node.reason_user if node.reason else None,
                "reason_time": node.reason_time,
            }
        )
    return rows


def _job(slurm: Any, job_id: str) -> str | None:
    """The NodeList of a job: ``123``, array task ``123_4`` or het component ``123+1``."""
    if job_id.isdigit():
        return slurm.Job.load(int(job_id)).allocated_nodes  # type: ignore[no-any-return]
    # Job.load takes the numeric id only: find array tasks and het components among all jobs.
    array = "_" in job_id
    first, second = (int(p) for p in job_id.split("_" if array else "+"))
    for job in slurm.Jobs.load().values():
        if array and (job.array_id, job.array_task_id) == (first, second):
            return job.allocated_nodes  # type: ignore[no-any-return]
        if not array and (job.het_job_id, job.het_job_offset) == (first, second):
            return job.allocated_nodes  # type: ignore[no-any-return]
    raise LookupError("Invalid job id specified")


def _record(job: Any) -> dict[str, Any]:
    """A job of Slurm's accounting (pyslurm.db.Job) as the backend reads it."""
    return {
        "job_id": str(job.id),
        "state": job.state,
        "start": job.start_time,
        "end": job.end_time,
        "nodes": job.num_nodes,
        "admin_comment": job.admin_comment,
    }


def _db_jobs(slurm: Any, **conditions: Any) -> list[dict[str, Any]]:
    jobs = slurm.db.Jobs.load(slurm.db.JobFilter(**conditions))
    return [_record(job) for job in jobs.values()]


def _handle(slurm: Any, request: dict[str, Any]) -> object:
    op = request.get("op")
    if op == "nodes":
        return _nodes(slurm)
    if op == "cluster_name":
        return slurm.slurmctld.Config.load().cluster_name
    if op == "controller_version":
        return slurm.slurmctld.Config.load().version
    if op == "drain":
        change = slurm.Node(state="DRAIN", reason=str(request["reason"]))
        slurm.Node(str(request["node"])).modify(change)
        return None
    if op == "resume":
        slurm.Node(str(request["node"])).modify(slurm.Node(state="RESUME"))
        return None
    if op == "job_nodes":
        nodelist = _job(slurm, str(request["job"]))
        if not nodelist:
            return None
        # Expanded by libslurm's own hostlist code, in node-rank order (SLURM_NODEID).
        return list(slurm.utils.nodelist_from_range_str(nodelist))
    if op == "job_record":
        return _db_jobs(slurm, ids=[int(request["job"])])
    if op == "ended_jobs":
        return _db_jobs(slurm, start_time=int(request["since"]), end_time=int(request["until"]))
    if op == "set_admin_comment":
        change = slurm.db.Job(admin_comment=str(request["text"]))
        slurm.db.Job(int(request["job"])).modify(change)
        return None
    raise ValueError(f"unknown request {op!r}")


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__


def main() -> int:
    # Ctrl-C in a terminal reaches the whole process group: the parent decides, not this.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # The answers get their own copy of stdout; fd 1 becomes stderr, so nothing libslurm
    # prints can corrupt them.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        slurm = importlib.import_module("pyslurm")
        hello = {
            "pyslurm": slurm.__version__,
            "slurm": ".".join(str(p) for p in slurm.slurm_api_version()),
        }
    except Exception as exc:  # ImportError of a mismatched libslurm, among others
        out.write(json.dumps({"fatal": f"cannot import pyslurm: {_one_line(exc)}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"hello": hello}) + "\n")
    out.flush()
    for line in sys.stdin:
        try:
            request = json.loads(line)
            answer: dict[str, object] = {"ok": _handle(slurm, request)}
        except Exception as exc:  # pyslurm.RPCError and bad requests alike: one line back
            answer = {"error": _one_line(exc)}
        out.write(json.dumps(answer) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
