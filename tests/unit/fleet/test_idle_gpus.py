"""Fleet's idle GPU time per cluster, partition and user, folded from gpu_idle events."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ingero.fleet.idle_gpus import IdleGpuLedger
from ingero.runtime.clock import ManualClock
from ingero.schema.events import Event

T0 = 1_800_000_000.0


def idle(event_id: str, state: str, gpus: list[int], since: float, idle_s: float | None = None,
         user: str = "alice", cluster: str = "c1", node: str = "n1") -> Event:  # fmt: skip
    extra: dict[str, object] = {"state": state, "gpus": gpus, "user": user, "partition": "gpu",
                                "since": since, "reason": "no_process"}  # fmt: skip
    if idle_s is not None:
        extra["idle_s"] = idle_s
    return Event("gpu_idle", node, cluster, since, event_id=event_id, job_id="77", extra=extra)


def samples(
    ledger: IdleGpuLedger, clusters: frozenset[str] | None = None
) -> dict[tuple[str, ...], float]:
    out = {}
    for family in text_string_to_metric_families(ledger.render(clusters).decode()):
        for s in family.samples:
            out[(s.name, *s.labels.values())] = s.value
    return out


A = ("c1", "gpu", "alice")


def test_open_episodes_count_to_now_and_ended_ones_in_full() -> None:
    clock = ManualClock(T0 + 3600)
    ledger = IdleGpuLedger(clock, max_open=10, series_limit=10)
    ledger([idle("e1", "start", [0, 1], T0)])
    got = samples(ledger)
    assert got[("ingero_fleet_idle_gpu_seconds", *A)] == 2 * 3600.0
    assert got[("ingero_fleet_idle_gpus", *A)] == 2
    ledger([idle("e1", "end", [0, 1], T0, idle_s=1800.0)])
    ledger([idle("e1", "end", [0, 1], T0, idle_s=1800.0)])  # delivered twice: once
    # an end whose start came before Fleet did: in full from its own figures
    ledger([idle("e0", "end", [3], T0 - 7200, idle_s=600.0)])
    clock.advance(3600)
    got = samples(ledger)
    assert got[("ingero_fleet_idle_gpu_seconds", *A)] == 2 * 1800.0 + 600.0
    assert got[("ingero_fleet_idle_gpus", *A)] == 0


def test_an_expired_node_ends_its_episodes_and_bounds_hold() -> None:
    clock = ManualClock(T0 + 100)
    ledger = IdleGpuLedger(clock, max_open=2, series_limit=1)
    ledger([idle("e1", "start", [0], T0, node="n1"), idle("e2", "start", [1], T0, user="bob", node="n2"),
            idle("e3", "start", [2], T0, node="n3")])  # fmt: skip
    ledger.expire([("c1", "n1")])
    clock.advance(100)
    got = samples(ledger)
    # alice's GPU 0 stopped counting at the expiry; bob's open one goes on; e3 was refused
    assert got[("ingero_fleet_idle_gpu_seconds", "c1", "gpu", "bob")] == 200.0
    assert ("ingero_fleet_idle_gpu_seconds", *A) not in got  # series_limit 1: the most idle
    assert got[("ingero_fleet_idle_gpu_series_omitted",)] == 1
    assert got[("ingero_fleet_idle_gpu_events_refused_total", "max_open")] == 1
    ledger([Event("gpu_idle", "n1", "c1", T0, extra={"state": "start"})])
    assert samples(ledger)[("ingero_fleet_idle_gpu_events_refused_total", "malformed")] == 1


def test_a_scoped_token_sees_its_clusters_only() -> None:
    ledger = IdleGpuLedger(ManualClock(T0 + 10), max_open=10, series_limit=10)
    ledger([idle("e1", "start", [0], T0), idle("e2", "start", [0], T0, cluster="c2")])
    got = samples(ledger, frozenset({"c2"}))
    assert {k[1] for k in got if len(k) > 1} == {"c2"}
    assert not any(k[0].startswith("ingero_fleet_idle_gpu_events_refused") for k in got)


@pytest.mark.skipif(
    shutil.which("promtool") is None, reason="promtool (Debian package prometheus) not installed"
)
def test_promtool_clean() -> None:
    ledger = IdleGpuLedger(ManualClock(T0 + 10), max_open=10, series_limit=10)
    ledger([idle("e1", "start", [0], T0, user='a "quoted"\\user')])
    done = subprocess.run(
        ["promtool", "check", "metrics"], input=ledger.render(), capture_output=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
