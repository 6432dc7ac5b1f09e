"""A real Slurm cluster on one host for the integration tests (adapted from the lab's up.sh).

Starts its own munged (own key and socket), one slurmctld and N ``slurmd -N nX`` daemons,
all in the foreground as children of the test process so each is stopped by its PID and
reaped. Nothing under /etc is touched: every command gets ``SLURM_CONF`` in its environment
and slurm.conf points munge at the private socket with ``AuthInfo``.

Slurm comes from Debian's packages (22.05) or, with ``prefix``, from a build under that
prefix (tests/slurm25/build.sh): its bin/ and sbin/ lead ``PATH`` in the cluster's
environment, so two clusters of different releases run side by side on their own ports.

With ``accounting`` (a MariaDB server, :func:`mariadb_server`, one per test session) the
cluster also runs its own slurmdbd, of its own release, on its own database of that server,
so ``sacct`` and ``sacctmgr`` read and change the jobs' accounting records.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch", "srun")


def slurm_path(prefix: Path | None) -> str:
    """``PATH`` with a Slurm build's bin/ and sbin/ first (unchanged without a prefix)."""
    path = os.environ.get("PATH", "/usr/bin:/bin")
    return f"{prefix / 'bin'}:{prefix / 'sbin'}:{path}" if prefix else path


def missing_reason(prefix: Path | None = None) -> str | None:
    """Why a cluster cannot be started here, or None when it can."""
    if os.geteuid() != 0:
        return "a Slurm cluster needs root (slurmd runs jobs as their users)"
    path = slurm_path(prefix)
    absent = [b for b in BINARIES if shutil.which(b, path=path) is None]
    if absent:
        return (
            f"Slurm/munge not installed (missing {', '.join(absent)}; see tests/apt-packages.txt)"
        )
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "the munge user does not exist (install the munge package)"
    return None


