"""``ingero check --health``: the verdict from fleet-push's state file and the node DB's GPU
rows (NVML's, in the shape ``ingero trace`` writes them), and the state file's codec."""

from __future__ import annotations

import contextlib
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingero.check.health import HealthConfig, judge
from ingero.cli.main import main
from ingero.collectors.nvml import GpuReading, NvmlReading
from ingero.nodedb.schema import connect
from ingero.nodedb.writer import Batch, write_batch
from ingero.schema import healthstate
from ingero.schema.healthstate import HealthState, IdleGpus, StateError, Straggler
from ingero.trace.gpusampler import reading_rows

NOW = 1_800_000_000.0
CFG = HealthConfig()  # episode_age 10 m, gpu_window 15 m, XIDs 13,31,43,45 ignored


def h100(index: int, **values: Any) -> GpuReading:
    """A healthy H100 as NvmlReader reports it, unless told otherwise."""
    base: dict[str, Any] = {
        "utilization": 0.97,
        "mem_used_bytes": 70 << 30,
        "mem_free_bytes": 10 << 30,
        "mem_total_bytes": 80 << 30,
        "sm_clock_mhz": 1980,
        "sm_clock_max_mhz": 1980,
        "throttle_reasons": 0,
        "temperature_c": 61,
        "power_w": 640.0,
        "ecc_corrected": 0,
        "ecc_uncorrected": 0,
        "remapped_rows_correctable": 0,
        "remapped_rows_uncorrectable": 0,
        "remap_pending": False,
        "remap_failure": False,
        "xids": (),
    }
    base.update(values)
    return GpuReading(index=index, **base)


def rows(*readings: tuple[float, list[GpuReading]]) -> list[dict[str, Any]]:
    """gpu_intervals rows of NVML readings taken at the given ends (1 s intervals)."""
    out: list[dict[str, Any]] = []
    for end, gpus in readings:
        out += reading_rows(NvmlReading(tuple(gpus)), end - 1.0, end).intervals
    return out


HEALTHY = rows((NOW - 2, [h100(0), h100(1)]), (NOW - 1, [h100(0), h100(1)]))


def state(straggler: Straggler | None = None, written_at: float = NOW - 2) -> HealthState:
    return HealthState("n1", "c1", written_at, 5.0, "active", "fleet", straggler)


def episode(age: float, reason: str = "score") -> Straggler:
    return Straggler("0b7e3c5e-1c1d-4e59-9a57-1f2e3d4c5b6a", NOW - age, reason, "77", 0.41, 0.87)


@pytest.mark.parametrize(
    ("gpu_rows", "health", "line"),
    [
        (HEALTHY, state(), "ingero: healthy (GPUs 0-1 clean)"),
        (rows((NOW - 1, [h100(0), h100(1, lost=True)])), state(), "ingero: GPU 1: lost (NVML)"),
        (
            rows((NOW - 1, [h100(0, remap_pending=True), h100(1)])),
            state(),
            "ingero: GPU 0: row remap pending (reset it)",
        ),
        (
            rows((NOW - 1, [h100(0), h100(1, remap_failure=True)])),
            state(),
            "ingero: GPU 1: row remapping failed",
        ),
        (
            rows((NOW - 1, [h100(0, ecc_uncorrected=2), h100(1)])),
            state(),
            "ingero: GPU 0: 2 uncorrected ECC errors",
        ),
        (
            rows((NOW - 300, [h100(0), h100(1, xids=(79,))]), (NOW - 1, [h100(0), h100(1)])),
            state(),
            "ingero: GPU 1: XID 79",
        ),
        # The application's own XID (a kernel's illegal address) is not the GPU's fault.
        (rows((NOW - 1, [h100(0, xids=(13, 31)), h100(1)])), state(), "ingero: healthy (GPUs 0-1 clean)"),
        # An XID older than the window is over; a pending remap stays in every row.
        (
            rows((NOW - 1000, [h100(0, xids=(48,))]), (NOW - 1, [h100(0), h100(1)])),
            state(),
            "ingero: healthy (GPUs 0-1 clean)",
        ),
        (HEALTHY, state(episode(720)), "ingero: straggler for 12m (job 77, score 0.41 < 0.87)"),
        (HEALTHY, state(episode(900, "stall")), "ingero: straggler for 15m (job 77, score 0.41 < 0.87, stall)"),
        (
            HEALTHY,
            state(episode(120)),
            "ingero: healthy (GPUs 0-1 clean; straggler episode 2m old, below 10m)",
        ),
        # fleet-push stopped: its last word is no evidence, and says so.
        (
            HEALTHY,
            state(episode(3600), written_at=NOW - 600),
            "ingero: healthy (GPUs 0-1 clean; fleet-push state 10m old)",
        ),
        (HEALTHY, None, "ingero: healthy (GPUs 0-1 clean; no fleet-push state)"),
        ([], state(), "ingero: healthy (no GPU rows in the last 15m)"),
        (
            rows((NOW - 1, [h100(0, lost=True), h100(1, ecc_uncorrected=1, xids=(94,))])),
            state(episode(700)),
            "ingero: GPU 0: lost (NVML); GPU 1: 1 uncorrected ECC errors; GPU 1: XID 94; +1 more",
        ),
    ],
)  # fmt: skip
def test_verdict(gpu_rows: list[dict[str, Any]], health: HealthState | None, line: str) -> None:
    verdict = judge(health, gpu_rows, NOW, CFG)
    assert verdict.line() == line
    assert verdict.healthy == line.startswith("ingero: healthy")


