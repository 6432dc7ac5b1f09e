"""Orchestrates the demo: Fleet, an event sink, N workloads and N fleet-push agents.

Phases: start everything → warm-up (agents calibrate, Fleet reaches quorum) → inject a
slowdown on one node (through its workload's control file), optionally with a cause → wait
for that node's ``straggler_state`` event on the sink → with a cause, ``ingero explain`` on
that node's DB, whose top causal chain must name it → summary. Every child is stopped by PID
on exit.
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any, Final, Protocol

from ingero.demo.job import control_line, story
from ingero.demo.procs import Children
from ingero.demo.status import NodeStatus, NotifyListener
from ingero.runtime.signals import SignalEvent
from ingero.runtime.systemd import JOURNAL_SOCKET
from ingero.workload.generator import CAUSES, DEFAULT_SHAPE, SHAPE_NAMES
from ingero.workload.lockstep import LOCKSTEP_CAUSES

EXPLAIN_MIN_INTERVALS = 5  # push intervals between the injection and explain, at least
EXPLAIN_TIMEOUT_S = 60.0
# Push intervals after the detection before a lock-step job's story is asked of Echo.
STORY_INTERVALS = 6
# The causal chain (a rule of ingero/explain/rules.yaml) that names each injectable cause.
CAUSE_RULES: Final = MappingProxyType(
    {
        "cpu": "cpu_contention",
        "io": "dataloader_starvation",
        "alloc": "allocator_churn",
        "throttle": "gpu_throttling",
        "net": "network_retransmits",
        "recapture": "graph_recapture",
    }
)


@dataclass(frozen=True)
class DemoOptions:
    nodes: int = 8
    push_interval: float = 1.0
    # Seconds between the workloads' node DB writes (ingero trace --interval); None: a
    # quarter of the push interval, at least 0.05 s.
    tracer_interval: float | None = None
    straggler: str | None = None  # node name; random when None
    slowdown: float = 0.3
    warmup: float = 20.0  # seconds before the slowdown is injected (at least)
    duration: float = 40.0  # seconds after injection to wait for detection
    cluster_id: str = "demo"
    job_id: str = "demo-1"
    workdir: Path | None = None  # keep files here (else a temporary directory, removed)
    seed: int | None = None
    hold: bool = False  # after the result, keep everything running until stopped
    shape: str = DEFAULT_SHAPE  # the workloads' reference loop (ingero workload --shape)
    stall: str | None = None  # node whose rank stops working instead of slowing down
    cause: str | None = None  # what the slowdown comes from (CAUSES); None: a sleep
    # Each node its own process (inference replicas), not the ranks of one lock-step job.
    independent: bool = False

    @property
    def lockstep(self) -> bool:
        """The nodes are the ranks of one lock-step training job (the default); an
        inference server is a replica of its own."""
        return not self.independent and self.shape != "inference"

    def node_names(self) -> list[str]:
        return [f"node-{i:02d}" for i in range(1, self.nodes + 1)]

    def validate(self) -> None:
        if not 5 <= self.nodes <= 64:
            # Fleet's threshold needs a quorum of 5 active nodes (quorum.statistical_min).
            raise ValueError("--nodes must be between 5 and 64")
        if not 0.2 <= self.push_interval <= 30:
            raise ValueError("--push-interval must be between 0.2 and 30 seconds")
        if not 0 < self.slowdown < 1:
            raise ValueError("--slowdown must be in (0, 1)")
        if self.tracer_interval is not None and not 0.05 <= self.tracer_interval <= 30:
            raise ValueError("--tracer-interval must be between 0.05 and 30 seconds")
        if self.warmup < 0 or self.duration <= 0:
            raise ValueError("--warmup must be >= 0 and --duration > 0")
        for option, node in (("--straggler", self.straggler), ("--stall", self.stall)):
            if node is not None and node not in self.node_names():
                raise ValueError(
                    f"{option} must be one of node-01 … node-{self.nodes:02d}, got {node!r}"
                )
        if self.stall is not None and self.straggler not in (None, self.stall):
            raise ValueError("--stall names the straggler: leave --straggler out or make it equal")
        causes = LOCKSTEP_CAUSES if self.lockstep else CAUSES
        if self.cause is not None and self.cause not in causes:
            raise ValueError(f"--cause must be one of {', '.join(causes)}, got {self.cause!r}")
        if self.cause is not None and self.stall is not None:
            raise ValueError("--cause slows a node down; a --stall has no cause to explain")
        if self.shape not in SHAPE_NAMES:
            raise ValueError(f"--shape must be one of {', '.join(SHAPE_NAMES)}, got {self.shape!r}")


@dataclass
class GroupView:
    threshold: float | None = None
    median: float | None = None
    quorum_met: bool = False
    active_nodes: int = 0
    panic: bool = False


@dataclass
class DemoState:
    """Everything the view shows; mutated only by the runner's thread."""

    options: DemoOptions
    straggler: str
    phase: str = "starting"  # starting | warm-up | injected | detected | done
    started_at: float = 0.0
    injected_at: float | None = None
    detected_at: float | None = None
    nodes: dict[str, NodeStatus] = field(default_factory=dict)
    group: GroupView = field(default_factory=GroupView)
    events: Counter[str] = field(default_factory=Counter)
    flagged: dict[str, float] = field(default_factory=dict)  # node -> first straggler event time
    log: list[str] = field(default_factory=list)
    api_url: str = ""
    sink_metrics_url: str = ""
    echo_url: str = ""  # the lock-step job's Echo (Fleet forwards its events there)
    story: list[str] = field(default_factory=list)  # what Echo said of the job
    journald: bool = False
    workdir: Path = Path()

    def note(self, message: str) -> None:
        self.log.append(f"[{time.time() - self.started_at:6.1f}s] {message}")


