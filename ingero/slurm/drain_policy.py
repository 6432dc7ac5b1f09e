"""Which straggler nodes to drain or resume: pure rules, no I/O (DESIGN.md "Slurm drain").

Input: the straggler verdicts of one Fleet tick, the Slurm nodes as the backend read them,
the drain configuration, the time, and the :class:`DrainMemory` the controller keeps
between ticks. Output: decisions (drain, resume, skip with a reason code) for the
controller to carry out. Rules, in order, for a node in its straggler state:

1. fewer than ``min_intervals`` consecutive straggler ticks: not yet (no decision);
1a. this Fleet replica does not own the node's cluster now (``ingero.fleet.ownership``:
   no push of it within two intervals, or its group has not had quorum for
   ``min_intervals`` ticks since the replica took the cluster over): skip ``not_owner``;
2. its group is in panic (a shared cause is likelier): skip ``panic``;
3. its group has no quorum (the threshold is not trustworthy): skip ``no_quorum``;
3a. its cause class is ``job`` (``ingero.schema.causes``: no GPU, host or network cause
   on the node, the application's own): skip ``job_cause``;
4. Slurm does not know the node: skip ``unknown_node``;
5. already drained by ingero: nothing to do;
6. DOWN, reboot pending, or carrying a reason ingero did not write (drained by someone
   else, or with no reason at all): skip ``down`` / ``reboot_pending`` / ``foreign_reason``;
7. ingero drained or resumed it less than ``cooldown`` ago: skip ``cooldown``;
8. draining it would put more than ``max_fraction`` of the cluster's nodes in ingero's
   hands (rounded down, so small clusters may allow none): skip ``max_fraction``;
9. ``dry_run``: skip ``dry_run`` (the event says what would have been done);
10. otherwise drain, with the reason ``ingero: straggler score=… threshold=… job=… since=…
    class=…``, or, for a node Fleet flags by NCCL peer lag alone (its score is not below the
    threshold, so the score would mislead), ``ingero: peer_lag rank R of comm H N ms late
    (job J) class=…``; ``class=`` is the remediation class (hardware|node|network, or
    unknown from an agent that does not say), last, for a script to parse.

With ``auto_resume``, a node ingero drained is resumed only on positive evidence: Fleet
ended its straggler episode with reason ``recovered`` (which Fleet reports only with quorum;
a recovery inside a panicking group is no evidence), and from that tick on (the first) it
stayed out of the verdicts for ``min_intervals`` ticks in a row. Absence alone proves
nothing: Fleet lists only stragglers, and an episode also ends when the node goes idle
(as a drained node does once its job ends), changes group, loses quorum or expires. Any
such ending, an expiry, or a new straggler verdict takes the eligibility away; a node with
no recovery evidence (e.g. after a Fleet restart) stays drained for a person to resume. A
skip is reported once per reason change, not every tick.

With ``resume_idle.enabled`` a node ingero drained whose job has ended (IDLE+DRAIN: no job
left on it, so no episode can end ``recovered``) comes back once it is proven safe
(:func:`idle_resumes`): its reason is still ingero's (never an admin's or NHC's), it is
not DOWN, failing or rebooting, its GPU health has been clean for ``resume_idle.clean_for``
(:func:`observe_health`: the node pushed all along, its agent said no ``hardware`` cause,
no GPU fault event came from it), and fewer than ``resume_idle.budget`` idle nodes were
resumed in the last hour. Such a node is handed to the controller to verify (a fresh read
of the node, then the site's ``resume_idle.command``, with a timeout) and resume; the
refusals (``no_health_evidence``, ``gpu_unhealthy``, ``resume_budget``, and the
controller's ``verify_failed``) are reported once per change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal, Protocol

from ingero.runtime.config import Duration, in_range, positive
from ingero.schema.causes import HARDWARE, JOB
from ingero.slurm.backend import INGERO_REASON_PREFIX, NodeInfo

Action = Literal["drain", "resume", "skip"]


@dataclass(frozen=True)
class IdleResumeConfig:
    """``drain.resume_idle``: resume a drained node whose job ended, once proven safe."""

    enabled: bool = False
    clean_for: Duration = Duration(600.0)  # noqa: RUF009 - an immutable float
    budget: int = field(default=2, metadata=positive())  # idle resumes per hour, at most
    # The site's own check: run as COMMAND... NODE (shell words, no shell), exit 0 passes.
    command: str | None = None
    timeout: Duration = field(default=Duration(60.0), metadata=in_range(1.0, 3600.0))


@dataclass(frozen=True)
class DrainConfig:
    """The ``drain:`` section of Fleet's configuration (opt-in; defaults in DESIGN.md)."""

    enabled: bool = False
    dry_run: bool = False
    backend: Literal["auto", "scontrol", "pyslurm"] = "auto"
    max_fraction: float = field(default=0.1, metadata=in_range(0.0, 1.0))
    min_intervals: int = field(default=6, metadata=positive())
    cooldown: Duration = Duration(1800.0)  # noqa: RUF009 - an immutable float
    auto_resume: bool = False
    resume_idle: IdleResumeConfig = field(default_factory=IdleResumeConfig)


