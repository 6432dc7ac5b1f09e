"""``ingero check --health``: is this node one ingero knows to be bad? (NHC's check_ingero)

Two node-local sources, no network call and no Slurm RPC (NHC gives all its checks 30 s):

- fleet-push's health state file (``ingero.schema.healthstate``): an open straggler episode
  older than ``episode_age`` fails the node. A missing or stale file (fleet-push stopped)
  tells nothing, and the check says so and passes: a node is not drained because its agent
  is down.
- the node DB's ``gpu_intervals`` (NVML's rows, from ``ingero trace`` or ``gpu-sample``):
  in the newest row of each GPU within ``gpu_window``, a lost GPU, a row remapping pending or
  failed, a page retirement pending, or uncorrected (volatile) ECC errors since the driver
  loaded fail it (each stays until the GPU is reset); so does an XID within the window that
  is not the application's own (``xid_ignore``), and fewer GPUs reporting than
  ``expect_gpus``. No GPU rows within the window tell nothing (said, and passed).

``judge`` is pure (rows and state in, verdict out); ``read_gpu_rows``
(``ingero.nodedb.gpu_rows``) is the one read of the node DB. The check takes about a tenth of a second
(docs/benchmarks.md#nhcs-check_ingero), most of it Python's start and click.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ingero.nodedb.gpu_rows import NodeDbTooNew, read_gpu_rows
from ingero.schema.healthstate import HealthState

# XIDs a job's own code raises (NVIDIA's XID catalog: 13 graphics engine exception, 31 GPU
# memory page fault, 43 GPU stopped processing, 45 preemptive cleanup): not the GPU's fault,
# so by default no reason to take the node out of service.
APPLICATION_XIDS: Final = frozenset({13, 31, 43, 45})
MAX_FINDINGS_SHOWN: Final = 3


@dataclass(frozen=True)
class HealthConfig:
    episode_age: float = 600.0  # s: an open straggler episode this old fails the node
    stragglers: bool = True  # False: Fleet's drain controller owns straggler drains
    gpu_window: float = 900.0  # s: GPU rows this recent count; XIDs this recent fail
    xid_ignore: frozenset[int] = APPLICATION_XIDS
    expect_gpus: int | None = None  # fewer GPUs reporting fails the node (None: not checked)


@dataclass(frozen=True)
class Finding:
    kind: str  # straggler | lost | remap | ecc | xid | missing_gpu
    text: str
    gpu: int | None = None


@dataclass(frozen=True)
class Verdict:
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = ()  # what could not be told, and why
    gpus: tuple[int, ...] = ()  # the GPUs that reported within the window
    straggler_age_s: float | None = None

    @property
    def healthy(self) -> bool:
        return not self.findings

    def line(self) -> str:
        """One line: what is wrong (NHC puts it in the drain reason), or that nothing is."""
        if self.findings:
            shown = [f.text for f in self.findings[:MAX_FINDINGS_SHOWN]]
            more = len(self.findings) - len(shown)
            return "ingero: " + "; ".join(shown) + (f"; +{more} more" if more > 0 else "")
        said = [f"GPUs {_span(self.gpus)} clean" if self.gpus else "", *self.notes]
        return "ingero: healthy" + (f" ({'; '.join(s for s in said if s)})" if any(said) else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "healthy": self.healthy,
            "line": self.line(),
            "findings": [{"kind": f.kind, "gpu": f.gpu, "text": f.text} for f in self.findings],
            "notes": list(self.notes),
            "gpus": list(self.gpus),
            "straggler_age_s": self.straggler_age_s,
        }


def _span(gpus: Sequence[int]) -> str:
    """0,1,2,3,5 -> 0-3,5"""
    out: list[str] = []
    start = prev = None
    for g in sorted(gpus):
        if prev is not None and g == prev + 1:
            prev = g
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = g
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ",".join(out)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f}m" if seconds >= 60 else f"{seconds:.0f}s"


def _straggler(
    state: HealthState | None, now: float, config: HealthConfig
) -> tuple[list[Finding], list[str], float | None]:
    if not config.stragglers:
        return [], [], None
    if state is None:
        return [], ["no fleet-push state"], None
    if not state.fresh(now):
        return [], [f"fleet-push state {_minutes(now - state.written_at)} old"], None
    s = state.straggler
    if s is None:
        return [], [], None
    age = max(0.0, now - s.since)
    if age < config.episode_age:
        return (
            [],
            [f"straggler episode {_minutes(age)} old, below {_minutes(config.episode_age)}"],
            age,
        )
    words = [f"job {s.job_id}"] if s.job_id else []
    if s.score is not None and s.threshold is not None:
        words.append(f"score {s.score:.2f} < {s.threshold:.2f}")
    if s.reason != "score":
        words.append(s.reason)
    detail = f" ({', '.join(words)})" if words else ""
    return [Finding("straggler", f"straggler for {_minutes(age)}{detail}")], [], age


def _gpu_findings(
    rows: Sequence[Mapping[str, Any]], now: float, config: HealthConfig
) -> tuple[list[Finding], list[str], tuple[int, ...]]:
    newest: dict[int, Mapping[str, Any]] = {}
    xids: dict[int, set[int]] = {}
    for row in sorted(rows, key=lambda r: float(r["ts_end"])):
        if float(row["ts_end"]) <= now - config.gpu_window:
            continue
        gpu = int(row["gpu"])
        newest[gpu] = row
        if row.get("xids"):
            try:
                codes = json.loads(row["xids"])
            except ValueError:
                codes = []
            found = {c for c in codes if type(c) is int and c not in config.xid_ignore}
            xids.setdefault(gpu, set()).update(found)
    findings: list[Finding] = []
    for gpu, row in sorted(newest.items()):
        if row.get("lost"):
            findings.append(Finding("lost", f"GPU {gpu}: lost (NVML)", gpu))
            continue
        if row.get("remap_failure"):
            findings.append(Finding("remap", f"GPU {gpu}: row remapping failed", gpu))
        elif row.get("remap_pending"):
            findings.append(Finding("remap", f"GPU {gpu}: row remap pending (reset it)", gpu))
        if row.get("retired_pages_pending"):
            findings.append(Finding("remap", f"GPU {gpu}: page retirement pending", gpu))
        uncorrected = row.get("ecc_uncorrected")
        if uncorrected:
            findings.append(
                Finding("ecc", f"GPU {gpu}: {int(uncorrected)} uncorrected ECC errors", gpu)
            )
        if xids.get(gpu):
            codes = ",".join(str(x) for x in sorted(xids[gpu]))
            findings.append(Finding("xid", f"GPU {gpu}: XID {codes}", gpu))
    notes: list[str] = []
    if not newest:
        notes.append(f"no GPU rows in the last {_minutes(config.gpu_window)}")
    if config.expect_gpus is not None and len(newest) < config.expect_gpus:
        findings.append(
            Finding(
                "missing_gpu",
                f"{len(newest)} of {config.expect_gpus} GPUs report"
                + (f" (GPUs {_span(list(newest))})" if newest else ""),
            )
        )
    return findings, notes, tuple(sorted(newest))


def judge(
    state: HealthState | None,
    gpu_rows: Sequence[Mapping[str, Any]],
    now: float,
    config: HealthConfig,
    notes: Iterable[str] = (),
) -> Verdict:
    """The node's verdict from fleet-push's state and the node DB's GPU rows (pure).
    ``notes``: what the reads could not tell (an unreadable file), said in the line."""
    stragglers, s_notes, age = _straggler(state, now, config)
    gpus, g_notes, seen = _gpu_findings(gpu_rows, now, config)
    return Verdict(tuple(gpus + stragglers), tuple([*notes, *s_notes, *g_notes]), seen, age)


@dataclass
class Sources:
    """Where the check reads; the defaults are the node's."""

    db_path: Path
    state_path: Path
    notes: list[str] = field(default_factory=list)

    def state(self) -> HealthState | None:
        from ingero.schema.healthstate import StateError, read

        try:
            return read(self.state_path)
        except StateError as exc:
            self.notes.append(f"fleet-push state unreadable: {exc}")
            return None

    def gpu_rows(self, since: float) -> list[dict[str, Any]]:
        try:
            return read_gpu_rows(self.db_path, since)
        except FileNotFoundError:
            self.notes.append("no node DB")
        except (OSError, sqlite3.Error, NodeDbTooNew) as exc:
            self.notes.append(f"node DB unreadable: {exc}")
        return []


def check_health(sources: Sources, now: float, config: HealthConfig) -> Verdict:
    state = sources.state()
    rows = sources.gpu_rows(now - config.gpu_window)
    return judge(state, rows, now, config, sources.notes)
