"""Render haproxy.cfg.j2 with the example replicas (what haproxy.cfg holds):

    python3 contrib/haproxy/render.py > contrib/haproxy/haproxy.cfg
    python3 contrib/haproxy/render.py fleet-a=10.1.0.5 fleet-b=10.1.0.6 > /etc/haproxy/haproxy.cfg

Each argument is NAME=HOST (Fleet's default ports) or NAME=HOST:OTLP_HTTP:OTLP_GRPC:API.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jinja2

TEMPLATE = Path(__file__).with_name("haproxy.cfg.j2")
EXAMPLE = ("fleet1=10.0.0.11", "fleet2=10.0.0.12", "fleet3=10.0.0.13")


def server(spec: str) -> dict[str, Any]:
    name, _, where = spec.partition("=")
    host, *ports = where.split(":")
    if not name or not host or len(ports) not in (0, 3):
        raise SystemExit(f"expected NAME=HOST or NAME=HOST:OTLP_HTTP:OTLP_GRPC:API, got {spec!r}")
    out: dict[str, Any] = {"name": name, "host": host}
    if ports:
        out.update(zip(("otlp_http", "otlp_grpc", "api"), map(int, ports), strict=True))
    return out


def render(servers: Sequence[Mapping[str, Any]], **settings: Any) -> str:
    """The configuration for ``servers`` (dicts: name, host, optional ports); ``settings``
    are the template's other variables (haproxy_bind, haproxy_*_port, haproxy_log, ...)."""
    env = jinja2.Environment(
        undefined=jinja2.StrictUndefined, trim_blocks=True, keep_trailing_newline=True
    )
    template = env.from_string(TEMPLATE.read_text())
    return template.render(haproxy_servers=list(servers), **settings)


if __name__ == "__main__":
    sys.stdout.write(render([server(s) for s in (sys.argv[1:] or EXAMPLE)]))
