"""Echo configuration schema; the field defaults are the documented defaults (docs/echo.md)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ingero.runtime.config import HOSTPORT, Duration, check, formerly, positive
from ingero.security.ratelimit import RateLimitConfig
from ingero.security.tls import check_pair


@dataclass(frozen=True)
class ListenConfig:
    otlp_grpc: str = field(default="0.0.0.0:4327", metadata=HOSTPORT)
    otlp_http: str = field(default="0.0.0.0:4328", metadata=HOSTPORT)
    api: str = field(default="0.0.0.0:8081", metadata=HOSTPORT)


@dataclass(frozen=True)
class RetentionConfig:
    max_age: Duration = field(default=Duration(90 * 86400.0), metadata=positive())
    max_bytes: int = field(default=10 * 1024**3, metadata=positive())
    check_interval: Duration = field(default=Duration(300.0), metadata=positive())


@dataclass(frozen=True)
class LimitsConfig:
    # OTLP request body (HTTP) / message (gRPC); Fleet's key has the same name.
    max_body_bytes: int = field(
        default=8 * 1024**2, metadata=positive() | formerly("max_request_bytes")
    )
    max_events_per_request: int = field(default=50_000, metadata=positive())
    sql_max_rows: int = field(default=10_000, metadata=positive())
    sql_timeout: Duration = field(default=Duration(5.0), metadata=positive())
    query_max_rows: int = field(default=1_000, metadata=positive())
    # Every answer (SQL and questions) stops before this many bytes of JSON.
    max_answer_bytes: int = field(default=8 * 1024**2, metadata=positive())
    score_bucket: Duration = field(default=Duration(60.0), metadata=positive())
    # Processes decoding OTLP requests; unset: one per CPU beyond the first, at most 4;
    # 0 decodes in the daemon's own process.
    decode_workers: int | None = field(
        default=None, metadata=check(lambda v: v is None or 0 <= v <= 64, "must be 0 to 64")
    )

    def decode_worker_count(self) -> int:
        if self.decode_workers is not None:
            return self.decode_workers
        return max(0, min(4, (os.cpu_count() or 1) - 1))


@dataclass(frozen=True)
class AuthConfig:
    # The token table (YAML): named tokens, each scoped to clusters or not (ingero.echo.auth).
    # A table, not Fleet's token_file (one token, the file's name its name); the earlier
    # name tokens_file is read too.
    token_table: str | None = field(default=None, metadata=formerly("tokens_file"))
    # With a token table, OTLP senders (Fleet) need a token too, scoped like readers'.
    ingest_requires_token: bool = True
    tls_cert: str | None = None  # PEM; with tls_key, every listener speaks TLS
    tls_key: str | None = None
    # SIGHUP reads the token table and the certificate again; a token the new file drops
    # stays valid this long (docs/security.md).
    token_grace: Duration = field(
        default=Duration(300.0), metadata=check(lambda v: v >= 0, "must be 0 or more")
    )
    rate_limit: RateLimitConfig = field(default_factory=RateLimitConfig)

    def validate(self) -> None:
        check_pair(self.tls_cert, self.tls_key)


@dataclass(frozen=True)
class EchoConfig:
    listen: ListenConfig = field(default_factory=ListenConfig)
    db: str = "/var/lib/ingero/echo.db"
    retention: RetentionConfig = field(default_factory=RetentionConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    auth: AuthConfig = field(default_factory=AuthConfig)
    gpu_rates_file: str | None = None
    mcp_http: bool = True
