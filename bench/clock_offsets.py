"""How far ``merge --nodes`` / ``export --nodes`` measure a node's clock from the truth.

Three real sshd "nodes" on this host (``tests/integration/fanout/sshd.py``), so every
true offset is 0 and every measured one is error. Each round runs what
``ssh.clock_offsets`` runs on the three at once (``ssh.CLOCK_ARGV``: the node prints its
time ``CLOCK_SAMPLES`` times, ``CLOCK_SAMPLE_GAP_S`` apart) and reads two estimates from the same
lines: the first line alone (the rule before: one ``date``, its line's arrival) and the
least delayed of all of them (the rule now, ``least_delayed_offset``). Run it beside a load
(``stress-ng --cpu N``) to see what a busy host does to each.

Run: ``.venv/bin/python -m bench.clock_offsets [--rounds 40]`` (needs sshd, as the
integration tests do).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from ingero.fanout import ssh
from tests.integration.fanout.sshd import missing_reason, ssh_nodes

NODES = ("gpu1", "gpu2", "gpu3")


def _show(name: str, errors: list[float]) -> None:
    xs = sorted(errors)
    p95 = xs[int(0.95 * (len(xs) - 1))]
    print(
        f"{name:<28} n {len(xs)}, median {statistics.median(xs) * 1e3:.1f} ms, "
        f"p95 {p95 * 1e3:.1f} ms, max {xs[-1] * 1e3:.1f} ms, over 100 ms: "
        f"{sum(x > 0.1 for x in xs)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    reason = missing_reason()
    if reason is not None:
        raise SystemExit(f"bench.clock_offsets: {reason}")
    root = Path(tempfile.mkdtemp(prefix="ingero-clock-"))
    dbs = {name: root / f"{name}.db" for name in NODES}
    for path in dbs.values():
        path.touch()  # the harness wants a node DB per node; this bench reads none
    first: list[float] = []
    least: list[float] = []
    with ssh_nodes(root / "ssh", dbs) as nodes:
        options = ssh.FanoutOptions(ssh_options=nodes.ssh_options)
        for _ in range(args.rounds):
            arrivals: dict[str, list[tuple[float, bytes]]] = {}
            ssh.run_on_nodes(list(NODES), ssh.CLOCK_ARGV, options, arrivals)
            for samples in arrivals.values():
                arrived, line = samples[0]
                first.append(abs(float(line) - arrived))
                offset = ssh.least_delayed_offset(samples)
                assert offset is not None
                least.append(abs(offset))
    print(
        f"# {args.rounds} rounds x {len(NODES)} nodes on one host (true offset 0), "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"
    )
    _show("first line (before)", first)
    _show(f"least delayed of {ssh.CLOCK_SAMPLES} (now)", least)


if __name__ == "__main__":
    main()
