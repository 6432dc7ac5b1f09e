"""The fleet-push loop: sample → score → push → read threshold → classify → events.

Fail-open: an unreachable, slow or confused Fleet costs at most one push timeout per
interval and steps detection down (``ingero.push.detection``); nothing here raises out of an
iteration, and no event channel can block it.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol, TypeVar

from ingero.otlp.collectives import ClockOffset
from ingero.otlp.exporter import jittered
from ingero.otlp.health import NodePush, encode_health
from ingero.otlp.resource import PUSH_SERVICE, service_attributes
from ingero.otlp.threshold import ThresholdView
from ingero.push.cause import sample_cause_class
from ingero.push.channels import Channel
from ingero.push.classifier import Classifier, Observation
from ingero.push.client import PushClient
from ingero.push.clock_offset import ClockEstimator, SkewEpisode, skew_event
from ingero.push.config import PushConfig
from ingero.push.detection import FLEET_MODES, Decision, DetectionSelector
from ingero.push.detection_store import DetectionStore
from ingero.push.engines import EngineWatcher
from ingero.push.gpu_health import gpu_events
from ingero.push.gpu_idle import GpuIdleDetector, HeldJob, gpu_uses, idle_events
from ingero.push.sampler import NodeSample
from ingero.push.stack_snapshot import Request, Snapshotter
from ingero.push.waiting import FleetNccl, waiting_words
from ingero.runtime.atomicfile import write_atomic
from ingero.runtime.clock import Clock
from ingero.runtime.systemd import Notifier, watchdog_interval
from ingero.schema import healthstate
from ingero.schema.events import Event
from ingero.slurm.jobfile import JobInfo

log = logging.getLogger(__name__)
T = TypeVar("T")


class Sampler(Protocol):
    def sample(
        self,
        peer_rates: Mapping[str, float] | None = None,
        job_file: bool = False,
        *,
        straggling: bool = False,
        job_id: str | None = None,
        nccl: FleetNccl | None = None,
    ) -> NodeSample: ...


@dataclass(frozen=True)
class Identity:
    node_id: str
    cluster_id: str
    host_name: str | None = None
    job_id: str | None = None
    rank: int | None = None
    world_size: int | None = None
    workload_type: str | None = None
    service: str | None = None  # the configured inference service (groups replicas)


@dataclass
class Status:
    """What the last iteration did (for STATUS=, logs and tests)."""

    iterations: int = 0
    pushes_ok: int = 0
    pushes_failed: int = 0
    polls: int = 0
    state: str = "calibrating"
    score: float | None = None
    mode: str | None = None
    threshold: float | None = None
    straggling: bool = False
    stalled: bool = False
    held: bool = False  # the last sample held its measurement (no new tracer data)
    quiet: bool = False  # no kernel launch in the last sample's intervals, the job running
    # Its NCCL rank waits at a collective (Fleet's word of whom for; {} inside the call).
    waiting_for: dict[str, object] | None = None
    last_error: str | None = None
    events: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class _Named:
    """Fleet's open NCCL episode that names a rank of this node, from a push reply."""

    event_id: str
    type: str
    lasted: float  # how long it had lasted when Fleet answered (s)
    at: float  # the reply's monotonic time
    op: str | None
    seq: int | None