class LagCause(Protocol):
    """The NCCL rank behind a peer-lag verdict (Fleet's ``PeerLagCause`` has it)."""

    @property
    def comm_hash(self) -> str: ...
    @property
    def comm_rank(self) -> int: ...
    @property
    def lag_s(self) -> float: ...


class Verdict(Protocol):
    """What the policy needs of a straggler verdict (Fleet's ``NodeVerdict`` has it)."""

    @property
    def node_id(self) -> str: ...
    @property
    def cluster_id(self) -> str: ...
    @property
    def job_id(self) -> str | None: ...
    @property
    def rank(self) -> int | None: ...
    @property
    def score(self) -> float: ...
    @property
    def threshold(self) -> float: ...
    @property
    def straggler(self) -> bool: ...
    @property
    def consecutive_straggler_ticks(self) -> int: ...
    @property
    def since(self) -> float: ...
    @property
    def panic(self) -> bool: ...
    @property
    def quorum_met(self) -> bool: ...
    @property
    def drain_owner(self) -> bool: ...
    @property
    def reason(self) -> str: ...  # "score" or "peer_lag": why the node is a straggler
    @property
    def peer_lag(self) -> LagCause | None: ...  # the lagging rank when reason is peer_lag
    @property
    def cause_class(self) -> str: ...  # ingero.schema.causes, or "unknown"


@dataclass(frozen=True)
class Decision:
    """One thing to do (or not) about one node; ``reason`` is Slurm's reason for a drain and
    the human explanation for a skip; ``code`` is the short machine key of a skip."""

    action: Action
    node: str
    cluster_id: str
    reason: str
    code: str = ""
    job_id: str | None = None
    rank: int | None = None
    score: float | None = None
    threshold: float | None = None


@dataclass
class DrainMemory:
    """What the policy remembers between ticks (in the controller, lost on restart: the
    ``ingero:`` reasons in Slurm are the durable record)."""

    # node -> monotonic time of ingero's last drain or resume of it (for the cooldown)
    last_action: dict[str, float] = field(default_factory=dict)
    # node -> the skip code last reported (so a skip is reported once, not every tick)
    last_skip: dict[str, str] = field(default_factory=dict)
    # node with recovery evidence -> ticks out of the verdicts since (the recovery tick is
    # the first); a node absent here is not eligible for auto-resume
    healthy_ticks: dict[str, int] = field(default_factory=dict)
    # node -> the cluster its verdicts named (resume decisions carry it)
    clusters: dict[str, str] = field(default_factory=dict)
    # node -> monotonic time since which its GPU health has been clean (observe_health)
    clean_since: dict[str, float] = field(default_factory=dict)
    # node -> why its health is not clean now (no_health_evidence, gpu_unhealthy)
    unclean: dict[str, str] = field(default_factory=dict)
    # monotonic times of the idle resumes of the last hour (the budget)
    idle_resumes: list[float] = field(default_factory=list)
    # node -> the idle-resume refusal code last reported
    idle_refusal: dict[str, str] = field(default_factory=dict)


