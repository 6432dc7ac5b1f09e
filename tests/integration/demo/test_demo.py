"""``ingero demo`` end to end: real Fleet, sink, workloads and fleet-push agents on loopback."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def demo(*args: str, workdir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ingero.cli.main",
            "demo",
            "--no-live",
            "--workdir",
            str(workdir),
            *args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def processes_under(workdir: Path, demo_pid: int) -> list[int]:
    """PIDs of live processes, other than the demo, whose command line names its directory."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), demo_pid):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
            state = (entry / "stat").read_text().split(")")[-1].split()[0]
        except OSError:
            continue
        if str(workdir) in cmdline and state != "Z":
            pids.append(int(entry.name))
    return pids


def finish(proc: subprocess.Popen[str], timeout: float) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    return out


def test_demo_detects_exactly_the_injected_node(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = demo(
        "--nodes", "5", "--push-interval", "1", "--warmup", "6", "--duration", "30",
        "--straggler", "node-04", "--slowdown", "0.3", workdir=workdir,
    )  # fmt: skip
    out = finish(proc, timeout=150)
    assert proc.returncode == 0, out
    assert "straggler injected: node-04 (30% slower)" in out
    match = re.search(r"detected: (node-\d+) after ([\d.]+) s = ([\d.]+) push intervals", out)
    assert match is not None, out
    assert match.group(1) == "node-04"
    flagged = set(re.findall(r"straggler_state (node-\d+)", out))
    assert flagged == {"node-04"}, out
    assert "false positives" not in out
    assert "straggler_state=1" in out
    assert re.search(r"Fleet /metrics: http://127\.0\.0\.1:\d+/metrics", out)
    # The straggler's own fleet-push logged the event; the others did not.
    for node in ("node-01", "node-02", "node-03", "node-05"):
        assert "straggler_state" not in (workdir / f"fleet-push-{node}.log").read_text()
    assert "straggler_state" in (workdir / "fleet-push-node-04.log").read_text()
    assert processes_under(workdir, proc.pid) == []


def test_demo_fails_with_a_reason_when_nothing_is_detected(tmp_path: Path) -> None:
    # A 1% slowdown is inside the group's noise margin: no detection, exit 1, one-line reason.
    workdir = tmp_path / "demo"
    proc = demo(
        "--nodes", "5", "--warmup", "6", "--duration", "4", "--slowdown", "0.01",
        "--straggler", "node-02", workdir=workdir,
    )  # fmt: skip
    out = finish(proc, timeout=150)
    assert proc.returncode == 1, out
    assert "ingero demo: node-02 was not detected within 4 s" in out
    assert "detected: no" in out
    assert processes_under(workdir, proc.pid) == []


def test_ctrl_c_stops_every_child(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = demo("--nodes", "5", "--warmup", "60", workdir=workdir)
    try:
        deadline = time.monotonic() + 120
        # Fleet, Echo, the sink, the lock-step job's workload and the 5 agents.
        while len(processes_under(workdir, proc.pid)) < 5 + 4:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, (
                f"children did not start: {processes_under(workdir, proc.pid)} {workdir}"
            )
            time.sleep(0.2)
        children = processes_under(workdir, proc.pid)
        os.kill(proc.pid, signal.SIGINT)
        out = finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
    assert proc.returncode == 1, out
    assert "ingero demo: interrupted" in out
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert alive == [] or all(
        Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z" for pid in alive
    )
    assert processes_under(workdir, proc.pid) == []


def test_hold_keeps_the_printed_urls_serving_until_ctrl_c(tmp_path: Path) -> None:
    workdir = tmp_path / "demo"
    proc = demo(
        "--nodes", "5", "--warmup", "5", "--straggler", "node-01", "--hold", workdir=workdir
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while not any("sink /metrics" in line for line in lines):
            assert time.monotonic() < deadline, "".join(lines)
            line = proc.stdout.readline()
            assert line, "".join(lines)
            lines.append(line)
        text = "".join(lines)
        fleet = re.search(r"Fleet /metrics: (\S+)", text)
        sink = re.search(r"sink /metrics: (\S+)", text)
        assert fleet is not None and sink is not None, text
        with urllib.request.urlopen(fleet.group(1), timeout=5) as response:
            assert b"ingero_fleet" in response.read()
        with urllib.request.urlopen(sink.group(1), timeout=5) as response:
            body = response.read().decode()
        assert 'ingero_sink_events_total{type="straggler_state"} 1.0' in body, body
        assert proc.poll() is None  # still holding
        os.kill(proc.pid, signal.SIGINT)
        finish(proc, timeout=60)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0
    assert processes_under(workdir, proc.pid) == []


# cause -> the chain explain must put first, and what its headline must show of the cause
CAUSE_CHAINS = {
    "cpu": ("CPU contention", "off-CPU switches of the threads of pid"),
    "io": ("dataloader starvation", "block I/O p99 12 ms"),
    "alloc": ("allocator churn", "cuMemAlloc calls"),
    "throttle": ("GPU throttling", "throttle_reasons=0x20 (sw_thermal_slowdown)"),
    "net": ("network retransmits", "TCP retransmits (was 0)"),
}


@pytest.mark.parametrize("cause", list(CAUSE_CHAINS))
def test_demo_cause_ends_with_its_chain_first(tmp_path: Path, cause: str) -> None:
    from ingero.demo.runner import CAUSE_RULES

    workdir = tmp_path / "demo"
    node = f"node-0{list(CAUSE_CHAINS).index(cause) + 1}"
    proc = demo(
        "--nodes", "5", "--warmup", "6", "--duration", "30", "--straggler", node,
        "--cause", cause, workdir=workdir,
    )  # fmt: skip
    out = finish(proc, timeout=180)
    assert proc.returncode == 0, out
    assert f"straggler injected: {node} (30% slower, cause {cause})" in out
    assert re.search(rf"detected: {node} after [\d.]+ s", out), out
    name, evidence = CAUSE_CHAINS[cause]
    command = re.search(r"^explain: (ingero explain --db (\S+) --until [\d.]+ --window [\d.]+s)$",
                        out, re.MULTILINE)  # fmt: skip
    assert command is not None, out
    assert command.group(2) == str(workdir / node / "ingero.db")
    top = re.search(r"^  1\. (.+?) \((high|medium) confidence, [\d.]+\): (.+)$", out, re.MULTILINE)
    assert top is not None, out
    assert top.group(1) == name
    headline = top.group(3)
    assert headline.startswith("kernel-launch rate down") and headline.endswith(f"← {name}")
    assert evidence in headline
    assert f"explain names the injected cause ({cause}: {CAUSE_RULES[cause]}): yes" in out
    # The printed command gives the same answer when a person runs it.
    again = subprocess.run(
        [sys.executable, "-m", "ingero.cli.main", *command.group(1).split()[1:]],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert f"1. {name} (" in again.stdout
    assert processes_under(workdir, proc.pid) == []
