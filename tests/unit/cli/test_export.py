"""``ingero export``: Trace Event Format timelines from a node DB and a merged DB."""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from ingero.cli.main import main
from ingero.schema.events import Event
from tests.unit.chain_dbs import T0, Proc, real_db
from tests.unit.tef import problems

PROCS = {n: Proc(pid=4000 + i, rank=i) for i, n in enumerate(["gpu1", "gpu2", "gpu3"])}
CAUSES = {"gpu1": "cpu", "gpu2": "peer", "gpu3": "alloc"}


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def job_db(tmp_path: Path, capsys: pytest.CaptureFixture[str], skew: float = 0.0) -> Path:
    """Three nodes of one job merged; gpu3's clock runs ``skew`` seconds ahead."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    files = []
    for name, cause in CAUSES.items():
        files.append(
            real_db(
                tmp_path / f"{name}.db",
                cause,
                procs=(PROCS[name],),
                peers=tuple(PROCS.values()),
                late_pid=4000,
                skew_s=skew if name == "gpu3" else 0.0,
            )
        )
    out = tmp_path / "job.db"
    assert run(capsys, "merge", str(out), *map(str, files))[0] == 0
    return out


def export(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[dict[str, Any], str]:
    code, out, err = run(capsys, "export", *args)
    assert code == 0, err
    trace = json.loads(out)
    assert problems(trace) == []
    return trace, err


def names(trace: dict[str, Any], what: str) -> dict[tuple[int, int], str]:
    return {
        (e["pid"], e["tid"]): e["args"]["name"]
        for e in trace["traceEvents"]
        if e["ph"] == "M" and e["name"] == what
    }


def test_single_node_db(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = real_db(
        tmp_path / "n.db",
        "cpu",
        procs=(Proc(), Proc(pid=4343, rank=1)),
        peers=(Proc(), Proc(pid=4343, rank=1)),
        late_pid=4343,
    )
    trace, err = export(capsys, "--db", str(path), "--node", "gpu07", "--since", "10m")
    assert err == ""
    assert names(trace, "process_name") == {(1, 0): "gpu07"}
    threads = names(trace, "thread_name")
    assert threads[(1, 4242)] == "rank 0 · pid 4242 (python)"
    assert threads[(1, 4343)] == "rank 1 · pid 4343 (python)"
    events = trace["traceEvents"]
    calls = [e for e in events if e["ph"] == "X" and e["cat"] == "nccl"]
    conn = sqlite3.connect(path)
    assert len(calls) == conn.execute("SELECT COUNT(*) FROM raw_events").fetchone()[0]
    conn.close()
    # a call is drawn from its start (return time - duration): once rank 1 is late (the
    # second half), rank 0 waits ~40 ms in each collective and rank 1 only a few ms
    late = [e for e in calls if e["ts"] > 300e6 + 5e6]
    waits = {tid: sorted(e["dur"] for e in late if e["tid"] == tid) for tid in (4242, 4343)}
    assert waits[4242][0] > 40_000 and waits[4343][-1] < 4_000
    counters = Counter(e["name"] for e in events if e["ph"] == "C")
    assert counters["calls/s pid 4242"] == 120 and counters["off-CPU s/s"] == 120
    rate = next(e for e in events if e["ph"] == "C" and e["name"] == "calls/s pid 4242")
    assert 18_000 < rate["args"]["cuLaunchKernel"] < 21_000
    assert trace["otherData"]["t0_unix_s"] == T0


def test_merged_job_links_collectives_and_warns_of_a_clock_ahead(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace, err = export(capsys, "--db", str(job_db(tmp_path, capsys, skew=0.25)))
    assert names(trace, "process_name") == {(1, 0): "gpu1", (2, 0): "gpu2", (3, 0): "gpu3"}
    assert err.startswith("ingero: warning: nodes' clocks disagree by 250 ms (gpu3 +250 ms,")
    offsets = trace["otherData"]["clock_offsets_s"]
    assert offsets["gpu3"] == pytest.approx(0.25, abs=1e-3) and offsets["gpu1"] == 0.0
    # after the offset, the three calls of each collective return together again
    ends = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and "collective" in e.get("args", {}):
            ends[e["args"]["collective"]].append(e["ts"] + e["dur"])
    assert len(ends) == 240 and all(len(v) == 3 for v in ends.values())
    assert max(max(v) - min(v) for v in ends.values()) < 1_000  # µs
    flows = Counter(e["ph"] for e in trace["traceEvents"] if e["ph"] in "stf")
    assert flows == {"s": 240, "t": 240, "f": 240}


def test_measured_offsets_win_and_no_warning_when_clocks_agree(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = job_db(tmp_path, capsys, skew=0.25)
    conn = sqlite3.connect(path)
    conn.execute("UPDATE merged_nodes SET clock_offset_s = 0.25 WHERE node = 'gpu3'")
    conn.execute("UPDATE merged_nodes SET clock_offset_s = 0.0 WHERE node != 'gpu3'")
    conn.commit()
    conn.close()
    trace, err = export(capsys, "--db", str(path), "--format", "chrome")
    assert "gpu3 +250 ms, measured" in err
    assert trace["otherData"]["format"] == "chrome"
    _, err = export(capsys, "--db", str(job_db(tmp_path / "b", capsys)))
    assert err == ""


def journal_line(kind: str, node: str, ts: float, **extra: Any) -> str:
    event = Event.from_dict(
        {
            "type": kind,
            "event_id": str(uuid.uuid4()),
            "node_id": node,
            "cluster_id": "c1",
            "job_id": "77",
            "timestamp": ts,
            "score": 0.3,
            "threshold": 0.5,
            "dominant_signal": "throughput",
            **extra,
        }
    )
    return json.dumps(event.journal_fields())


def test_episodes_and_drains_from_the_journal_are_slices(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = tmp_path / "journal.json"
    start = T0 + 320
    events.write_text(
        "\n".join(
            [
                journal_line("straggler_state", "gpu1", start),
                journal_line("straggler_resolved", "gpu1", start + 100, reason="recovered"),
                journal_line("node_drained", "gpu1", start + 40),
                journal_line("node_resumed", "gpu1", start + 90),
                journal_line("straggler_state", "gpu2", start + 10),  # still open
            ]
        )
        + "\n"
    )
    trace, _ = export(capsys, "--db", str(job_db(tmp_path, capsys)), "--events", str(events))
    slices = {(e["pid"], e["name"]): e for e in trace["traceEvents"] if e.get("cat") == "ingero"}
    t0 = trace["otherData"]["t0_unix_s"]
    episode = slices[(1, "straggler (throughput)")]
    assert episode["tid"] == 0 and episode["ts"] == pytest.approx((start - t0) * 1e6)
    assert episode["dur"] == pytest.approx(100e6)
    assert slices[(1, "drained")]["dur"] == pytest.approx(50e6)
    open_episode = slices[(2, "straggler (throughput)")]
    last = max(e["ts"] + e.get("dur", 0) for e in trace["traceEvents"] if "ts" in e)
    assert open_episode["ts"] + open_episode["dur"] == pytest.approx(last)
    assert names(trace, "thread_name")[(1, 0)] == "ingero events"


def test_output_file_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = real_db(tmp_path / "n.db", None)
    code, out, err = run(capsys, "export", "--db", str(path), "-o", str(tmp_path / "t.json"))
    assert code == 0 and out == "" and "events from 1 node(s)" in err
    assert problems(json.loads((tmp_path / "t.json").read_text())) == []
    assert run(capsys, "export", "--db", str(path), "--until", "soon")[0] == 2
    assert run(capsys, "export", "--db", str(tmp_path / "absent.db"))[0] == 69


def test_the_checker_catches_what_the_viewers_reject() -> None:
    bad = {
        "traceEvents": [
            {"ph": "X", "name": "a", "pid": 1, "tid": 1, "ts": 0},
            {"ph": "C", "name": "c", "pid": 1, "ts": 1, "args": {"v": "x"}},
            {"ph": "Q", "name": "q", "pid": 1},
        ]
    }
    assert problems(bad) == [
        "traceEvents[0]: ph X needs dur",
        "traceEvents[0]: dur must be a number >= 0",
        "traceEvents[1]: a counter's args must be numbers",
        "traceEvents[2]: unknown ph 'Q'",
    ]


def test_trace_processor_loads_the_export(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tp_module = pytest.importorskip("perfetto.trace_processor", reason="perfetto not installed")
    path = tmp_path / "t.json"
    code, _, err = run(capsys, "export", "--db", str(job_db(tmp_path, capsys)), "-o", str(path))
    assert code == 0, err
    # A local trace_processor_shell can be named; otherwise the package downloads one.
    binary = os.environ.get("PERFETTO_TRACE_PROCESSOR")
    kwargs = {"config": tp_module.TraceProcessorConfig(bin_path=binary)} if binary else {}
    try:
        tp = tp_module.TraceProcessor(trace=str(path), **kwargs)
    except Exception as exc:  # the binary is downloaded on first use
        pytest.skip(f"perfetto's trace_processor binary cannot be fetched offline here: {exc}")
    try:
        rows = list(tp.query("SELECT COUNT(*) AS n FROM slice WHERE category = 'nccl'"))
        assert rows[0].n == 720
        tracks = {r.name for r in tp.query("SELECT name FROM process")}
        assert {"gpu1", "gpu2", "gpu3"} <= tracks
    finally:
        tp.close()