def iso_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def drain_reason(verdict: Verdict) -> str:
    """Slurm's reason for an ingero drain (one line, starts with ``ingero:``): what made the
    node a straggler, so ``scontrol show node`` does not show a score above its threshold
    as the cause of a drain for peer lag."""
    lag = verdict.peer_lag
    cause = f"class={verdict.cause_class}"
    if verdict.reason == "peer_lag" and lag is not None:
        return (
            f"{INGERO_REASON_PREFIX} peer_lag rank {lag.comm_rank} of comm {lag.comm_hash} "
            f"{lag.lag_s * 1e3:.0f} ms late (job {verdict.job_id or 'none'}) {cause}"
        )
    return (
        f"{INGERO_REASON_PREFIX} straggler score={verdict.score:.2f} "
        f"threshold={verdict.threshold:.2f} job={verdict.job_id or 'none'} "
        f"since={iso_time(verdict.since)} {cause}"
    )


def max_drained(total_nodes: int, max_fraction: float) -> int:
    """How many nodes ingero may hold drained at once (rounded down)."""
    return math.floor(total_nodes * max_fraction + 1e-9)


def decide(
    verdicts: Iterable[Verdict],
    nodes: Iterable[NodeInfo],
    config: DrainConfig,
    memory: DrainMemory,
    monotonic_now: float,
    expired: Iterable[str] = (),
    recovered: Iterable[str] = (),
) -> list[Decision]:
    """The decisions of one tick; updates ``memory`` for the skips it reports and the
    resume counters (the controller records drains and resumes it carries out).

    ``expired`` names nodes Fleet stopped hearing from, or whose straggler episode ended
    any other way than recovered: they lose auto-resume eligibility. ``recovered`` names
    nodes whose episode Fleet ended ``recovered`` (after the expiries, which it overrides:
    the controller keeps only recoveries that came after a node's last other ending).
    """
    if not config.enabled:
        return []
    by_name: Mapping[str, NodeInfo] = {n.name: n for n in nodes}
    stragglers = {v.node_id: v for v in verdicts if v.straggler}
    for verdict in stragglers.values():
        memory.clusters[verdict.node_id] = verdict.cluster_id
    ingero_drained = {name for name, info in by_name.items() if info.ingero_reason and info.drained}
    budget = max_drained(len(by_name), config.max_fraction) - len(ingero_drained)
    decisions: list[Decision] = []

    for verdict in sorted(stragglers.values(), key=lambda v: (v.score, v.node_id)):
        if verdict.consecutive_straggler_ticks < config.min_intervals:
            continue
        info = by_name.get(verdict.node_id)
        if info is not None and info.ingero_reason and info.drained:
            memory.last_skip.pop(verdict.node_id, None)
            continue
        skip = _blocker(verdict, info, config, memory, monotonic_now, budget)
        if skip is not None:
            code, why = skip
            if memory.last_skip.get(verdict.node_id) != code:
                memory.last_skip[verdict.node_id] = code
                decisions.append(_decision("skip", verdict, why, code))
            continue
        memory.last_skip.pop(verdict.node_id, None)
        budget -= 1
        decisions.append(_decision("drain", verdict, drain_reason(verdict)))

    if config.auto_resume:
        for node in expired:
            memory.healthy_ticks.pop(node, None)
        for node in recovered:
            memory.healthy_ticks[node] = 0
        decisions.extend(_resumes(stragglers, by_name, ingero_drained, config, memory))
    for node in list(memory.last_skip):
        if node not in stragglers:
            del memory.last_skip[node]
    return decisions


