"""Real users, a real group and Slurm-shaped cgroups for the annotate server's tenancy tests.

The suite runs as root: each helper creates what it needs (``useradd``/``groupadd``, a
directory in a real cgroup hierarchy laid out as slurmstepd lays out a job's) and removes it
after; each skips with the reason where it cannot (not root, no tool, no writable cgroup).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# Another user's interpreter: the system one, with the worktree on its path (the client and
# its codec are standard library only, as a job imports them).
PYTHON = "/usr/bin/python3"

# Sends each argv line on one connection, reads the answers to EOF, prints them (stdlib only).
WRITE = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print("connect failed", exc.errno); sys.exit(3)
for line in sys.argv[2:]:
    s.sendall(line.encode() + b"\\n")
s.shutdown(socket.SHUT_WR)
out = b""
while chunk := s.recv(65536):
    out += chunk
sys.stdout.write(out.decode())
"""


def need_root(*tools: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates throwaway users, a group and cgroups")
    for tool in tools:
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")


@dataclass
class Users:
    group: str
    names: list[str]
    uids: dict[str, int] = field(default_factory=dict)

    def argv(self, name: str, *command: str) -> list[str]:
        """``command`` as user ``name`` with the group as its primary group."""
        return ["setpriv", f"--reuid={name}", f"--regid={self.group}", "--init-groups",
                *command]  # fmt: skip


@contextmanager
def throwaway_users(count: int) -> Iterator[Users]:
    """``count`` users in one new group, deleted after (by name, those this call made)."""
    need_root("useradd", "groupadd", "userdel", "groupdel", "setpriv")
    tag = f"{os.getpid() % 100000}"
    group = f"ingt-g{tag}"
    names = [f"ingt-{chr(ord('a') + i)}{tag}" for i in range(count)]
    made: list[str] = []
    subprocess.run(["groupadd", group], check=True, capture_output=True)
    try:
        for name in names:
            subprocess.run(
                ["useradd", "-M", "-N", "-g", group, "-s", "/usr/sbin/nologin", name],
                check=True, capture_output=True,
            )  # fmt: skip
            made.append(name)
        yield Users(group, names, {n: pwd.getpwnam(n).pw_uid for n in names})
    finally:
        for name in made:
            subprocess.run(["userdel", name], check=False, capture_output=True)
        subprocess.run(["groupdel", group], check=False, capture_output=True)


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, type, options) of the cgroup mounts."""
    out = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
            out.append((parts[1], parts[2], parts[3]))
    return out


class SlurmCgroups:
    """Job cgroups where slurmstepd puts a job's tasks: cgroup v2
    ``/system.slice/slurmstepd.scope/job_<id>/step_0/user/task_0``, cgroup v1
    ``/slurm/uid_<uid>/job_<id>/step_0/task_0``; only what this made is removed."""

    def __init__(self) -> None:
        self.v2: Path | None = None
        self.v1: Path | None = None
        for point, kind, options in _mounts():
            if "rw" not in options.split(","):
                continue
            if kind == "cgroup2" and self.v2 is None:
                self.v2 = Path(point)
            elif kind == "cgroup" and self.v1 is None and "freezer" in options.split(","):
                self.v1 = Path(point)
        self._made: list[Path] = []

    def leaf(self, version: int, job_id: str, uid: int) -> Path:
        root = self.v2 if version == 2 else self.v1
        if root is None:
            pytest.skip(f"no writable cgroup v{version} hierarchy here")
        if version == 2:
            parts = ["system.slice", "slurmstepd.scope", f"job_{job_id}", "step_0", "user",
                     "task_0"]  # fmt: skip
        else:
            parts = ["slurm", f"uid_{uid}", f"job_{job_id}", "step_0", "task_0"]
        path = root
        for part in parts:
            path = path / part
            if not path.exists():
                try:
                    path.mkdir()
                except OSError as exc:
                    pytest.skip(f"cannot create a cgroup in {root}: {exc}")
                self._made.append(path)
        return path

    @staticmethod
    def argv(leaf: Path, *command: str) -> list[str]:
        """``command`` started inside ``leaf`` (moved there by a root shell, then exec'd)."""
        return ["sh", "-c", f'echo $$ > {leaf}/cgroup.procs && exec "$@"', "sh", *command]

    def remove(self) -> None:
        for path in reversed(self._made):
            for _ in range(50):  # a task just exited may hold it a moment
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
        self._made.clear()


@contextmanager
def slurm_cgroups() -> Iterator[SlurmCgroups]:
    need_root()
    groups = SlurmCgroups()
    try:
        yield groups
    finally:
        groups.remove()


def public_env(**extra: str) -> dict[str, str]:
    """A clean environment for another user's process: the worktree on its path."""
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **extra}
