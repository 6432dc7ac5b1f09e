"""The remediation class of this node's slowness (``ingero.schema.causes``), from what the
sample measured; pushed every interval as ``ingero.node.cause_class`` (pure).

In order, the first that holds: a GPU's health factor below 1 (an XID, ECC errors, a row
remap pending or failed, a lost GPU, a hardware slowdown: ``ingero.push.gpu_health``) is
``hardware``; TCP retransmits at ``RETRANSMITS_PER_S`` or more over the window (the
tracer's host intervals; NCCL's sockets wait for them) are ``network``; a host signal
(CPU or memory) as the score's dominant signal is ``node``; anything else is ``job``, the
application's own. The same order as ``ingero explain``'s chains would put them
(gpu_xid/gpu_throttling, network_retransmits, cpu_contention/dataloader_starvation).
"""

from __future__ import annotations

from typing import Final

from ingero.push.sampler import NodeSample
from ingero.schema.causes import HARDWARE, JOB, NETWORK, NODE

# Retransmits per second that make the network a cause: a healthy node retransmits a few
# segments a minute; explain's network_retransmits rule fires on a rise well above that.
RETRANSMITS_PER_S: Final = 10.0


def node_cause_class(
    gpu_health: float | None,
    retransmits: int,
    covered_s: float,
    dominant_signal: str | None,
) -> str:
    """This node's class for one sample (its window's retransmits over ``covered_s``)."""
    if gpu_health is not None and gpu_health < 1.0:
        return HARDWARE
    if covered_s > 0 and retransmits / covered_s >= RETRANSMITS_PER_S:
        return NETWORK
    if dominant_signal in ("cpu", "memory"):
        return NODE
    return JOB


def sample_cause_class(sample: NodeSample) -> str | None:
    """The class of one health sample; None where nothing was scored (stale)."""
    if sample.result is None:
        return None
    window = sample.window
    return node_cause_class(
        sample.gpu_health.value if sample.gpu_health is not None else None,
        window.tcp_retransmits if window is not None else 0,
        window.covered_s if window is not None else 0.0,
        sample.result.dominant_signal,
    )
