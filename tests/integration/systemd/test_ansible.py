"""The Ansible playbook, linted, and run in a real systemd (PID 1 in namespaces), offline."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from ingero.schema.events import MESSAGE_IDS
from tests.integration.systemd.conftest import ROOT, Artefacts
from tests.integration.systemd.slurmbox import prolog_flags, run_job, start_slurm, write_site_conf
from tests.integration.systemd.sysdns import SystemdContainer

pytestmark = pytest.mark.integration

Boot = Callable[[str], SystemdContainer]
ANSIBLE = ROOT / "ansible"
BIN = Path(sys.executable).parent
CENTRAL = ["ingero-fleet", "ingero-echo"]
AGENT = ["ingero-annotate", "ingero-push", "ingero-sink"]
INVENTORY = """[gpu_nodes]
localhost ansible_connection=local
[fleet_host]
localhost ansible_connection=local
"""
# the same host is also the Slurm controller: its slurm.conf is merged once, hooks installed
WITH_CONTROLLER = INVENTORY + "[slurm_controller]\nlocalhost ansible_connection=local\n"


def bpf_possible(box: SystemdContainer) -> bool:
    """BCC is installed and the container has tracefs: ingero trace can load its probes."""
    return (box.root / "usr/lib/python3/dist-packages/bcc").is_dir() and (
        box.root / "sys/kernel/tracing/events"
    ).is_dir()


def playbook(
    box: SystemdContainer,
    artefacts: Artefacts,
    tmp_path: Path,
    *extra: str,
    inventory_text: str = INVENTORY,
) -> dict[str, int]:
    """Run site.yml inside the container; returns the PLAY RECAP counters for localhost."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text(inventory_text)
    result = box.run(
        "env",
        f"ANSIBLE_CONFIG={ANSIBLE / 'ansible.cfg'}",
        f"ANSIBLE_LOCAL_TEMP={tmp_path / 'ansible-tmp'}",
        "ANSIBLE_NOCOLOR=1",
        str(BIN / "ansible-playbook"),
        "-i",
        str(inventory),
        str(ANSIBLE / "site.yml"),
        "-e",
        f"ingero_wheelhouse={artefacts.wheelhouse_tar}",
        "-e",
        f"agent_trace_enabled={str(bpf_possible(box)).lower()}",
        *extra,
        check=False,
        timeout=600,
    )
    recap = re.search(r"^localhost\s+:\s+(.*)$", result.stdout, re.M)
    assert recap, result.stdout[-3000:] + result.stderr[-2000:]
    counters = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", recap.group(1))}
    assert result.returncode == 0 and counters["failed"] == 0, result.stdout[-4000:]
    return counters