def _blocker(
    verdict: Verdict,
    info: NodeInfo | None,
    config: DrainConfig,
    memory: DrainMemory,
    monotonic_now: float,
    budget: int,
) -> tuple[str, str] | None:
    if not verdict.drain_owner:
        return (
            "not_owner",
            "this Fleet replica does not own the node's cluster now (no recent push of it, "
            "or no quorum for min_intervals ticks since it took the cluster over)",
        )
    if verdict.panic:
        return "panic", "the node's group is degraded as a whole (panic): nothing is drained"
    if not verdict.quorum_met:
        return "no_quorum", "the node's group has no quorum: its threshold is not trusted"
    if verdict.cause_class == JOB:
        return (
            "job_cause",
            "no GPU, host or network cause on the node (class job): the application's own, "
            "which draining the node does not fix",
        )
    if info is None:
        return "unknown_node", "Slurm has no node of this name"
    if info.down:
        return "down", f"the node is {info.state.upper()}: left alone"
    if info.reboot_pending:
        return "reboot_pending", "a reboot is pending on the node: left alone"
    if info.drained or info.held_reason:
        return (
            "foreign_reason",
            f"the node has a reason ingero did not write: {info.reason or '(drained, no reason)'}",
        )
    last = memory.last_action.get(verdict.node_id)
    if last is not None and monotonic_now - last < config.cooldown:
        left = config.cooldown - (monotonic_now - last)
        return (
            "cooldown",
            f"ingero acted on the node {monotonic_now - last:.0f}s ago; cooldown {left:.0f}s left",
        )
    if budget <= 0:
        return (
            "max_fraction",
            f"ingero already holds max_fraction={config.max_fraction:g} of the cluster's nodes drained",
        )
    if config.dry_run:
        return "dry_run", f"dry run: would drain with reason '{drain_reason(verdict)}'"
    return None


def _resumes(
    stragglers: Mapping[str, Verdict],
    by_name: Mapping[str, NodeInfo],
    ingero_drained: set[str],
    config: DrainConfig,
    memory: DrainMemory,
) -> list[Decision]:
    out = []
    for name in sorted(ingero_drained):
        if name in stragglers:
            memory.healthy_ticks.pop(name, None)
            continue
        if name not in memory.healthy_ticks:  # no evidence that it recovered
            continue
        memory.healthy_ticks[name] += 1
        if memory.healthy_ticks[name] < config.min_intervals:
            continue
        info = by_name[name]
        if info.down or info.reboot_pending:
            continue
        cluster = memory.clusters.get(name, "")
        if config.dry_run:
            if memory.last_skip.get(name) != "dry_run_resume":
                memory.last_skip[name] = "dry_run_resume"
                out.append(
                    Decision("skip", name, cluster, "dry run: would resume (recovered)", "dry_run")
                )
            continue
        out.append(Decision("resume", name, cluster, f"recovered for {config.min_intervals} ticks"))
    for name in list(memory.healthy_ticks):
        if name not in ingero_drained:
            del memory.healthy_ticks[name]
    return out


def _decision(action: Action, verdict: Verdict, reason: str, code: str = "") -> Decision:
    return Decision(
        action=action,
        node=verdict.node_id,
        cluster_id=verdict.cluster_id,
        reason=reason,
        code=code,
        job_id=verdict.job_id,
        rank=verdict.rank,
        score=verdict.score,
        threshold=verdict.threshold,
    )


# -- idle drained nodes that come back when proven safe --------------------------------------

NO_HEALTH_EVIDENCE = "no_health_evidence"
GPU_UNHEALTHY = "gpu_unhealthy"
RESUME_BUDGET = "resume_budget"
VERIFY_FAILED = "verify_failed"
VERIFY = "verify"  # Decision.code of a node handed to the controller to verify and resume
HOUR = 3600.0


class NodeReport(Protocol):
    """What the node's last push said (Fleet's ``NodeReport`` has it)."""

    @property
    def state(self) -> str: ...  # calibrating|active|idle|stale
    @property
    def cause_class(self) -> str | None: ...  # None: its agent says no class


