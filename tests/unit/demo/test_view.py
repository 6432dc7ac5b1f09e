"""Demo pieces without processes: status lines, options, the rich and plain views, summary."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest
from rich.console import Console

from ingero.demo.runner import DemoOptions, DemoResult, DemoState, GroupView
from ingero.demo.status import NotifyListener, parse_notify, parse_status
from ingero.demo.view import LiveView, PlainView, summary


def test_parse_status_line() -> None:
    s = parse_status("active score=0.612 mode=fleet threshold=0.781 STRAGGLER")
    assert (s.state, s.score, s.mode, s.threshold, s.straggling) == (
        "active",
        0.612,
        "fleet",
        0.781,
        True,
    )
    s = parse_status("calibrating score=- mode=None threshold=-")
    assert (s.state, s.score, s.mode, s.threshold, s.straggling) == (
        "calibrating",
        None,
        None,
        None,
        False,
    )
    s = parse_status("active score=0.9 mode=local-cached threshold=0.7")
    assert s.mode == "local-cached"


def test_unknown_status_keeps_the_raw_text() -> None:
    held = parse_status("active (quiet, not yet a stall) score=0.8 mode=fleet threshold=0.7")
    assert (held.state, held.score, held.waiting) == ("active", 0.8, None)
    waiting = parse_status(
        "waiting score=0.81 mode=fleet threshold=0.76 WAITING for rank 2 (node-03) in"
        " ncclAllReduce #113"
    )
    assert waiting.state == "waiting" and not waiting.straggling
    assert waiting.waiting == "for rank 2 (node-03) in ncclAllReduce #113"
    s = parse_status("something else entirely")
    assert s.state == "unknown" and s.raw == "something else entirely" and s.score is None


def test_parse_notify_datagram() -> None:
    assert parse_notify(b"READY=1\nSTATUS=active score=1 mode=x threshold=-\n") == {
        "READY": "1",
        "STATUS": "active score=1 mode=x threshold=-",
    }
    assert parse_notify(b"\xff\xfegarbage") == {}


def test_notify_listener_receives_per_node(tmp_path: Path) -> None:
    listener = NotifyListener(tmp_path, ["node-01", "node-02"])
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.sendto(
                b"READY=1\nSTATUS=active score=0.5 mode=fleet threshold=0.4",
                str(listener.paths["node-02"]),
            )
            s.sendto(b"WATCHDOG=1", str(listener.paths["node-01"]))
        updates = listener.poll(1.0)
        assert set(updates) == {"node-02"}
        assert updates["node-02"].score == 0.5
        assert listener.ready == {"node-02"}
    finally:
        listener.close()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"nodes": 4}, "--nodes"),
        ({"nodes": 65}, "--nodes"),
        ({"push_interval": 0.1}, "--push-interval"),
        ({"slowdown": 0.0}, "--slowdown"),
        ({"slowdown": 1.0}, "--slowdown"),
        ({"duration": 0}, "--duration"),
        ({"straggler": "node-09"}, "--straggler"),
        ({"stall": "node-09"}, "--stall"),
        ({"stall": "node-02", "straggler": "node-03"}, "--stall names the straggler"),
        ({"shape": "tpu-bound"}, "--shape"),
        ({"cause": "disk"}, "--cause must be one of cpu, io"),
        ({"cause": "io", "stall": "node-02"}, "a --stall has no cause"),
    ],
)
def test_bad_options(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DemoOptions(**kwargs).validate()  # type: ignore[arg-type]


def state() -> DemoState:
    opts = DemoOptions(nodes=5, straggler="node-02")
    st = DemoState(options=opts, straggler="node-02", phase="detected", started_at=1.0)
    st.nodes = {
        "node-01": parse_status("active score=0.830 mode=fleet threshold=0.780"),
        "node-02": parse_status("active score=0.620 mode=fleet threshold=0.780 STRAGGLER"),
    }
    st.group = GroupView(threshold=0.78, median=0.83, quorum_met=True, active_nodes=3)
    st.injected_at, st.detected_at = 10.0, 11.5
    st.flagged = {"node-02": 11.5}
    st.api_url = "http://127.0.0.1:1234"
    st.sink_metrics_url = "http://127.0.0.1:5678/metrics"
    st.note("injected")
    return st


def test_live_view_renders_table_with_highlight() -> None:
    buffer = io.StringIO()
    console = Console(file=buffer, width=120, force_terminal=False, color_system=None)
    view = LiveView(console)
    console.print(view.render(state()))
    text = buffer.getvalue()
    assert "threshold 0.780" in text and "quorum yes" in text
    assert "node-02" in text and "STRAGGLER" in text and "0.620" in text
    assert "node-03" in text and "starting" in text
    assert "node-02 detected as a straggler" in text


def test_plain_view_prints_changes_once() -> None:
    out = io.StringIO()
    view = PlainView(out)
    st = state()
    view.update(st)
    view.update(st)
    text = out.getvalue()
    assert text.count("node-02: active score=0.620 mode=fleet threshold=0.780 STRAGGLER") == 1
    assert text.count("injected") == 1


def test_summary_names_latency_events_and_where_to_look() -> None:
    result = DemoResult(True, "ok", "node-02", 1.5, 1.5, (), {"straggler_state": 1})
    text = summary(state(), result)
    assert "detected: node-02 after 1.5 s = 1.5 push intervals of 1 s" in text
    assert "straggler_state=1" in text
    assert "http://127.0.0.1:1234/metrics" in text
    assert "journalctl" in text


def test_stall_names_the_straggler_and_writes_stall_to_its_control_file(tmp_path: Path) -> None:
    from ingero.demo.runner import Demo

    demo = Demo(DemoOptions(nodes=5, stall="node-03", seed=1, independent=True), Quiet())
    assert demo.state.straggler == "node-03"
    (tmp_path / "node-03").mkdir()
    demo._inject(tmp_path)
    assert (tmp_path / "node-03" / "slowdown").read_text() == "stall\n"
    assert demo.state.log[-1].endswith("injected a stall on node-03")
    result = DemoResult(True, "ok", "node-03", 2.0, 2.0, (), {})
    assert "straggler injected: node-03 (stalled)" in summary(demo.state, result)


def test_a_lock_step_job_s_rank_is_hung_or_slowed_through_the_job_s_control_file(
    tmp_path: Path,
) -> None:
    """By default the demo's nodes are the ranks of one lock-step job: the injection is the
    job's control word for the straggler's rank."""
    from ingero.demo.runner import Demo

    demo = Demo(DemoOptions(nodes=5, stall="node-03", seed=1), Quiet())
    assert demo.options.lockstep
    demo._inject(tmp_path)
    assert (tmp_path / "job-control").read_text() == "rank 2 hang\n"
    assert demo.state.log[-1].endswith(
        "injected a hang of rank 2 (before its next collective) on node-03"
    )
    result = DemoResult(True, "ok", "node-03", 2.0, 2.0, (), {})
    text = summary(demo.state, result)
    assert (
        "straggler injected: node-03 (hung before a collective), rank 2 of a lock-step job of 5"
        in text
    )
    slow = Demo(DemoOptions(nodes=5, straggler="node-05", cause="gpu"), Quiet())
    slow._inject(tmp_path)
    assert (tmp_path / "job-control").read_text() == "rank 4 0.3 gpu\n"
    # An inference server is a replica of its own, whatever the default.
    assert not DemoOptions(shape="inference").lockstep
    with pytest.raises(ValueError, match="--cause"):
        DemoOptions(cause="gpu", independent=True).validate()


class Quiet:
    def update(self, state: DemoState) -> None:
        pass


def node_db(path: Path, cause: str, slowed_from: float, end: float) -> None:
    """A node DB the workload generator writes: steady, then slowed by ``cause``."""
    from ingero.nodedb.schema import connect
    from ingero.workload.generator import WorkloadGenerator, WorkloadProfile

    db = connect(path)
    gen = WorkloadGenerator(WorkloadProfile(job_id="demo-1", rank=2), seed=1)
    ts = slowed_from - (end - slowed_from)
    while ts < end - 1e-9:
        on = ts >= slowed_from - 1e-9
        rows = gen.tick(ts, ts + 0.25, 0.3 if on else 0.0, cause=cause if on else None)
        for table in ("intervals", "gpu_intervals", "gpu_processes", "host_intervals"):
            db.table(table).insert_all(getattr(rows, table))
        ts += 0.25
    db.conn.commit()
    db.conn.close()


@pytest.mark.parametrize(("written", "named"), [("alloc", True), ("net", False)])
def test_explain_on_the_injected_node_must_name_the_cause(
    tmp_path: Path, written: str, named: bool
) -> None:
    import time

    from ingero.demo.runner import Demo

    demo = Demo(DemoOptions(nodes=5, straggler="node-03", cause="alloc", independent=True), Quiet())
    (tmp_path / "node-03").mkdir()
    demo._inject(tmp_path)
    assert (tmp_path / "node-03" / "slowdown").read_text() == "0.3 alloc\n"
    assert demo.state.log[-1].endswith("injected a 30% slowdown from alloc on node-03")
    now = time.time()
    demo.state.injected_at = now - 10.0
    node_db(tmp_path / "node-03" / "ingero.db", written, now - 10.0, now)
    outcome = demo._explain(tmp_path)
    assert outcome.command[:3] == ("ingero", "explain", "--db")
    assert outcome.error is None and outcome.chain is not None
    assert outcome.expected == "allocator_churn"
    assert outcome.named is named
    assert outcome.chain["rule"] == ("allocator_churn" if named else "network_retransmits")
    result = DemoResult(named, "ok", "node-03", 2.0, 2.0, (), {}, outcome)
    text = summary(demo.state, result)
    assert "straggler injected: node-03 (30% slower, cause alloc)" in text
    assert f"explain: ingero explain --db {tmp_path}/node-03/ingero.db --until " in text
    assert f"  1. {outcome.chain['name']} (" in text and "     fix: " in text
    verdict = "yes" if named else "no"
    assert f"explain names the injected cause (alloc: allocator_churn): {verdict}" in text


def test_explain_without_a_node_db_says_why(tmp_path: Path) -> None:
    from ingero.demo.runner import Demo

    demo = Demo(DemoOptions(nodes=5, straggler="node-01", cause="cpu"), Quiet())
    demo.state.injected_at = 1.0
    outcome = demo._explain(tmp_path)
    assert outcome.chain is None and not outcome.named
    assert outcome.error is not None and outcome.error.startswith("explain failed: ")
    assert "no node DB here" in outcome.error
