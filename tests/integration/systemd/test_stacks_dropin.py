"""The shipped ingero-push unit under a real systemd, with and without the example drop-in
systemd/examples/ingero-push.service.d/stacks.conf: the stack snapshot (py-spy) of a job
process that runs as another user is refused by the unit's sandbox, and works with it.

The unit file is the one in systemd/, as shipped; only what the service runs is replaced (a
drop-in: one snapshot of the job, printed to the journal, instead of the push loop), so
the user, capabilities, system call filter and namespaces are the unit's own. The code and
its dependencies come from this checkout (no package build).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ingero.push.stack_snapshot import PERMISSION_DENIED, find_py_spy
from tests.integration.systemd.sysdns import SystemdContainer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
UNIT = ROOT / "systemd" / "ingero-push.service"
STACKS_CONF = ROOT / "systemd" / "examples" / "ingero-push.service.d" / "stacks.conf"
PYTHON = "/usr/bin/python3.11"  # outside /root and /home, which the unit hides
SITE = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"

JOB = """import time


def wait_for_batch():
    time.sleep(3600)


wait_for_batch()
"""
JOB_LINE = 5  # time.sleep in wait_for_batch

SNAP = """import json
import sys

from ingero.push.stack_snapshot import Target, dump

for thread in dump(Target(int(sys.argv[1])), py_spy=sys.argv[2]):
    print("SNAPSHOT " + json.dumps(thread.to_json()), flush=True)
"""


def _snapshot(box: SystemdContainer, pid: int, py_spy: str) -> list[dict[str, object]]:
    box.run("journalctl", "--rotate", check=False)
    box.run("journalctl", "--vacuum-files=1", check=False)
    box.run("systemctl", "start", "ingero-push.service", timeout=120)
    out = box.run("journalctl", "-u", "ingero-push.service", "-o", "cat", "--no-pager").stdout
    return [json.loads(line.split(" ", 1)[1]) for line in out.splitlines()
            if line.startswith("SNAPSHOT ")]  # fmt: skip


def test_stacks_dropin_lets_the_unit_read_another_users_job(
    boot: Callable[[str], SystemdContainer],
) -> None:
    py_spy = find_py_spy()
    if py_spy is None:
        pytest.skip("py-spy is not installed")
    if not Path(PYTHON).exists():
        pytest.skip(f"{PYTHON} is needed (an interpreter the unit can see)")
    box = boot("stacks")
    root = box.root
    box.run("useradd", "--system", "--no-create-home", "ingero")
    box.run("useradd", "--no-create-home", "jobuser")
    (root / "srv").mkdir(exist_ok=True)
    (root / "srv/job.py").write_text(JOB)
    (root / "srv/snap.py").write_text(SNAP)
    (root / "etc/systemd/system/ingero-push.service").write_text(UNIT.read_text())
    dropins = root / "etc/systemd/system/ingero-push.service.d"
    dropins.mkdir(parents=True)
    # The checkout and its venv, wherever they are (a clone under /tmp is hidden by the
    # unit's PrivateTmp, one under /root by ProtectHome), bound read-only where the unit
    # sees them.
    for mount in ("src", "site"):
        (root / "opt/ingero-test" / mount).mkdir(parents=True, exist_ok=True)
    (root / "opt/ingero-test/py-spy").touch()
    (dropins / "zz-test.conf").write_text(
        "[Service]\nType=oneshot\nWatchdogSec=0\nRestart=no\n"
        f"BindReadOnlyPaths={ROOT}:/opt/ingero-test/src "
        f"{SITE / 'site-packages'}:/opt/ingero-test/site {py_spy}:/opt/ingero-test/py-spy\n"
        "Environment=PYTHONPATH=/opt/ingero-test/src:/opt/ingero-test/site\n"
        "ExecStart=\n"
        "ExecStart=" + PYTHON + " /srv/snap.py ${JOB_PID} /opt/ingero-test/py-spy\n"
    )
    box.run("systemd-run", "--unit=job", "--uid=jobuser", PYTHON, "/srv/job.py")
    pid = int(box.run("systemctl", "show", "-p", "MainPID", "--value", "job").stdout)
    assert pid > 0
    (dropins / "zz-job.conf").write_text(f"[Service]\nEnvironment=JOB_PID={pid}\n")
    box.run("systemctl", "daemon-reload")

    [refused] = _snapshot(box, pid, py_spy)
    assert refused["pid"] == pid and refused["frames"] == [], refused
    assert refused["reason"] == PERMISSION_DENIED, refused

    (dropins / "stacks.conf").write_text(STACKS_CONF.read_text())
    box.run("systemctl", "daemon-reload")
    threads = _snapshot(box, pid, py_spy)
    main = [t for t in threads if t.get("tid") == pid]
    assert len(main) == 1, threads
    frames = main[0]["frames"]
    assert isinstance(frames, list) and "reason" not in main[0], main
    assert [(f["function"], f["file"], f["line"]) for f in frames][:2] == [
        ("wait_for_batch", "/srv/job.py", JOB_LINE),
        ("<module>", "/srv/job.py", 8),
    ], frames
