"""Each inference server's decode steps, judged against the server's own baseline (pure).

A node may run several servers (replicas of one model, one per GPU, say). The node pushes
the median of their decode step rates (``inference_step_rate``), the rate peers compare;
a median hides one slow replica among several. So each server's decode step rate is also
kept apart, with a baseline of its own, and the node's throughput is its slowest server's:
without a peer median, the lowest ratio of a server's rate to its own baseline; with one,
the lowest server rate against the peers' median (ingero.push.sampler).

The same holds for the speeds a server's own /metrics give: its per-token speed
(``inference_token_rate``) and, where the engine times its forward steps (TGI, Triton),
its step rate in place of the tracer's. Each server's has a baseline of its own (its source
is ``(pid, METRICS)``), and the node is as slow as its slowest server by the rate judged.

The key is (server pid, decode stream): the server's process and its decode stream's
(pid, handle) (``ingero.push.streams``). Both die with the process, and a stream handle is
an address that a restarted server does not get back, so the baselines live in memory:
a server that is gone is dropped, a server whose decode stream changes (a restart, another
worker's stream taking the lead by ``streams.SWITCH_MARGIN``) starts again from nothing,
and a restart of fleet-push learns them again. A server is judged only once its baseline has ``warmup`` samples; before
that it is neutral (neither slow nor fast). There is no stable identity to persist them
under: two replicas of one model on one node share engine, model and role, and a port
says nothing of the GPU or the load behind it after a restart. At most ``MAX_SERVERS``
are kept, the most recently learned.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from ingero.nodedb.window import StreamWindow
from ingero.push.baseline import EmaBaseline
from ingero.push.engines import MAX_ENGINES
from ingero.push.streams import decode_steps

# One baseline per server: the node's servers that fleet-push keeps state for.
MAX_SERVERS = MAX_ENGINES
# The "stream" of a rate a server's own /metrics give.
METRICS = "/metrics"


@dataclass(frozen=True)
class ServerStep:
    """One server's speed in one window: its decode steps, or its /metrics token rate."""

    server: int  # the server's pid
    # Its decode stream (pid, handle), or (its pid, METRICS); None: syncs per second.
    stream: tuple[int, str] | None
    rate: float  # decode steps per second of step time (else its syncs, or tokens, per s)
    baseline: float | None = None  # its own baseline; None: not judged yet (neutral)

    @property
    def ratio(self) -> float | None:
        """The rate against the server's own baseline; None where it has none."""
        if self.baseline is None or self.baseline <= 0:
            return None
        return self.rate / self.baseline


def metered(rates: Mapping[int, float | None]) -> tuple[ServerStep, ...]:
    """Each server's speed from its own /metrics (server pid → its per-token speed, or its
    forward steps per second of step time; None: it served nothing)."""
    return tuple(
        ServerStep(pid, (pid, METRICS), rate) for pid, rate in sorted(rates.items()) if rate
    )


def measure(
    streams: Mapping[tuple[int, str], StreamWindow],
    syncs: Mapping[int, int],
    covered_s: float,
    trees: Mapping[int, Collection[int]],
    held: Mapping[int, tuple[int, str] | None] | None = None,
) -> tuple[ServerStep, ...]:
    """Each server's steps: of its process tree, the decode stream's decode steps
    (1 / their mean time), or where no stream is known (a node DB before version 6, syncs
    that name no stream) the tree's synchronize calls per second; servers that did not
    step are left out (no load is not slowness). ``held``: each server's decode stream so
    far (``ServerBaselines.streams``), kept while it leads or nearly does."""
    out = []
    for server, tree in sorted(trees.items()):
        found = decode_steps(streams, tree, (held or {}).get(server))
        if found is not None:
            out.append(ServerStep(server, *found))
            continue
        rate = sum(syncs.get(pid, 0) for pid in tree) / covered_s if covered_s > 0 else 0.0
        if rate > 0:
            out.append(ServerStep(server, None, rate))
    return tuple(out)


@dataclass
class _Entry:
    stream: tuple[int, str] | None  # None: the server's syncs per second
    baseline: EmaBaseline
    learned: int  # the learning sample it was last updated in (the oldest goes first)


class ServerBaselines:
    """The baselines of the node's servers, by server pid, each for one source of steps:
    a decode stream, the syncs per second (None) or the /metrics (``(pid, METRICS)``)."""

    def __init__(
        self,
        *,
        alpha: float,
        alpha_down: float | None,
        warmup: int,
        max_servers: int = MAX_SERVERS,
    ) -> None:
        self.alpha = alpha
        self.alpha_down = alpha_down
        self.warmup = warmup
        self.max_servers = max_servers
        self.entries: dict[int, _Entry] = {}
        self.learned = 0

    def judge(self, steps: tuple[ServerStep, ...]) -> tuple[ServerStep, ...]:
        """The steps with each server's own baseline where it has a warm one for the same
        decode stream."""
        out = []
        for step in steps:
            entry = self.entries.get(step.server)
            baseline = None
            if (
                entry is not None
                and entry.stream == step.stream
                and entry.baseline.n >= self.warmup
            ):
                baseline = entry.baseline.estimate
            out.append(ServerStep(step.server, step.stream, step.rate, baseline))
        return tuple(out)

    def learn(self, steps: tuple[ServerStep, ...]) -> None:
        """One learning sample: each server's rate updates its decode stream's baseline (a
        new stream, a new baseline); a server without stream rows learns its syncs per
        second, a baseline of their own (a server changing between the two starts again:
        the units differ)."""
        self.learned += 1
        for step in steps:
            entry = self.entries.get(step.server)
            if entry is None or entry.stream != step.stream:
                entry = _Entry(step.stream, EmaBaseline(self.alpha, self.alpha_down), 0)
                self.entries[step.server] = entry
            entry.baseline.update(step.rate)
            entry.learned = self.learned
        while len(self.entries) > self.max_servers:
            oldest = min(self.entries, key=lambda pid: (self.entries[pid].learned, pid))
            del self.entries[oldest]

    def streams(self) -> dict[int, tuple[int, str] | None]:
        """Each server's decode stream so far (None: its syncs per second)."""
        return {pid: entry.stream for pid, entry in self.entries.items()}

    def prune(self, live: Collection[int]) -> None:
        """Drop the baselines of servers that are gone."""
        for pid in [p for p in self.entries if p not in live]:
            del self.entries[pid]


def slowest(steps: tuple[ServerStep, ...], *, by_rate: bool = False) -> ServerStep | None:
    """The judged server with the lowest ratio to its own baseline; ``by_rate``: the server
    with the lowest rate (against a peer median every server is judged, its own baseline
    warm or not). None where none is judged (ties: the lower pid)."""
    judged = [
        (s.rate if by_rate else ratio, s.server, s)
        for s in steps
        if (ratio := s.ratio) is not None or by_rate
    ]
    return min(judged, key=lambda j: (j[0], j[1]))[2] if judged else None
