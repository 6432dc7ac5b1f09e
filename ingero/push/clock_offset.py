"""The node's clock offset to Fleet, from push round trips, and the ``clock_skew`` episode
(pure; times from the caller).

Fleet writes its Unix time into every push reply (``X-Ingero-Server-Time``). Fleet read
its clock somewhere between the node sending the push (``sent``) and reading the reply
(``received``), so with the midpoint as the estimate::

    offset      = server_time - (sent + received) / 2
    uncertainty = (received - sent) / 2

bounds the error whatever the asymmetry of the two directions. The caller stamps
``received`` as ``sent`` plus the monotonic time in between, so a wall-clock step during
the push cannot fake a round trip. The estimate is the sample with the smallest
uncertainty among the last ``samples`` (a quiet round trip beats a congested one).

A clock that steps (NTP, an operator's ``date``) on either side makes the older samples
describe a relation that no longer holds: a sample whose interval ``offset ± uncertainty``
is disjoint from the kept best's, by more than :data:`JUMP_SLACK`, drops the older
samples, so the estimate follows the step at once instead of after ``samples`` pushes.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from ingero.otlp.collectives import ClockOffset
from ingero.schema.events import Event, new_event_id

# Two honest samples of one clock relation overlap; beyond their uncertainties only drift
# separates them. 1 ms covers 25 ppm (an unsynchronised crystal) over 40 s of samples; a
# larger disagreement is a step.
JUMP_SLACK = 0.001


@dataclass(frozen=True)
class _Sample:
    offset: ClockOffset
    at: float  # node monotonic time (s) it was taken


def round_trip_offset(sent: float, received: float, server_time: float) -> ClockOffset:
    """One round trip's offset (Fleet minus node, s) and its error bound (s)."""
    if received < sent:
        raise ValueError("a reply cannot come before its push")
    return ClockOffset(server_time - (sent + received) / 2, (received - sent) / 2)


class ClockEstimator:
    """Best of the last ``samples`` round trips no older than ``max_age`` seconds."""

    def __init__(self, samples: int, max_age: float) -> None:
        if samples < 1 or max_age <= 0:
            raise ValueError("need samples >= 1 and max_age > 0")
        self._samples: deque[_Sample] = deque(maxlen=samples)
        self._max_age = max_age

    def observe(
        self, sent: float, received: float, server_time: float | None, mono: float
    ) -> ClockOffset | None:
        """Add one push's round trip (``server_time`` None: an older Fleet, or no reply);
        returns the estimate as of ``mono``."""
        if server_time is not None:
            new = round_trip_offset(sent, received, server_time)
            best = self.estimate(mono)
            if best is not None and abs(new.offset_s - best.offset_s) > (
                new.uncertainty_s + best.uncertainty_s + JUMP_SLACK
            ):
                self._samples.clear()  # a clock stepped: the older samples are void
            self._samples.append(_Sample(new, mono))
        return self.estimate(mono)

    def estimate(self, mono: float) -> ClockOffset | None:
        """The kept sample with the smallest uncertainty; None when none is fresh."""
        while self._samples and mono - self._samples[0].at > self._max_age:
            self._samples.popleft()
        if not self._samples:
            return None
        return min(self._samples, key=lambda s: s.offset.uncertainty_s).offset


class SkewEpisode:
    """``clock_skew`` start/end: it starts when ``|offset| - uncertainty > bound`` (the
    clock is off by more than the bound whatever the estimate's error) and ends, with the
    same event_id, when ``|offset| <= bound``. Without an estimate an open episode is held."""

    def __init__(self, bound: float) -> None:
        self.bound = bound
        self._episode: str | None = None

    @property
    def open(self) -> bool:
        return self._episode is not None

    def observe(self, estimate: ClockOffset | None) -> tuple[str, str] | None:
        """``(state, event_id)`` when the episode starts or ends in this interval."""
        if estimate is None:
            return None
        off = abs(estimate.offset_s)
        if self._episode is None and off - estimate.uncertainty_s > self.bound:
            self._episode = new_event_id()
            return "start", self._episode
        if self._episode is not None and off <= self.bound:
            episode, self._episode = self._episode, None
            return "end", episode
        return None


def skew_event(
    state: str,
    event_id: str,
    estimate: ClockOffset,
    bound: float,
    *,
    node_id: str,
    cluster_id: str,
    timestamp: float,
    job_id: str | None = None,
    rank: int | None = None,
) -> Event:
    """The ``clock_skew`` event of one start or end (``extra.offset_ms``/``uncertainty_ms``
    become INGERO_OFFSET_MS/INGERO_UNCERTAINTY_MS in the journal catalog's text)."""
    offset_ms = estimate.offset_s * 1e3
    detail = (
        f"clock {offset_ms:+.1f} ms off Fleet's (±{estimate.uncertainty_s * 1e3:.1f} ms),"
        f" bound {bound * 1e3:g} ms"
    )
    return Event(
        type="clock_skew",
        node_id=node_id,
        cluster_id=cluster_id,
        timestamp=timestamp,
        event_id=event_id,
        job_id=job_id,
        rank=rank,
        extra={
            "state": state,
            "offset_ms": round(offset_ms, 3),
            "uncertainty_ms": round(estimate.uncertainty_s * 1e3, 3),
            "bound_ms": round(bound * 1e3, 3),
            "reason": detail if state == "start" else f"back within the bound: {detail}",
        },
    )
