"""The agent loop with a scripted sampler and client (the I/O edges), real core and channels."""

from __future__ import annotations

import logging
import random
import socket
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import pytest
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from ingero.nodedb.window import GpuWindow, WindowAggregates
from ingero.otlp.collectives import CommReport
from ingero.otlp.health import decode_health
from ingero.otlp.threshold import ENTER_INTERVALS, EXIT_INTERVALS, ThresholdView
from ingero.push.agent import Agent, Identity
from ingero.push.channels.uds import UdsChannel
from ingero.push.client import PushResult
from ingero.push.config import ClassifierConfig, PushConfig
from ingero.push.detection_store import DetectionStore
from ingero.push.sampler import NodeSample
from ingero.push.score import ScoreResult
from ingero.push.waiting import FleetNccl
from ingero.runtime.clock import ManualClock
from ingero.schema.events import Event
from ingero.slurm.jobfile import JobInfo
from tests.pyspy_loader import LOADER, start_loader


class Sampler:
    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.score = 0.9
        self.state = "active"
        self.stalled = False
        self.held = False
        self.window: WindowAggregates | None = None
        self.waiting = False  # the sample waits at a collective, as Fleet said
        self.measured = True  # False: nothing measured yet (a result of None)
        self.collectives: tuple[CommReport, ...] = ()
        self.calls: list[tuple[dict[str, float] | None, bool]] = []  # (peer_rates, job_file)
        self.straggling: list[bool] = []  # what each call said of the node's episode
        self.jobs: list[str | None] = []  # the job whose marked steps each call counted
        self.nccl: list[FleetNccl | None] = []  # what Fleet said of its NCCL ranks' waits

    def sample(
        self,
        peer_rates: Mapping[str, float] | None = None,
        job_file: bool = False,
        *,
        straggling: bool = False,
        job_id: str | None = None,
        nccl: FleetNccl | None = None,
    ) -> NodeSample:
        self.calls.append((dict(peer_rates) if peer_rates is not None else None, job_file))
        self.straggling.append(straggling)
        self.jobs.append(job_id)
        self.nccl.append(nccl)
        result = ScoreResult(
            score=self.score,
            signals=MappingProxyType({"throughput": self.score}),
            dominant_signal="throughput",
            invalid_inputs=(),
            missing_signals=(),
            rates=MappingProxyType({"kernel_launch_rate": 100.0}),
            penalty=1.0,
        )
        return NodeSample(
            self.clock.now(),
            self.state,  # type: ignore[arg-type]
            result if self.measured else None,
            self.window,
            None,
            stalled=self.stalled,
            job_running=True if self.stalled else None,
            held=self.held or self.waiting,
            quiet=self.waiting,
            waiting=self.waiting,
            waiting_for=nccl.waiting_for if self.waiting and nccl is not None else None,
            collectives=self.collectives,
        )


class Client:
    def __init__(self) -> None:
        self.result = PushResult(True, ThresholdView(threshold=0.7, quorum_met=True, panic=False))
        self.poll: ThresholdView | None = None
        self.pushed: list[ExportMetricsServiceRequest] = []
        self.polls = 0

    def push(self, request: ExportMetricsServiceRequest) -> PushResult:
        self.pushed.append(request)
        return self.result

    def poll_threshold(
        self, cluster_id: str, job_id: str | None, service: str | None = None
    ) -> ThresholdView | None:
        self.polls += 1
        return self.poll

    def export_logs(self, request: ExportLogsServiceRequest) -> None:
        raise OSError("not used")

    def close(self) -> None:
        pass


class Recorder:
    name = "recorder"

    def __init__(self) -> None:
        self.events: list[Event] = []

    def send(self, event: Event) -> None:
        self.events.append(event)

    def stats(self) -> dict[str, int]:
        return {"sent": len(self.events)}

    def close(self) -> None:
        pass


