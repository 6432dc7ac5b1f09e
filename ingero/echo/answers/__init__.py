"""The questions Echo answers, each implemented once and described once, its parameters and
answer schema registered beside its function (the framework: ``ingero.echo.questions``).

Every function filters by the caller's ``Principal``: a tenant never sees a row of a
cluster outside its token's scope. A module per topic: ``stragglers`` (the score history's
summary, stragglers, outliers and cost), ``events`` (events, drains, idle GPUs), ``lag``
(NCCL collective lag), ``jobs`` (jobs and a job's report), ``timeline`` (a job over time).
"""

from __future__ import annotations

# Imported for what they do on import: register their questions.
from ingero.echo.answers import events, jobs, lag, stragglers, timeline  # noqa: F401
from ingero.echo.answers.common import REGISTRY
from ingero.echo.answers.jobs import JOB_ACTIVE_S

__all__ = ["JOB_ACTIVE_S", "QUESTIONS"]

# The modules imported above registered their questions; this is the order the HTTP API,
# the OpenAPI document and the MCP tool list show them in.
QUESTIONS = REGISTRY.ordered(
    (
        "summary",
        "stragglers",
        "outliers",
        "events",
        "job_report",
        "collective_lag",
        "jobs",
        "job_timeline",
        "idle_gpus",
        "drains",
        "cost",
    )
)
