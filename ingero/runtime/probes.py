"""What Fleet's and Echo's HTTP APIs answer besides their data, alike on both daemons.

- ``/healthz`` (liveness): 200 ``{"status": "ok"}`` while the process serves.
- ``/readyz`` (readiness): the same 200 while the daemon is ready for traffic, else 503
  ``{"status": "not ready"}``. Load balancers check the status code (contrib/haproxy).
- An API error: ``{"error": "<one line>", "status": <the HTTP status>}``.

The probes are open (no token) and constant: they name no cluster, node or token.
"""

from __future__ import annotations

CONTENT_TYPE = "application/json"

HEALTHZ = "/healthz"
READYZ = "/readyz"
PATHS = (HEALTHZ, READYZ)

_OK = b'{"status": "ok"}\n'
_NOT_READY = b'{"status": "not ready"}\n'


def probe_answer(ready: bool) -> tuple[int, bytes]:
    """The status and body of a probe: ``/healthz`` always asks with True, ``/readyz``
    with the daemon's readiness."""
    return (200, _OK) if ready else (503, _NOT_READY)


def error_body(status: int, message: str) -> dict[str, object]:
    """An API error's JSON object: the message (one line) and the HTTP status."""
    return {"error": message, "status": status}
