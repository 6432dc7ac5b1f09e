"""Wall time of the Slurm hook processes (slurm/prolog, taskprolog, epilog), as slurmd runs them.

Each hook runs ``--runs`` times with a prolog-like environment (no PATH), its job file and
event log in a temporary directory; prints median and p95 wall milliseconds per hook, and
the same for a bare ``python -I -c pass`` and for the package import alone, to show where
the time goes. Usage: ``.venv/bin/python -m bench.slurm_hooks [--runs 30] [--events 10000]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def run_once(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall ms, CPU ms of the child) for one run."""
    cpu = cpu_ms()
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return (time.perf_counter() - start) * 1000, cpu_ms() - cpu


def summary(samples: list[tuple[float, float]]) -> str:
    wall = sorted(s[0] for s in samples)
    cpu = sorted(s[1] for s in samples)
    p95 = wall[min(len(wall) - 1, int(len(wall) * 0.95))]
    return f"{statistics.median(wall):>10.1f} {p95:>8.1f} {statistics.median(cpu):>8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--events", type=int, default=10_000, help="lines in the event log")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name in ("prolog", "epilog", "taskprolog", "ingero-hook"):
            shutil.copy2(REPO / "slurm" / name, root / name)
        (root / "ingero-slurm.env").write_text(
            f"INGERO_PYTHON={sys.executable}\nINGERO_JOBS_DIR={root}/jobs\n"
            f"INGERO_EVENT_LOG={root}/events.ndjson\nINGERO_JOURNAL_SOCKET={root}/none\n"
        )
        now = time.time()
        with (root / "events.ndjson").open("w") as log:
            for i in range(args.events):
                kind = "straggler_state" if i % 2 == 0 else "straggler_resolved"
                node = f"n{i % 64:03d}"
                log.write(
                    json.dumps(
                        {
                            "type": kind,
                            "node_id": node,
                            "job_id": "4242",
                            "timestamp": now + i * 0.001,
                            "score": 0.5,
                        }
                    )
                    + "\n"
                )
        env = {
            "SLURM_JOB_ID": "4242",
            "SLURMD_NODENAME": "n007",
            "SLURM_CLUSTER_NAME": "bench",
            "SLURM_NODELIST": "n[000-511]",
            "SLURM_JOB_NUM_NODES": "512",
            "SLURM_JOB_USER": "alice",
            "SLURM_JOB_UID": "1000",
            "SLURM_JOB_PARTITION": "gpu",
            "SLURM_JOB_GPUS": "0,1,2,3,4,5,6,7",
            "SLURM_PROCID": "7",
        }
        rows = [
            ("python -I -c pass", [sys.executable, "-I", "-c", "pass"]),
            ("python -I -c 'import ingero'", [sys.executable, "-I", "-c", "import ingero"]),
            ("prolog (512-node job)", [str(root / "prolog")]),
            ("taskprolog", [str(root / "taskprolog")]),
            (f"epilog ({args.events} event lines)", [str(root / "epilog")]),
        ]
        # The epilog removes the job file and the taskprolog reads it: restore it each run.
        print(f"{'hook':<34} {'median ms':>10} {'p95 ms':>8} {'CPU ms':>8}  ({args.runs} runs)")
        for label, cmd in rows:
            samples = []
            for _ in range(args.runs):
                if cmd[0].endswith(("epilog", "taskprolog")):
                    subprocess.run([str(root / "prolog")], env=env, check=True)
                samples.append(run_once(cmd, env))
            print(f"{label:<34} {summary(samples)}")


if __name__ == "__main__":
    main()
