"""Causal chains of ``ingero explain``: each rule of the table on a real-shaped node DB."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from ingero.cli.main import main
from ingero.explain.chains import (
    DETECTORS,
    SIGNALS,
    Chain,
    explain_chains,
    load_rules,
    parse_rules,
    signals,
)
from ingero.explain.reader import read_timeline
from ingero.nodedb.schema import open_node_db
from ingero.runtime.errors import ConfigError
from tests.unit.chain_dbs import END, TICK_S, Proc, real_db

WINDOW = 300.0
TWO = (Proc(), Proc(pid=4343, rank=1))


def chains_of(path: Path, **kw: Any) -> list[Chain]:
    db = open_node_db(path)
    try:
        return explain_chains(read_timeline(db, END, WINDOW, None), **kw)
    finally:
        db.conn.close()


# cause injected -> the rule that must come first, the signal ids its causes hold
EXPECTED = [
    ("cpu", "cpu_contention", {"offcpu"}, "launch_latency"),
    ("io", "dataloader_starvation", {"offcpu", "block_io", "page_allocs"}, None),
    ("alloc", "allocator_churn", {"alloc_churn"}, "sync_latency"),
    ("memcpy", "memcpy_bound", {"memcpy"}, None),
    ("throttle", "gpu_throttling", {"gpu_throttle"}, "sync_latency"),
    ("xid", "gpu_xid", {"gpu_xid"}, None),
    ("net", "network_retransmits", {"tcp_retransmits"}, "nccl_latency"),
    ("peer", "peer_lag", {"peer_lag"}, "nccl_latency"),
]


@pytest.mark.parametrize(("cause", "rule", "causes", "via"), EXPECTED, ids=[e[0] for e in EXPECTED])
def test_each_cause_puts_its_rule_first(
    tmp_path: Path, cause: str, rule: str, causes: set[str], via: str | None
) -> None:
    path = real_db(tmp_path / "n.db", cause, procs=TWO if cause == "peer" else (Proc(),))
    chains = chains_of(path)
    top = chains[0]
    assert top.rule == rule, [c.headline() for c in chains]
    assert {s.id for s in top.causes} == causes
    assert (top.via.id if top.via else None) == via
    # the effect is the launch-rate drop the DB holds (30% in every cause)
    assert top.effect is not None and top.effect.id == "throughput_drop"
    assert top.effect.evidence["metric"] == "kernel-launch rate"
    assert 0.27 < top.effect.evidence["drop"] < 0.33
    # every cause and its next layer started in the same interval (tick 60)
    assert all(
        "began in the same interval" in lk.time for lk in top.links if lk.cause != "peer_lag"
    )
    assert top.fix == next(r.fix for r in load_rules() if r.id == rule)
    # no rule fires on something the DB does not hold
    assert len({c.rule for c in chains}) == len(chains)


def test_steady_node_has_no_chain(tmp_path: Path) -> None:
    path = real_db(tmp_path / "n.db", None, gpu_columns=True)
    db = open_node_db(path)
    try:
        timeline = read_timeline(db, END, WINDOW, None)
    finally:
        db.conn.close()
    assert signals(timeline) == {}
    assert explain_chains(timeline) == []


def test_cpu_contention_evidence_names_process_counts_and_times(tmp_path: Path) -> None:
    chain = chains_of(real_db(tmp_path / "n.db", "cpu"))[0]
    offcpu = chain.causes[0]
    assert offcpu.pids == frozenset({4242})
    assert offcpu.evidence["processes"] == [
        {"pid": 4242, "comm": "python", "job_id": "77", "rank": 0}
    ]
    # 600 switches/s at rest, 3x from tick 60: ~1,800/s over the recent 5 minutes
    assert 1700 < offcpu.evidence["switch_rate"] < 1900
    assert 570 < offcpu.evidence["switch_rate_baseline"] < 630
    assert offcpu.onset == END - WINDOW + TICK_S  # the first recent interval
    assert "pid 4242 (python)" in chain.headline()
    assert chain.headline().startswith("kernel-launch rate down 3")
    assert chain.level == "high"
    assert all(lk.process == "same process: pid 4242" for lk in chain.links)


def test_dataloader_starvation_and_cpu_contention_exclude_each_other(tmp_path: Path) -> None:
    io = {c.rule for c in chains_of(real_db(tmp_path / "io.db", "io"))}
    cpu = {c.rule for c in chains_of(real_db(tmp_path / "cpu.db", "cpu"))}
    assert "dataloader_starvation" in io and "cpu_contention" not in io
    assert "cpu_contention" in cpu and "dataloader_starvation" not in cpu


def test_a_cause_in_another_process_links_with_less_confidence(tmp_path: Path) -> None:
    same = chains_of(real_db(tmp_path / "a.db", "cpu", procs=TWO, cause_pids=(4242,)))[0]
    other = chains_of(
        real_db(tmp_path / "b.db", "cpu", procs=TWO, cause_pids=(4242,), slow_pids=(4343,))
    )[0]
    assert same.rule == other.rule == "cpu_contention"
    assert same.links[-1].process == "same process: pid 4242"
    assert other.links[-1].process == "different processes"
    assert other.confidence < same.confidence


def test_a_cause_that_starts_after_the_drop_links_with_less_confidence(tmp_path: Path) -> None:
    aligned = chains_of(real_db(tmp_path / "a.db", "alloc"))[0]
    late = chains_of(real_db(tmp_path / "b.db", "alloc", cause_from=100, slow_from=60))[0]
    assert aligned.rule == late.rule == "allocator_churn"
    assert late.via is not None and late.effect is not None
    # the allocator burst (and the slower syncs it causes) began 200 s after the drop
    assert late.links[0].time.startswith("alloc_churn and sync_latency began in the same")
    assert late.links[1].time.startswith("sync_latency began 200 s after throughput_drop")
    assert late.confidence < aligned.confidence


def test_gpu_throttle_columns_are_read_only_where_present(tmp_path: Path) -> None:
    # gpu_intervals rows without the NVML columns (schema version 1): read, no throttle signal
    path = real_db(tmp_path / "plain.db", "cpu", gpu_rows=True)
    db = open_node_db(path)
    try:
        timeline = read_timeline(db, END, WINDOW, None)
    finally:
        db.conn.close()
    assert len(timeline.gpus) == 120 and not any(g.throttled or g.xid for g in timeline.gpus)
    assert all(c.rule != "gpu_throttling" for c in chains_of(path))
    # the columns present but only GPU-idle (0x1) reasons: not throttling
    path = real_db(tmp_path / "idle.db", None, gpu_columns=True)
    assert chains_of(path) == []


def test_the_rule_table_is_data(tmp_path: Path) -> None:
    path = real_db(tmp_path / "n.db", "cpu")
    table = {
        "rules": [
            {
                "id": "busy_neighbour",
                "name": "noisy neighbour",
                "cause_any": ["offcpu"],
                "effect_any": ["throughput_drop"],
                "prior": 0.5,
                "fix": "move the job",
            }
        ]
    }
    chains = chains_of(path, rules=parse_rules(table))
    assert [(c.rule, c.fix, c.via) for c in chains] == [("busy_neighbour", "move the job", None)]
    assert chains[0].confidence == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        ({"name": "x", "fix": "f", "prior": 0.5, "cause_any": ["offcpu"]}, "'id' must be"),
        ({"id": "a", "name": "x", "fix": "f", "prior": 2, "cause_any": ["offcpu"]}, "'prior'"),
        ({"id": "a", "name": "x", "fix": "f", "prior": 0.5, "cause_any": ["cpu"]}, "'cpu'"),
        ({"id": "a", "name": "x", "fix": "f", "prior": 0.5}, "needs cause_any or cause_all"),
        ({"id": "a", "name": "x", "fix": "f", "prior": 0.5, "causes": []}, "unknown key"),
    ],
)
def test_a_bad_rule_table_is_refused_naming_the_rule(rule: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_rules({"rules": [rule]}, "t.yaml")


def test_shipped_table_covers_every_cause() -> None:
    ids = {r.id for r in load_rules()}
    assert ids >= {e[1] for e in EXPECTED}
    with pytest.raises(ConfigError, match="duplicate id"):
        rule = {"id": "a", "name": "x", "fix": "f", "prior": 0.5, "cause_any": ["offcpu"]}
        parse_rules({"rules": [rule, rule]})


def test_every_signal_a_rule_may_name_has_one_detector() -> None:
    assert tuple(DETECTORS) == SIGNALS


def test_cli_prints_chains_and_json_keeps_their_structure(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = real_db(tmp_path / "n.db", "cpu")
    with pytest.raises(SystemExit) as info:
        main(["explain", "--db", str(path), "--until", "latest"])
    out = capsys.readouterr().out
    assert info.value.code == 0
    assert "Causal chains, most likely first:" in out
    assert "1. CPU contention (high confidence" in out and "fix: The training threads" in out
    with pytest.raises(SystemExit):
        main(["explain", "--db", str(path), "--until", "latest", "--json"])
    report = json.loads(capsys.readouterr().out)
    chain = report["chains"][0]
    assert chain["rule"] == "cpu_contention" and chain["level"] == "high"
    assert [c["signal"] for c in chain["causes"]] == ["offcpu"]
    assert chain["via"]["signal"] == "launch_latency"
    assert chain["effect"]["signal"] == "throughput_drop"
    assert chain["causes"][0]["evidence"]["processes"][0]["comm"] == "python"
    assert [(lk["cause"], lk["effect"]) for lk in chain["links"]] == [
        ("offcpu", "launch_latency"),
        ("launch_latency", "throughput_drop"),
    ]


def test_the_software_power_cap_is_not_gpu_throttling(tmp_path: Path) -> None:
    # A GPU-bound job at full load meets the software power cap (0x4) on healthy GPUs, and
    # sync boost (0x10) is a setting: only the hardware slowdown reasons are throttling, as
    # in fleet-push's GPU health (DEGRADING_THROTTLE).
    path = real_db(tmp_path / "n.db", None, gpu_columns=True)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE gpu_intervals SET throttle_reasons = 0x14 WHERE ts_end > ?", (END - WINDOW,)
        )
    assert chains_of(path) == []
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE gpu_intervals SET throttle_reasons = 0x24 WHERE ts_end > ?", (END - WINDOW,)
        )
    (chain,) = chains_of(path)
    assert chain.rule == "gpu_throttling"
    assert chain.causes[0].evidence["reasons"] == [
        "throttle_reasons=0x24 (sw_power_cap, sw_thermal_slowdown)"
    ]
