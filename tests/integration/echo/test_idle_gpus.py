"""Echo's idle_gpus question over a real store: episodes folded from their gpu_idle events,
in a window, scoped by the caller's clusters, with GPU-hours worked out by hand."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ingero.echo.auth import Principal
from ingero.echo.rates import GpuRates
from ingero.echo.service import Service
from ingero.echo.store import Store
from ingero.runtime.clock import ManualClock
from ingero.schema.events import Event

pytestmark = pytest.mark.integration

OPS = Principal("ops")
TENANT_A = Principal("tenant-a", frozenset({"A"}))
IDS = {n: f"00000000-0000-4000-8000-00000000000{n}" for n in range(1, 6)}


def idle(n: int, state: str, ts: float, since: float, gpus: list[int], cluster: str = "A",
         node: str = "n1", user: str = "alice", idle_s: float | None = None) -> Event:  # fmt: skip
    extra: dict[str, object] = {"state": state, "gpus": gpus, "user": user, "partition": "gpu",
                                "since": since, "reason": "no_process"}  # fmt: skip
    if state == "end":
        extra.update(idle_s=idle_s, end="used")
    return Event("gpu_idle", node, cluster, ts, event_id=IDS[n], job_id=f"{n}0", extra=extra)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    clock = ManualClock(start=10_000.0)
    store = Store(tmp_path / "e.db", clock=clock)
    try:
        store.write(
            [
                idle(1, "start", 2800.0, 1000.0, [0, 1]),  # 2 GPUs, 1000 -> 3400
                idle(1, "end", 3400.0, 1000.0, [0, 1], idle_s=2400.0),
                idle(2, "start", 4000.0, 2200.0, [3], node="n2", user="bob"),  # open
                idle(3, "start", 300.0, 100.0, [5]),  # ended before the window
                idle(3, "end", 500.0, 100.0, [5], idle_s=400.0),
                idle(4, "start", 3000.0, 2000.0, [0], cluster="B", node="b1"),
                idle(5, "end", 3600.0, 0.0, [7], idle_s=3600.0),  # its start was never stored
            ]
        )
        yield Service(store.path, GpuRates("USD", 1.0, {}), clock=clock)
    finally:
        store.close()


def test_episodes_of_the_window_folded_and_their_gpu_hours(service: Service) -> None:
    got = service.answer("idle_gpus", {"since": 1000, "until": 7600}, TENANT_A)
    eps = {e["event_id"]: e for e in got["episodes"]}
    assert list(eps) == [IDS[2], IDS[1], IDS[5]]  # open first, then the most GPU-hours
    open_one = {k: eps[IDS[2]][k] for k in ("open", "end", "idle_s", "gpu_hours", "gpus", "user")}
    assert open_one == {"open": True, "end": None, "idle_s": 5400.0, "gpu_hours": 1.5,
                        "gpus": [3], "user": "bob"}  # fmt: skip
    assert (eps[IDS[1]]["since"], eps[IDS[1]]["end"], eps[IDS[1]]["gpu_hours"]) == (
        1000.0,
        3400.0,
        pytest.approx(2400 * 2 / 3600),
    )
    assert (eps[IDS[5]]["gpus"], eps[IDS[5]]["gpu_hours"]) == ([7], 1.0)
    totals = {(t["user"], t["episodes"], t["gpus_idle_now"]) for t in got["totals"]}
    assert totals == {("alice", 2, 0), ("bob", 1, 1)}
    # cluster B's episode is the operator's to see, not tenant A's
    everyone = service.answer("idle_gpus", {"since": 1000, "until": 7600}, OPS)
    assert IDS[4] in {e["event_id"] for e in everyone["episodes"]}
    bob = service.answer("idle_gpus", {"since": 1000, "until": 7600, "user": "bob"}, OPS)
    assert [e["event_id"] for e in bob["episodes"]] == [IDS[2]]
    # before the window's start: only what was open across it
    early = service.answer("idle_gpus", {"since": 0, "until": 600}, OPS)
    assert [e["event_id"] for e in early["episodes"]] == [IDS[3]]
