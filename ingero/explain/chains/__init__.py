"""Causal chains: link what changed on the host, the GPU and in CUDA/NCCL to the throughput drop.

Pure: takes a ``Timeline`` (per-interval rows of the recent window and the one before it,
as plain values) and the rule table (``rules.yaml``, data), returns ranked ``Chain``s.

1. Signals (``detect``): each thing that changed between the two windows (off-CPU time of
   the traced threads, block I/O, page allocations, TCP retransmits, GPU throttle/XID, CUDA
   call latencies, memcpy and allocator time, NCCL latency, peer lag, the throughput drop),
   with its evidence (counts, times, PIDs, comm), the PIDs it concerns (None: node-wide),
   its onset (the first recent interval past the baseline) and its per-interval series.
   One detector per signal, grouped by family: ``host``, ``gpu``, ``calls``, ``peers``,
   ``throughput``.
2. Links (``links``): a cause and the signal it leads to line up *in time* (the cause
   starts no later than one interval after the effect, and the per-interval series move
   together) and *by process* (the same PIDs, where both are per-process). Each link gets
   a confidence.
3. Chains (``links``): one per rule of the table (``rules``) whose cause is present,
   ordered cause -> via -> effect, with confidence ``prior x weakest link`` and the rule's
   fix hint.
4. Call sites (``sites``): where the node DB holds call stacks, each step about calls gets
   the stacks those calls came from (``ingero.explain.callsites``), and the fix hint the
   line where one stack holds most of the time.

The input types are in ``timeline``.
"""

from __future__ import annotations

from collections.abc import Sequence

from ingero.explain.callsites import SiteData
from ingero.explain.chains.detect import DETECTORS, signals
from ingero.explain.chains.links import Chain, Link, build_chains, confidence_level, link
from ingero.explain.chains.peers import peer_lag_signal
from ingero.explain.chains.rules import SIGNALS, Rule, load_rules, parse_rules
from ingero.explain.chains.signal import Signal
from ingero.explain.chains.sites import with_call_sites
from ingero.explain.chains.timeline import (
    CollectiveCall,
    CollectiveId,
    GpuPoint,
    HostPoint,
    OpPoint,
    Process,
    RankKey,
    Timeline,
    join_collectives,
)

__all__ = [
    "DETECTORS",
    "SIGNALS",
    "Chain",
    "CollectiveCall",
    "CollectiveId",
    "GpuPoint",
    "HostPoint",
    "Link",
    "OpPoint",
    "Process",
    "RankKey",
    "Rule",
    "Signal",
    "Timeline",
    "build_chains",
    "confidence_level",
    "explain_chains",
    "join_collectives",
    "link",
    "load_rules",
    "parse_rules",
    "peer_lag_signal",
    "signals",
    "with_call_sites",
]


def explain_chains(
    t: Timeline, rules: Sequence[Rule] | None = None, sites: SiteData | None = None
) -> list[Chain]:
    """Ranked causal chains for the timeline (the package's rule table by default), with
    the call sites of ``sites`` (the recent window's stacks) on the steps about calls."""
    chains = build_chains(t, load_rules() if rules is None else rules, signals(t))
    return chains if sites is None else with_call_sites(chains, sites)
