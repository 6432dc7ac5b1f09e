"""The Ansible fleet role's opt-in HAProxy part renders contrib/haproxy's template with
every fleet_host as a replica, on the balancer's own ports, and haproxy accepts it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.fleet.helpers import ROOT

pytestmark = pytest.mark.integration

PLAYBOOK = Path(sys.executable).with_name("ansible-playbook")


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
@pytest.mark.skipif(not PLAYBOOK.exists(), reason="ansible-playbook is not in the venv")
def test_role_templates_the_haproxy_config(tmp_path: Path) -> None:
    (tmp_path / "hosts.ini").write_text(
        "[fleet_host]\n"
        "fa ansible_host=10.1.0.5 ansible_connection=local\n"
        "fb ansible_host=10.1.0.6 ansible_connection=local\n"
    )
    out = tmp_path / "haproxy.cfg"
    (tmp_path / "play.yml").write_text(
        f"""- hosts: fa
  gather_facts: false
  vars:
    fleet_haproxy: true
    fleet_haproxy_config: {out}
    ingero_manage_services: false
  tasks:
    - ansible.builtin.include_role:
        name: fleet
        tasks_from: haproxy
"""
    )
    env = {
        **os.environ,
        "ANSIBLE_ROLES_PATH": str(ROOT / "ansible" / "roles"),
        # Debian's python3: the one with python3-apt (the apt module runs on it)
        "ANSIBLE_PYTHON_INTERPRETER": "/usr/bin/python3",
        "ANSIBLE_NOCOLOR": "1",
    }
    run = subprocess.run(
        [str(PLAYBOOK), "-i", str(tmp_path / "hosts.ini"), str(tmp_path / "play.yml")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = out.read_text()
    assert "bind :14318" in text and "bind :14317 proto h2" in text and "bind :18080" in text
    for name, host in (("fa", "10.1.0.5"), ("fb", "10.1.0.6")):
        assert f"server {name} {host}:4318 check port 8080" in text
        assert f"server {name} {host}:4317 proto h2 check port 8080 check-proto h1" in text
    check = subprocess.run(["haproxy", "-c", "-f", str(out)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
