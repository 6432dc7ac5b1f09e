"""The drain controller: carries out drain-policy decisions on its own thread, off ingest.

Fleet's tick thread hands each tick to :meth:`DrainController.on_tick`, which only stores
it and returns: ticks that arrive while Slurm is slow are coalesced (the newest wins), so a
stalled slurmctld never holds up the tick or the pushes. The worker reads the nodes, asks
:func:`ingero.slurm.drain_policy.decide`, runs each drain/resume through the backend (every
call with a timeout), and emits every decision as an event (``node_drained``,
``node_resumed``, ``drain_skipped``). A failed Slurm call is logged and retried with
exponential backoff on the newest tick.

With ``drain.resume_idle`` it also follows the health of the idle nodes it drained (the
node's last push through ``report``, its GPU fault events through :meth:`on_events`),
verifies each one the policy hands it (a fresh read of the node, then the site's command
with a timeout) and resumes it, or refuses; both are events with the verification's
result (``extra.verification``), logged, and counted in :attr:`idle_outcomes`.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from ingero.runtime.clock import Clock, SystemClock
from ingero.schema.events import Event
from ingero.slurm.backend import NodeInfo, SlurmBackend, SlurmError
from ingero.slurm.drain_policy import (
    GPU_UNHEALTHY,
    NO_HEALTH_EVIDENCE,
    RESUME_BUDGET,
    VERIFY,
    VERIFY_FAILED,
    Decision,
    DrainConfig,
    DrainMemory,
    NodeReport,
    Verdict,
    decide,
    gpu_fault,
    idle_drained,
    idle_resumes,
    observe_health,
)
from ingero.slurm.factory import make_backend

log = logging.getLogger(__name__)

_EVENT_TYPES = {"drain": "node_drained", "resume": "node_resumed", "skip": "drain_skipped"}
# A node's GPU fault events, which restart its clean time for an idle resume.
GPU_FAULTS = frozenset({"gpu_xid", "gpu_ecc", "gpu_throttle"})
IDLE_REFUSALS = frozenset({NO_HEALTH_EVIDENCE, GPU_UNHEALTHY, RESUME_BUDGET})
OUTPUT_TAIL = 400  # characters of the verify command's output kept in the event

Reporter = Callable[[str, str], "NodeReport | None"]  # (cluster_id, node_id) -> last push


class Tick(Protocol):
    """What the controller needs of a Fleet tick (Fleet's ``TickResult`` has it)."""

    @property
    def verdicts(self) -> Sequence[Verdict]: ...
    @property
    def expired_nodes(self) -> Sequence[tuple[str, str]]: ...  # (cluster_id, node_id)
    @property
    def events(self) -> Sequence[Event]: ...


def is_recovery(event: Event) -> bool:
    """Whether a ``straggler_resolved`` event is evidence that the node recovered: Fleet
    ended the episode ``recovered`` (it says ``quorum_lost`` without quorum) outside panic."""
    return event.extra.get("reason") == "recovered" and not event.extra.get("panic")


class DrainController:
    def __init__(
        self,
        config: DrainConfig,
        backend: SlurmBackend,
        emit: Callable[[Event], None],
        clock: Clock | None = None,
        backoff_initial: float = 1.0,
        backoff_max: float = 60.0,
        report: Reporter | None = None,
    ) -> None:
        self.config = config
        self._backend = backend
        self._emit = emit
        self._clock = clock or SystemClock()
        self._report = report
        # GPU fault events not yet handled, as (cluster_id, node_id)
        self._faults: list[tuple[str, str]] = []
        # (outcome, code) -> count: ("resumed", "verified"), ("refused", <code>)
        self.idle_outcomes: dict[tuple[str, str], int] = {}
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._memory = DrainMemory()
        self._cond = threading.Condition()
        self._pending: Tick | None = None
        self._submitted = 0
        self._done = 0
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.failures = 0
        # Episode endings of ticks not yet handled, in order, as (cluster_id, node_id): a
        # node id names a node only within its cluster, and Fleet may serve several. The
        # nodes that lost auto-resume eligibility (expired, or their episode ended other
        # than recovered), and those whose recovery no later ending cancelled.
        self._expired: list[tuple[str, str]] = []
        self._recovered: set[tuple[str, str]] = set()

    def start(self) -> None:
        if not self.running:
            self._stopping = False
            self._thread = threading.Thread(target=self._run, name="ingero-drain", daemon=True)
            self._thread.start()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the worker; a Slurm call in flight ends at its own timeout at the latest."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)

    def on_tick(self, tick: Tick) -> None:
        """Called from Fleet's tick thread: O(events of the tick), never waits on Slurm."""
        with self._cond:
            self._pending = tick
            # Endings in coalesced ticks must not be lost (they make or end auto-resume
            # eligibility).
            self._note_endings(tick)
            self._submitted += 1
            self._cond.notify_all()

    def on_events(self, events: Sequence[Event]) -> None:
        """Every event Fleet publishes: a node's GPU faults restart its clean time."""
        faults = [
            (e.cluster_id, e.node_id)
            for e in events
            if e.type in GPU_FAULTS and (e.type != "gpu_throttle" or e.extra.get("state") != "end")
        ]
        if faults:
            with self._cond:
                self._faults.extend(faults)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every tick handed in so far has been handled (for tests and shutdown)."""
        with self._cond:
            target = self._submitted
            return self._cond.wait_for(lambda: self._done >= target, timeout)

    def _run(self) -> None:
        backoff = self._backoff_initial
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._pending is not None)
                if self._stopping:
                    return
                tick, self._pending = self._pending, None
                expired, self._expired = self._expired, []
                recovered, self._recovered = self._recovered, set()
                seq = self._submitted
            assert tick is not None
            try:
                self._handle(tick, expired, recovered)
                backoff = self._backoff_initial
            except SlurmError as exc:
                self.failures += 1
                log.warning("drain controller: %s; retrying in %.1fs", exc, backoff)
                with self._cond:
                    if self._pending is None:  # retry this tick unless a newer one came
                        self._pending = tick
                    self._expired[:0] = expired
                    # a newer ending of a node cancels its older recovery
                    lost = set(self._expired[len(expired) :])
                    self._recovered.update(recovered - lost)
                    if self._cond.wait_for(lambda: self._stopping, backoff):
                        return
                backoff = min(backoff * 2, self._backoff_max)
                continue
            except Exception:  # a bug must not end the worker for good
                self.failures += 1
                log.exception("drain controller: unexpected error")
            with self._cond:
                self._done = max(self._done, seq)
                self._cond.notify_all()

    def _note_endings(self, tick: Tick) -> None:
        """Fold one tick's episode endings into the pending ones (caller holds the lock)."""
        for node in tick.expired_nodes:
            self._recovered.discard(node)
        self._expired.extend(tick.expired_nodes)
        for event in tick.events:
            if event.type != "straggler_resolved":
                continue
            node = (event.cluster_id, event.node_id)
            if is_recovery(event):
                self._recovered.add(node)
            else:
                self._recovered.discard(node)
                self._expired.append(node)

    def _handle(
        self, tick: Tick, expired: Sequence[tuple[str, str]], recovered: set[tuple[str, str]]
    ) -> None:
        # Most ticks have no node ready for a decision: then Slurm is not asked at all
        # (auto-resume needs the node list every tick to find ingero's drained nodes).
        ready = any(
            v.straggler and v.consecutive_straggler_ticks >= self.config.min_intervals
            for v in tick.verdicts
        )
        idle_on = self.config.resume_idle.enabled
        if not ready and not self.config.auto_resume and not idle_on:
            nodes: list[NodeInfo] = []
            verdicts: Sequence[Verdict] = ()
            gone: list[str] = []
            mine: list[str] = []
        else:
            # Fleet may serve several clusters; this Slurm owns only its own nodes (another
            # cluster may well have a node of the same name).
            cluster = self._backend.cluster_name()
            verdicts = [v for v in tick.verdicts if v.cluster_id == cluster]
            gone = [node for c, node in expired if c == cluster]
            mine = [node for c, node in recovered if c == cluster]
            nodes = self._backend.nodes()
        decisions = decide(
            verdicts,
            nodes,
            self.config,
            self._memory,
            self._clock.monotonic(),
            gone,
            mine,
        )
        if idle_on and self.config.enabled:
            decisions += self._idle(nodes)
        if any(d.action == "drain" for d in decisions):
            # Read again right before acting: someone may have drained or annotated a node
            # since the first read, and their reason must not be overwritten.
            fresh = {n.name: n for n in self._backend.nodes()}
            decisions = [self._recheck(d, fresh.get(d.node)) for d in decisions]
        for decision in decisions:
            if decision.code == VERIFY:
                self._verify_and_resume(decision)
                continue
            if decision.action == "drain":
                self._backend.drain(decision.node, decision.reason)
                self._memory.last_action[decision.node] = self._clock.monotonic()
                log.warning("drained %s: %s", decision.node, decision.reason)
            elif decision.action == "resume":
                self._backend.resume(decision.node)
                self._memory.last_action[decision.node] = self._clock.monotonic()
                log.warning("resumed %s: %s", decision.node, decision.reason)
            elif decision.code in IDLE_REFUSALS:
                log.warning("not resuming idle %s: %s", decision.node, decision.reason)
            else:
                log.info("not draining %s: %s", decision.node, decision.reason)
            self._send(decision)

    def _idle(self, nodes: Sequence[NodeInfo]) -> list[Decision]:
        """This tick's look at the idle nodes ingero drained (their health, then the policy)."""
        cluster = self._backend.cluster_name()
        with self._cond:
            faults, self._faults = self._faults, []
        mono = self._clock.monotonic()
        for c, node in faults:
            if c == cluster:
                gpu_fault(self._memory, node)
        for info in nodes:
            if idle_drained(info):
                report = self._report(cluster, info.name) if self._report else None
                observe_health(self._memory, info.name, report, mono)
        decisions = idle_resumes(nodes, self.config, self._memory, mono, cluster)
        for d in decisions:
            if d.code != VERIFY and d.action == "skip" and d.code != "dry_run":
                self._count("refused", d.code)
        return decisions

    def _count(self, outcome: str, code: str) -> None:
        key = (outcome, code)
        self.idle_outcomes[key] = self.idle_outcomes.get(key, 0) + 1

    def verify(self, node: str) -> tuple[bool, dict[str, object]]:
        """ingero's own checks of an idle drained node, then the site's command: (passed,
        what was checked and found)."""
        mono = self._clock.monotonic()
        since = self._memory.clean_since.get(node)
        found = {n.name: n for n in self._backend.nodes()}.get(node)
        result: dict[str, object] = {
            "idle_drained_by_ingero": found is not None and idle_drained(found),
            "gpu_clean_s": round(mono - since, 1) if since is not None else None,
        }
        if not result["idle_drained_by_ingero"]:
            state = "gone from Slurm" if found is None else f"{found.state.upper()}"
            result["why"] = f"the node changed: {state} ({found.reason if found else ''})"
            return False, result
        command = self.config.resume_idle.command
        if not command:
            return True, result
        argv = [*shlex.split(command), node]
        env = {**os.environ, "INGERO_NODE": node, "INGERO_CLUSTER": self._backend.cluster_name()}
        timeout = float(self.config.resume_idle.timeout)
        started = time.monotonic()
        ran: dict[str, object] = {"command": argv}
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                env=env,
            )
            ran["exit"] = proc.returncode
            ran["output"] = (proc.stdout + proc.stderr).strip()[-OUTPUT_TAIL:]
        except subprocess.TimeoutExpired:
            ran["exit"] = None
            ran["output"] = f"no answer within {timeout:g}s"
        except OSError as exc:
            ran["exit"] = None
            ran["output"] = f"cannot run: {exc.strerror or exc}"
        ran["seconds"] = round(time.monotonic() - started, 3)
        result["site_check"] = ran
        return ran["exit"] == 0, result

    def _verify_and_resume(self, decision: Decision) -> None:
        node = decision.node
        passed, result = self.verify(node)
        if not passed:
            # It stays drained; its clean time starts again, so it is tried again after
            # resume_idle.clean_for at the soonest.
            self._memory.clean_since[node] = self._clock.monotonic()
            refusal = dataclasses.replace(
                decision,
                action="skip",
                code=VERIFY_FAILED,
                reason=f"verification failed: {_said(result)}",
            )
            log.warning("not resuming idle %s: %s", node, refusal.reason)
            self._count("refused", VERIFY_FAILED)
            self._send(refusal, {"verification": result})
            return
        self._backend.resume(node)
        self._memory.last_action[node] = self._clock.monotonic()
        resumed = dataclasses.replace(
            decision, action="resume", reason=f"{decision.reason}; verified: {_said(result)}"
        )
        log.warning("resumed idle %s: %s", node, resumed.reason)
        self._count("resumed", "verified")
        self._send(resumed, {"verification": result})

    @staticmethod
    def _recheck(decision: Decision, info: NodeInfo | None) -> Decision:
        if decision.action != "drain":
            return decision
        if info is not None and not (
            info.drained or info.held_reason or info.down or info.reboot_pending
        ):
            return decision
        why = "the node changed before ingero acted" + (
            f": {info.reason or info.state.upper()}" if info else ": gone from Slurm"
        )
        return dataclasses.replace(decision, action="skip", code="foreign_reason", reason=why)

    def _send(self, decision: Decision, more: dict[str, object] | None = None) -> None:
        extra: dict[str, object] = {"reason": decision.reason, "backend": self._backend.name}
        extra.update(more or {})
        if decision.action == "skip":
            extra["skip"] = decision.code
        if self.config.dry_run:
            extra["dry_run"] = True
        event = Event(
            type=_EVENT_TYPES[decision.action],
            node_id=decision.node,
            cluster_id=decision.cluster_id,
            timestamp=self._clock.now(),
            job_id=decision.job_id,
            rank=decision.rank,
            score=decision.score,
            threshold=decision.threshold,
            detection_mode="fleet",
            extra=extra,
        )
        try:
            self._emit(event)
        except Exception:  # the event exit point's trouble is not ours to die of
            log.exception("drain controller: cannot emit %s event", event.type)


