"""The remediation class of a straggler's cause: what an operator does about it, one word a
script can parse. The same vocabulary on the push (``ingero.node.cause_class``), in Fleet's
verdicts and ``straggler_state`` events (``extra.cause_class``), in every drain reason
(``class=...``) and in the job's sacct verdict.

- ``hardware``: a GPU fault or slowdown the node's NVML reports (an XID, ECC errors, a row
  remap pending or failed, a lost GPU, a thermal or power slowdown): inspect or reboot.
- ``node``: the host around the GPUs (its CPU or memory pulls the score down): find the
  competing work.
- ``network``: the node's TCP retransmits are up (NCCL's traffic waits for them): check
  the NIC, cable and switch port.
- ``job``: none of those: the application's own (its data, its code); never a reason to
  drain a node on its own.

``unknown`` is what Fleet says of a node whose agent does not push a class and whose
dominant signal does not tell one either (an agent older than the classes).
"""

from __future__ import annotations

from typing import Final

HARDWARE: Final = "hardware"
NODE: Final = "node"
NETWORK: Final = "network"
JOB: Final = "job"
UNKNOWN: Final = "unknown"
# Gravest first: the class to act on when a node shows several.
CAUSE_CLASSES: Final = (HARDWARE, NODE, NETWORK, JOB)


def gravest(old: str | None, new: str) -> str:
    """Of two classes the one to act on first (hardware, node, network, job)."""
    if new not in CAUSE_CLASSES:
        return old or new
    if old is None or old not in CAUSE_CLASSES:
        return new
    return new if CAUSE_CLASSES.index(new) < CAUSE_CLASSES.index(old) else old


def class_from_signal(dominant_signal: str | None) -> str:
    """Fleet's class for a node whose agent pushes none: what its dominant signal tells."""
    if dominant_signal == "gpu_health":
        return HARDWARE
    if dominant_signal in ("cpu", "memory"):
        return NODE
    return UNKNOWN