@pytest.mark.skipif(shutil.which("ansible-lint", path=str(BIN)) is None, reason="no ansible-lint")
def test_ansible_lint_production_profile() -> None:
    result = subprocess.run(
        [str(BIN / "ansible-lint"), "--profile", "production", "--nocolor"],
        cwd=ANSIBLE,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Profile 'production' was required, and it passed" in result.stderr


# Four playbook runs on one host, the first a full install: over the suite's 300 s per test
# when the machine is shared with the rest of the suite (tests/run.sh runs this directory
# beside it), so this test has a bound of its own.
@pytest.mark.timeout(900)
def test_playbook_installs_restarts_on_change_merges_slurm_conf_idempotently(
    boot: Boot, artefacts: Artefacts, tmp_path: Path
) -> None:
    """One host, as a site runs the playbook over time: installed and started (slurm.conf
    left alone), run again (nothing changes), a changed setting (only its daemon restarts),
    then the opt-in slurm.conf merge on the running Slurm controller (jobs get tagged), run
    again (nothing changes). One host for all of it: each fresh install takes minutes."""
    box = boot("ans")
    host = write_site_conf(box)  # PrologFlags=Serial, Epilog=/etc/slurm/epilog.d/*
    start_slurm(box)  # a running site: the merge's handler reconfigures it
    slurm_conf = box.root / "etc/slurm/slurm.conf"
    before = slurm_conf.read_bytes()

    first = playbook(box, artefacts, tmp_path)
    assert first["changed"] > 0
    units = CENTRAL + AGENT + (["ingero-trace"] if bpf_possible(box) else [])
    for unit in units:
        assert box.prop(unit, "ActiveState") == "active", unit
        assert box.prop(unit, "UnitFileState") == "enabled", unit
        assert box.prop(unit, "FragmentPath") == f"/etc/systemd/system/{unit}.service"
    for unit in units:  # as Ansible rendered them, in the target system
        verify = box.run("systemd-analyze", "verify", f"/etc/systemd/system/{unit}.service")
        assert verify.stderr == "", verify.stderr
    assert box.run("/usr/local/bin/ingero", "--version").stdout.startswith("ingero, version")
    # the role installed the journal catalog and its handler indexed it
    drained = box.run("journalctl", "--list-catalog", MESSAGE_IDS["node_drained"]).stdout
    assert "ingero: node @INGERO_NODE@ drained" in drained
    push_conf = (box.root / "etc/ingero/fleet-push.yaml").read_text()
    assert "fleet_endpoint: http://localhost:4318" in push_conf
    assert box.run("test", "-x", "/usr/lib/ingero/slurm/prolog").returncode == 0
    hooks_env = (box.root / "etc/default/ingero-slurm").read_text()
    assert "INGERO_PYTHON=/opt/ingero/venv/bin/python" in hooks_env
    assert box.run("test", "-x", "/usr/lib/ingero/slurm/ingero-hook").returncode == 0
    # the site's slurm.conf is not edited without slurm_hooks_edit_slurm_conf
    assert slurm_conf.read_bytes() == before

    # a running service's event, found in the journal by its fields
    out = box.journal("-o", "json", "-u", "ingero-push", "INGERO_EVENT=detection_mode")
    assert any(json.loads(line)["INGERO_CLUSTER"] == "default" for line in out.splitlines())

    assert playbook(box, artefacts, tmp_path)["changed"] == 0

    # a changed fleet.yaml restarts fleet (handler), and only fleet
    pids = {unit: box.prop(unit, "MainPID") for unit in units}
    changed = playbook(box, artefacts, tmp_path, "-e", '{"fleet_config": {"push_interval": "7s"}}')
    assert changed["changed"] == 2  # fleet.yaml + its restart handler
    assert "push_interval: 7s" in (box.root / "etc/ingero/fleet.yaml").read_text()
    assert box.prop("ingero-fleet", "MainPID") != pids["ingero-fleet"]
    assert box.prop("ingero-fleet", "ActiveState") == "active"
    for unit in units[1:]:
        assert box.prop(unit, "MainPID") == pids[unit], unit

    # Opted in on the Slurm controller: slurm.conf merged, the site's lines kept, and the
    # handler reconfigures the running slurmctld.
    site_conf = before.decode()
    opt_in = ("-e", "slurm_hooks_edit_slurm_conf=true")
    merge = playbook(box, artefacts, tmp_path, *opt_in, inventory_text=WITH_CONTROLLER)
    assert merge["changed"] > 0
    merged = slurm_conf.read_text()
    assert merged.startswith(site_conf.split("PrologFlags=")[0])  # the site's lines kept
    assert "PrologFlags=Serial,Alloc" in merged
    assert "TaskProlog=/usr/lib/ingero/slurm/taskprolog" in merged
    assert os.readlink(box.root / "etc/slurm/epilog.d/ingero") == "/usr/lib/ingero/slurm/epilog"
    assert "Alloc" in prolog_flags(box).split(",")  # the handler ran scontrol reconfigure

    job = run_job(box)
    assert (job.job_file["job_id"], job.job_file["node_id"]) == (job.job_id, host)
    assert f"INGERO_JOB_ID={job.job_id}" in job.task_env
    assert job.site_epilog_ran and not job.job_file_left

    # a second run finds slurm.conf merged: nothing changes, nothing is reconfigured
    again = playbook(box, artefacts, tmp_path, *opt_in, inventory_text=WITH_CONTROLLER)
    assert again["changed"] == 0
    assert slurm_conf.read_text() == merged


def test_check_mode_on_a_fresh_host_changes_nothing(
    boot: Boot, artefacts: Artefacts, tmp_path: Path
) -> None:
    box = boot("chk")
    counters = playbook(box, artefacts, tmp_path, "--check")
    assert counters["changed"] > 0  # it reports what it would do ...
    for path in ("/opt/ingero", "/etc/ingero", "/etc/systemd/system/ingero-fleet.service"):
        assert box.run("test", "-e", path, check=False).returncode == 1, path  # ... does none
