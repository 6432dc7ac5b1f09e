"""The traced operations: which symbols, which library, where the bytes/count/comm args are.

Op ids are the indices into ``OPS``; the BPF program is generated from this table, so the
ids in the kernel maps and in decoded events always agree. Per-thread-stream variants
(``_ptsz``/``_ptds``) are folded into their base operation.

``stream_arg`` is the integer argument slot (System V x86-64: 1-6 in registers, 7-9 on the
stack) holding a stream handle, for the per-stream counts of stream syncs and kernel
launches. A struct passed by value takes the slots of its eightbytes: ``cudaLaunchKernel``'s
two ``dim3`` (12 bytes each) take two registers apiece, so its stream is slot 8, not 6.
Where the argument is a pointer to a struct holding the stream (``cuLaunchKernelEx``'s
``CUlaunchConfig``, ``cudaLaunchKernelExC``'s ``cudaLaunchConfig_t``), ``stream_offset``
is the stream's byte offset in that struct, read from user memory at entry.

Event records name an event (``event_arg``) and the stream it is recorded on; an event
synchronize names only the event, and counts as a sync of the stream its event was last
recorded on (the tracer keeps event -> stream per process from the records).
"""

from __future__ import annotations

from dataclasses import dataclass

CUDART = "cudart"
CUDA = "cuda"
NCCL = "nccl"

LIB_SOURCES = {CUDART: "cuda_runtime", CUDA: "cuda_driver", NCCL: "nccl"}
# The file-name stem each library kind is found by in /proc/PID/maps.
LIB_STEMS = {CUDART: "libcudart.so", CUDA: "libcuda.so", NCCL: "libnccl.so"}


@dataclass(frozen=True)
class Op:
    """One traced operation. ``*_arg`` are 1-based argument positions (7 = first stack slot)."""

    name: str
    lib: str  # cudart | cuda | nccl | host
    symbols: tuple[str, ...] = ()
    bytes_arg: int = 0
    count_arg: int = 0
    dtype_arg: int = 0
    comm_arg: int = 0
    always_sample: bool = False
    special: str = ""  # comm_init | comm_destroy: hand-written probe pairs
    # An NCCL collective: numbered per communicator at entry (its arrival is also sampled).
    # Point-to-point ncclSend/ncclRecv are not: NCCL orders them per peer, not per comm.
    numbered: bool = False
    stream_arg: int = 0  # 0: the op names no stream (or its stream is not read)
    stream_kind: str = ""  # sync | launch | record | event_sync
    # -1: the stream is the argument itself; else its byte offset in the struct the
    # argument points to (user memory).
    stream_offset: int = -1
    event_arg: int = 0  # record | event_sync: the argument slot of the event handle

    @property
    def source(self) -> str:
        return LIB_SOURCES.get(self.lib, "host")

    @property
    def launch(self) -> bool:
        """A launch-class op: counted at entry, a sample timed (``LAUNCH_OP_NAMES``)."""
        return self.name in LAUNCH_OP_NAMES


# The launch-class ops: kernel and graph launches, many thousand a second in a launch-bound
# job, whose count (the node's throughput) and stream are what the score reads. Where the
# kernel has uprobe sessions they are counted at entry, and only a sample of them takes the
# return probe that times it (bpf/ingero.bpf.c, LAUNCH_PROBE; docs/trace.md "Launches").
# Every other op (syncs, event records and syncs, copies, the allocator, graph builds, NCCL)
# keeps entry and return: its duration is the signal.
LAUNCH_OP_NAMES = frozenset(
    (
        "cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaGraphLaunch",
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuGraphLaunch",
    )
)

STREAM_SYNC = "sync"
STREAM_LAUNCH = "launch"
STREAM_RECORD = "record"  # an event recorded on a stream: remembered, counts nothing itself
STREAM_EVENT_SYNC = "event_sync"  # a sync of the stream the event was last recorded on
# As STREAM_* in bpf/ingero.bpf.c.
STREAM_KINDS = {"": 0, STREAM_SYNC: 1, STREAM_LAUNCH: 2, STREAM_RECORD: 3, STREAM_EVENT_SYNC: 4}
# The stream's offset in CUlaunchConfig (cuLaunchKernelEx) and in cudaLaunchConfig_t
# (cudaLaunchKernelExC) on x86-64, from CUDA 13's cuda.h and driver_types.h: seven 32-bit
# fields (grid, block, shared memory) or two dim3 and a size_t come first. A unit test
# compiles offsetof() against the installed headers.
LAUNCH_CONFIG_STREAM_OFFSET = 32


def _rt(
    name: str, bytes_arg: int = 0, variants: tuple[str, ...] = (), stream: tuple[int, str] = (0, "")
) -> Op:
    return Op(
        name, CUDART, (name, *(name + v for v in variants)), bytes_arg=bytes_arg,
        stream_arg=stream[0], stream_kind=stream[1],
    )  # fmt: skip


