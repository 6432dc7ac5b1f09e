"""Fake cluster nodes for the fan-out tests: one real OpenSSH ``sshd`` per node on loopback.

Each node gets its own port, its own host key (pinned in a known_hosts file under the node's
name, so host keys are checked as on a real cluster) and its own node DB, which its sshd
hands to every session as ``INGERO_DB`` (``SetEnv``): the remote ``ingero`` then reads that
node's DB by default, as each real node reads its own. One client key, generated here, is
the only authorized key. The client side is an ssh_config file naming every node, passed
with ``--ssh-options '-F FILE'``. Every sshd runs in the foreground as a child of the test
and is stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def missing_reason() -> str | None:
    """Why real sshd nodes cannot be started here, or None when they can."""
    if os.geteuid() != 0:
        return "sshd for root logins on loopback needs root"
    for binary in (SSHD, "ssh", "ssh-keygen"):
        if shutil.which(binary) is None:
            return f"{binary} not installed (openssh-server/openssh-client, tests/apt-packages.txt)"
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Nodes:
    root: Path
    ssh_config: Path
    ports: dict[str, int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def ssh_options(self) -> str:
        return f"-F {self.ssh_config}"


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
        check=True,
    )
    return path.with_suffix(".pub").read_text().strip()


def _wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sshd on port {port} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"sshd on port {port} did not listen within {timeout:g}s")


@contextmanager
def silent_listener() -> Iterator[int]:
    """A port that accepts TCP connections and never answers: a hung node."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
                held.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield int(server.getsockname()[1])
    finally:
        stop.set()
        thread.join(2)
        for conn in held:
            conn.close()
        server.close()


@contextmanager
def ssh_nodes(
    root: Path,
    dbs: Mapping[str, Path],
    unreachable: Sequence[str] = (),
    hung: Mapping[str, int] | None = None,
) -> Iterator[Nodes]:
    """An sshd per name of ``dbs``; ``unreachable`` names get a port nobody listens on,
    ``hung`` names the port of a listener that never answers."""
    root.mkdir(parents=True, exist_ok=True)
    # sshd refuses to start without its privilege separation directory.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    client_pub = _keygen(root / "id_client")
    (root / "authorized_keys").write_text(client_pub + "\n")
    known, config = [], []
    ports = {name: free_port() for name in [*dbs, *unreachable]}
    ports.update(hung or {})
    nodes = Nodes(root, root / "ssh_config", ports)
    try:
        for name, db in dbs.items():
            home = root / name
            home.mkdir()
            host_pub = _keygen(home / "ssh_host_ed25519_key")
            known.append(f"{name} {host_pub}")
            conf = home / "sshd_config"
            conf.write_text(
                "\n".join(
                    [
                        f"Port {ports[name]}",
                        "ListenAddress 127.0.0.1",
                        f"HostKey {home / 'ssh_host_ed25519_key'}",
                        f"PidFile {home / 'sshd.pid'}",
                        f"AuthorizedKeysFile {root / 'authorized_keys'}",
                        "PubkeyAuthentication yes",
                        "PasswordAuthentication no",
                        "KbdInteractiveAuthentication no",
                        "PermitRootLogin prohibit-password",
                        "UsePAM no",
                        "StrictModes no",
                        "PrintMotd no",
                        f"SetEnv INGERO_DB={db}",
                        "LogLevel ERROR",
                        "",
                    ]
                )
            )
            log = (home / "sshd.log").open("wb")
            proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(conf)], stdout=log, stderr=subprocess.STDOUT
            )
            nodes.procs[name] = proc
        for name, proc in nodes.procs.items():
            _wait_port(ports[name], proc)
        (root / "known_hosts").write_text("\n".join(known) + "\n")
        for name, port in ports.items():
            config += [
                f"Host {name}",
                "  HostName 127.0.0.1",
                f"  Port {port}",
                f"  HostKeyAlias {name}",
                "  User root",
                f"  IdentityFile {root / 'id_client'}",
                "  IdentitiesOnly yes",
                f"  UserKnownHostsFile {root / 'known_hosts'}",
                "  StrictHostKeyChecking yes",
                "  LogLevel ERROR",
            ]
        nodes.ssh_config.write_text("\n".join(config) + "\n")
        yield nodes
    finally:
        for proc in nodes.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in nodes.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
