"""NCCL collectives joined across ranks by (communicator, sequence number), and the NCCL
tables carried by merge and export, with node DBs of schema versions 1, 2 and 3."""

from __future__ import annotations

import json
import sqlite3
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from ingero.cli.main import main
from ingero.explain.chains import CollectiveCall, Timeline, join_collectives, peer_lag_signal
from ingero.explain.reader import sampled_collectives
from ingero.fanout.across import cross_node_peer_lag
from ingero.fanout.ssh import MergedRows
from ingero.nodedb.nccl import NCCL_COLUMNS, nccl_calls_sql, nccl_sql
from tests.unit.collective_dbs import COLLECTIVES, COMM, LATE_S, PERIOD_S, T0, job
from tests.unit.tef import problems


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return int(info.value.code or 0), out, err


def call(node: str, pid: int, n: int, seq: int | None, late: float = 0.0) -> CollectiveCall:
    arrival = T0 + n * PERIOD_S + late
    return CollectiveCall(
        ts=arrival + 0.005, duration_ns=5_000_000, pid=pid, op="ncclAllReduce",
        comm_hash=COMM, rank=pid - 4000, node=node, seq=seq,
    )  # fmt: skip


def ranks(numbered: bool, missing: dict[int, set[int]]) -> list[CollectiveCall]:
    """Three ranks, 12 collectives; rank 0 late by 40 ms; ``missing``: rank -> numbers."""
    return [
        call(f"gpu{r + 1}", 4000 + r, n, n if numbered else None, LATE_S if r == 0 else 0.0)
        for r in range(3)
        for n in range(1, COLLECTIVES + 1)
        if n not in missing.get(r, set())
    ]


# (case, calls, collectives joined, how many have all 3 ranks, each collective's own number)
JOIN_CASES = [
    ("numbered, all sampled", ranks(True, {}), 12, 12, True),
    ("numbered, rank 1 misses #3", ranks(True, {1: {3}}), 12, 11, True),
    ("numbered, ranks miss different ones", ranks(True, {1: {3}, 2: {7, 8}}), 12, 9, True),
    ("unnumbered (node DB v1/v2)", ranks(False, {}), 12, 12, True),
    # positional: rank 1's calls after its gap join the others' next collective
    ("unnumbered, rank 1 misses #3", ranks(False, {1: {3}}), 12, 11, False),
    # one rank without numbers (an older node DB) puts the communicator back on positions
    (
        "mixed versions",
        [c for c in ranks(True, {}) if c.pid != 4002]
        + [c for c in ranks(False, {}) if c.pid == 4002],
        12,
        12,
        True,
    ),
]


@pytest.mark.parametrize(
    ("calls", "joined", "complete", "aligned"),
    [c[1:] for c in JOIN_CASES],
    ids=[c[0] for c in JOIN_CASES],
)
def test_join_collectives(
    calls: list[CollectiveCall], joined: int, complete: int, aligned: bool
) -> None:
    groups = join_collectives(calls)
    assert len(groups) == joined
    assert sum(len(m) == 3 for m in groups.values()) == complete
    # a collective holds one call per rank, all of the same collective (same period)
    same = all(len({round(c.arrival - T0) for c in m.values()}) == 1 for m in groups.values())
    assert same is aligned


@pytest.mark.parametrize("missing", [{}, {1: {3}}, {1: {3}, 2: {5, 9}}, {0: {2}}])
def test_a_rank_missing_a_sampled_call_does_not_shift_peer_lag(
    missing: dict[int, set[int]],
) -> None:
    t = Timeline(T0, T0, T0 + 100, collectives=tuple(ranks(True, missing)))
    sig = peer_lag_signal(t)
    assert sig is not None
    ev = sig.evidence
    complete = COLLECTIVES - len(set().union(*missing.values()))
    assert (ev["late_node"], ev["late_rank"], ev["joined_by"]) == ("gpu1", 0, "seq")
    assert (ev["rounds"], ev["last_in"]) == (complete, complete)
    assert ev["median_lag_ns"] == pytest.approx(LATE_S * 1e9, rel=0.01)


def test_without_numbers_one_missing_call_misaligns_as_before() -> None:
    """The fallback for older node DBs is still the i-th call (and shifts, as documented)."""
    t = Timeline(T0, T0, T0 + 100, collectives=tuple(ranks(False, {1: {3}})))
    sig = peer_lag_signal(t)
    assert sig is not None and sig.evidence["joined_by"] == "position"
    assert sig.evidence["late_node"] == "gpu2"  # its calls after the gap look a period late


def test_a_call_in_both_tables_counts_once() -> None:
    numbered = ranks(True, {})
    raw = [c for c in ranks(True, {1: {4}}) if c.pid == 4001] + [call("gpu2", 4001, 99, None)]
    combined = sampled_collectives(numbered, raw)
    assert len(combined) == len(numbered) + 1  # only the raw call without a number is added


VERSIONS = {
    "v3 everywhere": {},
    "gpu2 on v2": {"gpu2": 2},
    "gpu2 on v1, gpu3 on v2": {"gpu2": 1, "gpu3": 2},
}


