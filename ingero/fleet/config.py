"""Fleet configuration schema; the field defaults are the documented defaults (DESIGN.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ingero.otlp.ports import FLEET_API_PORT, FLEET_OTLP_GRPC_PORT, FLEET_OTLP_HTTP_PORT
from ingero.otlp.threshold import (
    ENTER_INTERVALS,
    ENTER_WINDOW,
    EXIT_INTERVALS,
    MAX_ENTER_WINDOW,
    MAX_EXIT_INTERVALS,
)
from ingero.runtime.config import HOSTPORT, Duration, check, formerly, in_range, positive
from ingero.security.ratelimit import RateLimitConfig
from ingero.security.tls import check_pair
from ingero.slurm.drain_policy import DrainConfig
from ingero.slurm.verdict import VerdictConfig


@dataclass(frozen=True)
class ListenConfig:
    otlp_grpc: str = field(default=f"0.0.0.0:{FLEET_OTLP_GRPC_PORT}", metadata=HOSTPORT)
    otlp_http: str = field(default=f"0.0.0.0:{FLEET_OTLP_HTTP_PORT}", metadata=HOSTPORT)
    api: str = field(default=f"0.0.0.0:{FLEET_API_PORT}", metadata=HOSTPORT)


@dataclass(frozen=True)
class ThresholdConfig:
    k: float = field(default=2.0, metadata=positive())
    # The margin when the peers agree (MAD near 0, as on real nodes): a 10% slowdown takes
    # 0.05-0.06 off the score, so the margin must sit below that; the enter rule, not the
    # margin, keeps one noisy interval from being an episode
    # (docs/decisions/0034-min-margin-004-three-of-five.md).
    min_margin: float = field(default=0.04, metadata=in_range(0.0, 1.0))
    # The margin also at least noise_k times the group's noise: the median over its nodes of
    # how much each one's score changes from one measurement to the next. A job whose
    # rates vary more per push than the margin allows (5% per second at a 1 s push) would
    # otherwise flag its healthy nodes; 0 turns the term off (docs/fleet-threshold.md).
    noise_k: float = field(default=3.0, metadata=in_range(0.0, 100.0))
    ema_alpha: float = field(default=0.2, metadata=check(lambda v: 0 < v <= 1, "must be in (0, 1]"))
    hysteresis: float = field(default=0.02, metadata=in_range(0.0, 1.0))
    panic_fraction: float = field(
        default=0.25, metadata=check(lambda v: 0 < v < 1, "must be in (0, 1)")
    )
    # Ticks below the threshold before an episode starts: fleet-push's rule
    # (classifier.enter_intervals), so Fleet and the node agree on who straggles...
    enter_intervals: int = field(default=ENTER_INTERVALS, metadata=in_range(1, MAX_ENTER_WINDOW))
    # ... of the last this many ticks (classifier.enter_window; at most enter_intervals: in
    # a row).
    enter_window: int = field(default=ENTER_WINDOW, metadata=in_range(1, MAX_ENTER_WINDOW))
    # An episode recovers once the score was at threshold + hysteresis or above in this many
    # measured ticks in a row (classifier.exit_intervals).
    exit_intervals: int = field(default=EXIT_INTERVALS, metadata=in_range(1, MAX_EXIT_INTERVALS))


@dataclass(frozen=True)
class QuorumConfig:
    statistical_min: int = field(default=5, metadata=check(lambda v: v >= 3, "must be at least 3"))
    coverage_fraction: float = field(default=0.8, metadata=in_range(0.0, 1.0))
    max_expected_nodes: int = field(default=10000, metadata=positive())


@dataclass(frozen=True)
class AuthConfig:
    # Tokens every listener accepts (but /healthz and /readyz), several at once: this file,
    # each of token_files and each file of token_dir, one token per file named by the
    # file's name in the audit log. SIGHUP reads them again (docs/security.md). One token
    # per file is token_file, as everywhere (echo.token_file); bearer_token_file is read too.
    token_file: str | None = field(default=None, metadata=formerly("bearer_token_file"))
    token_files: list[str] = field(default_factory=list)
    token_dir: str | None = None
    # A token a SIGHUP removed stays valid this long, so senders can switch over.
    token_grace: Duration = field(
        default=Duration(300.0), metadata=check(lambda v: v >= 0, "must be 0 or more")
    )
    tls_cert: str | None = None
    tls_key: str | None = None
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)
    # token name -> the cluster ids it may push for (ingero.fleet.scope); a token not
    # listed may push for every cluster. SIGHUP reads it again with the tokens.
    token_clusters: dict[str, list[str]] = field(default_factory=dict)

    def validate(self) -> None:
        check_pair(self.tls_cert, self.tls_key)
        for name, clusters in self.token_clusters.items():
            if not clusters:
                raise ValueError(
                    f"token_clusters.{name}: an empty list would refuse every push; "
                    "list its clusters, or leave the token out to let it push for any"
                )
            if not all(clusters):
                raise ValueError(f"token_clusters.{name}: a cluster id is empty")


@dataclass(frozen=True)
class EchoConfig:
    endpoint: str | None = None
    # Fleet's token for Echo, re-read when the file changes (a rotation needs no restart);
    # without it, INGERO_ECHO_TOKEN from the environment, read at start.
    token_file: str | None = None
    # Every this-many seconds one score sample per active or idle node goes to Echo; 0: none.
    score_history_interval: Duration = Duration(30.0)  # noqa: RUF009 - an immutable float
    # Where the events waiting for Echo are kept (a SQLite file in it), so a replica killed
    # before forwarding them sends them after its restart; none: in memory, lost if killed.
    spool_dir: str | None = None
    # Bounds of the spool; beyond either, new events are dropped and counted (as in memory).
    spool_max_events: int = field(default=1_000_000, metadata=positive())
    spool_max_bytes: int = field(default=512 * 1024 * 1024, metadata=positive())


@dataclass(frozen=True)
class LimitsConfig:
    """Hard caps that keep one Fleet's memory bounded; a new node beyond them is refused."""

    max_nodes: int = field(default=100000, metadata=positive())
    # One push is a few hundred bytes; 4 MiB leaves room for batching collectors. Also the
    # cap on a gzip body's decompressed size.
    max_body_bytes: int = field(default=4 * 1024 * 1024, metadata=positive())
    # An HTTP request head (every listener) must be complete this long after its first
    # byte, else 408 and the connection is closed: a head trickled byte by byte would
    # otherwise hold its connection forever (the idle timeout never fires).
    head_timeout: Duration = field(default=Duration(10.0), metadata=positive())