def make(
    tmp_path: Path | None = None,
    channels: list[object] | None = None,
    config: PushConfig | None = None,
):  # type: ignore[no-untyped-def]
    clock = ManualClock()
    sampler, client, rec = Sampler(clock), Client(), Recorder()
    store = DetectionStore(tmp_path / "d.json", "n1", clock) if tmp_path else None
    agent = Agent(
        config or PushConfig(),
        Identity("n1", "c1", job_id="42", rank=1),
        sampler,
        client,
        [rec, *(channels or [])],
        clock,
        store,
        random.Random(0),  # type: ignore[list-item]
    )
    return agent, clock, sampler, client, rec


def test_push_carries_the_sample_and_straggler_episode_reaches_channels() -> None:
    agent, clock, sampler, client, rec = make(
        config=PushConfig(classifier=ClassifierConfig(enter_intervals=1, exit_intervals=1))
    )
    agent.step()
    decoded = decode_health(client.pushed[0])
    assert decoded.pushes[0].node_id == "n1" and decoded.pushes[0].score == 0.9
    assert [e.type for e in rec.events] == ["detection_mode"]
    sampler.score = 0.5
    clock.advance(5)
    agent.step()
    assert rec.events[-1].type == "straggler_state"
    assert rec.events[-1].detection_mode == "fleet" and rec.events[-1].job_id == "42"
    sampler.score = 0.75
    clock.advance(5)
    agent.step()
    assert rec.events[-1].type == "straggler_resolved"
    assert rec.events[-1].event_id == rec.events[-2].event_id
    # The sampler learns no baseline from a sample taken while the episode is open.
    clock.advance(5)
    agent.step()
    assert sampler.straggling == [False, False, True, False]


def test_a_held_sample_is_pushed_as_held_and_not_classified_again() -> None:
    """The tracer slower than the pushes: every other sample repeats the last measurement.
    Fleet is told which pushes repeat one, and the node counts each measurement once in
    its enter rule (3 of the last 5 by default)."""
    agent, clock, sampler, client, rec = make()
    sampler.score = 0.5
    for held in (False, True, False, True):
        sampler.held = held
        agent.step()
        clock.advance(1)
    assert [decode_health(r).pushes[0].held for r in client.pushed] == [False, True] * 2
    assert "straggler_state" not in [e.type for e in rec.events]
    sampler.held = False
    agent.step()
    assert rec.events[-1].type == "straggler_state"


def test_a_rank_waiting_from_its_first_sample_reports_where_it_waits() -> None:
    """Nothing measured yet and held (its rank waits in a collective from the start, as
    when fleet-push starts beside a running job): no score is pushed for it, but while
    calibrating its communicators are, so that Fleet hears of the rank before a hang
    is judged; anything else with nothing measured is not pushed at all."""
    agent, clock, sampler, client, _rec = make()
    sampler.measured, sampler.waiting = False, True
    sampler.state = "calibrating"
    agent.step()
    assert client.pushed == []
    report = CommReport(
        comm_hash="9f1c2e3d4a5b6c7d", comm_rank=1, nranks=3, entered_seq=1310,
        returned_seq=1309, calls_in_interval=0, inflight_seq=1310,
        inflight_op="ncclAllReduce", inflight_since_ns=5_000_000_000,
    )  # fmt: skip
    sampler.collectives = (report,)
    clock.advance(1)
    agent.step()
    (push,) = [p for r in client.pushed for p in decode_health(r).pushes]
    assert (push.state, push.held, push.waiting) == ("calibrating", True, True)
    assert push.collectives == (report,)
    for state in ("active", "idle"):
        sampler.state = state
        clock.advance(1)
        agent.step()
    assert len(client.pushed) == 1


def test_peer_medians_from_the_reply_feed_the_next_sample_while_fresh() -> None:
    agent, clock, sampler, client, _rec = make()
    view = ThresholdView(threshold=0.7, quorum_met=True, peer_rates={"kernel_launch_rate": 3e3})
    client.result = PushResult(True, view)
    agent.step()
    clock.advance(5)
    agent.step()
    assert sampler.calls[0] == (None, False) and sampler.calls[1] == (
        {"kernel_launch_rate": 3e3},
        False,
    )
    # Fleet goes away: the medians are used only as long as a threshold counts as fresh.
    client.result = PushResult(False, error="refused")
    clock.advance(float(PushConfig().detection.fleet_max_age) + 1)
    agent.step()
    assert sampler.calls[-1][0] is None


