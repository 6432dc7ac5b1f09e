"""The op vocabulary of the node DB: which ``op`` names (``intervals``, ``raw_events``) are
kernel launches, graph replays, graph builds, host waits, steps and NCCL calls that are no
collective. The tracer writes the ops it probes (``ingero.trace.ops``); every reader that
counts them (fleet-push's window, ``explain``'s chains) groups them by these tuples, so a
new launch API is one line here.
"""

from __future__ import annotations

from typing import Final

# Kernel launches through the runtime and through the driver API (PyTorch built against
# CUDA 13 launches through cuLaunchKernel only). A driver call the runtime makes inside a
# runtime call is not recorded (the runtime call is), so a runtime launch that calls the
# driver is counted once.
LAUNCH_OPS: Final = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "cuLaunchCooperativeKernel",
)
# CUDA graph replays: one call launches a whole captured step (torch.compile reduce-overhead
# launches through cuGraphLaunch only). Work like kernel launches, with a rate of its own:
# a graph launch stands for hundreds of kernels, so the two are never added into one rate.
GRAPH_LAUNCH_OPS: Final = ("cudaGraphLaunch", "cuGraphLaunch")
# What makes a tracer interval one with work: a job that replays graphs and launches no
# kernel outside them is working, not stalled.
WORK_OPS: Final = (*LAUNCH_OPS, *GRAPH_LAUNCH_OPS)
# The graph's capture and instantiation: a graph built again in the loop costs host time.
GRAPH_BUILD_OPS: Final = (
    "cudaStreamBeginCapture",
    "cudaStreamEndCapture",
    "cudaGraphInstantiate",
    "cuStreamBeginCapture",
    "cuStreamEndCapture",
    "cuGraphInstantiate",
)
# Host waits for the GPU: on the device, on a stream, or on an event recorded on a stream
# (inference engines wait for each step's sampled tokens that way).
SYNC_OPS: Final = (
    "cudaDeviceSynchronize",
    "cudaStreamSynchronize",
    "cudaEventSynchronize",
    "cuCtxSynchronize",
    "cuStreamSynchronize",
    "cuEventSynchronize",
)
# Step rows: the steps the job marked through ``ingero annotate`` (source "annotate", one
# row per writer and flush) or the synthetic workload writes.
STEP_OPS: Final = ("step",)
# NCCL calls that are not one collective of a communicator (no alignment across ranks).
NON_COLLECTIVE_OPS: Final = ("ncclGroupEnd", "ncclCommInitRank", "ncclCommDestroy")
