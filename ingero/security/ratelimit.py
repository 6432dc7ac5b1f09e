"""Token buckets keyed by token or source address, with a bounded number of keys.

Fleet and Echo limit each bearer token's request rate, and each source address's rate of
refused (unauthenticated) requests, with :class:`RateLimiter`; the defaults are written
once, here, in :class:`RateLimitConfig` (the ``auth.rate_limit`` section of both daemons).
Memory is bounded: at most ``max_keys`` keys are tracked, the least recently used is
forgotten first (a forgotten key starts again with a full bucket, which errs on letting a
request through, never on refusing one).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from ingero.runtime.clock import Clock, SystemClock
from ingero.runtime.config import check, positive

_NON_NEGATIVE = check(lambda v: v >= 0, "must be 0 (off) or more")


@dataclass(frozen=True)
class RateLimitConfig:
    # Requests per second each token may make. Nodes usually share one token, so this is
    # sized for a fleet: 100,000 nodes every 5 s is 20,000/s. 0: no per-token limit.
    per_token: float = field(default=25000.0, metadata=_NON_NEGATIVE)
    token_burst: int = field(default=50000, metadata=positive())
    # Refused (no or a wrong token) requests per second from one source address before
    # that address is answered 429 instead of 401. 0: no limit.
    refusals_per_source: float = field(default=5.0, metadata=_NON_NEGATIVE)
    refusal_burst: int = field(default=20, metadata=positive())
    # Keys (tokens, source addresses) each limiter tracks at most.
    max_keys: int = field(default=10000, metadata=positive())


class RateLimiter:
    """One token bucket per key: ``rate`` tokens a second, up to ``burst``. ``rate`` 0
    means unlimited. Thread-safe (Fleet checks from its HTTP loop and gRPC workers)."""

    def __init__(self, rate: float, burst: int, max_keys: int, clock: Clock | None = None) -> None:
        self.rate = rate
        self.burst = float(burst)
        self.max_keys = max_keys
        self._clock = clock or SystemClock()
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (level, t)
        self._lock = threading.Lock()

    def take(self, key: str) -> float:
        """Spend one token of ``key``'s bucket: 0.0 when there was one, else the seconds
        until there will be (nothing is spent then)."""
        rate = self.rate
        if not rate:
            return 0.0
        now = self._clock.monotonic()
        with self._lock:  # every push takes this path: names bound once, no min() call
            buckets = self._buckets
            found = buckets.get(key)
            if found is None:
                level = self.burst
                if len(buckets) >= self.max_keys:
                    buckets.popitem(last=False)
            else:
                level = found[0] + (now - found[1]) * rate
                if level > self.burst:
                    level = self.burst
                buckets.move_to_end(key)
            wait = 0.0
            if level >= 1.0:
                level -= 1.0
            else:
                wait = (1.0 - level) / rate
            buckets[key] = (level, now)
            return wait

    def __len__(self) -> int:
        return len(self._buckets)