def test_one_episode_one_id_whichever_side_saw_it_first() -> None:
    config = PushConfig(classifier=ClassifierConfig(enter_intervals=1))
    # Fleet first: its open episode id comes in the reply, and the node's episode takes it.
    agent, clock, sampler, client, rec = make(config=config)
    client.result = PushResult(
        True, ThresholdView(threshold=0.7, quorum_met=True, episode_id="F-1")
    )
    sampler.score = 0.5
    agent.step()
    assert rec.events[-1].type == "straggler_state" and rec.events[-1].event_id == "F-1"
    # ... and goes with every later push, so Fleet knows the node holds it.
    clock.advance(5)
    agent.step()
    assert decode_health(client.pushed[-1]).pushes[0].episode_id == "F-1"
    # The node first: a new id, pushed from the next interval on for Fleet to adopt.
    agent, clock, sampler, client, rec = make(config=config)
    agent.step()
    assert decode_health(client.pushed[-1]).pushes[0].episode_id == ""  # none open: ""
    sampler.score = 0.5
    clock.advance(5)
    agent.step()
    opened = rec.events[-1]
    assert opened.type == "straggler_state" and opened.event_id not in ("", "F-1")
    clock.advance(5)
    agent.step()
    assert decode_health(client.pushed[-1]).pushes[0].episode_id == opened.event_id


def test_a_stalled_node_is_pushed_stalled_and_flagged_with_reason_stall() -> None:
    agent, clock, sampler, client, rec = make(
        config=PushConfig(classifier=ClassifierConfig(enter_intervals=1))
    )
    agent.step()
    sampler.stalled, sampler.score = True, 0.1
    clock.advance(5)
    agent.step()
    pushed = decode_health(client.pushed[-1]).pushes[0]
    assert pushed.state == "active" and pushed.stalled
    assert rec.events[-1].type == "straggler_state" and rec.events[-1].extra["reason"] == "stall"
    assert agent.status_line().startswith("stalled ")
    # Its job ends first (processes gone): the episode ends as job_ended, not recovered.
    sampler.stalled, sampler.state, sampler.score = False, "idle", 0.9
    clock.advance(5)
    agent.step()
    assert rec.events[-1].type == "straggler_resolved"
    assert rec.events[-1].extra["reason"] == "job_ended"


def test_fleet_down_steps_down_without_raising() -> None:
    agent, clock, _sampler, client, rec = make()
    agent.step()
    client.result = PushResult(False, error="refused")
    for _ in range(80):
        clock.advance(5)
        agent.step()
    modes = [e.detection_mode for e in rec.events if e.type == "detection_mode"]
    assert modes == ["fleet", "fleet-cached", "local-cached"]
    assert agent.status.pushes_failed == 80 and client.polls == 0


def test_poll_only_when_headers_absent() -> None:
    agent, _clock, _sampler, client, _rec = make()
    client.result = PushResult(True, None)
    client.poll = ThresholdView(threshold=0.6, quorum_met=True, panic=False)
    agent.step()
    assert client.polls == 1 and agent.status.mode == "fleet" and agent.status.threshold == 0.6
    client.result = PushResult(True, None, error="rejected: threshold 'nan' is not sane")
    agent.step()
    assert client.polls == 1


def test_retry_after_stretches_the_delay() -> None:
    agent, _clock, _sampler, client, _rec = make()
    assert 4.5 <= agent.step() <= 5.5
    client.result = PushResult(False, retry_after=42.0, error="HTTP 429")
    assert agent.step() == 42.0