def _event_record(name: str, lib: str) -> Op:
    """An event record ``(event, stream[, flags])``: the entry points with and without
    flags, and their per-thread default stream variants, are one op."""
    symbols = tuple(name + v for v in ("", "_ptsz", "WithFlags", "WithFlags_ptsz"))
    return Op(name, lib, symbols, stream_arg=2, stream_kind=STREAM_RECORD, event_arg=1)


def _event_sync(name: str, lib: str) -> Op:
    """An event synchronize ``(event)``: a sync of the stream the event was recorded on."""
    return Op(name, lib, (name,), stream_kind=STREAM_EVENT_SYNC, event_arg=1)


def _launch_ex(name: str, lib: str, symbols: tuple[str, ...]) -> Op:
    """A launch with a config struct, passed by pointer as the first argument."""
    return Op(name, lib, symbols, stream_arg=1, stream_kind=STREAM_LAUNCH,
              stream_offset=LAUNCH_CONFIG_STREAM_OFFSET)  # fmt: skip


def _drv(
    name: str, symbols: tuple[str, ...], bytes_arg: int = 0, stream: tuple[int, str] = (0, "")
) -> Op:
    return Op(name, CUDA, symbols, bytes_arg=bytes_arg, stream_arg=stream[0],
              stream_kind=stream[1])  # fmt: skip


def _coll(name: str, count: int, dtype: int, comm: int, numbered: bool = True) -> Op:
    return Op(
        name, NCCL, (name,), count_arg=count, dtype_arg=dtype, comm_arg=comm, always_sample=True,
        numbered=numbered,
    )  # fmt: skip


