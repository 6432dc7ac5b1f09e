"""Fleet's OTLP/HTTP push path in one run: the no-op server, Fleet at HEAD with every
feature on, and the previous release, side by side.

Run: ``.venv/bin/python -m bench.fleet_compare`` (``--rounds 3 --duration 5`` are the
defaults; ``--release REV`` names the previous release, ``--release ''`` leaves it out;
``--decode N`` prints only the in-process cost of each push shape's decode, N nodes).

The servers run at once and take the same load in turn, interleaved round by round (the
order rotates), so a machine shared with other work shifts them all alike:

``noop``    Fleet's own asyncio HTTP server (``ingero.fleet.httpserver``) with a handler
            that answers an empty 200: the transport alone, the ceiling of the push path;
``fleet``   ``ingero fleet`` from this tree with every feature on: a bearer token on each
            request, the per-token rate limit (set high enough never to refuse, so its
            arithmetic runs on every push), the audit log, and pushes that carry what
            fleet-push sends (``service.*``, signals, the raw peer rates with their unit
            gauges, one NCCL communicator with 16 sampled collectives, packed, the clock
            offset and whether the push held; ``--shape full-arrays``: the calls as the
            arrays of older nodes);
``parse``   with ``--floors``: the no-op server that also parses each body (upb), reading
            nothing of it;
``read``    with ``--floors``: the no-op server that parses each body and decodes it as
            Fleet's receiver does (``decode_health``), storing nothing, answering no
            threshold: the least any server on this stack that reads the push pays;
``release`` ``ingero fleet`` of ``--release`` (``git archive`` of this repository into a
            temporary directory, run with this interpreter), with its bearer token and the
            same pushes (what it does not know it ignores).

Every request is one agent's push (``--agents`` distinct node ids, 64 per Slurm job) over
keep-alive connections. The load generator is ``wrk`` with a Lua script cycling through the
prepared requests when it is on PATH (one thread: on a 2-core machine the other core is the
server's), else this module's Python client processes (``bench.fleet_push``; they cost more
CPU per request than wrk, so the rates are lower and closer together). The robust figure is
CPU s per 1k pushes of the server process (user + system, all its threads); pushes/s also
depends on what else runs. It prints each round and the median ratios.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

from bench.fleet_push import ROOT, agent_bodies, cpu_seconds, measure

TOKEN = "bench-token-0123456789abcdef"

WRK_SCRIPT = """
local reqs = {}
local i = 0
init = function(args)
  local f = assert(io.open(args[1], "rb"))
  local headers = {["Content-Type"] = "application/x-protobuf"}
  if args[2] ~= "" then headers["Authorization"] = "Bearer " .. args[2] end
  while true do
    local line = f:read("*l")
    if not line then break end
    reqs[#reqs + 1] = wrk.format("POST", "/v1/metrics", headers, f:read(tonumber(line)))
  end
  f:close()
end
request = function()
  i = i % #reqs + 1
  return reqs[i]
end
"""


def full_bodies(first: int, count: int, nccl_packed: bool = True) -> list[bytes]:
    """What fleet-push sends with every feature of the push on, one body per node;
    ``nccl_packed=False``: the NCCL calls as the parallel arrays of older nodes."""
    from ingero.otlp.collectives import ClockOffset, CollectiveCall, CommReport
    from ingero.otlp.health import NodePush, encode_health
    from ingero.otlp.resource import PUSH_SERVICE, service_attributes

    now = time.time_ns()
    bodies = []
    for i in range(first, first + count):
        calls = tuple(
            CollectiveCall(
                1000 + k,
                "AllReduce",
                now - 10**8 + k * 10**6,
                now - 10**8 + k * 10**6 + 5 * 10**5,
                1 << 20,
            )
            for k in range(16)
        )
        comm = CommReport(
            comm_hash=f"{i // 64:016x}",
            comm_rank=i % 64,
            nranks=64,
            entered_seq=1015,
            returned_seq=1015,
            calls_in_interval=16,
            last_enter_ns=now - 10**7,
            calls=calls,
        )
        push = NodePush(
            node_id=f"node{i:06d}",
            cluster_id="bench",
            score=0.85 + (i % 10) / 100,
            host_name=f"host{i:06d}",
            job_id=str(i // 64),
            rank=i % 64,
            world_size=64,
            workload_type="training",
            dominant_signal="throughput",
            signals={"throughput": 0.9, "compute": 0.8, "memory": 0.95, "cpu": 0.9},
            rates={
                "kernel_launch_rate": 5000.0 + i % 7,
                "nccl_collective_rate": 3.2,
                "step_rate": 1.6,
                "gpu_busy_fraction": 0.93,
                "mem_free_fraction": 0.4,
                "cpu_busy_fraction": 0.3,
            },
            gpu_model="NVIDIA H100 80GB HBM3",
            gpu_count=8,
            provider="bench",
            episode_id="",
            collectives=(comm,),
            clock=ClockOffset(0.0012, 0.0003),
            held=False,
        )
        service = service_attributes(PUSH_SERVICE, push.node_id)
        bodies.append(
            encode_health(push, now, service, nccl_packed=nccl_packed).SerializeToString()
        )
    return bodies


def full_array_bodies(first: int, count: int) -> list[bytes]:
    return full_bodies(first, count, nccl_packed=False)


SHAPES = {"full": full_bodies, "full-arrays": full_array_bodies, "basic": agent_bodies}


def decode_costs(count: int) -> None:
    """CPU µs per push of Fleet's decode (``decode_health`` as its receiver calls it) and of
    the whole receiver (decode and ``FleetState.ingest``, the NCCL join's included), each
    shape, in this process: no sockets, best of 5 passes over ``count`` nodes' pushes."""
    print(f"# in-process CPU us per push (best of 5 x {count:,} pushes)")
    print(f"{'shape':<13}{'bytes':>7}{'parse':>8}{'decode':>8}{'receiver':>10}")
    for shape in SHAPES:
        size, (parse, decode, receive) = _shape_costs(shape, count)
        print(f"{shape:<13}{size:>7}{parse:>8.1f}{decode:>8.1f}{receive:>10.1f}")


def _shape_costs(shape: str, count: int) -> tuple[int, list[float]]:
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    from ingero.fleet.config import FleetConfig, LimitsConfig
    from ingero.fleet.daemon import FleetDaemon
    from ingero.otlp.health import decode_health

    bodies = SHAPES[shape](0, count)
    requests = [ExportMetricsServiceRequest.FromString(b) for b in bodies]
    daemon = FleetDaemon(FleetConfig(limits=LimitsConfig(max_nodes=10 * count)))
    for request in requests:  # every node known, as in steady state
        daemon.receiver.metrics_request(request)
    daemon.state.tick()
    # Each result is dropped at once, as the server drops it: a list holding them all would
    # hand the cyclic GC thousands of live objects to walk, which is not the push's cost.
    stages = [
        lambda: deque(map(ExportMetricsServiceRequest.FromString, bodies), maxlen=0),
        lambda: deque((decode_health(r, details=False, rates=True) for r in requests), maxlen=0),
        lambda: deque(map(daemon.receiver.metrics_request, requests), maxlen=0),
    ]
    costs = []
    for stage in stages:
        best = float("inf")
        for _ in range(5):
            start = time.process_time()
            stage()
            best = min(best, time.process_time() - start)
        costs.append(best / count * 1e6)
    return len(bodies[0]), costs


def release_tree(rev: str, into: Path) -> str | None:
    """The source of ``rev`` under ``into`` (``git archive``); None with why not on stdout."""
    try:
        tar = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "ingero"],
            capture_output=True,
            check=True,
            timeout=60,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"# release {rev}: not available ({exc}); it is left out")
        return None
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")
    return str(into)