def test_stragglers_left_to_fleet_and_gpus_expected() -> None:
    old = state(episode(3600))
    assert judge(old, HEALTHY, NOW, replace(CFG, stragglers=False)).healthy
    missing = judge(state(), rows((NOW - 1, [h100(0)])), NOW, replace(CFG, expect_gpus=2))
    assert missing.line() == "ingero: 1 of 2 GPUs report (GPUs 0)"
    ignored = replace(CFG, xid_ignore=frozenset())
    assert judge(state(), rows((NOW - 1, [h100(0, xids=(13,))])), NOW, ignored).line() == (
        "ingero: GPU 0: XID 13"
    )


# -- the state file's codec ----------------------------------------------------------------

texts = st.text(min_size=1, max_size=40)
finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
stragglers = st.builds(
    Straggler,
    texts,
    finite,
    st.sampled_from(healthstate.STRAGGLER_REASONS),
    st.none() | texts,
    st.none() | finite,
    st.none() | finite,
    st.none() | texts,
)
idle = st.builds(
    IdleGpus,
    texts,
    texts,
    st.lists(st.integers(0, 63), max_size=8).map(tuple),
    finite,
    st.sampled_from(healthstate.IDLE_REASONS),
)
states = st.builds(
    HealthState,
    texts,
    texts,
    finite,
    st.floats(min_value=0.01, max_value=3600),
    texts,
    st.none() | texts,
    st.none() | stragglers,
    st.lists(idle, max_size=4).map(tuple),
)


@given(states)
def test_decoder_returns_all_the_encoder_wrote(value: HealthState) -> None:
    assert healthstate.decode(healthstate.encode(value)) == value


@settings(max_examples=300)
@given(st.binary(max_size=512) | st.recursive(st.none() | st.booleans() | finite | texts,
       lambda c: st.lists(c, max_size=4) | st.dictionaries(texts, c, max_size=4)).map(
           lambda v: json.dumps(v).encode()))  # fmt: skip
def test_decoder_refuses_anything_else_with_a_state_error(data: bytes) -> None:
    with contextlib.suppress(StateError):
        healthstate.decode(data)


def test_decoder_names_what_is_wrong() -> None:
    good = json.loads(healthstate.encode(state(episode(60))))
    with pytest.raises(StateError, match="straggler reason 'slow'"):
        healthstate.decode(
            json.dumps({**good, "straggler": {**good["straggler"], "reason": "slow"}}).encode()
        )
    with pytest.raises(StateError, match="interval_s must be > 0"):
        healthstate.decode(json.dumps({**good, "interval_s": 0}).encode())
    with pytest.raises(StateError, match="more than"):
        healthstate.decode(b" " * (healthstate.MAX_BYTES + 1))
    # A later version's keys are ignored: versions only add.
    later = healthstate.decode(json.dumps({**good, "version": 2, "new": 1}).encode())
    assert later.version == 2 and later.straggler == episode(60)  # fmt: skip


# -- the command: a node DB written by the node DB writer, the state file by its codec -------


def node_db(path: Path, gpu_rows: list[dict[str, Any]]) -> Path:
    db = connect(path)
    write_batch(db, Batch(gpu_intervals=gpu_rows))
    db.conn.close()
    return path


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        main(["check", "--health", *args])
    return int(info.value.code or 0), capsys.readouterr().out


def test_command_exit_code_and_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import time

    now = time.time()
    faulty = reading_rows(NvmlReading((h100(0), h100(1, xids=(79,)))), now - 2, now - 1)
    db = node_db(tmp_path / "node.db", faulty.intervals)
    path = tmp_path / "health.json"
    path.write_bytes(healthstate.encode(replace(state(), written_at=now)))
    code, out = run(capsys, "--db", str(db), "--state-file", str(path))
    assert (code, out) == (1, "ingero: GPU 1: XID 79\n")
    code, out = run(capsys, "--db", str(db), "--state-file", str(path), "--xid-ignore", "79")
    assert (code, out) == (0, "ingero: healthy (GPUs 0-1 clean)\n")
    code, out = run(capsys, "--db", str(tmp_path / "none.db"), "--state-file", str(path), "--json")
    assert code == 0
    assert json.loads(out)["notes"] == ["no node DB", "no GPU rows in the last 15m"]
    path.write_text("{not json")
    code, out = run(capsys, "--db", str(db), "--state-file", str(path), "--xid-ignore", "79")
    assert code == 0 and "fleet-push state unreadable" in out
    code, _ = run(capsys, "--db", str(db), "--episode-age", "soon")
    assert code == 2


def test_a_newer_node_db_is_refused_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3

    db = node_db(tmp_path / "node.db", HEALTHY)
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    code, out = run(capsys, "--db", str(db), "--state-file", str(tmp_path / "none.json"))
    assert code == 0
    assert f"node DB unreadable: {db}: schema version 99 is newer than" in out
