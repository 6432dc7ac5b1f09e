"""contrib/haproxy/haproxy.cfg is what its template renders (one source), and it is valid."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from ingero.otlp.transport import CLUSTER_ID_HEADER, CLUSTER_ID_METADATA
from tests.integration.fleet.haproxy import ROOT, example


def test_shipped_config_is_the_rendered_template() -> None:
    rendered, shipped = example()
    assert rendered == shipped, (
        "run: python3 contrib/haproxy/render.py > contrib/haproxy/haproxy.cfg"
    )
    for needle in (
        f"balance hdr({CLUSTER_ID_HEADER})",
        f"balance hdr({CLUSTER_ID_METADATA})",
        "hash-type consistent",
        "option httpchk GET /readyz",
        "proto h2",
    ):
        assert needle in shipped


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed")
def test_haproxy_accepts_it() -> None:
    path = ROOT / "contrib" / "haproxy" / "haproxy.cfg"
    check = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