@dataclass(frozen=True)
class MetricsConfig:
    """Per-node series on /metrics: opt-in, since their number grows with the cluster."""

    node_series: bool = False
    # At most this many nodes get series (three each); stragglers first, then lowest scores.
    node_series_limit: int = field(default=1000, metadata=positive())
    # At most this many (cluster, partition, user) series of idle GPU time, the most idle first.
    idle_gpu_series_limit: int = field(default=1000, metadata=positive())


@dataclass(frozen=True)
class NcclConfig:
    """Joining the ranks of NCCL communicators (docs/fleet-threshold.md, "Peer lag and hung
    collectives"); bounds keep the memory fixed whatever the nodes push."""

    # Joined collectives a rank's lateness is judged over.
    window: int = field(default=20, metadata=check(lambda v: v >= 2, "must be at least 2"))
    # A rank is late in a collective beyond max(k * 1.4826 * MAD, min_lag) of its lags.
    k: float = field(default=3.0, metadata=positive())
    min_lag: Duration = field(default=Duration(0.020), metadata=positive())
    # Late in more than this share of the window opens a peer_lag episode; fewer than half
    # of it closes the episode.
    lag_fraction: float = field(
        default=0.5, metadata=check(lambda v: 0 < v < 1, "must be in (0, 1)")
    )
    # Share of a large communicator's ranks that must report a collective to join it (one of
    # at most 8 ranks needs all of them).
    join_fraction: float = field(
        default=0.75, metadata=check(lambda v: 0.5 <= v <= 1, "must be in [0.5, 1]")
    )
    hang_after: Duration = field(default=Duration(30.0), metadata=positive())
    # A communicator stopped at one collective this long (ranks behind it, as of their own
    # reports; or every rank, their nodes quiet) is a collective_wait: its replies say who
    # waits for whom, long before hang_after. Only its length tells a hang from a rank that
    # is late: half a second names the hung rank within 3 intervals of a 1 s push (a tracer
    # interval, a push and a tick come after it), and a rank must be about 40% slower than
    # its peers at a 1 s step to be waited for so long (decisions/0057).
    wait_after: Duration = field(default=Duration(0.5), metadata=positive())
    max_comms: int = field(default=10000, metadata=positive())
    max_comms_per_group: int = field(default=64, metadata=positive())
    # Unjoined sequence numbers kept per communicator (ranks sampling others never join).
    max_pending: int = field(default=256, metadata=positive())


@dataclass(frozen=True)
class FleetConfig:
    listen: ListenConfig = field(default_factory=ListenConfig)
    push_interval: Duration = field(default=Duration(5.0), metadata=positive())
    ttl_multiplier: float = field(default=5, metadata=check(lambda v: v >= 1, "must be at least 1"))
    threshold: ThresholdConfig = field(default_factory=ThresholdConfig)
    quorum: QuorumConfig = field(default_factory=QuorumConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    drain: DrainConfig = field(default_factory=DrainConfig)
    verdict: VerdictConfig = field(default_factory=VerdictConfig)
    echo: EchoConfig = field(default_factory=EchoConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    nccl: NcclConfig = field(default_factory=NcclConfig)

    @property
    def node_ttl(self) -> float:
        """Seconds after its last push that a node expires."""
        return float(self.push_interval) * float(self.ttl_multiplier)
