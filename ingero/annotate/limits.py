"""What the annotate server holds at most: its bounds, written once, here.

Standard library only, so the command line reads the defaults without loading the server.
Memory follows from them: per client at most ``line.max_line_bytes`` of partial line plus
one read (``READ_BYTES``) and ``MAX_REPLY_BYTES`` of refusals; per remembered pid a bucket
and at most ``max_open_phases`` phase names; per remembered uid a bucket.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from ingero.annotate.codec import DEFAULT_LIMITS, Limits


@dataclass(frozen=True)
class ServerLimits:
    lines_per_s: float = 100.0  # per writer (pid), a token bucket ...
    burst: int = 200  # ... holding this many lines
    # Per uid, over all its processes: a writer forking a new pid per burst draws on it too.
    # Eight ranks of one job at the pid rate fit.
    uid_lines_per_s: float = 1000.0
    uid_burst: int = 2000
    max_clients: int = 64
    # One user's connections at once: the others always find a free client.
    max_clients_per_uid: int = 16
    # Pids and uids whose buckets (and open phases) are remembered after their connections
    # close; the least recently used are forgotten first.
    max_writers: int = 4096
    max_open_phases: int = 16  # per writer
    # A connection that sent nothing for idle_s, or sits inside a line for line_timeout_s,
    # is answered ``idle`` and closed (the client connects again at its next mark).
    idle_s: float = 300.0
    line_timeout_s: float = 10.0
    line: Limits = DEFAULT_LIMITS


# How long a stop goes on reading what writers already sent: bounded, so a client that
# never stops writing cannot hold the stop (systemd would SIGKILL it, losing every mark).
DRAIN_S: Final = 2.0