def test_restart_keeps_the_threshold_as_local_cached(tmp_path: Path) -> None:
    agent, _clock, _s, _c, _r = make(tmp_path)
    agent.step()
    assert (tmp_path / "d.json").exists()
    again, _clock2, _s2, client2, _rec2 = make(tmp_path)
    client2.result = PushResult(False, error="refused")
    again.step()
    assert again.status.mode == "local-cached" and again.status.threshold == 0.7


def test_stalled_event_consumer_does_not_hold_the_loop(tmp_path: Path) -> None:
    path = str(tmp_path / "ev.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)  # accepts, never reads
    uds = UdsChannel(path, queue_size=4, send_timeout=60.0)
    config = PushConfig(classifier=ClassifierConfig(reemit_intervals=1, enter_intervals=1))
    agent, clock, sampler, _client, rec = make(channels=[uds], config=config)
    try:
        sampler.score = 0.1
        for _ in range(300):
            clock.advance(5)
            agent.step()
        assert agent.status.iterations == 300
        assert len(rec.events) > 290  # every iteration emitted
    finally:
        uds.close(timeout=0.1)
        server.close()


def test_job_file_sets_the_peer_group_each_interval() -> None:
    agent, _clock, sampler, client, _rec = make()
    jobs: list[object] = [
        JobInfo(job_id="7", cluster_id="c1", node_id="n1", rank=2, world_size=8),
        None,
        ValueError("job file for job 9 is not JSON"),
    ]

    def source() -> JobInfo | None:
        item = jobs.pop(0)
        if isinstance(item, Exception):
            raise item
        return item  # type: ignore[return-value]

    agent.job_source = source
    for _ in range(3):
        agent.step()
    pushed = [decode_health(r).pushes[0] for r in client.pushed]
    assert [(p.job_id, p.rank, p.world_size) for p in pushed] == [
        ("7", 2, 8),
        ("42", 1, None),
        ("42", 1, None),
    ]
    # the pushed job's marked steps alone are the node's steps (no other writer's)
    assert sampler.jobs == ["7", "42", "42"]


def test_each_mode_change_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    agent, clock, _sampler, client, _rec = make()
    caplog.set_level(logging.INFO, logger="ingero.push.agent")
    agent.step()
    client.result = PushResult(False, error="refused")
    for _ in range(80):
        clock.advance(5)
        agent.step()
    mode_lines = [r.getMessage() for r in caplog.records if "detection mode" in r.getMessage()]
    assert mode_lines == [
        "detection mode (start) -> fleet",
        "detection mode fleet -> fleet-cached",
        "detection mode fleet-cached -> local-cached",
    ]
    push_lines = [r.getMessage() for r in caplog.records if "push to Fleet" in r.getMessage()]
    assert push_lines == ["push to Fleet: refused"]  # not once per failed interval


class TimedClient(Client):
    """A Fleet whose clock runs ``offset`` s ahead of the node's and which answers at the
    midpoint of a ``rtt`` round trip (``offset`` None: an older Fleet, no time sent)."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self.clock = clock
        self.offset: float | None = 0.0
        self.rtt = 0.002

    def push(self, request: ExportMetricsServiceRequest) -> PushResult:
        self.pushed.append(request)
        self.clock.advance(self.rtt / 2)
        server = None if self.offset is None else self.clock.now() + self.offset
        self.clock.advance(self.rtt / 2)
        view = ThresholdView(threshold=0.7, quorum_met=True, server_time=server)
        return PushResult(True, view)


def timed(config: PushConfig | None = None):  # type: ignore[no-untyped-def]
    agent, clock, sampler, _client, rec = make(config=config)
    client = TimedClient(clock)
    agent.client = client
    return agent, clock, sampler, client, rec


def test_the_clock_offset_from_push_round_trips_goes_with_the_next_push() -> None:
    agent, clock, _sampler, client, _rec = timed()
    client.offset = 0.003
    agent.step()
    assert decode_health(client.pushed[0]).pushes[0].clock is None  # no round trip yet
    clock.advance(5)
    agent.step()
    offset = decode_health(client.pushed[1]).pushes[0].clock
    assert offset is not None
    assert offset.offset_s == pytest.approx(0.003, abs=1e-6)
    assert offset.uncertainty_s == pytest.approx(0.001, abs=1e-6)


def test_clock_skew_starts_and_ends_with_one_event_id_through_the_channels() -> None:
    agent, clock, _sampler, client, rec = timed()
    client.offset = -0.050  # the node's clock is 50 ms ahead of Fleet's
    agent.step()
    skews = [e for e in rec.events if e.type == "clock_skew"]
    assert [e.extra["state"] for e in skews] == ["start"]
    assert skews[0].extra["offset_ms"] == pytest.approx(-50.0, abs=0.01)
    assert skews[0].job_id == "42" and skews[0].rank == 1
    for _ in range(3):  # still off: no repeat
        clock.advance(5)
        agent.step()
    client.offset = 0.0  # chrony stepped the node's clock back
    clock.advance(5)
    agent.step()
    skews = [e for e in rec.events if e.type == "clock_skew"]
    assert [e.extra["state"] for e in skews] == ["start", "end"]
    assert skews[0].event_id == skews[1].event_id
    assert agent.status.events["clock_skew"] == 2


def test_an_older_fleet_without_its_time_gives_no_offset_and_no_event() -> None:
    agent, clock, _sampler, client, rec = timed()
    client.offset = None
    for _ in range(3):
        agent.step()
        clock.advance(5)
    assert all(decode_health(p).pushes[0].clock is None for p in client.pushed)
    assert not [e for e in rec.events if e.type == "clock_skew"]


def test_fleets_peer_lag_makes_the_node_a_straggler_with_a_good_score() -> None:
    agent, clock, sampler, client, rec = make()
    sampler.score = 0.95
    client.result = PushResult(True, ThresholdView(threshold=0.7, quorum_met=True, peer_lag=0.29))
    for _ in range(ENTER_INTERVALS - 1):  # fewer intervals than the enter rule's: no episode
        agent.step()
        assert not agent.status.straggling
        clock.advance(5)
    agent.step()
    assert agent.status.straggling
    event = rec.events[-1]
    assert event.type == "straggler_state" and event.dominant_signal == "peer_lag"
    assert event.extra["peer_lag_s"] == 0.29
    # Fleet unreachable for a push: the lag it last sent still counts while fresh.
    client.result = PushResult(False, error="refused")
    clock.advance(5)
    agent.step()
    assert agent.status.straggling
    # Fleet no longer finds the rank late: the good score resolves the episode, after the
    # exit rule's intervals in a row.
    client.result = PushResult(True, ThresholdView(threshold=0.7, quorum_met=True))
    for _ in range(EXIT_INTERVALS):
        assert agent.status.straggling
        clock.advance(5)
        agent.step()
    assert rec.events[-1].type == "straggler_resolved" and not agent.status.straggling


# ---- the stack snapshot ----------------------------------------------------------------

HANG_ID = "9d1c2b3a-0d7b-4f4e-9b7e-1c2d3e4f5a6b"


@pytest.fixture
def job_process(tmp_path: Path):  # type: ignore[no-untyped-def]
    """A real Python process of job 42 (rank 1) asleep in read_batch, in a real node DB."""
    import sys

    from ingero.nodedb.schema import connect

    proc = start_loader()
    db = tmp_path / "node.db"
    conn = connect(db).conn
    conn.execute(
        "INSERT INTO processes VALUES (?, 'python3', ?, '42', 1, 1.0, 2.0)",
        (proc.pid, sys.executable),
    )
    conn.commit()
    conn.close()
    yield proc, db
    proc.kill()
    proc.wait()


def with_snapshots(agent: Agent, db: Path, py_spy: str | None) -> None:
    from ingero.push.sampler import _pid_alive
    from ingero.push.stack_snapshot import Snapshotter, dump, job_targets

    agent.snapshotter = Snapshotter(
        targets=lambda job: job_targets(db, job, limit=8, pid_alive=_pid_alive),
        dumper=lambda t, timeout: dump(t, py_spy=py_spy, timeout_s=timeout),
        emit=agent.emit,
        clock=agent.clock,
        min_gap_s=30.0,
        timeout_s=5.0,
        max_processes=8,
        max_bytes=10_000,
    )


def hang_reply(**fields: object) -> PushResult:
    """Fleet's reply naming this node in the episode HANG_ID (a collective_hang unless
    ``nccl_episode_type`` says otherwise)."""
    given = {"nccl_episode_type": "collective_hang", **fields}
    view = ThresholdView(
        threshold=0.7,
        quorum_met=True,
        nccl_episode_id=HANG_ID,
        **given,  # type: ignore[arg-type]
    )
    return PushResult(True, view)


def snapshots(agent: Agent, rec: Recorder) -> list[Event]:
    assert agent.snapshotter is not None
    agent.snapshotter.wait(30)
    return [e for e in rec.events if e.type == "stack_snapshot"]


def test_a_hang_that_waits_for_the_node_gets_one_snapshot_under_its_id(job_process) -> None:  # type: ignore[no-untyped-def]
    from ingero.push.stack_snapshot import find_py_spy

    proc, db = job_process
    agent, clock, _, client, rec = make()
    with_snapshots(agent, db, find_py_spy())
    client.result = hang_reply(
        server_time=clock.now(),
        nccl_episode_since=clock.now() - 45.0,
        nccl_episode_op="ncclAllReduce",
        nccl_episode_seq=9001,
    )
    agent.step()
    (snap,) = snapshots(agent, rec)
    assert snap.event_id == HANG_ID and (snap.node_id, snap.job_id, snap.rank) == ("n1", "42", 1)
    assert snap.extra["trigger"] == "collective_hang" and snap.extra["for_s"] == 45.0
    main = next(s for s in snap.extra["stacks"] if s.get("thread") == "MainThread")
    assert (main["pid"], main["rank"]) == (proc.pid, 1)
    top = main["frames"][0]
    assert (top["function"], top["line"], top["file"]) == ("read_batch", 12, str(LOADER))
    assert (snap.extra["op"], snap.extra["seq"]) == ("ncclAllReduce", 9001)
    assert "collective_hang in ncclAllReduce #9001 for 45 s: rank 1" in snap.message()
    assert f"read_batch at {LOADER}:12 ← Loader.__next__ at {LOADER}:18" in snap.message()
    # one per episode, not one per push
    clock.advance(60.0)
    agent.step()
    assert len(snapshots(agent, rec)) == 1


def test_a_stalled_straggler_gets_one_snapshot_under_its_episode_id(job_process) -> None:  # type: ignore[no-untyped-def]
    _, db = job_process
    agent, clock, sampler, _, rec = make()
    with_snapshots(agent, db, None)  # no py-spy here: the event says so
    sampler.stalled, sampler.score = True, 0.1
    for _ in range(3):
        agent.step()
        clock.advance(5.0)
    (straggler, *_) = [e for e in rec.events if e.type == "straggler_state"]
    (snap,) = snapshots(agent, rec)
    assert snap.event_id == straggler.event_id and snap.extra["trigger"] == "stalled"
    (entry,) = snap.extra["stacks"]
    assert entry["frames"] == [] and entry["reason"] == "py-spy not found: no stack snapshot"
    sampler.stalled, sampler.score = False, 0.9
    agent.step()
    assert len(snapshots(agent, rec)) == 1


def test_no_snapshot_while_nothing_names_the_node(job_process) -> None:  # type: ignore[no-untyped-def]
    _, db = job_process
    agent, clock, sampler, _, rec = make()
    with_snapshots(agent, db, None)
    sampler.score = 0.1  # a straggler, not stalled: its stack is not the question
    for _ in range(3):
        agent.step()
        clock.advance(5.0)
    assert agent.status.straggling and snapshots(agent, rec) == []


def test_the_snapshot_waits_until_the_node_db_lists_a_process_of_the_job(job_process) -> None:  # type: ignore[no-untyped-def]
    from ingero.nodedb.schema import connect
    from ingero.push.stack_snapshot import find_py_spy

    proc, db = job_process
    conn = connect(db).conn
    conn.execute("UPDATE processes SET job_id = 'another'")
    conn.commit()
    agent, clock, _, client, rec = make()
    with_snapshots(agent, db, find_py_spy())
    client.result = hang_reply(nccl_episode_since=clock.now())
    agent.step()
    assert snapshots(agent, rec) == []  # nothing of job 42 to dump yet: the episode waits
    conn.execute("UPDATE processes SET job_id = '42'")  # the tracer tagged it
    conn.commit()
    conn.close()
    clock.advance(5.0)
    agent.step()
    (snap,) = snapshots(agent, rec)
    assert snap.event_id == HANG_ID and snap.extra["stacks"][0]["pid"] == proc.pid


def test_a_peer_lag_that_names_the_node_gets_its_snapshot(job_process) -> None:  # type: ignore[no-untyped-def]
    from ingero.push.stack_snapshot import find_py_spy

    _, db = job_process
    agent, clock, _, client, rec = make()
    with_snapshots(agent, db, find_py_spy())
    client.result = hang_reply(
        nccl_episode_type="peer_lag",
        nccl_episode_since=clock.now() - 20.0,
        nccl_episode_op="ncclAllReduce",
    )
    agent.step()
    (snap,) = snapshots(agent, rec)
    assert (snap.event_id, snap.extra["trigger"], snap.extra["op"]) == (
        HANG_ID,
        "peer_lag",
        "ncclAllReduce",
    )
    assert "seq" not in snap.extra and snap.extra["for_s"] == 20.0
    assert "peer_lag in ncclAllReduce for 20 s: rank 1" in snap.message()


def test_an_episode_against_the_nodes_own_score_leaves_its_baselines_learning() -> None:
    """Without Fleet (local-baseline) nothing but learning says a lasting change of the
    job's work is its new normal: the sampler is never told to hold its baselines still."""
    agent, clock, sampler, client, rec = make(
        config=PushConfig(classifier=ClassifierConfig(enter_intervals=1))
    )
    client.result = PushResult(True, None)  # Fleet answers, with no threshold
    for _ in range(8):  # the score EMA warms up
        agent.step()
        clock.advance(5)
    assert agent.status.mode == "local-baseline"
    sampler.score = 0.5
    agent.step()
    clock.advance(5)
    agent.step()
    assert rec.events[-1].type == "straggler_state"
    assert agent.status.straggling
    assert not any(sampler.straggling)


