"""What an event costs the push loop, per channel, when the consumer is fine, stalled or absent.

``send`` is called from the push loop; it must return at once whatever the consumer does.
Prints the median, p99 and max time of one ``send`` (µs) and the channel's counters for:
a UDS consumer that reads everything, one that accepts and never reads, none at all; and
journald's datagram socket with a reader and with nobody listening.

    .venv/bin/python bench/event_channels.py [--events 5000]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ingero.push.channels import Channel
from ingero.push.channels.journald import JournaldChannel
from ingero.push.channels.uds import UdsChannel
from ingero.schema.events import Event


def event(i: int) -> Event:
    return Event(
        type="straggler_state",
        node_id=f"n{i % 64}",
        cluster_id="c",
        timestamp=float(i),
        score=0.5,
        threshold=0.7,
        detection_mode="fleet",
    )


def measure(name: str, channel: Channel, events: int) -> None:
    times = []
    for i in range(events):
        t0 = time.perf_counter()
        channel.send(event(i))
        times.append(time.perf_counter() - t0)
    stats = channel.stats()
    channel.close()
    print(
        f"{name:<28} send median {statistics.median(times) * 1e6:6.1f} us  "
        f"p99 {statistics.quantiles(times, n=100)[98] * 1e6:7.1f} us  "
        f"max {max(times) * 1e6:8.1f} us  {stats}"
    )


def reader(server: socket.socket, stop: threading.Event) -> Callable[[], None]:
    def run() -> None:
        conn, _ = server.accept()
        conn.settimeout(0.2)
        while not stop.is_set():
            try:
                if not conn.recv(1 << 16):
                    break
            except TimeoutError:
                continue
        conn.close()

    return run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=5000)
    n = parser.parse_args().events
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        for label, reads in (("uds, consumer reading", True), ("uds, consumer stalled", False)):
            path = str(d / f"{reads}.sock")
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            server.bind(path)
            server.listen(1)
            stop = threading.Event()
            if reads:
                threading.Thread(target=reader(server, stop), daemon=True).start()
            measure(label, UdsChannel(path, queue_size=1000), n)
            stop.set()
            server.close()
        measure("uds, no consumer", UdsChannel(str(d / "absent.sock"), queue_size=1000), n)
        jpath = str(d / "journal.sock")
        jsock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        jsock.bind(jpath)
        measure("journald socket, not read", JournaldChannel(jpath), n)
        jsock.close()
        measure("journald, no socket", JournaldChannel(str(d / "nojournal.sock")), n)


if __name__ == "__main__":
    main()
