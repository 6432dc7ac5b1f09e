"""The dashboard in a real browser: headless Chromium (Debian's package) loads each page of
a real ``ingero echo`` fed by a real ``ingero fleet`` and six ``ingero workload`` +
``ingero fleet-push`` pairs running one job, one node of which is slowed down.

Chromium sends no Authorization header of its own: it goes through a small reverse proxy
that adds the bearer token, the set-up docs/echo.md describes for sites that sign users in
at a proxy. Checked: the slowed node is on the job's page as its straggler (and the uPlot
chart drew, so the vendored script loaded under the page's CSP), another tenant's token
gets no page of that cluster, and the screenshots are compared by structure: the size
asked for, and far more drawn than on a blank page of the same run (a PNG of a blank page
compresses to almost nothing).
"""

from __future__ import annotations

import os
import shutil
import struct
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.push.cluster import Cluster, Procs, wait_for

from .browser import CHROMIUM, HEIGHT, WIDTH, Proxy, chromium
from .helpers import TOKEN_B, TOKEN_OPS, EchoProcess, http

pytestmark = pytest.mark.integration

NODES = 6
INTERVAL = 0.5
JOB = "77"
SLOW = 2


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture
def running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Cluster, EchoProcess]]:
    if CHROMIUM is None:
        pytest.skip("chromium is not installed (apt-get install chromium: tests/apt-packages.txt)")
    (tmp_path / "echo").mkdir()
    echo = EchoProcess(tmp_path / "echo")
    c = Cluster(tmp_path, Procs(), INTERVAL, NODES, job_id=JOB, cluster_id="A")
    try:
        echo.start()
        endpoint = f"http://{echo.otlp_http}"
        c.echo_endpoint = endpoint
        c.fleet_config = {"echo": {"endpoint": endpoint, "score_history_interval": "1s"}}
        monkeypatch.setenv("INGERO_ECHO_TOKEN", TOKEN_OPS)  # Fleet's token for Echo
        yield c, echo
    finally:
        c.procs.stop_all()
        echo.stop()


def test_pages_in_chromium_name_the_straggler_and_keep_tenants_apart(
    running: tuple[Cluster, EchoProcess], tmp_path: Path
) -> None:
    c, echo = running
    c.start_fleet()
    c.start_sink()
    for i in range(NODES):
        c.start_workload(i)
        c.start_push(i)
    nodes = [c.node(i) for i in range(NODES)]
    wait_for(lambda: all("fleet" in c.modes(n) for n in nodes), 90, "every node in fleet mode")
    c.slow_down(SLOW, 0.4)
    slow = c.node(SLOW)

    def flagged() -> bool:
        query = urllib.parse.urlencode({"cluster_id": "A", "job_id": JOB, "last": "1h"})
        status, body = http("GET", f"{echo.url}/api/v1/stragglers?{query}", token=TOKEN_OPS)
        return status == 200 and slow in [s["node_id"] for s in body["stragglers"]]

    wait_for(flagged, 90, "Echo naming the slowed node a straggler")
    wait_for(
        lambda: http(
            "GET",
            f"{echo.url}/api/v1/job_timeline?cluster_id=A&job_id={JOB}",
            token=TOKEN_OPS,
        )[1]["band"],
        30,
        "score samples of the job in Echo",
    )

    ops, tenant_b = Proxy(echo.url, TOKEN_OPS), Proxy(echo.url, TOKEN_B)
    shots = tmp_path / "shots"
    shots.mkdir()
    try:
        job = f"/dashboard/clusters/A/jobs/{JOB}"
        dom = chromium(tmp_path, ops.url + "/dashboard/")
        assert 'href="/dashboard/clusters/A"' in dom
        dom = chromium(tmp_path, ops.url + "/dashboard/clusters/A")
        assert f'href="{job}"' in dom and slow in dom
        dom = chromium(tmp_path, ops.url + job)
        chain = dom.split('<ol class="chain">')[1].split("</ol>")[0]
        assert f'<b class="node">{slow}</b>' in chain
        assert dom.count(f"<td>{slow}</td>") == 1  # one row of the nodes' table
        for n in nodes:
            assert f"<td>{n}</td>" in dom
        # the vendored uPlot ran under the page's CSP and drew the scores
        scores = dom.split('id="scores"')[1].split('id="scores-data"')[0]
        assert 'class="uplot' in scores and "<canvas" in scores
        assert '<svg class="timeline"' in dom and '<table class="nodes">' in dom

        # tenant B's token: cluster A is not listed, and its pages are refused
        dom = chromium(tmp_path, tenant_b.url + "/dashboard/")
        assert "/dashboard/clusters/A" not in dom
        dom = chromium(tmp_path, tenant_b.url + job)
        assert 'data-status="403"' in dom and slow not in dom

        pages = {
            "clusters": ops.url + "/dashboard/",
            "cluster": ops.url + "/dashboard/clusters/A",
            "job": ops.url + job,
            "refused": tenant_b.url + job,
            "blank": "data:text/html,<html><body></body></html>",
        }
        for name, url in pages.items():
            chromium(tmp_path, url, shots / f"{name}.png")
        blank = (shots / "blank.png").stat().st_size
        for name in pages:
            assert png_size(shots / f"{name}.png") == (WIDTH, HEIGHT), name
        for name in ("clusters", "cluster", "job"):
            assert (shots / f"{name}.png").stat().st_size > 4 * blank, name
        # the job's page draws the most: chart, timeline, heatmap and tables
        sizes = {n: (shots / f"{n}.png").stat().st_size for n in pages}
        assert sizes["job"] > sizes["refused"]
        keep = os.environ.get("INGERO_DASHBOARD_SHOTS")
        if keep:  # docs/img's screenshot comes from here
            shutil.copytree(shots, keep, dirs_exist_ok=True)
    finally:
        ops.close()
        tenant_b.close()