def test_health_state_file_says_the_open_episode_and_since_when(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What ``ingero check --health`` (NHC) reads: rewritten every iteration, the episode
    with the time it opened (not the time of its latest re-emit), gone once it ends."""
    from ingero.schema import healthstate

    path = tmp_path / "push" / "health.json"
    path.parent.mkdir()
    config = PushConfig(
        classifier=ClassifierConfig(enter_intervals=1, exit_intervals=1, reemit_intervals=1)
    )
    agent, clock, sampler, _client, rec = make(config=config)
    agent.health_state = path
    agent.step()
    first = healthstate.read(path)
    assert first is not None and first.straggler is None and first.node_id == "n1"
    sampler.score, sampler.stalled = 0.5, True
    clock.advance(5)
    opened = clock.now()
    agent.step()
    clock.advance(5)
    agent.step()  # a re-emit of the same episode
    assert [e.type for e in rec.events][-2:] == ["straggler_state", "straggler_state"]
    held = healthstate.read(path)
    assert held is not None and held.straggler is not None
    assert held.written_at == clock.now() and held.interval_s == 5.0
    assert (held.straggler.since, held.straggler.reason, held.straggler.job_id) == (
        opened,
        "stall",
        "42",
    )
    assert held.straggler.episode_id == rec.events[-1].event_id
    sampler.score, sampler.stalled = 0.9, False
    clock.advance(5)
    agent.step()
    assert rec.events[-1].type == "straggler_resolved"
    ended = healthstate.read(path)
    assert ended is not None and ended.straggler is None
    # Its directory gone (fleet-push's RuntimeDirectory removed): logged once, pushes go on.
    path.unlink()
    path.parent.rmdir()
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            clock.advance(5)
            agent.step()
    assert sum("cannot write the health state file" in r.message for r in caplog.records) == 1
    assert agent.status.pushes_ok == 7


def test_gpus_held_and_unused_are_an_episode_in_events_and_the_state_file(tmp_path: Path) -> None:
    from ingero.push.gpu_idle import GpuIdleDetector, HeldJob
    from ingero.schema import healthstate

    agent, clock, sampler, _client, rec = make()
    agent.health_state = tmp_path / "health.json"
    agent.gpu_idle = GpuIdleDetector(idle_after=10.0, busy_below=0.01)
    jobs = [HeldJob("42", (0, 1), "alice", "gpu", 1, clock.now())]
    agent.held_jobs = lambda: jobs
    for _ in range(4):
        end = clock.now()
        sampler.window = WindowAggregates(
            start=end - 5, end=end, covered_s=5, kernel_launches=900, steps=0,
            gpus={0: GpuWindow(0, busy=0.95, pids=(7,)), 1: GpuWindow(1, busy=0.0)},
            launch_pids=(7,), tracer_intervals=1, new_intervals=1, new_launches=900,
        )  # fmt: skip
        agent.step()
        clock.advance(5)
    (start,) = [e for e in rec.events if e.type == "gpu_idle"]
    assert (start.extra["state"], start.extra["gpus"], start.extra["reason"]) == (
        "start",
        [1],
        "no_process",
    )
    state = healthstate.read(tmp_path / "health.json")
    assert state is not None
    assert [(g.event_id, g.job_id, g.gpus) for g in state.gpu_idle] == [
        (start.event_id, "42", (1,))
    ]
    jobs.clear()  # the job ends
    agent.step()
    assert rec.events[-1].type == "gpu_idle" and rec.events[-1].extra["end"] == "job_ended"
    state = healthstate.read(tmp_path / "health.json")
    assert state is not None and state.gpu_idle == ()


def test_fleet_s_word_of_a_wait_reaches_the_sampler_the_status_line_and_the_push() -> None:
    agent, _, sampler, client, rec = make()
    said = {"event_id": "e1", "comm_hash": "9f1c2e3d4a5b6c7d", "op": "ncclAllReduce",
            "seq": 113, "since": 5.0, "ranks": [2], "nodes": ["n3"]}  # fmt: skip
    client.result = PushResult(
        True, ThresholdView(threshold=0.7, quorum_met=True, waiting_for=said)
    )
    agent.step()
    assert sampler.nccl[-1] is None  # nothing said before the first reply
    sampler.waiting = True
    agent.step()
    got = sampler.nccl[-1]
    assert got is not None and got.waiting_for == said and not got.waited_for
    assert agent.status_line() == (
        "waiting score=0.900 mode=fleet threshold=0.700"
        " WAITING for rank 2 (n3) in ncclAllReduce #113"
    )
    push = decode_health(client.pushed[-1]).pushes[0]
    assert push.waiting and push.quiet and push.held
    assert [e for e in rec.events if e.type == "straggler_state"] == []
    # Named as the rank the others wait for: the sampler hears it (its quiet is a stall).
    client.result = PushResult(
        True,
        ThresholdView(
            threshold=0.7, quorum_met=True, nccl_episode_id="w1",
            nccl_episode_type="collective_wait", nccl_episode_since=5.0,
        ),
    )  # fmt: skip
    agent.step()
    agent.step()
    got = sampler.nccl[-1]
    assert got is not None and got.waited_for and got.waiting_for is None
