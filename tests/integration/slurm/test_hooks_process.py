"""The shipped hook scripts (slurm/) run as real processes, without a Slurm cluster:
files written atomically, exit status always 0, problems reported, summary appended."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def hooks(tmp_path: Path) -> Path:
    """The slurm/ scripts copied beside an ingero-slurm.env naming this Python and tmp paths."""
    target = tmp_path / "hooks"
    target.mkdir()
    for name in ("prolog", "epilog", "taskprolog", "ingero-hook"):
        shutil.copy2(REPO / "slurm" / name, target / name)
    (target / "ingero-slurm.env").write_text(
        f"INGERO_PYTHON={sys.executable}\n"
        f"INGERO_JOBS_DIR={tmp_path}/jobs\n"
        f"INGERO_EVENT_LOG={tmp_path}/events.ndjson\n"
        f"INGERO_JOURNAL_SOCKET={tmp_path}/journal.socket\n"
    )
    return target


def run_hook(hooks: Path, name: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # slurmd gives hooks no PATH and only its own SLURM_* variables.
    return subprocess.run(
        [str(hooks / name)], env=env, capture_output=True, text=True, timeout=30, check=False
    )


ENV = {
    "SLURM_JOB_ID": "77",
    "SLURMD_NODENAME": "n2",
    "SLURM_NODELIST": "n[1-3]",
    "SLURM_JOB_NUM_NODES": "3",
    "SLURM_CLUSTER_NAME": "lab",
    "SLURM_JOB_USER": "alice",
    "SLURM_JOB_UID": "1001",
    "SLURM_JOB_PARTITION": "gpu",
    "SLURM_JOB_GPUS": "0,1",
}


def test_prolog_taskprolog_epilog_cycle(hooks: Path, tmp_path: Path) -> None:
    assert run_hook(hooks, "prolog", ENV).returncode == 0
    data = json.loads((tmp_path / "jobs" / "77.json").read_text())
    assert (data["job_id"], data["node_id"], data["rank"], data["world_size"]) == ("77", "n2", 1, 3)
    assert (data["gpus"], data["user"], data["partition"]) == (["0", "1"], "alice", "gpu")
    assert oct((tmp_path / "jobs" / "77.json").stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in (tmp_path / "jobs").iterdir()] == ["77.json"]  # no temp left

    task = run_hook(hooks, "taskprolog", {**ENV, "SLURM_PROCID": "4"})
    assert task.returncode == 0
    assert task.stdout.splitlines() == [
        "export INGERO_CLUSTER_ID=lab",
        "export INGERO_JOB_ID=77",
        "export INGERO_NODE_ID=n2",
        "export INGERO_RANK=1",
        "export INGERO_WORLD_SIZE=3",
        "export INGERO_TASK_RANK=4",
    ]

    started = data["started_at"]
    log = tmp_path / "events.ndjson"
    lines = [
        {
            "type": "straggler_state",
            "node_id": "n2",
            "job_id": "77",
            "timestamp": started + 0.01,
            "score": 0.4,
        },
        {
            "type": "straggler_resolved",
            "node_id": "n2",
            "job_id": "77",
            "timestamp": started + 0.02,
            "score": 0.9,
        },
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in lines) + "{torn line\n")
    assert run_hook(hooks, "epilog", ENV).returncode == 0
    assert not (tmp_path / "jobs" / "77.json").exists()
    summary = json.loads(log.read_text().splitlines()[-1])
    assert summary["type"] == "job_summary"
    assert (summary["node_id"], summary["job_id"], summary["rank"]) == ("n2", "77", 1)
    assert summary["worst_score"] == summary["score"] == 0.4
    assert summary["straggler_episodes"] == 1
    assert summary["straggler_seconds"] == pytest.approx(0.01, abs=1e-3)


def test_epilog_without_job_file_still_summarises(hooks: Path, tmp_path: Path) -> None:
    (tmp_path / "events.ndjson").touch()
    assert run_hook(hooks, "epilog", ENV).returncode == 0
    summary = json.loads((tmp_path / "events.ndjson").read_text())
    assert summary["type"] == "job_summary" and summary["straggler_seconds"] == 0.0


@pytest.mark.parametrize(
    ("name", "env", "problem"),
    [
        ("prolog", {k: v for k, v in ENV.items() if k != "SLURMD_NODENAME"}, "SLURMD_NODENAME"),
        ("prolog", {**ENV, "SLURM_JOB_ID": "1/../../x"}, "invalid Slurm job id"),
        ("prolog", {**ENV, "SLURM_NODELIST": "n[1-"}, "node list"),
        ("taskprolog", {}, "invalid Slurm job id"),
        ("epilog", {**ENV, "SLURM_JOB_ID": ""}, "invalid Slurm job id"),
    ],
)
def test_bad_input_exits_0_and_says_why(
    hooks: Path, tmp_path: Path, name: str, env: dict[str, str], problem: str
) -> None:
    proc = run_hook(hooks, name, env)
    assert proc.returncode == 0
    assert problem in proc.stderr
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_a_corrupt_job_file_does_not_stop_the_epilog(hooks: Path, tmp_path: Path) -> None:
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "77.json").write_text("{not json")
    (tmp_path / "events.ndjson").touch()
    proc = run_hook(hooks, "epilog", ENV)
    assert proc.returncode == 0 and "not JSON" in proc.stderr
    assert not (tmp_path / "jobs" / "77.json").exists()
    assert json.loads((tmp_path / "events.ndjson").read_text())["rank"] == 1


def test_the_job_file_goes_even_when_the_summary_fails(hooks: Path, tmp_path: Path) -> None:
    assert run_hook(hooks, "prolog", ENV).returncode == 0
    (tmp_path / "jobs" / "77.json").write_text("{corrupt")
    # corrupt file and no SLURMD_NODENAME: no summary can be made
    env = {k: v for k, v in ENV.items() if k != "SLURMD_NODENAME"}
    proc = run_hook(hooks, "epilog", env)
    assert proc.returncode == 0 and "SLURMD_NODENAME" in proc.stderr
    assert not (tmp_path / "jobs" / "77.json").exists()


def test_unwritable_jobs_dir_exits_0(hooks: Path, tmp_path: Path) -> None:
    (tmp_path / "jobs").write_text("a file where the directory should be")
    proc = run_hook(hooks, "prolog", ENV)
    assert proc.returncode == 0 and "prolog" in proc.stderr


def test_missing_python_exits_0(hooks: Path, tmp_path: Path) -> None:
    env_file = hooks / "ingero-slurm.env"
    env_file.write_text(env_file.read_text() + "INGERO_PYTHON=/nonexistent/python\n")
    assert run_hook(hooks, "prolog", ENV).returncode == 0


def test_hooks_in_a_venv_find_its_python_without_settings(tmp_path: Path) -> None:
    # As `pip install` lays the hooks out: <venv>/share/ingero/slurm/, beside no settings
    # file naming a Python. The venv's bin/python stands in for one with ingero installed.
    venv = tmp_path / "venv"
    hooks = venv / "share" / "ingero" / "slurm"
    hooks.mkdir(parents=True)
    for name in ("prolog", "epilog", "taskprolog", "ingero-hook"):
        shutil.copy2(REPO / "slurm" / name, hooks / name)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (venv / "bin").mkdir()
    python = venv / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    (hooks / "ingero-slurm.env").write_text(
        f"INGERO_JOBS_DIR={tmp_path}/jobs\nINGERO_JOURNAL_SOCKET={tmp_path}/journal.socket\n"
    )
    assert run_hook(hooks, "prolog", ENV).returncode == 0
    assert json.loads((tmp_path / "jobs" / "77.json").read_text())["node_id"] == "n2"
    task = run_hook(hooks, "taskprolog", ENV)
    assert "export INGERO_JOB_ID=77" in task.stdout.splitlines()


def test_a_hook_run_through_a_sites_glob_link_works(hooks: Path, tmp_path: Path) -> None:
    # Prolog=/etc/slurm/prolog.d/* with a link to ingero's prolog (what slurm-conf places)
    prolog_d = tmp_path / "prolog.d"
    prolog_d.mkdir()
    (prolog_d / "ingero").symlink_to(hooks / "prolog")
    assert run_hook(prolog_d, "ingero", ENV).returncode == 0
    assert json.loads((tmp_path / "jobs" / "77.json").read_text())["job_id"] == "77"


def test_problems_reach_the_journal_socket(hooks: Path, tmp_path: Path) -> None:
    import socket

    path = tmp_path / "journal.socket"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        sock.settimeout(10)
        assert run_hook(hooks, "prolog", {"SLURM_JOB_ID": "5"}).returncode == 0
        entry = sock.recv(65536).decode()
    assert "SYSLOG_IDENTIFIER=ingero-slurm\n" in entry
    assert "INGERO_HOOK=prolog\n" in entry and "PRIORITY=4\n" in entry
    assert "SLURMD_NODENAME is not set" in entry


def test_missing_directories_are_created_readable(hooks: Path, tmp_path: Path) -> None:
    env_file = hooks / "ingero-slurm.env"
    env_file.write_text(
        env_file.read_text().replace(f"{tmp_path}/jobs", f"{tmp_path}/run/ingero/jobs")
    )
    old = os.umask(0o077)  # the hook inherits it; job files must be readable anyway
    try:
        assert run_hook(hooks, "prolog", ENV).returncode == 0
    finally:
        os.umask(old)
    assert (tmp_path / "run" / "ingero" / "jobs" / "77.json").is_file()
    for sub in ("run", "run/ingero", "run/ingero/jobs"):
        assert os.stat(tmp_path / sub).st_mode & 0o777 == 0o755, sub


JOURNAL_SCRIPT = """set -e
"$HOOKS/prolog"
"$PY" -c '
import time
from ingero.schema.events import Event
from ingero.slurm.hooks import journal_send
t = time.time()
for kind, delay, score in (("straggler_state", 0.01, 0.35), ("straggler_resolved", 0.5, 0.9)):
    event = Event(type=kind, node_id="n2", cluster_id="lab", timestamp=t + delay, job_id="77", score=score)
    assert journal_send(event.journal_fields(), "/run/systemd/journal/socket")