def start(
    name: str, tmp: Path, cwd: str | None, config: dict[str, Any] | None
) -> tuple[subprocess.Popen[bytes], str]:
    ready = tmp / f"{name}.ready"
    ready.unlink(missing_ok=True)
    env = {**os.environ, "INGERO_CONFIG": ""}
    if config is None:
        cmd = [sys.executable, "-m", "bench.fleet_push", "--serve", f"{name}-http"]
    else:
        path = tmp / f"{name}.yaml"
        path.write_text(json.dumps(config))  # JSON is YAML
        env["INGERO_CONFIG"] = str(path)
        cmd = [
            sys.executable,
            "-m",
            "ingero.cli.main",
            "fleet",
            "--otlp-grpc",
            "127.0.0.1:0",
            "--otlp-http",
            "127.0.0.1:0",
            "--api",
            "127.0.0.1:0",
            "--push-interval",
            "5s",
            "--max-nodes",
            "1000000",
            "--log-level",
            "error",
        ]
    if cwd is not None:
        env["PYTHONPATH"] = cwd  # the release's ingero, not this tree's
    proc = subprocess.Popen(
        [*cmd, "--ready-file", str(ready)], cwd=cwd or ROOT, env=env, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while not ready.exists() or not ready.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{name} server did not start")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["otlp_http"]


def run_wrk(
    address: str, pid: int, tmp: Path, opts: argparse.Namespace, seconds: float
) -> dict[str, float]:
    cpu0 = cpu_seconds(pid)
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{opts.connections}",
            f"-d{seconds:g}s",
            "-s",
            str(tmp / "push.lua"),
            f"http://{address}",
            "--",
            str(tmp / "bodies"),
            TOKEN,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    cpu = cpu_seconds(pid) - cpu0
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"wrk against {address} saw errors:\n{out}")
    count = re.search(r"(\d+) requests in ([\d.]+)s", out)
    assert count is not None, out
    n, elapsed = int(count.group(1)), float(count.group(2))
    return {"rate": n / elapsed, "cpu_per_1k": cpu / n * 1000}


