"""The detectors, one per signal of the rule table, and the signals they find."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from ingero.explain.chains import calls, gpu, graphs, host, peers, throughput
from ingero.explain.chains.signal import Detector, Signal
from ingero.explain.chains.timeline import Timeline

# One detector per signal the rules may name (rules.SIGNALS), in that order.
DETECTORS: Final[Mapping[str, Detector]] = {
    "offcpu": host.offcpu,
    "block_io": host.block_io,
    "page_allocs": host.page_allocs,
    "tcp_retransmits": host.tcp_retransmits,
    "gpu_throttle": gpu.gpu_throttle,
    "gpu_xid": gpu.gpu_xid,
    "launch_latency": calls.launch_latency,
    "sync_latency": calls.sync_latency,
    "op_latency": calls.op_latency,
    "memcpy": calls.memcpy,
    "alloc_churn": calls.alloc_churn,
    "nccl_latency": calls.nccl_latency,
    "graph_recapture": graphs.graph_recapture,
    "peer_lag": peers.peer_lag_signal,
    "throughput_drop": throughput.throughput_drop,
}


def signals(t: Timeline) -> dict[str, Signal]:
    """Every signal present in the timeline, by id (the strongest of a kind)."""
    return {name: sig for name, detect in DETECTORS.items() if (sig := detect(t)) is not None}
