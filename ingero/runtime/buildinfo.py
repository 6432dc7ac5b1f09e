"""What every daemon's /metrics shares: ``ingero_build_info`` and no ``_created`` series.

``ingero_build_info{daemon,version,python_version} 1`` lets a dashboard or alert tell which
version runs where (join on it: ``* on(instance) group_left(version) ingero_build_info``).
``_created`` series (one per counter and histogram, a creation timestamp) are turned off for
the whole process: nothing in ingero's rules or dashboard reads them, and promtool and
Prometheus derive counter resets without them.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from ingero import __version__


class BuildInfo(Collector):
    def __init__(self, daemon: str) -> None:
        self._labels = [daemon, __version__, platform.python_version()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "ingero_build_info",
            "Always 1; the labels name the daemon, ingero's version and Python's.",
            labels=["daemon", "version", "python_version"],
        )
        family.add_metric(self._labels, 1)
        yield family


def daemon_registry(daemon: str, auto_describe: bool = False) -> CollectorRegistry:
    """A registry for ``daemon``'s /metrics, with its build info and without _created series."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=auto_describe)
    registry.register(BuildInfo(daemon))
    return registry
