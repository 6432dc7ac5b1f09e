"""A small real cluster on loopback: ``ingero fleet``, N ``ingero workload`` + ``ingero
fleet-push`` pairs and one ``ingero sink --print`` that every fleet-push sends events to."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from prometheus_client.parser import text_string_to_metric_families

from ingero.schema.events import Event
from tests.integration.echo.helpers import EchoProcess

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], T], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def ingero(*args: str) -> list[str]:
    return [sys.executable, "-m", "ingero.cli.main", *args]


@dataclass
class Procs:
    """Every process a test starts; ``stop_all`` ends each by its own PID."""

    running: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(
        self, argv: list[str], log: Path, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with log.open("ab") as out:
            proc = subprocess.Popen(
                argv,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
            )
        self.running.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> int:
        if proc.poll() is None:
            proc.send_signal(sig)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def stop_all(self) -> None:
        for proc in reversed(self.running):
            self.stop(proc)


@dataclass
class Cluster:
    tmp: Path
    procs: Procs
    interval: float
    nodes: int
    ports: dict[str, int] = field(default_factory=dict)
    fleet: subprocess.Popen[bytes] | None = None
    pushers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    workloads: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    echo_endpoint: str | None = None  # where Fleet forwards events, if anywhere
    job_id: str | None = None  # every node runs this Slurm job, its file in <node>.jobs
    fleet_config: dict[str, Any] = field(default_factory=dict)  # laid over Fleet's config
    push_config: dict[str, Any] = field(default_factory=dict)  # laid over each fleet-push's
    tracer_interval: float | None = None  # the workloads' write interval (None: half a push)
    cluster_id: str = "itest"  # every node's
    node_prefix: str = "node"  # node ids are this and two digits
    token_file: Path | None = None  # fleet-push's auth_token_file, where Fleet wants one

    @property
    def events_file(self) -> Path:
        return self.tmp / "sink.out"

    def node(self, i: int) -> str:
        return f"{self.node_prefix}{i:02d}"

    def start_fleet(self) -> None:
        # The first start binds port 0 and reads what Fleet bound from its ready file (a
        # port picked free can be taken before Fleet binds it: this host is shared); a
        # restart keeps them, as the nodes were told.
        first = not self.ports
        ports = dict.fromkeys(("otlp_grpc", "otlp_http", "api"), 0) if first else self.ports
        cfg: dict[str, Any] = {
            "listen": {k: f"127.0.0.1:{p}" for k, p in ports.items()},
            "push_interval": f"{self.interval}s",
            "threshold": {"ema_alpha": 0.5},
        }
        if self.echo_endpoint:
            cfg["echo"] = {"endpoint": self.echo_endpoint, "score_history_interval": "0s"}
        cfg.update(self.fleet_config)
        path = self.tmp / "fleet.yaml"
        path.write_text(yaml.safe_dump(cfg))
        ready = self.tmp / "fleet-ready.json"
        ready.unlink(missing_ok=True)
        self.fleet = self.procs.start(
            ingero("fleet", "--config", str(path), "--ready-file", str(ready)),
            self.tmp / "fleet.log",
        )
        fleet = self.fleet
        wait_for(lambda: ready.exists() or fleet.poll() is not None, 60, "fleet to start")
        assert fleet.poll() is None, (self.tmp / "fleet.log").read_text()
        if first:
            bound = json.loads(ready.read_text())
            self.ports = {k: int(str(bound[k]).rpartition(":")[2]) for k in ports}

    def start_sink(self) -> None:
        self.procs.start(
            ingero("sink", "--socket", str(self.tmp / "ev.sock"), "--metrics", "", "--print"),
            self.events_file,
        )
        wait_for(lambda: (self.tmp / "ev.sock").exists(), 30, "sink socket")

    def jobs_dir(self, i: int) -> Path:
        return self.tmp / f"{self.node(i)}.jobs"

    def start_workload(self, i: int, *extra: str) -> subprocess.Popen[bytes]:
        node = self.node(i)
        if self.job_id is not None:
            extra = (*extra, "--job-id", self.job_id, "--rank", str(i))
            extra = (*extra, "--jobs-dir", str(self.jobs_dir(i)))
        proc = self.procs.start(
            ingero(
                "workload",
                "--db",
                str(self.tmp / f"{node}.db"),
                "--interval",
                str(self.tracer_interval or self.interval / 2),
                "--noise",
                "0.02",
                "--seed",
                str(i),
                "--control",
                str(self.tmp / f"{node}.slow"),
                *extra,
            ),
            self.tmp / f"{node}.workload.log",
        )
        self.workloads[node] = proc
        return proc

    def host_proc(self) -> Path:
        """The /proc every node's fleet-push reads the host's CPU and memory from: written
        once and never changed (all memory available, a CPU that never moves: not measured).

        Every simulated node shares this host, so its readings are no node's own: memory
        that anything on the host takes or frees moves every node's score at once. Fleet's
        threshold moves with the scores, but with Fleet away the nodes judge themselves
        against its cached threshold, which does not: 15% of the host's memory taken then
        (3.6 GiB of 24) put healthy nodes below it, as false stragglers."""
        root = self.tmp / "host-proc"
        if not root.exists():
            root.mkdir()
            (root / "stat").write_text("cpu  1000 0 1000 100000 0 0 0 0 0 0\n")
            total = 64 * 2**20  # KiB
            (root / "meminfo").write_text(f"MemTotal: {total} kB\nMemAvailable: {total} kB\n")
        return root

    def push_config_for(
        self, i: int, transport: str = "http", endpoint: str | None = None
    ) -> dict[str, Any]:
        """Node ``i``'s fleet-push configuration (``start_push``)."""
        node = self.node(i)
        endpoint = endpoint or (
            f"http://127.0.0.1:{self.ports['otlp_http']}"
            if transport == "http"
            else f"127.0.0.1:{self.ports['otlp_grpc']}"
        )
        cfg: dict[str, Any] = {
            "transport": transport,
            "fleet_endpoint": endpoint,
            "api_endpoint": f"http://127.0.0.1:{self.ports['api']}",
            "push_interval": f"{self.interval}s",
            "node_id": node,
            "cluster_id": self.cluster_id,
            "node_db": str(self.tmp / f"{node}.db"),
            "state_dir": str(self.tmp / f"{node}.state"),
            # Not the host's /run/ingero/push, nor the host's Slurm cgroups.
            "health_state": str(self.tmp / f"{node}.health.json"),
            "gpu_idle": {"cgroup_root": str(self.tmp / "no-cgroups")},
            "detection": {
                "fleet_max_age": f"{3 * self.interval}s",
                "fleet_cached_max_age": f"{8 * self.interval}s",
                "local_cached_max_age": f"{16 * self.interval}s",
            },
            # Every simulated node shares this host's CPU: a busy neighbour (another test,
            # another node's process) must not look like this node's slowdown. Nor is the
            # host's memory read (host_proc).
            "score": {
                "weights": {"throughput": 0.6, "compute": 0.25, "memory": 0.15, "cpu": 0.0},
                "floor": 0.0,
            },
            "channels": {
                "journal_socket": str(self.tmp / "no-journald.sock"),
                "event_socket": str(self.tmp / "ev.sock"),
            },
        }
        if self.token_file is not None:
            cfg["auth_token_file"] = str(self.token_file)
        cfg.update(self.push_config)
        # Also where a test gives a score section of its own (unless it names a proc_root).
        cfg["score"] = {"proc_root": str(self.host_proc()), **cfg.get("score", {})}
        return cfg

    def start_push(
        self, i: int, transport: str = "http", endpoint: str | None = None
    ) -> subprocess.Popen[bytes]:
        """``endpoint``: where it pushes instead of Fleet (a recording proxy in front of it)."""
        node = self.node(i)
        cfg = self.push_config_for(i, transport, endpoint)
        path = self.tmp / f"{node}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        proc = self.procs.start(
            ingero("fleet-push", "--config", str(path), "--workload-type", "training"),
            self.tmp / f"{node}.push.log",
            # Not the host's /run/ingero/jobs: the node's own (empty without a job).
            {"INGERO_JOBS_DIR": str(self.jobs_dir(i) if self.job_id else self.tmp / "jobs")},
        )
        self.pushers[node] = proc
        return proc

    def start_job(self, *workload_args: str) -> list[str]:
        """Fleet, the sink, and on every node a workload (with ``workload_args``) and its
        fleet-push; returns the node ids once every node is in detection mode ``fleet``."""
        self.start_fleet()
        self.start_sink()
        for i in range(self.nodes):
            self.start_workload(i, *workload_args)
            self.start_push(i)
        nodes = [self.node(i) for i in range(self.nodes)]
        wait_for(
            lambda: all("fleet" in self.modes(n) for n in nodes), 120, "every node in fleet mode"
        )
        return nodes

    def slow_down(self, i: int, fraction: float, intervals: int | None = None) -> None:
        """Node ``i``'s work ``fraction`` slower from its next tracer interval: until told
        otherwise, or for exactly ``intervals`` of them (its workload counts them)."""
        until = "" if intervals is None else f" for {intervals}"
        (self.tmp / f"{self.node(i)}.slow").write_text(f"{fraction}{until}")

    def events(self) -> list[Event]:
        try:
            text = self.events_file.read_text()
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            if line.startswith("{"):
                out.append(Event.from_dict(json.loads(line)))
        return out

    def modes(self, node: str) -> list[str]:
        return [
            str(e.detection_mode)
            for e in self.events()
            if e.type == "detection_mode" and e.node_id == node
        ]

    def fleet_metric(self, name: str, **labels: str) -> float:
        """Sum of Fleet's /metrics samples ``name`` whose labels include ``labels``."""
        return fleet_metric(self.ports["api"], name, **labels)

    def threshold(self, **query: str) -> dict[str, Any]:
        """Fleet's threshold API answer for ``query`` (cluster_id, job_id, service, …)."""
        url = f"http://127.0.0.1:{self.ports['api']}/api/v1/threshold?" + "&".join(
            f"{k}={v}" for k, v in query.items()
        )
        with urllib.request.urlopen(url, timeout=10) as resp:
            body: dict[str, Any] = json.loads(resp.read())
        return body

    def push_log(self, node: str) -> str:
        return (self.tmp / f"{node}.push.log").read_text(errors="replace")


def fleet_metric(api_port: int, name: str, token: str | None = None, **labels: str) -> float:
    """Sum of the /metrics samples ``name`` of the Fleet whose API is on ``api_port``, whose
    labels include ``labels`` (``token``: Fleet's bearer token, where it requires one)."""
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://127.0.0.1:{api_port}/metrics", headers=auth)
    with urllib.request.urlopen(request, timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and set(labels.items()) <= set(sample.labels.items())
    )


@contextmanager
def with_echo(c: Cluster) -> Iterator[EchoProcess]:
    """A real ``ingero echo`` (no tokens) that the cluster's Fleet forwards its events to;
    after, every process the cluster started is stopped by its PID, then Echo."""
    (c.tmp / "echo-work").mkdir()
    echo = EchoProcess(c.tmp / "echo-work", tokens=False)
    try:
        echo.start()
        c.echo_endpoint = f"http://{echo.otlp_http}"
        yield echo
    finally:
        c.procs.stop_all()
        echo.stop()