OPS: tuple[Op, ...] = (
    _rt("cudaMalloc", 2),
    _rt("cudaFree"),
    _rt("cudaMallocManaged", 2),
    _rt("cudaMemcpy", 3, ("_ptds",)),
    _rt("cudaMemcpyAsync", 3, ("_ptsz",)),
    # cudaLaunchKernel(func, dim3 grid, dim3 block, args, sharedMem, stream): slot 8.
    _rt("cudaLaunchKernel", 0, ("_ptsz",), (8, STREAM_LAUNCH)),
    # cudaLaunchKernelExC(const cudaLaunchConfig_t *config, func, args): Triton and
    # torch.compile launch with a config (the C++ cudaLaunchKernelEx template calls it).
    _launch_ex("cudaLaunchKernelExC", CUDART, ("cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz")),
    _rt("cudaStreamSynchronize", 0, ("_ptsz",), (1, STREAM_SYNC)),
    # A host wait through an event: recorded on a stream, then synchronized (vLLM's and
    # SGLang's step, docs/fleet-push.md "Inference servers").
    _event_record("cudaEventRecord", CUDART),
    _event_sync("cudaEventSynchronize", CUDART),
    _rt("cudaDeviceSynchronize"),
    _rt("cudaGraphLaunch", 0, ("_ptsz",)),
    # The CUDA graph lifecycle: a capture (begin..end) records a stream's work into a graph,
    # instantiation builds it into a launchable one. Each is folded into one op whatever the
    # entry point's version or flags.
    Op(
        "cudaGraphInstantiate",
        CUDART,
        (
            "cudaGraphInstantiate",
            "cudaGraphInstantiateWithFlags",
            "cudaGraphInstantiateWithParams",
            "cudaGraphInstantiateWithParams_ptsz",
        ),
    ),
    Op(
        "cudaStreamBeginCapture",
        CUDART,
        (
            "cudaStreamBeginCapture",
            "cudaStreamBeginCapture_ptsz",
            "cudaStreamBeginCaptureToGraph",
            "cudaStreamBeginCaptureToGraph_ptsz",
        ),
    ),
    _rt("cudaStreamEndCapture", 0, ("_ptsz",)),
    # cuLaunchKernel(f, grid x/y/z, block x/y/z, sharedMemBytes, hStream, …): slot 9.
    _drv("cuLaunchKernel", ("cuLaunchKernel", "cuLaunchKernel_ptsz"), 0, (9, STREAM_LAUNCH)),
    # CUDA 12+: launches with attributes (cluster dims: Triton, torch.compile) and cooperative
    # launches; each is a kernel launch like cuLaunchKernel.
    # cuLaunchKernelEx(const CUlaunchConfig *config, f, params, extra): the stream is in
    # the config.
    _launch_ex("cuLaunchKernelEx", CUDA, ("cuLaunchKernelEx", "cuLaunchKernelEx_ptsz")),
    _drv(
        "cuLaunchCooperativeKernel",
        ("cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz"),
        0,
        (9, STREAM_LAUNCH),
    ),
    _drv("cuMemAlloc", ("cuMemAlloc_v2", "cuMemAlloc"), 2),
    _drv("cuMemcpy", ("cuMemcpy", "cuMemcpy_ptds"), 3),
    _drv("cuMemcpyAsync", ("cuMemcpyAsync", "cuMemcpyAsync_ptsz"), 3),
    _drv("cuMemcpyHtoD", ("cuMemcpyHtoD_v2", "cuMemcpyHtoD_v2_ptds"), 3),
    _drv("cuMemcpyDtoH", ("cuMemcpyDtoH_v2", "cuMemcpyDtoH_v2_ptds"), 3),
    _drv("cuMemcpyDtoD", ("cuMemcpyDtoD_v2", "cuMemcpyDtoD_v2_ptds"), 3),
    _drv("cuMemcpyHtoDAsync", ("cuMemcpyHtoDAsync_v2", "cuMemcpyHtoDAsync_v2_ptsz"), 3),
    _drv("cuMemcpyDtoHAsync", ("cuMemcpyDtoHAsync_v2", "cuMemcpyDtoHAsync_v2_ptsz"), 3),
    _drv("cuCtxSynchronize", ("cuCtxSynchronize",)),
    _event_record("cuEventRecord", CUDA),
    _event_sync("cuEventSynchronize", CUDA),
    _drv(
        "cuStreamSynchronize",
        ("cuStreamSynchronize", "cuStreamSynchronize_ptsz"),
        0,
        (1, STREAM_SYNC),
    ),
    # CUDA graphs through the driver (PyTorch's CUDA graphs, torch.compile reduce-overhead):
    # one cuGraphLaunch replays a whole captured step. cuGraphInstantiate and
    # cuStreamBeginCapture name the header's macros; the exported symbols are versioned
    # (_v2, WithFlags) and the legacy ones stay exported for old binaries.
    _drv("cuGraphLaunch", ("cuGraphLaunch", "cuGraphLaunch_ptsz")),
    _drv(
        "cuGraphInstantiate",
        (
            "cuGraphInstantiateWithFlags",
            "cuGraphInstantiateWithParams",
            "cuGraphInstantiateWithParams_ptsz",
            "cuGraphInstantiate_v2",
            "cuGraphInstantiate",
        ),
    ),
    _drv(
        "cuStreamBeginCapture",
        (
            "cuStreamBeginCapture_v2",
            "cuStreamBeginCapture_v2_ptsz",
            "cuStreamBeginCapture",
            "cuStreamBeginCapture_ptsz",
            "cuStreamBeginCaptureToGraph",
            "cuStreamBeginCaptureToGraph_ptsz",
        ),
    ),
    _drv("cuStreamEndCapture", ("cuStreamEndCapture", "cuStreamEndCapture_ptsz")),
    # NCCL: (sendbuff, recvbuff, count, datatype, [op|root], comm, stream) and friends.
    _coll("ncclAllReduce", 3, 4, 6),
    _coll("ncclBroadcast", 3, 4, 6),
    _coll("ncclReduce", 3, 4, 7),
    _coll("ncclAllGather", 3, 4, 5),
    _coll("ncclReduceScatter", 3, 4, 6),
    # NCCL 2.28+ (absent symbols are simply not attached).
    _coll("ncclAlltoAll", 3, 4, 5),
    _coll("ncclGather", 3, 4, 6),
    _coll("ncclScatter", 3, 4, 6),
    _coll("ncclSend", 2, 3, 5, numbered=False),
    _coll("ncclRecv", 2, 3, 5, numbered=False),
    # Collectives issued inside a group stay in flight until the outermost ncclGroupEnd.
    Op("ncclGroupStart", NCCL, ("ncclGroupStart",), always_sample=True),
    Op("ncclGroupEnd", NCCL, ("ncclGroupEnd",), always_sample=True),
    Op(
        "ncclCommInitRank",
        NCCL,
        ("ncclCommInitRank", "ncclCommInitRankConfig"),
        always_sample=True,
        special="comm_init",
    ),
    Op(
        "ncclCommDestroy",
        NCCL,
        ("ncclCommDestroy", "ncclCommAbort"),
        always_sample=True,
        special="comm_destroy",
    ),
    Op("offcpu", "host"),
)

OP_IDS = {op.name: i for i, op in enumerate(OPS)}
OP_OFFCPU = OP_IDS["offcpu"]
OP_COMM_INIT = OP_IDS["ncclCommInitRank"]
OP_COMM_DESTROY = OP_IDS["ncclCommDestroy"]
OP_GROUP_START = OP_IDS["ncclGroupStart"]
OP_GROUP_END = OP_IDS["ncclGroupEnd"]


def ops_for_lib(lib: str) -> list[tuple[int, Op]]:
    return [(i, op) for i, op in enumerate(OPS) if op.lib == lib]


def op_name(op_id: int) -> str:
    """The op's name, or ``op<id>`` for an id this build does not know (never raises)."""
    return OPS[op_id].name if 0 <= op_id < len(OPS) else f"op{op_id}"