def table(path: Path, sql: str) -> list[tuple[Any, ...]]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.mark.parametrize("how", ["raw", "calls", "both"])
@pytest.mark.parametrize("versions", list(VERSIONS.values()), ids=list(VERSIONS))
def test_merge_carries_the_nccl_tables_of_the_nodes_that_have_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str, versions: dict[str, int]
) -> None:
    files = job(tmp_path, versions, how=how)
    out = tmp_path / "job.db"
    code, _, err = run(capsys, "merge", str(out), *map(str, files))
    assert code == 0, err
    v3 = [n for n in ("gpu1", "gpu2", "gpu3") if versions.get(n, 3) >= 3]
    merged = dict(table(out, "SELECT node, schema_version FROM merged_nodes"))
    assert merged == {n: versions.get(n, 3) for n in ("gpu1", "gpu2", "gpu3")}
    calls = table(out, "SELECT node, COUNT(*), MIN(seq), MAX(seq) FROM nccl_calls GROUP BY node")
    expected = [(n, COLLECTIVES, 1, COLLECTIVES) for n in v3] if how != "raw" else []
    assert calls == expected
    # and the merged DB answers like a node DB
    code, text, err = run(capsys, "query", "--db", str(out), "--json", "--table", "nccl_calls")
    assert code == 0, err
    assert json.loads(text)["row_count"] == len(expected) * COLLECTIVES


def test_merging_only_older_node_dbs_makes_no_nccl_tables(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = job(tmp_path, {"gpu1": 2, "gpu2": 1, "gpu3": 2})
    out = tmp_path / "job.db"
    code, _, err = run(capsys, "merge", str(out), *map(str, files))
    assert code == 0 and "error" not in err
    names = {r[0] for r in table(out, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "raw_events" in names and not names & {"nccl_calls", "nccl_comms"}
    trace = export(capsys, out)  # and exports, joined by position
    assert len(collectives(trace)) == COLLECTIVES


def export(capsys: pytest.CaptureFixture[str], db: Path) -> dict[str, Any]:
    code, out, err = run(capsys, "export", "--db", str(db), "--since", "1h")
    assert code == 0, err
    trace: dict[str, Any] = json.loads(out)
    assert problems(trace) == []
    return trace


def collectives(trace: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and "collective" in e.get("args", {}):
            out[e["args"]["collective"]].append(e)
    return out


@pytest.mark.parametrize("how", ["raw", "calls", "both"])
def test_export_links_one_collective_by_its_number_when_a_node_misses_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    files = job(tmp_path, {}, how=how, missing={"gpu2": {3}}, skew_s=0.25)
    out = tmp_path / "job.db"
    assert run(capsys, "merge", str(out), *map(str, files))[0] == 0
    trace = export(capsys, out)
    offsets = trace["otherData"]["clock_offsets_s"]
    assert offsets["gpu3"] == pytest.approx(0.25, abs=1e-3)
    assert offsets["gpu2"] == pytest.approx(0.0, abs=1e-3)
    groups = collectives(trace)
    assert len(groups) == COLLECTIVES
    for cid, members in groups.items():
        n = int(cid.rsplit(":", 1)[1])
        assert len(members) == (2 if n == 3 else 3)
        # after the offsets, the ranks of one collective return together
        ends = [e["ts"] + e["dur"] for e in members]
        assert max(ends) - min(ends) < 1_000  # µs
    calls = [e for e in trace["traceEvents"] if e["ph"] == "X" and e.get("cat") == "nccl"]
    assert len(calls) == 3 * COLLECTIVES - 1  # a call in both tables is drawn once
    flows = [e for e in trace["traceEvents"] if e["ph"] in "stf"]
    assert len(flows) == 3 * COLLECTIVES - 1


def test_export_draws_a_collective_in_flight_to_the_end(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.unit.collective_dbs import node_db

    files = job(tmp_path, {}, how="calls")
    (tmp_path / "hung").mkdir()
    files[1] = node_db(tmp_path / "hung" / "gpu2.db", "gpu2", how="calls", in_flight=True)
    out = tmp_path / "job.db"
    assert run(capsys, "merge", str(out), *map(str, files))[0] == 0
    trace = export(capsys, out)
    hung = [e for e in trace["traceEvents"] if e.get("args", {}).get("in_flight")]
    assert len(hung) == 1 and hung[0]["args"]["seq"] == COLLECTIVES
    end = max(e["ts"] + e.get("dur", 0) for e in trace["traceEvents"] if "ts" in e)
    assert hung[0]["ts"] + hung[0]["dur"] == pytest.approx(end)
    assert trace["otherData"]["clock_offsets_s"]["gpu2"] == pytest.approx(0.0, abs=1e-3)


def rows(db: Path, sql: str) -> MergedRows:
    """``sql`` over a merged DB, as the fan-out's merged answer (node first)."""
    conn = sqlite3.connect(db)
    try:
        cur = conn.execute(sql.replace("SELECT ", "SELECT node, ", 1))
        return MergedRows([d[0] for d in cur.description], [list(r) for r in cur], [], [], [])
    finally:
        conn.close()


@pytest.mark.parametrize("how", ["raw", "calls"])
@pytest.mark.parametrize("versions", [{}, {"gpu3": 2}], ids=["v3", "gpu3 on v2"])
def test_explain_across_nodes_names_the_late_rank_when_a_node_misses_a_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], how: str, versions: dict[str, int]
) -> None:
    files = job(tmp_path, versions, how=how, missing={"gpu2": {3}})
    out = tmp_path / "job.db"
    assert run(capsys, "merge", str(out), *map(str, files))[0] == 0
    window = (T0, T0 + 100)
    raw = rows(out, nccl_sql(*window))
    assert raw.columns == ["node", *NCCL_COLUMNS]
    numbered = rows(out, nccl_calls_sql(*window)) if how == "calls" else None
    sig = cross_node_peer_lag(raw, *window, numbered=numbered)
    if versions:  # a v2 node among the ranks: joined by position, which the gap shifts
        assert sig is not None and sig.evidence["joined_by"] == "position"
        return
    assert sig is not None
    assert (sig.evidence["late_node"], sig.evidence["joined_by"]) == ("gpu1", "seq")
    assert sig.evidence["rounds"] == COLLECTIVES - 1
    assert sig.evidence["median_lag_ns"] == pytest.approx(LATE_S * 1e9, rel=0.01)
