"""A real ``ingero annotate serve`` process on a temporary socket and node DB."""

from __future__ import annotations

import importlib.util
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CONTRIB = ROOT / "contrib" / "annotate"


def contrib_module(name: str) -> ModuleType:
    """A callback module from contrib/annotate, loaded from its file as a user would."""
    spec = importlib.util.spec_from_file_location(name, CONTRIB / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass
class Server:
    socket: Path
    db: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        conn = sqlite3.connect(f"file:{self.db}?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql, args)]
        finally:
            conn.close()

    def marks(self) -> list[dict[str, Any]]:
        return self.rows("SELECT * FROM marks ORDER BY rowid")

    def stop(self) -> str:
        """Stop the server (it writes what it holds first); its log."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.log.read_text()


@contextmanager
def annotate_server(tmp: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[Server]:
    """``ingero annotate serve`` on tmp/annotate.sock writing tmp/node.db; stopped after.
    ``env`` is laid over this process's environment (INGERO_JOBS_DIR, say)."""
    sock, db, log = tmp / "annotate.sock", tmp / "node.db", tmp / "annotate.log"
    argv = [sys.executable, "-m", "ingero.cli.main", "annotate", "serve"]
    argv += ["--socket", str(sock), "--db", str(db), "--flush", "0.1", *extra]
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    server = Server(sock, db, proc, log)
    try:
        deadline = time.monotonic() + 60
        # The log line, not a probe connection: a probe would hold one of the clients
        # until the server reads its end.
        while "listening on" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"annotate server did not listen: {log.read_text()}")
            time.sleep(0.05)
        yield server
    finally:
        server.stop()
