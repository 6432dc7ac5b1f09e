"""What the demo knows about each node, from the agents' sd_notify STATUS lines.

Each fleet-push gets its own ``NOTIFY_SOCKET`` (a datagram socket the demo owns), so the demo
reads the same status line systemd would show, without any private channel into the agent.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
from dataclasses import dataclass
from pathlib import Path

_STATUS_RE = re.compile(
    r"^(?P<state>\w+)(?: \((?P<held>[^)]*)\))? score=(?P<score>[-\d.]+) mode=(?P<mode>[\w-]+|None)"
    r" threshold=(?P<threshold>[-\d.]+)(?P<straggler> STRAGGLER)?(?: WAITING (?P<waiting>.+))?"
)


@dataclass(frozen=True)
class NodeStatus:
    state: str
    score: float | None
    mode: str | None
    threshold: float | None
    straggling: bool
    raw: str
    waiting: str | None = None  # whom its NCCL rank waits for ("for rank 5 (…) in … #N")


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_status(line: str) -> NodeStatus:
    """Parse ``active score=0.912 mode=fleet threshold=0.850 STRAGGLER``; unknown forms keep raw."""
    match = _STATUS_RE.match(line.strip())
    if match is None:
        return NodeStatus("unknown", None, None, None, False, line.strip())
    mode = match["mode"]
    return NodeStatus(
        state=match["state"],
        score=_float(match["score"]),
        mode=None if mode == "None" else mode,
        threshold=_float(match["threshold"]),
        straggling=match["straggler"] is not None,
        raw=line.strip(),
        waiting=match["waiting"],
    )


def parse_notify(datagram: bytes) -> dict[str, str]:
    """``KEY=value`` lines of one sd_notify datagram."""
    fields: dict[str, str] = {}
    for line in datagram.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key] = value
    return fields


class NotifyListener:
    """One datagram socket per node; ``poll`` returns the newest status each node sent."""

    def __init__(self, directory: Path, nodes: list[str]) -> None:
        self.paths: dict[str, Path] = {}
        self._socks: dict[int, tuple[str, socket.socket]] = {}
        for node in nodes:
            path = directory / f"notify-{node}.sock"
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            sock.bind(str(path))
            sock.setblocking(False)
            self.paths[node] = path
            self._socks[sock.fileno()] = (node, sock)
        self.ready: set[str] = set()

    def poll(self, timeout: float) -> dict[str, NodeStatus]:
        updates: dict[str, NodeStatus] = {}
        readable, _, _ = select.select(list(self._socks), [], [], max(0.0, timeout))
        for fd in readable:
            node, sock = self._socks[fd]
            while True:
                try:
                    datagram = sock.recv(4096)
                except (BlockingIOError, InterruptedError):
                    break
                fields = parse_notify(datagram)
                if fields.get("READY") == "1":
                    self.ready.add(node)
                if "STATUS" in fields:
                    updates[node] = parse_status(fields["STATUS"])
        return updates

    def close(self) -> None:
        for _, sock in self._socks.values():
            sock.close()
        for path in self.paths.values():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