'
sleep 1
"$HOOKS/epilog"
journalctl -o json --no-pager INGERO_EVENT=job_summary
"""


def test_epilog_summarises_from_the_journal(hooks: Path, tmp_path: Path) -> None:
    from tests.integration.journald_harness import run_with_journald, unavailable

    reason = unavailable()
    if reason:
        pytest.skip(reason)
    # journald at its default socket, no event log: the journal is the only source
    env_file = hooks / "ingero-slurm.env"
    env_file.write_text(
        "\n".join(line for line in env_file.read_text().splitlines() if "JOURNAL" not in line)
    )
    (tmp_path / "events.ndjson").unlink(missing_ok=True)
    proc = run_with_journald(
        ["bash", "-c", JOURNAL_SCRIPT],
        env={**ENV, "HOOKS": str(hooks), "PY": sys.executable},
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    (record,) = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert record["INGERO_NODE"] == "n2" and record["INGERO_JOB"] == "77"
    assert float(record["INGERO_WORST_SCORE"]) == 0.35
    assert record["INGERO_STRAGGLER_EPISODES"] == "1"
    assert float(record["INGERO_STRAGGLER_SECONDS"]) == pytest.approx(0.49, abs=0.01)
    assert not (tmp_path / "jobs" / "77.json").exists()


def test_hooks_never_run_a_slurm_command(hooks: Path, tmp_path: Path) -> None:
    tripwires = tmp_path / "bin"
    tripwires.mkdir()
    for name in ("scontrol", "sinfo", "squeue", "sacct", "srun", "sbatch", "scancel"):
        script = tripwires / name
        script.write_text(f"#!/bin/sh\necho {name} >> {tmp_path}/called\nexit 0\n")
        script.chmod(0o755)
    env = {**ENV, "PATH": f"{tripwires}:/usr/bin:/bin", "SLURM_PROCID": "0"}
    for name in ("prolog", "taskprolog", "epilog"):
        assert run_hook(hooks, name, env).returncode == 0
    assert not (tmp_path / "called").exists()
    assert not (tmp_path / "jobs" / "77.json").exists()  # the cycle ran to the end