def free_ports(count: int) -> list[int]:
    """Distinct free loopback TCP ports (closed again; the daemons bind them right after)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


@dataclass(frozen=True)
class MariaDb:
    """A MariaDB server on loopback (no grant tables: any user, no password)."""

    host: str
    port: int


def mariadb_missing_reason() -> str | None:
    """Why no MariaDB server can be started here (tests/apt-packages.txt), or None."""
    absent = [b for b in ("mariadbd", "mariadb-install-db") if shutil.which(b) is None]
    return f"MariaDB not installed (missing {', '.join(absent)})" if absent else None


@contextmanager
def mariadb_server(root: Path) -> Iterator[MariaDb]:
    """A MariaDB server with its data under ``root``, stopped by its PID on exit.

    Grant tables are skipped: it listens on 127.0.0.1 only and holds nothing but the test
    clusters' accounting, so slurmdbd connects as any user without a password.
    """
    data = root / "data"
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mariadb-install-db", "--no-defaults", "--user=root", f"--datadir={data}",
         "--auth-root-authentication-method=normal", "--skip-test-db"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    port = free_ports(1)[0]
    log = open(root / "mariadbd.log", "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        ["mariadbd", "--no-defaults", "--user=root", f"--datadir={data}",
         f"--socket={root / 'mariadb.sock'}", f"--port={port}", "--bind-address=127.0.0.1",
         "--skip-grant-tables", "--skip-log-bin", "--innodb-buffer-pool-size=32M",
         f"--pid-file={root / 'mariadbd.pid'}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    log.close()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"mariadbd did not start; log in {root / 'mariadbd.log'}"
                    ) from None
                time.sleep(0.1)
        yield MariaDb("127.0.0.1", port)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@dataclass
class SlurmCluster:
    root: Path
    node_names: list[str]
    cluster_name: str
    conf: Path
    env: dict[str, str]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def run(
        self, args: Sequence[str], timeout: float = 30, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout, check=check
        )

    def _spawn(self, name: str, args: Sequence[str], user: str | None = None) -> None:
        cmd = (["runuser", "-u", user, "--"] if user else []) + list(args)
        log = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - owned by the child
        self.procs[name] = subprocess.Popen(
            cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def start_controller(self) -> None:
        if (self.conf.parent / "slurmdbd.conf").exists() and "slurmdbd" not in self.procs:
            self.start_dbd()
        self._spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        self.wait(lambda: "is UP" in self.run(["scontrol", "ping"], check=False).stdout, 20)

    def start_dbd(self) -> None:
        """slurmdbd (it reads slurmdbd.conf beside SLURM_CONF), then this cluster in its
        database, which slurmctld registers with when it starts."""
        self._spawn("slurmdbd", ["slurmdbd", "-D"])
        self.wait(
            lambda: self.run(["sacctmgr", "-n", "list", "cluster"], check=False).returncode == 0,
            60,
            "slurmdbd to answer",
        )
        self.run(["sacctmgr", "-i", "add", "cluster", self.cluster_name], check=False)

    def stop_process(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def wait(self, predicate: object, timeout: float, what: str = "condition") -> None:
        assert callable(predicate)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.2)
        raise TimeoutError(f"timed out waiting for {what}; logs in {self.root / 'log'}")

    def idle_nodes(self) -> set[str]:
        out = self.run(["sinfo", "-h", "-N", "-t", "idle", "-o", "%N"], check=False).stdout
        return set(out.split())

    def wait_idle(self, timeout: float = 60) -> None:
        self.wait(lambda: self.idle_nodes() >= set(self.node_names), timeout, "all nodes idle")

    def stop(self) -> None:
        if "slurmctld" in self.procs:
            jobs = self.run(["squeue", "-h", "-o", "%i"], check=False, timeout=10).stdout.split()
            if jobs:
                self.run(["scancel", "--full", *jobs], check=False, timeout=10)
        for name in [n for n in self.procs if n.startswith("slurmd-")]:
            self.stop_process(name)
        self.stop_process("slurmctld")
        self.stop_process("slurmdbd")
        self.stop_process("munged")


# A small cluster on one host: no cgroups, accounting or MPI; jobs scheduled at once.
PLAIN_SETTINGS = (
    "SlurmctldDebug=info",
    "SlurmdDebug=info",
    "ProctrackType=proctrack/linuxproc",
    "TaskPlugin=task/none",
    "MpiDefault=none",
    "JobAcctGatherType=jobacct_gather/none",
    "AccountingStorageType=accounting_storage/none",
    "JobCompType=jobcomp/none",
    "SchedulerType=sched/backfill",
    "PriorityType=priority/basic",  # 22.05's default; 25.11 defaults to multifactor
    "SchedulerParameters=batch_sched_delay=0",
    "SelectType=select/cons_tres",
    "SelectTypeParameters=CR_Core",
    "SlurmdParameters=config_overrides",
    "ReturnToService=2",
    "SlurmdTimeout=30",
    "MessageTimeout=5",
    "InactiveLimit=0",
    "KillWait=5",
    "MinJobAge=300",
)


def _write_conf(
    root: Path,
    nodes: list[str],
    cluster_name: str,
    ctld_port: int,
    node_ports: list[int],
    hooks: dict[str, Path],
    gpus: int,
    extra_conf: Sequence[str],
    dbd_port: int | None = None,
) -> Path:
    host = socket.gethostname().split(".")[0]
    settings = list(PLAIN_SETTINGS)
    if dbd_port is not None:
        settings = [s for s in settings if not s.startswith("AccountingStorageType=")]
        settings += [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={dbd_port}",
            # The munge socket of slurmdbd's connections (AuthInfo's is not used for them).
            f"AccountingStoragePass={root}/munge/munge.socket",
        ]
    lines = [
        f"ClusterName={cluster_name}",
        f"SlurmctldHost={host}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={root}/munge/munge.socket",
        f"StateSaveLocation={root}/state",
        f"SlurmdSpoolDir={root}/spool/%n",
        f"SlurmctldPidFile={root}/run/slurmctld.pid",
        f"SlurmdPidFile={root}/run/slurmd-%n.pid",
        f"SlurmctldLogFile={root}/log/slurmctld.log",
        f"SlurmdLogFile={root}/log/slurmd-%n.log",
        *settings,
        "PrologFlags=Alloc",
    ]
    for key, path in hooks.items():
        lines.append(f"{key}={path}")
    gres = ""
    if gpus:
        for g in range(gpus):
            link = root / "dev" / f"gpu{g}"
            link.parent.mkdir(exist_ok=True)
            link.symlink_to("/dev/null")
        (root / "etc" / "gres.conf").write_text(f"Name=gpu File={root}/dev/gpu[0-{gpus - 1}]\n")
        lines.append("GresTypes=gpu")
        gres = f"Gres=gpu:{gpus}"
    for name, port in zip(nodes, node_ports, strict=True):
        lines.append(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs=2 RealMemory=1000 {gres} State=UNKNOWN"
        )
    lines.append("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP")
    lines.extend(extra_conf)
    conf = root / "etc" / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


@contextmanager
def slurm_cluster(
    root: Path,
    nodes: int = 3,
    hooks: dict[str, Path] | None = None,
    gpus: int = 0,
    cluster_name: str = "ingerotest",
    extra_conf: Sequence[str] = (),
    prefix: Path | None = None,
    accounting: MariaDb | None = None,
) -> Iterator[SlurmCluster]:
    """Start munged (+ slurmdbd on ``accounting``) + slurmctld + ``nodes`` slurmd under
    ``root``; stop them all on exit."""
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    for sub in ("etc", "state", "run", "log", "munge"):
        (root / sub).mkdir(exist_ok=True)
    names = [f"n{i}" for i in range(1, nodes + 1)]
    for name in names:
        (root / "spool" / name).mkdir(parents=True, exist_ok=True)
    munge_dir = root / "munge"
    key = munge_dir / "munge.key"
    if not key.exists():
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True)
    shutil.chown(munge_dir, "munge", "munge")
    shutil.chown(key, "munge", "munge")
    munge_dir.chmod(0o755)
    key.chmod(0o600)
    ports = free_ports(nodes + (2 if accounting else 1))
    dbd_port = ports.pop() if accounting else None
    conf = _write_conf(
        root, names, cluster_name, ports[0], ports[1:], hooks or {}, gpus, extra_conf, dbd_port
    )
    if accounting is not None:
        dbd_conf = root / "etc" / "slurmdbd.conf"
        dbd_conf.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={munge_dir}/munge.socket",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={dbd_port}",
                    "SlurmUser=root",
                    "DebugLevel=info",
                    f"LogFile={root}/log/slurmdbd.log",
                    f"PidFile={root}/run/slurmdbd.pid",
                    "StorageType=accounting_storage/mysql",
                    f"StorageHost={accounting.host}",
                    f"StoragePort={accounting.port}",
                    "StorageUser=slurm",
                    # One database per cluster: two releases' schemas never meet.
                    f"StorageLoc=acct_{cluster_name}_{dbd_port}",
                ]
            )
            + "\n"
        )
        dbd_conf.chmod(0o600)  # slurmdbd refuses a config others can read
    if prefix:
        # The build has no cgroup plugin (nor needs one: proctrack/linuxproc, task/none);
        # without this line slurmd looks for one and fails. 22.05 knows no "disabled".
        (root / "etc" / "cgroup.conf").write_text("CgroupPlugin=disabled\n")
    # Neither the runner's Slurm nor its INGERO_* (tests/run.sh exports its own): a job here
    # sees only what the cluster and ingero's hooks give it, as on a fresh node.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "INGERO_"))}
    env["SLURM_CONF"] = str(conf)
    env["PATH"] = slurm_path(prefix)
    if prefix:
        # built without rpath (as packagers do): libslurm and libslurmfull from the prefix
        env["LD_LIBRARY_PATH"] = f"{prefix / 'lib'}:{prefix / 'lib' / 'slurm'}"
    cluster = SlurmCluster(root, names, cluster_name, conf, env)
    try:
        cluster._spawn(
            "munged",
            [
                "munged",
                "-F",
                f"--socket={munge_dir}/munge.socket",
                f"--key-file={key}",
                f"--pid-file={munge_dir}/munged.pid",
                f"--log-file={munge_dir}/munged.log",
                f"--seed-file={munge_dir}/munged.seed",
            ],
            user="munge",
        )
        cluster.wait(lambda: (munge_dir / "munge.socket").exists(), 10, "munged socket")
        cluster.start_controller()
        for name in names:
            cluster._spawn(f"slurmd-{name}", ["slurmd", "-D", "-f", str(conf), "-N", name])
        cluster.wait_idle()
        yield cluster
    finally:
        cluster.stop()
