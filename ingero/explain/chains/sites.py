"""Call sites on the chains: each step about calls gets the stacks those calls came from.

A step whose evidence names calls (``op`` or ``ops``: latency, allocator churn, memcpy, NCCL,
peer lag) gets the hottest call sites of those calls in its processes (the late rank's for
peer lag); the chain's fix hint names the line where one stack holds most of that time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from ingero.explain.analysis import fmt_pct
from ingero.explain.callsites import (
    CallSite,
    SiteData,
    call_sites,
    frame_text,
    ops_of,
    user_frames,
)
from ingero.explain.chains.links import Chain
from ingero.explain.chains.signal import Signal


def with_call_sites(chains: Sequence[Chain], data: SiteData, limit: int = 3) -> list[Chain]:
    """The chains with call sites on their steps; unchanged without stacks."""
    if data.empty:
        return list(chains)

    def attach(s: Signal) -> Signal:
        ops = ops_of(s.evidence)
        if not ops:
            return s
        late = s.evidence.get("late_pid")
        pids = {late} if isinstance(late, int) and not isinstance(late, bool) else s.pids
        sites = call_sites(data, ops, pids, limit)
        return replace(s, sites=tuple(sites)) if sites else s

    out = []
    for c in chains:
        causes = tuple(attach(s) for s in c.causes)
        via = None if c.via is None else attach(c.via)
        steps = [*causes, *([via] if via is not None else [])]
        top = next((s.sites[0] for s in steps if s.sites and s.sites[0].dominant), None)
        fix = c.fix if top is None else f"{fix_hint(top)} {c.fix}"
        out.append(replace(c, causes=causes, via=via, fix=fix))
    return out


def fix_hint(site: CallSite) -> str:
    """``Start at `allocate` at `model.py:88`: 92% of the cuMemAlloc time comes from there.``"""
    frames = user_frames(site.stack)
    at = frame_text(frames[0]) if frames else f"stack {site.stack_key}"
    return f"Start at {at}: {fmt_pct(site.share)} of the {site.op} time comes from there."
