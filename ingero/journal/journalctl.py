"""The one place ingero runs ``journalctl``: a query in, journal JSON lines out."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from ingero.runtime.errors import UnavailableError, UsageError
from ingero.schema.events import MESSAGE_IDS


@dataclass(frozen=True)
class Query:
    """Which ingero events to read. Matches on one field are OR-ed, across fields AND-ed."""

    types: Sequence[str]
    node: str | None = None
    job: str | None = None
    cluster: str | None = None
    since: str | None = None
    until: str | None = None
    unit: str | None = None
    directory: str | None = None

    def args(self) -> list[str]:
        """journalctl arguments; matches are ``FIELD=VALUE`` words, so no shell is involved."""
        out = ["-o", "json", "--no-pager", "--quiet"]
        for flag, value in (
            ("--since", self.since),
            ("--until", self.until),
            ("--unit", self.unit),
            ("--directory", self.directory),
        ):
            if value:
                out += [flag, value]
        out += [f"MESSAGE_ID={MESSAGE_IDS[t]}" for t in self.types]
        for name, value in (
            ("INGERO_NODE", self.node),
            ("INGERO_JOB", self.job),
            ("INGERO_CLUSTER", self.cluster),
        ):
            if value is not None:
                out.append(f"{name}={value}")
        return out


class Journalctl:
    """Reads the journal by running ``journalctl``, streaming its output."""

    def __init__(self, binary: str = "journalctl") -> None:
        self.binary = binary

    def lines(self, query: Query) -> Iterator[str]:
        path = shutil.which(self.binary)
        if path is None:
            raise UnavailableError(f"{self.binary} not found: is this a systemd host?")
        with subprocess.Popen(
            [path, *query.args()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
        ) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            yield from proc.stdout
            err = proc.stderr.read().strip()
            code = proc.wait()
        if code != 0:
            # journalctl's own message says what it could not parse or open
            raise UsageError(f"journalctl: {err or f'exit status {code}'}")
