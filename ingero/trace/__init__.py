"""``ingero trace``: eBPF (BCC) tracer for CUDA, NCCL and host events, writing the node DB."""
