"""GPUs held and unused, on real processes: a Slurm job file holding GPUs 0 and 1, a node DB
written by the node DB writer as ``ingero trace`` writes it (host intervals, kernel launches
by pid, NVML's rows through ``reading_rows``): the job's trainer works on GPU 0, nobody is on
GPU 1. The real ``ingero fleet-push`` raises ``gpu_idle``; the real ``ingero fleet`` counts it
on its promtool-clean /metrics and forwards it to the real ``ingero echo``, whose
``idle_gpus`` question answers it over HTTP; GPU 1 used ends the episode everywhere."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ingero.collectors.nvml import GpuProcess, GpuReading, NvmlReading
from ingero.nodedb.writer import Batch, NodeDbWriter
from ingero.slurm.jobfile import JobInfo, write_job
from ingero.trace.gpusampler import reading_rows
from tests.integration.echo.helpers import EchoProcess, http
from tests.integration.fleet.test_prometheus import promtool_check
from tests.integration.push.cluster import Cluster, Procs, wait_for, with_echo

pytestmark = pytest.mark.integration

INTERVAL = 0.5
TRAINER = 4242
LABELS = {"cluster_id": "itest", "partition": "gpu", "user": "alice"}


class Tracer:
    """Writes one tracer interval every ``step`` s through the node DB writer: GPU 0 busy
    with the trainer's launches; GPU 1 idle, no process, until ``use_gpu1`` is set."""

    def __init__(self, db: Path, step: float) -> None:
        self.writer = NodeDbWriter(db)
        self.step = step
        self.use_gpu1 = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last = time.time()
        while not self.stop.wait(self.step):
            now = time.time()
            gpu1 = (0.9, (GpuProcess(TRAINER),)) if self.use_gpu1.is_set() else (0.0, ())
            reading = NvmlReading(
                (
                    GpuReading(0, utilization=0.95, processes=(GpuProcess(TRAINER),)),
                    GpuReading(1, utilization=gpu1[0], processes=gpu1[1]),
                )
            )
            rows = reading_rows(reading, last, now)
            self.writer.submit(
                Batch(
                    intervals=[{"ts_start": last, "ts_end": now, "op": "cuLaunchKernel",
                                "count": 500, "total_ns": 0, "pid": TRAINER, "source": "cuda_driver"}],
                    host_intervals=[{"ts_start": last, "ts_end": now}],
                    gpu_intervals=rows.intervals,
                    gpu_processes=rows.processes,
                )
            )  # fmt: skip
            last = now

    def __enter__(self) -> Tracer:
        self.writer.start()
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(10)
        self.writer.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Cluster, EchoProcess]]:
    c = Cluster(tmp_path, Procs(), INTERVAL, 1, job_id="77")
    (tmp_path / "cgroup").mkdir()  # no Slurm cgroups here: the job file alone says
    c.push_config = {
        "gpu_idle": {"idle_after": "2s", "cgroup_root": str(tmp_path / "cgroup")},
        "health_state": str(tmp_path / "health.json"),
    }
    with with_echo(c) as echo:
        yield c, echo


def idle_events(c: Cluster) -> list[Any]:
    return [e for e in c.events() if e.type == "gpu_idle"]


def metrics(c: Cluster) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{c.ports['api']}/metrics", timeout=10) as r:
        body: bytes = r.read()
    return body


def episodes(echo: EchoProcess) -> list[dict[str, Any]]:
    status, body = http("GET", echo.url + "/api/v1/idle_gpus?cluster_id=itest&last=1h")
    assert status == 200, body
    return list(body["episodes"])


def test_an_idle_gpu_from_node_db_to_fleet_and_echo(cluster: tuple[Cluster, EchoProcess]) -> None:
    c, echo = cluster
    db = c.tmp / "node00.db"
    job = JobInfo("77", "itest", "node00", 0, 1, ["node00"], "alice", 1000, "gpu", ["0", "1"],
                  time.time())  # fmt: skip
    write_job(c.jobs_dir(0), job)
    c.start_fleet()
    c.start_sink()
    with Tracer(db, INTERVAL / 2) as tracer:
        c.start_push(0)
        (start,) = wait_for(lambda: idle_events(c), 60, "gpu_idle from fleet-push")
        assert start.job_id == "77" and start.node_id == "node00"
        assert {k: start.extra[k] for k in ("state", "gpus", "user", "partition", "reason")} == {
            "state": "start", "gpus": [1], "user": "alice", "partition": "gpu",
            "reason": "no_process",
        }  # fmt: skip
        assert start.extra["since"] <= start.timestamp - 2.0
        state = json.loads((c.tmp / "health.json").read_text())
        assert [g["event_id"] for g in state["gpu_idle"]] == [start.event_id]

        wait_for(
            lambda: c.fleet_metric("ingero_fleet_idle_gpus", **LABELS) == 1, 30, "Fleet's gauge"
        )
        assert c.fleet_metric("ingero_fleet_idle_gpu_seconds", **LABELS) >= 2.0
        assert promtool_check(metrics(c)) == ""
        (stored,) = wait_for(lambda: episodes(echo), 30, "the episode in Echo")
        assert (stored["event_id"], stored["open"], stored["gpus"]) == (start.event_id, True, [1])

        tracer.use_gpu1.set()
        end = wait_for(lambda: idle_events(c)[1:], 30, "the episode's end")[0]
    assert end.event_id == start.event_id
    assert end.extra["state"] == "end" and end.extra["end"] == "used"
    assert end.extra["idle_s"] >= 2.0
    wait_for(lambda: c.fleet_metric("ingero_fleet_idle_gpus", **LABELS) == 0, 30, "the gauge at 0")
    seconds = c.fleet_metric("ingero_fleet_idle_gpu_seconds", **LABELS)
    assert seconds == pytest.approx(end.extra["idle_s"])
    (ended,) = wait_for(lambda: [e for e in episodes(echo) if not e["open"]], 30, "the end in Echo")
    assert ended["idle_s"] == end.extra["idle_s"] and ended["end_reason"] == "used"