def _said(result: dict[str, object]) -> str:
    """A verification's result in a few words (the event carries all of it)."""
    if "why" in result:
        return str(result["why"])
    words = [f"GPU health clean for {result.get('gpu_clean_s')}s"]
    ran = result.get("site_check")
    if isinstance(ran, dict):
        words.append(f"site check exit {ran.get('exit')}")
        if ran.get("exit") != 0 and ran.get("output"):
            words.append(str(ran["output"]).splitlines()[-1][:120])
    return ", ".join(words)


class _State(Protocol):
    def node_report(self, cluster_id: str, node_id: str) -> NodeReport | None: ...


class FleetDaemonHooks(Protocol):
    """What the Slurm parts' ``attach`` need of ``ingero.fleet.daemon.FleetDaemon`` (the
    drain controller here, the verdict writer too)."""

    def add_tick_listener(
        self, listener: Callable[[Any], None], name: str | None = None
    ) -> None: ...

    def add_event_sink(
        self, sink: Callable[[Sequence[Event]], None], name: str | None = None
    ) -> None: ...

    @property
    def events(self) -> _EventExit: ...

    @property
    def state(self) -> _State: ...


class _EventExit(Protocol):
    def submit(self, events: Iterable[Event], source: str) -> None: ...


def attach(daemon: FleetDaemonHooks, config: DrainConfig) -> DrainController:
    """Build the controller for ``ingero fleet`` (``drain.enabled``), listen to its ticks,
    publish decisions through Fleet's event exit point, and start the worker."""
    backend = make_backend(config.backend)
    controller = DrainController(
        config,
        backend,
        lambda event: daemon.events.submit([event], source="drain"),
        report=daemon.state.node_report,
    )
    daemon.add_tick_listener(controller.on_tick, "drain")
    if config.resume_idle.enabled:
        daemon.add_event_sink(controller.on_events, "drain-gpu-faults")
    controller.start()
    log.warning(
        "drain controller enabled (backend %s%s, max_fraction %g, min_intervals %d)",
        backend.name,
        ", dry run" if config.dry_run else "",
        config.max_fraction,
        config.min_intervals,
    )
    return controller
