"""Cost of Fleet's durable Echo spool (``echo.spool_dir``) against the in-memory queue.

Run: ``.venv/bin/python -m bench.fleet_spool`` (``--requests 200`` to shorten).
``submit`` is what a receiver thread pays per OTLP logs request before it answers the node:
per request size, the median and p99 of ``Forwarder.submit`` with Echo down (nothing
leaves, so the spool only grows) and with an Echo that acknowledges at once (the sender
reads and deletes while receivers append), in microseconds per request and per event.
The drain line: events per second the sender takes from a full queue to an Echo that
acknowledges at once (encoding included, no network). The spool is in a temporary
directory on the disk ``--dir`` names (default: the system's temporary directory).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from typing import Any

from ingero.fleet.forwarder import Forwarder
from ingero.fleet.spool import EventSpool
from ingero.otlp.exporter import ExportError
from ingero.schema.events import Event


class Echo:
    """Acknowledges every request at once, or (``down``) refuses each as retryable."""

    def __init__(self, down: bool) -> None:
        self.down = down

    def send(self, request: Any) -> None:
        if self.down:
            raise ExportError("down", True)

    def close(self) -> None:
        return None


def events(n: int, start: int) -> list[Event]:
    return [
        Event(
            "straggler_state",
            f"node-{(start + i) % 4096}",
            "prod",
            1.7e9 + start + i,
            job_id="4242",
            rank=(start + i) % 64,
            score=0.41,
            threshold=0.8,
            dominant_signal="compute",
        )
        for i in range(n)
    ]


def forwarder(echo: Echo, directory: str | None, backoff: float = 0.5) -> Forwarder:
    spool = EventSpool(directory, 10**9, 10**12) if directory else None
    return Forwarder(
        echo, capacity=10**9, backoff_initial=backoff, backoff_max=backoff, spool=spool
    )


def submit_costs(size: int, requests: int, down: bool, directory: str | None) -> list[float]:
    fwd = forwarder(Echo(down), directory)
    batches = [events(size, r * size) for r in range(requests)]
    costs = []
    for batch in batches:
        t0 = time.perf_counter()
        fwd.submit(batch)
        costs.append(time.perf_counter() - t0)
    fwd.close(timeout=0 if down else 30)
    return costs


def drain_rate(total: int, directory: str | None) -> float:
    echo = Echo(down=True)
    fwd = forwarder(echo, directory, backoff=0.001)  # retries every 1 ms until Echo is up
    for start in range(0, total, 1000):
        fwd.submit(events(1000, start))
    echo.down = False
    t0 = time.perf_counter()
    fwd.flush(600)
    elapsed = time.perf_counter() - t0
    fwd.close(1)
    return total / elapsed


def line(name: str, size: int, costs: list[float]) -> str:
    median = statistics.median(costs) * 1e6
    p99 = sorted(costs)[int(0.99 * (len(costs) - 1))] * 1e6
    return (
        f"{name:<22} {size:>5} events/request: median {median:8.1f} us"
        f" ({median / size:6.1f} us/event), p99 {p99:8.1f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,25,500")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--drain", type=int, default=50_000)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the forwarder's retry lines while Echo is "down"
    for size in (int(s) for s in args.sizes.split(",")):
        for down in (True, False):
            state = "echo down" if down else "echo acking"
            print(line(f"memory, {state}", size, submit_costs(size, args.requests, down, None)))
            with tempfile.TemporaryDirectory(dir=args.dir) as directory:
                costs = submit_costs(size, args.requests, down, directory)
            print(line(f"spool, {state}", size, costs))
    print(f"drain, memory: {drain_rate(args.drain, None):,.0f} events/s")
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        print(f"drain, spool:  {drain_rate(args.drain, directory):,.0f} events/s")


if __name__ == "__main__":
    main()