@dataclass(frozen=True)
class ExplainOutcome:
    """What ``ingero explain`` said of the injected node: its top causal chain."""

    cause: str
    command: tuple[str, ...]  # the command line, as a person would run it again
    chain: dict[str, Any] | None  # the top chain as ``ingero explain --json`` gives it
    error: str | None = None  # why explain gave no answer

    @property
    def expected(self) -> str:
        return CAUSE_RULES[self.cause]

    @property
    def named(self) -> bool:
        return self.chain is not None and self.chain.get("rule") == self.expected


@dataclass(frozen=True)
class DemoResult:
    ok: bool
    reason: str
    straggler: str
    detection_s: float | None
    detection_intervals: float | None
    false_positives: tuple[str, ...]
    events: dict[str, int]
    explain: ExplainOutcome | None = None


class View(Protocol):
    def update(self, state: DemoState) -> None: ...


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_file(
    path: Path, timeout: float, children: Children, stop: threading.Event
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not stop.is_set():
        if path.exists():
            data: dict[str, Any] = json.loads(path.read_text())
            return data
        for child in children.exited():
            raise RuntimeError(f"{child.name} exited early: {child.tail(3)}")
        time.sleep(0.05)
    if stop.is_set():
        raise RuntimeError("interrupted")
    raise RuntimeError(f"Fleet did not become ready within {timeout:g} s")


def _read_events(stream: IO[bytes], out: queue.Queue[dict[str, Any]]) -> None:
    for line in stream:
        with contextlib.suppress(ValueError):
            event = json.loads(line)
            if isinstance(event, dict):
                out.put(event)


class Demo:
    def __init__(
        self,
        options: DemoOptions,
        view: View,
        on_result: Callable[[DemoResult], None] | None = None,
    ) -> None:
        options.validate()
        self.options = options
        self.view = view
        self.on_result = on_result
        rng = random.Random(options.seed)
        straggler = options.stall or options.straggler or rng.choice(options.node_names())
        self.state = DemoState(options=options, straggler=straggler)
        self.stop = SignalEvent()  # set by the command's SIGINT/SIGTERM handler

    def run(self) -> DemoResult:
        opts = self.options
        owned_tmp = opts.workdir is None
        workdir = Path(tempfile.mkdtemp(prefix="ingero-demo-")) if owned_tmp else opts.workdir
        assert workdir is not None
        workdir.mkdir(parents=True, exist_ok=True)
        self.state.workdir = workdir
        children = Children(workdir)
        listener: NotifyListener | None = None
        try:
            listener = NotifyListener(workdir, opts.node_names())
            try:
                result = self._run(workdir, children, listener)
            except RuntimeError as exc:
                result = self._result(False, str(exc))
            if self.on_result is not None:
                self.on_result(result)
            if opts.hold and not self.stop.is_set():
                self.stop.wait()
            return result
        finally:
            children.stop_all()
            if listener is not None:
                listener.close()
            if owned_tmp:
                shutil.rmtree(workdir, ignore_errors=True)

    def _run(self, workdir: Path, children: Children, listener: NotifyListener) -> DemoResult:
        opts, st = self.options, self.state
        st.started_at = time.time()
        interval = f"{opts.push_interval:g}s"
        ready_file = workdir / "fleet-ready.json"
        fleet_config: list[str] = []
        if opts.lockstep:
            # Fleet forwards its NCCL events to a real Echo, which the summary asks.
            echo = self._start_echo(workdir, children)
            config = workdir / "fleet.yaml"
            config.write_text(json.dumps({"echo": {"endpoint": echo}}))
            fleet_config = ["--config", str(config)]
        children.start(
            "fleet",
            [
                "fleet",
                *fleet_config,
                "--otlp-grpc", "127.0.0.1:0",
                "--otlp-http", "127.0.0.1:0",
                "--api", "127.0.0.1:0",
                "--push-interval", interval,
                "--ready-file", str(ready_file),
                "--log-level", "warning",
            ],
            env={"NOTIFY_SOCKET": ""},
        )  # fmt: skip
        st.note("starting Fleet")
        self.view.update(st)
        bound = _wait_file(ready_file, 60.0, children, self.stop)
        st.api_url = f"http://{bound['api']}"
        otlp_http = f"http://{bound['otlp_http']}"
        st.note(f"Fleet up: OTLP/HTTP {otlp_http}, API {st.api_url}")

        event_socket = workdir / "events.sock"
        sink_port = _free_port()
        st.sink_metrics_url = f"http://127.0.0.1:{sink_port}/metrics"
        sink = children.start(
            "sink",
            [
                "sink",
                "--socket",
                str(event_socket),
                "--metrics",
                f"127.0.0.1:{sink_port}",
                "--print",
            ],
            env={"NOTIFY_SOCKET": ""},
            stdout=subprocess.PIPE,
        )
        events: queue.Queue[dict[str, Any]] = queue.Queue()
        assert sink.process.stdout is not None
        threading.Thread(
            target=_read_events, args=(sink.process.stdout, events), daemon=True
        ).start()

        st.journald = Path(JOURNAL_SOCKET).is_socket()
        workload_interval = opts.tracer_interval or max(0.05, opts.push_interval / 4)
        if opts.lockstep:
            # One process holds the job's ranks: the slowest rank paces every one of them.
            (workdir / "job-control").write_text("0\n")
            children.start(
                "workload-job",
                [
                    "workload",
                    "--job-ranks", str(opts.nodes),
                    "--db", str(workdir / "{node}" / "ingero.db"),
                    "--interval", f"{workload_interval:g}",
                    "--control", str(workdir / "job-control"),
                    "--shape", opts.shape,
                    "--proc-dir", str(workdir / "{node}" / "proc"),
                    "--job-id", opts.job_id,
                    *(["--seed", str(opts.seed)] if opts.seed is not None else []),
                ],
                env={"NOTIFY_SOCKET": ""},
            )  # fmt: skip
        for rank, node in enumerate(opts.node_names()):
            node_dir = workdir / node
            node_dir.mkdir(exist_ok=True)
            (node_dir / "slowdown").write_text("0\n")
            if not opts.lockstep:
                children.start(
                    f"workload-{node}",
                    [
                        "workload",
                        "--db", str(node_dir / "ingero.db"),
                        "--interval", f"{workload_interval:g}",
                        "--control", str(node_dir / "slowdown"),
                        "--shape", opts.shape,
                        "--proc-dir", str(node_dir / "proc"),
                        "--job-id", opts.job_id,
                        "--rank", str(rank),
                        "--seed", str(rank if opts.seed is None else opts.seed * 1000 + rank),
                    ],
                    env={"NOTIFY_SOCKET": ""},
                )  # fmt: skip
            config = node_dir / "fleet-push.yaml"
            config.write_text(
                json.dumps(
                    {
                        "channels": {"journald": st.journald},
                        # Every simulated node has its own synthetic host: the real one is
                        # shared by all of them, so its CPU and memory would tell them apart
                        # by nothing but sampling noise. Calibrate for 5 intervals, not 6.
                        "score": {"warmup_samples": 5, "proc_root": str(node_dir / "proc")},
                        # The inference shape's servers are in that synthetic /proc.
                        "inference": {"proc_root": str(node_dir / "proc")},
                        # Its own files, not the host's: no /run/ingero/push, and no GPUs
                        # of the host's Slurm jobs.
                        "health_state": str(node_dir / "health.json"),
                        "gpu_idle": {"enabled": False},
                    }
                )
            )
            children.start(
                f"fleet-push-{node}",
                [
                    "fleet-push",
                    "--config", str(config),
                    "--endpoint", otlp_http,
                    "--api-endpoint", st.api_url,
                    "--node-id", node,
                    "--cluster-id", opts.cluster_id,
                    "--node-db", str(node_dir / "ingero.db"),
                    "--state-dir", str(node_dir / "state"),
                    "--event-socket", str(event_socket),
                    "--push-interval", interval,
                    "--job-id", opts.job_id,
                    "--rank", str(rank),
                    "--world-size", str(opts.nodes),
                ],
                env={"NOTIFY_SOCKET": str(listener.paths[node])},
            )  # fmt: skip
        st.note(
            f"started a lock-step job of {opts.nodes} ranks and {opts.nodes} fleet-push agents"
            if opts.lockstep
            else f"started {opts.nodes} workloads and {opts.nodes} fleet-push agents"
        )
        st.phase = "warm-up"
        return self._loop(workdir, children, listener, events)

    def _loop(
        self,
        workdir: Path,
        children: Children,
        listener: NotifyListener,
        events: queue.Queue[dict[str, Any]],
    ) -> DemoResult:
        opts, st = self.options, self.state
        warmup_until = time.time() + opts.warmup
        # Quorum may take longer than --warmup on a loaded host; give it a bounded extra while.
        warmup_limit = warmup_until + 60.0 + 10 * opts.push_interval
        next_poll = 0.0
        end_at: float | None = None
        while not self.stop.is_set():
            st.nodes.update(listener.poll(min(0.25, opts.push_interval / 2)))
            now = time.time()
            if now >= next_poll:
                next_poll = now + opts.push_interval / 2
                self._poll_fleet()
            self._drain_events(events)
            dead = children.exited()
            if dead:
                child = dead[0]
                return self._result(False, f"{child.name} exited: {child.tail(2) or 'no output'}")
            if st.phase == "warm-up" and now >= warmup_until:
                if self._ready_to_inject():
                    self._inject(workdir)
                elif now >= warmup_limit:
                    return self._result(
                        False,
                        f"Fleet never reached quorum ({st.group.active_nodes} active nodes)",
                    )
            elif st.phase == "injected":
                if st.detected_at is not None:
                    st.phase = "detected"
                    end_at = now + 2 * opts.push_interval  # let the table show it
                    if opts.lockstep:
                        # Fleet's lag episode opens on a window that still holds collectives
                        # from before; it says the lag of now a window later (Echo's story).
                        end_at = now + STORY_INTERVALS * opts.push_interval
                    if opts.cause in CAUSE_RULES and st.injected_at is not None:
                        # explain compares the time since the injection with as long before
                        # it: give that window a few push intervals' worth of rows.
                        end_at = max(
                            end_at, st.injected_at + EXPLAIN_MIN_INTERVALS * opts.push_interval
                        )
                elif st.injected_at is not None and now - st.injected_at > opts.duration:
                    # Undetected, explain may still say what the node went through.
                    return self._result(
                        False,
                        f"{st.straggler} was not detected within {opts.duration:g} s",
                        self._explain(workdir) if opts.cause is not None else None,
                    )
            elif st.phase == "detected" and end_at is not None and now >= end_at:
                st.phase = "done"
                if st.echo_url:
                    st.story = story(
                        st.echo_url, opts.cluster_id, opts.job_id, opts.nodes,
                        opts.stall is not None,
                    )  # fmt: skip
                self.view.update(st)
                if opts.cause not in CAUSE_RULES:  # none, or one no chain explains ('gpu')
                    return self._result(True, "straggler detected")
                outcome = self._explain(workdir)
                if outcome.named:
                    return self._result(True, "straggler detected and explained", outcome)
                top = outcome.chain["name"] if outcome.chain else "no causal chain"
                return self._result(
                    False,
                    outcome.error
                    or f"explain on {st.straggler} named {top} first, not {outcome.expected}",
                    outcome,
                )
            self.view.update(st)
        return self._result(False, "interrupted")

    def _ready_to_inject(self) -> bool:
        st = self.state
        active = [n for n, s in st.nodes.items() if s.state == "active"]
        return (
            st.group.quorum_met
            and st.group.threshold is not None
            and len(active) == self.options.nodes
            and all(s.mode == "fleet" for s in st.nodes.values())
        )

    def _inject(self, workdir: Path) -> None:
        st, opts = self.state, self.options
        control = workdir / st.straggler / "slowdown"
        # Noted before the write: the workload may read the file at once, and its first
        # slowed interval must end after this time, or explain's "before" window (up to
        # this time) would hold it.
        st.injected_at = time.time()
        if opts.lockstep:
            rank = opts.node_names().index(st.straggler)
            (workdir / "job-control").write_text(
                control_line(rank, opts.slowdown, opts.cause, opts.stall is not None)
            )
            what = (
                f"a hang of rank {rank} (before its next collective)"
                if opts.stall is not None
                else f"a {opts.slowdown:.0%} slowdown"
                + (f" from {opts.cause}" if opts.cause else "")
                + f" of rank {rank}"
            )
        elif opts.stall is not None:
            # The rank stops working; its process, GPU memory and job go on.
            control.write_text("stall\n")
            what = "a stall"
        elif opts.cause is not None:
            control.write_text(f"{opts.slowdown:g} {opts.cause}\n")
            what = f"a {opts.slowdown:.0%} slowdown from {opts.cause}"
        else:
            control.write_text(f"{opts.slowdown:g}\n")
            what = f"a {opts.slowdown:.0%} slowdown"
        st.phase = "injected"
        st.note(f"injected {what} on {st.straggler}")

    def _start_echo(self, workdir: Path, children: Children) -> str:
        """A real ``ingero echo`` on loopback for Fleet's events; its OTLP/HTTP endpoint. The
        demo goes on without its story when it does not come up."""
        st = self.state
        api, otlp_http, otlp_grpc = (f"127.0.0.1:{_free_port()}" for _ in range(3))
        children.start(
            "echo",
            ["echo", "--db", str(workdir / "echo.db"), "--api", api, "--otlp-http", otlp_http,
             "--otlp-grpc", otlp_grpc, "--log-level", "warning"],
            env={"NOTIFY_SOCKET": ""},
        )  # fmt: skip
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline and not self.stop.is_set():
            try:
                with urllib.request.urlopen(f"http://{api}/readyz", timeout=1.0) as response:
                    if response.status == 200:
                        st.echo_url = f"http://{api}"
                        st.note(f"Echo up: API {st.echo_url}")
                        break
            except (OSError, urllib.error.URLError):
                time.sleep(0.1)
        else:
            st.note("Echo did not come up: no story at the end")
        return f"http://{otlp_http}"

    def _explain(self, workdir: Path) -> ExplainOutcome:
        """``ingero explain --json`` on the injected node's DB: the time since the injection
        against as long before it."""
        st, opts = self.state, self.options
        assert opts.cause is not None and st.injected_at is not None
        end = time.time()
        args = (
            "explain",
            "--db", str(workdir / st.straggler / "ingero.db"),
            "--until", f"{end:.3f}",
            "--window", f"{end - st.injected_at:.2f}s",
        )  # fmt: skip
        shown = ("ingero", *args)
        try:
            done = subprocess.run(
                [sys.executable, "-m", "ingero.cli.main", *args, "--json"],
                capture_output=True,
                text=True,
                timeout=EXPLAIN_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return ExplainOutcome(
                opts.cause, shown, None, f"explain gave no answer in {EXPLAIN_TIMEOUT_S:g} s"
            )
        try:
            report = json.loads(done.stdout) if done.returncode == 0 else None
        except ValueError:
            report = None
        if not isinstance(report, dict):
            why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
            return ExplainOutcome(opts.cause, shown, None, f"explain failed: {why}")
        chains = report.get("chains") or []
        top = chains[0] if chains and isinstance(chains[0], dict) else None
        st.note(
            f"explain on {st.straggler}: "
            + (f"{top.get('name')} ({top.get('level')} confidence) first" if top else "no chain")
        )
        return ExplainOutcome(opts.cause, shown, top)

    def _poll_fleet(self) -> None:
        st, opts = self.state, self.options
        url = f"{st.api_url}/api/v1/threshold?cluster_id={opts.cluster_id}&job_id={opts.job_id}"
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                data = json.loads(response.read())
        except (OSError, ValueError, urllib.error.URLError):
            return
        st.group = GroupView(
            threshold=data.get("threshold"),
            median=data.get("median"),
            quorum_met=bool(data.get("quorum_met")),
            active_nodes=int(data.get("active_nodes") or 0),
            panic=bool(data.get("panic")),
        )

    def _drain_events(self, events: queue.Queue[dict[str, Any]]) -> None:
        st = self.state
        while True:
            try:
                event = events.get_nowait()
            except queue.Empty:
                return
            kind = str(event.get("type"))
            node = str(event.get("node_id"))
            st.events[kind] += 1
            if kind == "straggler_state" and node not in st.flagged:
                st.flagged[node] = float(event.get("timestamp") or time.time())
                score, threshold = event.get("score"), event.get("threshold")
                st.note(
                    f"straggler_state {node}: score {score:.3f} < threshold {threshold:.3f} "
                    f"({event.get('detection_mode')}, dominant {event.get('dominant_signal')})"
                    if isinstance(score, float) and isinstance(threshold, float)
                    else f"straggler_state {node}"
                )
                if node == st.straggler and st.injected_at is not None:
                    st.detected_at = st.flagged[node]
            elif kind == "straggler_resolved":
                st.note(f"straggler_resolved {node}")

    def _result(self, ok: bool, reason: str, explain: ExplainOutcome | None = None) -> DemoResult:
        st, opts = self.state, self.options
        false_positives = tuple(sorted(n for n in st.flagged if n != st.straggler))
        if ok and false_positives:
            ok, reason = False, f"healthy nodes were flagged too: {', '.join(false_positives)}"
        detection_s = (
            st.detected_at - st.injected_at
            if st.detected_at is not None and st.injected_at is not None
            else None
        )
        return DemoResult(
            ok=ok,
            reason=reason,
            straggler=st.straggler,
            detection_s=detection_s,
            detection_intervals=(
                detection_s / opts.push_interval if detection_s is not None else None
            ),
            false_positives=false_positives,
            events=dict(st.events),
            explain=explain,
        )
