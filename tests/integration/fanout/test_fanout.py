"""Commands across nodes over real SSH: an OpenSSH sshd per fake node on loopback.

The remote ``ingero`` is this test's venv (``--remote-ingero``), run by each node's sshd as
root, reading that node's own node DB; one node is unreachable (nobody listens on its port).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.fanout.sshd import Nodes, missing_reason, silent_listener, ssh_nodes
from tests.unit.chain_dbs import Proc, real_db
from tests.unit.tef import problems

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(missing_reason() is not None, reason=str(missing_reason())),
]

INGERO = str(Path(sys.prefix) / "bin" / "ingero")
# One job, one NCCL communicator over three nodes: gpu1 has CPU contention and reaches the
# collectives last, gpu2 only waits for it, gpu3 has allocator churn; gpu9 is down.
CAUSES = {"gpu1": "cpu", "gpu2": "peer", "gpu3": "alloc"}
RANKS = {"gpu1": 0, "gpu2": 1, "gpu3": 2}
PROCS = {name: Proc(pid=4000 + rank, rank=rank) for name, rank in RANKS.items()}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Nodes]:
    root = tmp_path_factory.mktemp("nodes")
    dbs = {}
    for name, cause in CAUSES.items():
        dbs[name] = real_db(
            root / f"{name}.db",
            cause,
            procs=(PROCS[name],),
            peers=tuple(PROCS.values()),
            late_pid=PROCS["gpu1"].pid,
            seed=RANKS[name],
        )
    with ssh_nodes(root / "ssh", dbs, unreachable=["gpu9"]) as cluster:
        yield cluster


def ingero(nodes: Nodes, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [INGERO, *args, "--ssh-options", nodes.ssh_options, "--remote-ingero", INGERO],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_query_merges_rows_with_a_node_column_and_reports_the_unreachable_node(
    nodes: Nodes,
) -> None:
    sql = "SELECT rank, COUNT(*) AS n, MAX(ts_end) FROM intervals GROUP BY rank"
    proc = ingero(nodes, "query", "--nodes", "gpu[1-3,9]", "--json", sql)
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["columns"] == ["node", "rank", "n", "MAX(ts_end)"]
    # each node read its own DB: its own rank, 120 intervals x 5 ops (+3 cuMemAlloc at start)
    by_node = {row[0]: row[1:] for row in answer["rows"]}
    assert {n: v[0] for n, v in by_node.items()} == RANKS
    assert by_node["gpu2"][1] == 120 * 5 + 1
    assert answer["nodes"]["ok"] == ["gpu1", "gpu2", "gpu3"]
    [failed] = answer["nodes"]["failed"]
    assert failed["node"] == "gpu9" and failed["exit"] == 255
    assert failed["error"].startswith("unreachable:") and "refused" in failed["error"]
    assert "ingero: gpu9: unreachable:" in proc.stderr


def test_query_table_output_and_csv(nodes: Nodes) -> None:
    proc = ingero(nodes, "query", "--nodes", "gpu[1-2]", "--csv", "SELECT pid, comm FROM processes")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["node,pid,comm", "gpu1,4000,python", "gpu2,4001,python"]


def test_a_refused_query_is_each_nodes_error_and_exit_65(nodes: Nodes) -> None:
    proc = ingero(nodes, "query", "--nodes", "gpu[1-2]", "DELETE FROM intervals")
    assert proc.returncode == 65
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 3 and lines[-1] == "ingero: no node answered (2 failed)"
    assert all(ln.startswith(("ingero: gpu1: ", "ingero: gpu2: ")) for ln in lines[:2])
    assert "read-only" in lines[0]


def test_all_nodes_unreachable_exits_69(nodes: Nodes) -> None:
    proc = ingero(nodes, "query", "--nodes", "gpu9", "SELECT 1")
    assert proc.returncode == 69
    assert proc.stderr.strip().splitlines()[-1] == "ingero: no node answered (1 failed)"


def test_a_hung_node_times_out_and_the_others_answer(tmp_path: Path) -> None:
    db = real_db(tmp_path / "a.db", None)
    with silent_listener() as port, ssh_nodes(tmp_path / "ssh", {"a1": db}, hung={"a2": port}) as n:
        proc = ingero(
            n,
            "query",
            "--nodes",
            "a[1-2]",
            # a1 answers over a real ssh, a Python start that a loaded host slows down: a
            # bound it meets there, below ssh's own 10 s connect timeout (which a2, which
            # accepts and never answers, would meet first otherwise).
            "--node-timeout",
            "8s",
            "--json",
            "SELECT COUNT(*) FROM processes",
        )
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    assert answer["rows"] == [["a1", 1]]
    assert answer["nodes"]["failed"] == [
        {"node": "a2", "exit": None, "error": "timed out after 8s"}
    ]


def test_bad_node_set_is_a_usage_error(nodes: Nodes) -> None:
    proc = ingero(nodes, "query", "--nodes", "gpu[3-", "SELECT 1")
    assert proc.returncode == 2 and proc.stderr.startswith("ingero: --nodes: not a node set")


def test_explain_across_nodes_names_each_cause_and_the_lagging_peer(nodes: Nodes) -> None:
    proc = ingero(nodes, "explain", "--nodes", "gpu[1-3,9]", "--until", "latest", "--json")
    assert proc.returncode == 0, proc.stderr
    answer = json.loads(proc.stdout)
    top = {node: r["chains"][0]["rule"] for node, r in answer["nodes"].items()}
    assert top == {"gpu1": "cpu_contention", "gpu2": "peer_lag", "gpu3": "allocator_churn"}
    assert [f["node"] for f in answer["failed"]] == ["gpu9"]
    # only the nodes together show who the others wait for: rank 0, on gpu1
    peer = answer["across"]["peer_lag"]
    assert peer["evidence"]["late_node"] == "gpu1" and peer["evidence"]["late_rank"] == 0
    assert peer["evidence"]["ranks"] == 3 and peer["evidence"]["last_in"] >= 100
    assert 35e6 < peer["evidence"]["median_lag_ns"] < 45e6  # the builder's 40 ms

    text = ingero(nodes, "explain", "--nodes", "gpu[1-3]", "--until", "latest")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].startswith("gpu1: CPU contention (high")
    assert any(ln.startswith("gpu2: peer lag") for ln in lines)
    assert lines[-1].startswith("across nodes: rank 0 on gpu1 reaches ncclAllReduce last")


def test_merge_over_ssh_keeps_every_node_and_measures_clock_offsets(
    nodes: Nodes, tmp_path: Path
) -> None:
    out = tmp_path / "job.db"
    # the DBs hold rows from 2023: --since reaches back that far
    args = ["merge", str(out), "--nodes", "gpu[1-3,9]", "--since", "100000d"]
    proc = ingero(nodes, *args)
    assert proc.returncode == 0, proc.stderr
    assert "ingero: gpu9: intervals: unreachable:" in proc.stderr
    conn = sqlite3.connect(out)
    try:
        rows = conn.execute(
            "SELECT node, job_id, rank, COUNT(*) FROM host_intervals GROUP BY node ORDER BY node"
        ).fetchall()
        assert rows == [("gpu1", "77", 0, 120), ("gpu2", "77", 1, 120), ("gpu3", "77", 2, 120)]
        offsets = dict(conn.execute("SELECT node, clock_offset_s FROM merged_nodes").fetchall())
    finally:
        conn.close()
    # one host, one clock: every measured offset is a loopback delay, far below 100 ms
    assert set(offsets) == {"gpu1", "gpu2", "gpu3"}
    assert all(abs(v) < 0.1 for v in offsets.values()), offsets
    assert ingero(nodes, *args).returncode == 0  # again: the same rows, not twice
    conn = sqlite3.connect(out)
    assert conn.execute("SELECT COUNT(*) FROM host_intervals").fetchone()[0] == 360
    conn.close()


def test_export_over_ssh_is_a_valid_timeline_with_a_track_per_node(
    nodes: Nodes, tmp_path: Path
) -> None:
    out = tmp_path / "job.json"
    args = ["export", "--nodes", "gpu[1-3,9]", "--since", "100000d", "-o", str(out)]
    proc = ingero(nodes, *args)
    assert proc.returncode == 0, proc.stderr
    assert "ingero: gpu9: intervals: unreachable:" in proc.stderr
    assert "clocks disagree" not in proc.stderr  # one host: the measured offsets agree
    trace = json.loads(out.read_text())
    assert problems(trace) == []
    processes = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert processes == {"gpu1", "gpu2", "gpu3"}
    offsets = trace["otherData"]["clock_offsets_s"]
    assert set(offsets) == {"gpu1", "gpu2", "gpu3"} and all(abs(v) < 0.1 for v in offsets.values())
    collectives = {
        e["args"]["collective"]
        for e in trace["traceEvents"]
        if e["ph"] == "X" and "collective" in e["args"]
    }
    assert len(collectives) == 240


def test_merge_and_export_over_ssh_carry_nccl_calls_where_a_node_db_has_them(
    tmp_path: Path,
) -> None:
    """gpu1 and gpu3 run node DB v3 (nccl_calls; gpu3's sample lacks collective #5), gpu2 an
    older v2 DB: its ingero refuses the NCCL tables, and it is merged without them."""
    from tests.unit.collective_dbs import COLLECTIVES, job

    files = job(tmp_path / "dbs", {"gpu2": 2}, how="calls", missing={"gpu3": {5}})
    dbs = {f.stem: f for f in files}
    out = tmp_path / "job.db"
    with ssh_nodes(tmp_path / "ssh", dbs) as n:
        merged = ingero(n, "merge", str(out), "--nodes", "gpu[1-3]", "--since", "100000d")
        exported = ingero(n, "export", "--nodes", "gpu[1-3]", "--since", "100000d")
    assert merged.returncode == 0, merged.stderr
    assert "gpu2" not in merged.stderr.replace("gpu2: ", "", 1)  # only its "rows" line
    conn = sqlite3.connect(out)
    try:
        calls = conn.execute(
            "SELECT node, COUNT(*), MAX(seq) FROM nccl_calls GROUP BY node ORDER BY node"
        ).fetchall()
        comms = conn.execute("SELECT COUNT(*) FROM nccl_comms").fetchone()[0]
        raw = dict(conn.execute("SELECT node, COUNT(*) FROM raw_events GROUP BY node").fetchall())
    finally:
        conn.close()
    assert calls == [("gpu1", COLLECTIVES, COLLECTIVES), ("gpu3", COLLECTIVES - 1, COLLECTIVES)]
    assert comms == 0 and raw == {"gpu2": COLLECTIVES}
    assert exported.returncode == 0, exported.stderr
    trace = json.loads(exported.stdout)
    assert problems(trace) == []
    seqs = [e["args"]["seq"] for e in trace["traceEvents"] if "seq" in e.get("args", {})]
    assert len(seqs) == 2 * COLLECTIVES - 1  # gpu2's raw events (v2) carry none