def run_python(
    address: str, pid: int, opts: argparse.Namespace, seconds: float
) -> dict[str, float]:
    return measure(
        pid,
        {
            "agents": opts.agents,
            "clients": 2,
            "connections": opts.connections // 2,
            "duration": seconds,
            "transport": "http",
            "address": address,
            "rate": 0.0,
            "token": TOKEN,
            "make_bodies": SHAPES[opts.shape],
        },
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--shape",
        choices=sorted(SHAPES),
        default="full",
        help="full: what fleet-push sends (rates, collectives); full-arrays: the same with the "
        "NCCL calls as older nodes send them (parallel arrays); basic: score and signals",
    )
    parser.add_argument("--release", default="8f3ed5c", help="the previous release's commit")
    parser.add_argument("--python-clients", action="store_true", help="even when wrk is here")
    parser.add_argument(
        "--floors",
        action="store_true",
        help="also the servers that only parse the push (parse) or parse and decode it as "
        "Fleet does, storing nothing (read): what any server on this stack pays at least",
    )
    parser.add_argument(
        "--decode",
        type=int,
        metavar="N",
        help="only print the in-process decode and receiver cost of each shape for N nodes",
    )
    opts = parser.parse_args()
    if opts.decode:
        decode_costs(opts.decode)
        return
    use_wrk = shutil.which("wrk") is not None and not opts.python_clients
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        bodies = SHAPES[opts.shape](0, opts.agents)
        with (tmp / "bodies").open("wb") as f:
            for body in bodies:
                f.write(b"%d\n" % len(body) + body)
        (tmp / "push.lua").write_text(WRK_SCRIPT)
        (tmp / "token").write_text(TOKEN + "\n")
        auth = {"token_file": str(tmp / "token")}
        # The per-token limit's arithmetic runs on every push; this rate never refuses one.
        head = {"auth": {**auth, "rate_limit": {"per_token": 1e9, "token_burst": 10**9}}}
        servers: list[tuple[str, str | None, dict[str, Any] | None]] = [
            ("noop", None, None),
            ("fleet", None, head),
        ]
        if opts.floors:
            servers[1:1] = [("parse", None, None), ("read", None, None)]
        if opts.release:
            old = release_tree(opts.release, tmp / "release")
            if old is not None:
                # The key's former name: releases before 88de374 know only that one, and
                # every later tree still reads it.
                former = {"bearer_token_file": auth["token_file"]}
                servers.append(("release", old, {"auth": former}))
        print(
            f"# {opts.agents:,} agents ({opts.shape} push, {len(bodies[0])} bytes), {opts.connections} "
            f"connections, {'wrk -t1' if use_wrk else 'Python clients (2 processes)'}, "
            f"{opts.duration:g}s x {opts.rounds} rounds, {os.cpu_count()} CPUs, "
            f"load average {os.getloadavg()[0]:.1f}; release {opts.release or '-'}"
        )
        running: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
        results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in servers}
        try:
            for name, cwd, config in servers:
                running[name] = start(name, tmp, cwd, config)

            def load(name: str, seconds: float) -> dict[str, float]:
                proc, address = running[name]
                if use_wrk:
                    return run_wrk(address, proc.pid, tmp, opts, seconds)
                return run_python(address, proc.pid, opts, seconds)

            for name in running:  # every node known, as in steady state
                load(name, 2.0)
            print(f"{'round':<7}{'server':<9}{'pushes/s':>10}{'CPU s/1k':>10}")
            names = list(running)
            for r in range(opts.rounds):
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    result = load(name, opts.duration)
                    results[name].append(result)
                    print(
                        f"{r + 1:<7}{name:<9}{result['rate']:>10,.0f}{result['cpu_per_1k']:>10.4f}"
                    )
        finally:
            for proc, _ in running.values():
                proc.send_signal(signal.SIGTERM)
            for proc, _ in running.values():
                proc.wait(timeout=30)

    def ratios(num: str, den: str, key: str) -> list[float]:
        return [a[key] / b[key] for a, b in zip(results[num], results[den], strict=True)]

    # The best round of each is the one least disturbed by whatever else ran; the median
    # of the rounds' ratios compares servers measured back to back.
    for name, rows in results.items():
        top, least = max(r["rate"] for r in rows), min(r["cpu_per_1k"] for r in rows)
        print(f"{'best':<7}{name:<9}{top:>10,.0f}{least:>10.4f}")
    pairs = [(name, "noop") for name in results if name not in ("noop", "release")]
    pairs += [("fleet", "release")] if "release" in results else []
    for num, den in pairs:
        rate = ratios(num, den, "rate")
        cpu = ratios(num, den, "cpu_per_1k")
        print(
            f"{num}/{den}: pushes/s {statistics.median(rate):.2f} "
            f"(rounds {', '.join(f'{x:.2f}' for x in rate)}), CPU per push "
            f"{statistics.median(cpu):.2f} (rounds {', '.join(f'{x:.2f}' for x in cpu)})"
        )


if __name__ == "__main__":
    main()