def observe_health(
    memory: DrainMemory, node: str, report: NodeReport | None, monotonic_now: float
) -> None:
    """Fold one tick's look at a drained node into its clean time: clean while Fleet hears
    from it (active or idle, not stale) and its agent names a cause class that is not
    ``hardware`` (an agent that names none proves nothing); anything else restarts it."""
    if report is None or report.state not in ("active", "idle") or report.cause_class is None:
        memory.clean_since.pop(node, None)
        memory.unclean[node] = NO_HEALTH_EVIDENCE
    elif report.cause_class == HARDWARE:
        memory.clean_since.pop(node, None)
        memory.unclean[node] = GPU_UNHEALTHY
    else:
        memory.clean_since.setdefault(node, monotonic_now)
        memory.unclean.pop(node, None)


def gpu_fault(memory: DrainMemory, node: str) -> None:
    """A GPU fault event of the node (gpu_xid, gpu_ecc, a gpu_throttle that starts)."""
    memory.clean_since.pop(node, None)
    memory.unclean[node] = GPU_UNHEALTHY


def idle_drained(info: NodeInfo) -> bool:
    """Drained by ingero with no job left on it (IDLE+DRAIN), and nothing else wrong."""
    return (
        info.ingero_reason
        and info.drained
        and info.state == "idle"
        and not (info.down or info.reboot_pending or "FAIL" in info.flags)
    )


def idle_resumes(
    nodes: Iterable[NodeInfo],
    config: DrainConfig,
    memory: DrainMemory,
    monotonic_now: float,
    cluster_id: str = "",
) -> list[Decision]:
    """This tick's idle drained nodes to verify (``skip`` with ``code`` VERIFY: the
    controller verifies and resumes them, or refuses) and the refusals to report."""
    idle = config.resume_idle
    if not (config.enabled and idle.enabled):
        return []
    memory.idle_resumes = [t for t in memory.idle_resumes if monotonic_now - t < HOUR]
    out: list[Decision] = []
    waiting = {n.name for n in nodes if idle_drained(n)}
    for name in sorted(waiting):
        since = memory.clean_since.get(name)
        if since is None:
            code = memory.unclean.get(name, NO_HEALTH_EVIDENCE)
            why = (
                "Fleet hears nothing from the node, or its agent names no cause class"
                if code == NO_HEALTH_EVIDENCE
                else "its GPU health is not clean (a GPU fault, or its agent says hardware)"
            )
            out += _refusal(memory, name, cluster_id, code, why)
            continue
        clean = monotonic_now - since
        if clean < idle.clean_for:
            continue  # not yet: no decision, nothing to report
        if len(memory.idle_resumes) >= idle.budget:
            out += _refusal(
                memory,
                name,
                cluster_id,
                RESUME_BUDGET,
                f"{len(memory.idle_resumes)} idle nodes resumed in the last hour "
                f"(budget {idle.budget})",
            )
            continue
        last = memory.last_action.get(name)
        if last is not None and monotonic_now - last < config.cooldown:
            continue
        if config.dry_run:
            why = f"dry run: would verify and resume (idle, GPU health clean for {clean:.0f}s)"
            out += _refusal(memory, name, cluster_id, "dry_run", why)
            continue
        memory.idle_refusal.pop(name, None)
        out.append(
            Decision(
                "resume",
                name,
                memory.clusters.get(name, cluster_id),
                f"idle with GPU health clean for {clean:.0f}s",
                VERIFY,
            )
        )
        memory.idle_resumes.append(monotonic_now)  # the budget counts attempts
    for name in list(memory.clean_since):
        if name not in waiting:
            memory.clean_since.pop(name, None)
    for table in (memory.unclean, memory.idle_refusal):
        for name in [n for n in table if n not in waiting]:
            del table[name]
    return out


def _refusal(
    memory: DrainMemory, node: str, cluster_id: str, code: str, why: str
) -> list[Decision]:
    if memory.idle_refusal.get(node) == code:
        return []
    memory.idle_refusal[node] = code
    return [Decision("skip", node, memory.clusters.get(node, cluster_id), why, code)]
