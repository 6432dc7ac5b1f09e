"""Child processes of the demo: started in their own session, stopped by PID."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO


@dataclass
class Child:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def tail(self, lines: int = 5) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class Children:
    """Starts ``python -m ingero.cli.main …`` children; ``stop_all`` ends each by its PID."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.children: list[Child] = []

    def start(
        self,
        name: str,
        args: list[str],
        env: dict[str, str] | None = None,
        stdout: int | IO[bytes] | None = None,
    ) -> Child:
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            # A session of its own: Ctrl-C reaches only the demo, which then stops each child.
            process = subprocess.Popen(
                [sys.executable, "-m", "ingero.cli.main", *args],
                stdin=subprocess.DEVNULL,
                stdout=stdout if stdout is not None else log,
                stderr=log,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        child = Child(name, process, log_path)
        self.children.append(child)
        return child

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.process.poll() is not None]

    def stop_all(self, timeout: float = 5.0) -> None:
        """SIGTERM each child by PID, then SIGKILL those still running after ``timeout``."""
        for child in reversed(self.children):
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGTERM)
        for child in reversed(self.children):
            try:
                child.process.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
                child.process.wait()
            if child.process.stdout is not None:
                child.process.stdout.close()
