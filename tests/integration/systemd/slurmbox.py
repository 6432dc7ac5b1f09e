"""A real Slurm inside a booted systemd container, set up as a site would have it: Debian's
munge, slurmctld and slurmd units, /etc/slurm/slurm.conf with the site's own PrologFlags and
epilogs. For proving what the .deb and the playbook do to a running Slurm."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tests.integration.slurm.cluster import PLAIN_SETTINGS
from tests.integration.systemd.sysdns import SystemdContainer, wait_for

SITE_EPILOG = '#!/bin/sh\necho "$SLURM_JOB_ID" >> /var/tmp/site-epilog.log\nexit 0\n'
JOB = """#!/bin/sh
cp /run/ingero/jobs/$SLURM_JOB_ID.json /var/tmp/job.json
srun sh -c 'env | grep ^INGERO_ | sort' > /var/tmp/task-env.txt
"""


def write_site_conf(box: SystemdContainer) -> str:
    """slurm.conf of a one-node site whose PrologFlags and epilog.d ingero must keep."""
    host = box.run("hostname", "-s").stdout.strip()
    lines = [
        "ClusterName=site",
        f"SlurmctldHost={host}(127.0.0.1)",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "StateSaveLocation=/var/lib/slurm/slurmctld",
        "SlurmdSpoolDir=/var/lib/slurm/slurmd",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        *PLAIN_SETTINGS,
        "PrologFlags=Serial  # the site's: must survive ingero's merge",
        "Epilog=/etc/slurm/epilog.d/*",
        f"NodeName={host} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=UNKNOWN",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]
    conf = box.root / "etc/slurm/slurm.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("\n".join(lines) + "\n")
    conf.chmod(0o644)
    # The container sees the host's cgroup v1 hierarchies in /proc/self/cgroup under its own
    # cgroup2 /sys/fs/cgroup; slurmd's autodetection calls that hybrid and stops. Nothing here
    # uses cgroups (proctrack/linuxproc, task/none): name the v1 plugin, which then idles.
    (box.root / "etc/slurm/cgroup.conf").write_text("CgroupPlugin=cgroup/v1\n")
    epilog = box.root / "etc/slurm/epilog.d/00-site"
    epilog.parent.mkdir(exist_ok=True)
    epilog.write_text(SITE_EPILOG)
    epilog.chmod(0o755)
    return host


def start_slurm(box: SystemdContainer) -> None:
    # Slurm resolves even "127.0.0.1" with AI_ADDRCONFIG, which finds nothing in a network
    # namespace with only 127.0.0.1/8: an address outside 127/8 (TEST-NET-1, on lo, so
    # nothing is reachable through it) makes IPv4 count as configured.
    box.run("ip", "addr", "add", "192.0.2.1/32", "dev", "lo")
    box.run("systemctl", "start", "munge.service", "slurmctld.service", "slurmd.service")

    def idle() -> bool:
        out = box.run("sinfo", "-h", "-o", "%t", check=False).stdout.split()
        return out == ["idle"]

    assert wait_for(idle, timeout=60), box.journal("-u", "slurmctld", "-u", "slurmd", "-o", "cat")


@dataclass(frozen=True)
class JobRun:
    job_id: str
    job_file: dict[str, object]
    task_env: list[str]
    site_epilog_ran: bool
    job_file_left: bool


def run_job(box: SystemdContainer) -> JobRun:
    """One sbatch job, waited for; what the prolog, task prolog and epilogs left behind."""
    script = box.root / "var/tmp/job.sh"
    script.write_text(JOB)
    sub = box.run(
        "sbatch", "--parsable", "--wait", "-o", "/var/tmp/job.log", "/var/tmp/job.sh", timeout=120
    )
    job_id = sub.stdout.strip().split(";")[0]
    assert job_id.isdigit(), sub
    log = (box.root / "var/tmp/job.log").read_text()
    assert log == "", log
    site_log = box.root / "var/tmp/site-epilog.log"
    job_file = box.root / f"run/ingero/jobs/{job_id}.json"
    # epilogs run after the job: wait for ours (the job file goes) and the site's
    wait_for(lambda: not job_file.exists() and site_log.exists(), timeout=30)
    return JobRun(
        job_id=job_id,
        job_file=json.loads((box.root / "var/tmp/job.json").read_text()),
        task_env=(box.root / "var/tmp/task-env.txt").read_text().splitlines(),
        site_epilog_ran=site_log.exists() and job_id in site_log.read_text().split(),
        job_file_left=job_file.exists(),
    )


def prolog_flags(box: SystemdContainer) -> str:
    """PrologFlags as the running slurmctld has them."""
    for line in box.run("scontrol", "show", "config").stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "PrologFlags":
            return value.strip()
    raise AssertionError("scontrol show config has no PrologFlags")