class Agent:
    def __init__(
        self,
        config: PushConfig,
        identity: Identity,
        sampler: Sampler,
        client: PushClient,
        channels: list[Channel],
        clock: Clock,
        store: DetectionStore | None = None,
        rng: random.Random | None = None,
        job_source: Callable[[], JobInfo | None] | None = None,
        engines: EngineWatcher | None = None,
        health_state: Path | None = None,
        gpu_idle: GpuIdleDetector | None = None,
        held_jobs: Callable[[], list[HeldJob]] | None = None,
    ) -> None:
        """``job_source`` names the Slurm job running here now (the prolog's job file); its
        job id, rank and world size then override the identity's, interval by interval.
        ``engines``: the node's inference servers (the sampler measures them); the service
        they serve groups the node's push where the identity configures none.
        ``health_state``: where the node's health state file is rewritten after every
        iteration (``ingero.schema.healthstate``; None: nowhere). ``gpu_idle`` with
        ``held_jobs`` (the jobs on the node and the GPUs each holds, read every interval):
        the ``gpu_idle`` episodes (None: none looked for)."""
        self.config = config
        self.identity = identity
        # The node id is the push agent's stable service.instance.id (one agent per node).
        self.service = service_attributes(PUSH_SERVICE, identity.node_id)
        self.sampler = sampler
        self.client = client
        self.channels = channels
        self.clock = clock
        self.store = store
        self.rng = rng or random.Random()
        self.job_source = job_source
        self.engines = engines
        restored = store.load() if store is not None else None
        self.selector = DetectionSelector(
            config.detection,
            clock,
            persisted=restored.cached if restored else None,
            baseline=restored.baseline if restored else None,
        )
        self.classifier = Classifier(config.classifier)
        self.status = Status()
        # Fleet's peer medians of the raw rates, with the monotonic time they came; used as
        # the throughput reference while as fresh as a threshold in mode ``fleet``.
        self._peers: tuple[dict[str, float], float] | None = None
        # Fleet's peer lag of this node's NCCL rank (None: not late), with the monotonic
        # time of the reply that said so; held as long as a threshold in mode ``fleet``.
        self._lag: tuple[float | None, float] | None = None
        interval = float(config.push_interval)
        # The last ``samples`` pushes span about that many intervals; twice that, jitter
        # and a slow Fleet included, before an estimate counts as stale.
        self.clock_offset = ClockEstimator(
            config.clock.samples, 2 * config.clock.samples * interval
        )
        self.skew = SkewEpisode(float(config.clock.skew_bound))
        # Takes the stack snapshot of a stalled node, or of one Fleet names (None: never).
        self.snapshotter: Snapshotter | None = None
        # Fleet's open NCCL episode naming a rank of this node, held like the lag.
        self._named: tuple[_Named | None, float] | None = None
        # What Fleet's last reply said of this node's NCCL ranks' waits, held like the lag.
        self._nccl: tuple[FleetNccl | None, float] | None = None
        self._stalled_since: float | None = None  # monotonic, while the node is stalled
        self.health_state = health_state
        self.gpu_idle = gpu_idle
        self.held_jobs = held_jobs
        self._state_error: str | None = None  # the last failure to write it (logged once)
        # The open straggler episode as its straggler_state events said it: opened at
        # (Unix s), and the latest of them.
        self._episode: tuple[float, Event] | None = None

    def step(self) -> float:
        """One iteration; returns the seconds to wait before the next one."""
        status = self.status
        status.iterations += 1
        ident, job_file = self._current_identity()
        if self.engines is not None:
            self.engines.tags = (ident.job_id, ident.rank)
        # An episode judged against Fleet's threshold freezes the baselines: its peers say
        # what normal is, and a job-wide change moves them all. Judged against the node's
        # own score (local modes) nothing would ever say a lasting change of the job's work
        # (a new phase) is the new normal, so the baselines go on learning there.
        sample = self.sampler.sample(
            self._fresh(self._peers),
            job_file,
            straggling=self.classifier.straggling and status.mode in FLEET_MODES,
            job_id=ident.job_id,
            nccl=self._fresh(self._nccl),
        )
        if sample.transition is not None:
            t = sample.transition
            log.info("node state %s -> %s (%s)", t.previous, t.current, t.reason)
        push = self._node_push(sample, ident)
        status.state, status.score, status.stalled = sample.state, push.score, sample.stalled
        status.held, status.quiet = sample.held, sample.quiet
        status.waiting_for = (
            dict(sample.waiting_for or {}) if sample.waiting and not sample.stalled else None
        )
        if sample.held and sample.result is None and not _reports_only(sample):
            # Nothing measured yet to repeat: pushing a score of 0 would be a false one.
            self._write_state(push, status.mode)
            return jittered(float(self.config.push_interval), self.config.jitter, self.rng)
        request = encode_health(push, int(self.clock.now() * 1e9), self.service)
        # The round trip on the monotonic clock, placed at the wall time of sending: a
        # wall-clock step during the push cannot fake a short (or negative) round trip.
        sent, sent_mono = self.clock.now(), self.clock.monotonic()
        result = self.client.push(request)
        received_mono = self.clock.monotonic()
        reading = result.reading
        offset = self.clock_offset.observe(
            sent,
            sent + (received_mono - sent_mono),
            reading.server_time if result.ok and reading is not None else None,
            received_mono,
        )
        self._clock_skew(offset, push)
        if result.ok:
            status.pushes_ok += 1
            if reading is None and result.error is None:
                status.polls += 1
                reading = self.client.poll_threshold(push.cluster_id, push.job_id, push.service)
        else:
            status.pushes_failed += 1
        if result.error != status.last_error:
            if result.error:
                log.warning("push to Fleet: %s", result.error)
            elif status.last_error:
                log.info("push to Fleet works again")
            status.last_error = result.error
        if reading is not None and reading.peer_rates and reading.quorum_met:
            self._peers = (dict(reading.peer_rates), self.clock.monotonic())
        if reading is not None:
            self._lag = (reading.peer_lag, self.clock.monotonic())
            self._named = (self._named_episode(reading), self.clock.monotonic())
            self._nccl = (FleetNccl.of(reading), self.clock.monotonic())
        fresh = self.selector.on_fleet(reading)
        # A held sample repeats the last measurement: not a new one to learn from or to
        # classify (it counts neither towards an episode nor towards its end).
        measured = sample.state == "active" and not sample.held
        decision = self.selector.decide(push.score if measured else None)
        if self.store is not None and (fresh or sample.state == "active"):
            self._save()
        if decision.transition is not None:
            self._emit(self._mode_event(decision, push))
        status.mode, status.threshold = decision.mode, decision.threshold
        observation = Observation.of(
            push,
            decision,
            self.clock.now(),
            job_ended=sample.job_running is False,
            fleet_episode=reading.episode_id if reading is not None else None,
            peer_lag=self._fresh(self._lag),
        )
        for event in () if sample.held else self.classifier.observe(observation):
            log.warning("%s", event.message())
            self._emit(event)
        status.straggling = self.classifier.straggling
        if not sample.held:
            self._stalled_since = (
                (self._stalled_since or self.clock.monotonic()) if sample.stalled else None
            )
        self._offer_snapshot(push)
        for event in gpu_events(
            sample.gpu_findings,
            node_id=push.node_id,
            cluster_id=push.cluster_id,
            timestamp=self.clock.now(),
            job_id=push.job_id,
            rank=push.rank,
            score=push.score,
        ):
            log.warning("%s", event.message())
            self._emit(event)
        self._idle_gpus(sample, push)
        self._write_state(push, decision.mode)
        delay = jittered(float(self.config.push_interval), self.config.jitter, self.rng)
        if result.retry_after is not None:
            delay = max(delay, min(result.retry_after, 60 * float(self.config.push_interval)))
        return delay

    def run(self, stop: threading.Event, notifier: Notifier | None = None) -> None:
        """Loop until ``stop`` is set; READY after the first iteration, WATCHDOG between them."""
        watchdog = watchdog_interval()
        ready = False
        while not stop.is_set():
            try:
                delay = self.step()
            except Exception:  # an iteration's bug is logged; the agent keeps pushing
                log.exception("iteration %d failed", self.status.iterations)
                delay = float(self.config.push_interval)
            if notifier is not None:
                if not ready:
                    notifier.notify("READY=1")
                    ready = True
                notifier.notify(f"STATUS={self.status_line()}")
            deadline = self.clock.monotonic() + delay
            while not stop.is_set():
                if notifier is not None and watchdog is not None:
                    notifier.notify("WATCHDOG=1")
                left = deadline - self.clock.monotonic()
                if left <= 0:
                    break
                stop.wait(min(left, watchdog) if watchdog is not None else left)
        if notifier is not None:
            notifier.notify("STOPPING=1")

    def close(self) -> None:
        if self.snapshotter is not None:  # a snapshot under way is sent, within its bound
            self.snapshotter.wait(self.snapshotter.budget_s)
        for channel in self.channels:
            channel.close()
        self.client.close()

    def status_line(self) -> str:
        s = self.status
        score = "-" if s.score is None else f"{s.score:.3f}"
        threshold = "-" if s.threshold is None else f"{s.threshold:.3f}"
        straggler = " STRAGGLER" if s.straggling else ""
        if s.waiting_for is not None and s.state == "active":
            # Waiting at a collective: held, but not for want of data.
            words = waiting_words(s.waiting_for) if s.waiting_for else "inside a collective"
            return (
                f"waiting score={score} mode={s.mode} threshold={threshold}{straggler}"
                f" WAITING {words}"
            )
        held = " (quiet, not yet a stall)" if s.quiet else " (no new data)"
        state = ("stalled" if s.stalled else s.state) + (held if s.held else "")
        return f"{state} score={score} mode={s.mode} threshold={threshold}{straggler}"

    def _fresh(self, held: tuple[T, float] | None) -> T | None:
        """What a Fleet reply said, while as fresh as a threshold in mode ``fleet``."""
        if held is None:
            return None
        value, at = held
        if self.clock.monotonic() - at > float(self.config.detection.fleet_max_age):
            return None
        return value

    def _named_episode(self, reading: ThresholdView) -> _Named | None:
        """The reply's NCCL episode naming this node, with how long it had lasted (on
        Fleet's clock, from its own answer time: no clock offset in it)."""
        if not reading.nccl_episode_id or reading.nccl_episode_since is None:
            return None
        answered = reading.server_time if reading.server_time is not None else self.clock.now()
        return _Named(
            reading.nccl_episode_id,
            reading.nccl_episode_type or "collective_hang",
            max(0.0, answered - reading.nccl_episode_since),
            self.clock.monotonic(),
            reading.nccl_episode_op,
            reading.nccl_episode_seq,
        )

    def _offer_snapshot(self, push: NodePush) -> None:
        """One stack snapshot per episode: the NCCL episode Fleet names this node in (the
        others wait for it), else this node's stall once it is a straggler episode."""
        if self.snapshotter is None:
            return
        now = self.clock.monotonic()
        named = self._fresh(self._named)
        op, seq = None, None
        if named is not None:
            episode, trigger = named.event_id, named.type
            for_s = named.lasted + (now - named.at)
            op, seq = named.op, named.seq
        elif self._stalled_since is not None and self.classifier.straggling:
            episode, trigger = self.classifier.episode_id, "stalled"
            for_s = now - self._stalled_since
        else:
            return
        request = Request(
            episode,
            trigger,
            for_s,
            push.node_id,
            push.cluster_id,
            push.job_id,
            push.rank,
            op=op,
            seq=seq,
        )
        if self.snapshotter.offer(request):
            log.info("stack snapshot for %s episode %s", trigger, episode)

    def emit(self, event: Event) -> None:
        """Log and send an event raised off the push loop (the stack snapshot)."""
        log.warning("%s", event.message())
        self._emit(event)

    def _clock_skew(self, offset: ClockOffset | None, push: NodePush) -> None:
        change = self.skew.observe(offset)
        if change is None or offset is None:
            return
        state, event_id = change
        event = skew_event(
            state,
            event_id,
            offset,
            self.skew.bound,
            node_id=push.node_id,
            cluster_id=push.cluster_id,
            timestamp=self.clock.now(),
            job_id=push.job_id,
            rank=push.rank,
        )
        log.warning("%s", event.message())
        self._emit(event)

    def _current_identity(self) -> tuple[Identity, bool]:
        """The identity this interval, and whether the prolog's job file is present."""
        job = None
        if self.job_source is not None:
            try:
                job = self.job_source()
            except (OSError, ValueError) as exc:
                log.warning("cannot read the Slurm job file: %s", exc)
        if job is None:
            return self.identity, False
        ident = replace(self.identity, job_id=job.job_id, rank=job.rank, world_size=job.world_size)
        return ident, True

    def _node_push(self, sample: NodeSample, ident: Identity) -> NodePush:
        result = sample.result
        return NodePush(
            node_id=ident.node_id,
            cluster_id=ident.cluster_id,
            score=sample.score,
            state=sample.state,
            host_name=ident.host_name,
            job_id=ident.job_id,
            rank=ident.rank,
            world_size=ident.world_size,
            workload_type=ident.workload_type,
            dominant_signal=result.dominant_signal if result else None,
            signals=dict(result.signals) if result else {},
            rates=dict(result.rates) if result else {},
            stalled=sample.stalled,
            episode_id=self.classifier.episode_id,
            collectives=sample.collectives,
            clock=self.clock_offset.estimate(self.clock.monotonic()),
            service=ident.service or (self.engines.service if self.engines else None),
            held=sample.held,
            cause_class=sample_cause_class(sample),
            quiet=sample.quiet,
            waiting=sample.waiting,
        )

    def _mode_event(self, decision: Decision, push: NodePush) -> Event:
        assert decision.transition is not None
        previous, current = decision.transition
        log.info("detection mode %s -> %s", previous or "(start)", current)
        return Event(
            type="detection_mode",
            node_id=push.node_id,
            cluster_id=push.cluster_id,
            timestamp=self.clock.now(),
            job_id=push.job_id,
            rank=push.rank,
            threshold=decision.threshold,
            detection_mode=current,
            extra={"previous_mode": previous},
        )

    def _idle_gpus(self, sample: NodeSample, push: NodePush) -> None:
        """The jobs' GPUs held and unused, judged on the window's new tracer data."""
        window = sample.window
        if self.gpu_idle is None or self.held_jobs is None:
            return
        if window is None or window.new_intervals == 0:
            return
        try:
            jobs = self.held_jobs()
        except (OSError, ValueError) as exc:
            log.warning("cannot read the jobs' GPUs: %s", exc)
            return
        uses = gpu_uses(window.gpus, window.launch_pids)
        changes = self.gpu_idle.observe(jobs, uses, window.start, window.end)
        for event in idle_events(
            changes, node_id=push.node_id, cluster_id=push.cluster_id, timestamp=self.clock.now()
        ):
            log.info("%s", event.message())
            self._emit(event)

    def _write_state(self, push: NodePush, mode: str | None) -> None:
        """Rewrite the health state file: what local readers (``ingero check --health``,
        NHC) learn of the node without asking Fleet. A failure is logged once per cause."""
        if self.health_state is None:
            return
        straggler = None
        if self._episode is not None:
            since, last = self._episode
            reason = last.extra.get("reason")
            straggler = healthstate.Straggler(
                episode_id=last.event_id,
                since=since,
                reason=reason if reason in ("stall", "peer_lag") else "score",
                job_id=last.job_id,
                score=last.score,
                threshold=last.threshold,
                dominant_signal=last.dominant_signal,
            )
        state = healthstate.HealthState(
            node_id=push.node_id,
            cluster_id=push.cluster_id,
            written_at=self.clock.now(),
            interval_s=float(self.config.push_interval),
            state=push.state,
            mode=mode,
            straggler=straggler,
            gpu_idle=tuple(
                healthstate.IdleGpus(c.event_id, c.job.job_id, c.gpus, c.since, c.reason)
                for c in (self.gpu_idle.open() if self.gpu_idle is not None else ())
            ),
        )
        try:
            # Readable by every user (NHC runs as root, a site's own checks as anyone); on
            # tmpfs, and rewritten every interval: no fsyncs.
            write_atomic(self.health_state, healthstate.encode(state), mode=0o644, durable=False)
        except OSError as exc:
            error = f"{exc.strerror or exc}"
            if error != self._state_error:
                log.warning("cannot write the health state file %s: %s", self.health_state, error)
            self._state_error = error
            return
        if self._state_error is not None:
            log.info("health state file %s written again", self.health_state)
            self._state_error = None

    def _emit(self, event: Event) -> None:
        if event.type == "straggler_state":
            same = self._episode is not None and self._episode[1].event_id == event.event_id
            opened = self._episode[0] if same and self._episode else event.timestamp
            self._episode = (opened, event)
        elif event.type == "straggler_resolved":
            self._episode = None
        self.status.events[event.type] = self.status.events.get(event.type, 0) + 1
        for channel in self.channels:
            channel.send(event)

    def _save(self) -> None:
        assert self.store is not None
        try:
            self.store.save(self.selector.cached, self.selector.baseline)
        except OSError as exc:
            log.warning("cannot save detection state to %s: %s", self.store.path, exc)


def _reports_only(sample: NodeSample) -> bool:
    """A calibrating node with nothing measured yet whose ranks are at a collective (they
    waited in one from the first sample): its push carries where they are, or Fleet's
    join and hang judging would never hear of them and name them among the missing. Its
    score is no measurement, and Fleet keeps no calibrating score (statistics, series,
    Echo's history): only the reports count."""
    return sample.state == "calibrating" and bool(sample.collectives)
