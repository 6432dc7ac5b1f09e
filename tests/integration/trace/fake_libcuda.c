/* A stand-in libcuda.so.1 for machines without the NVIDIA driver: the driver API entry
 * points ingero probes, with their real signatures, each failing with FAKE_ERROR.
 * cuMemAlloc is an alias of cuMemAlloc_v2 (one address, two names), like NCCL's
 * ncclX/pncclX, so the test also proves each address is probed once.
 *
 * The syncs wait for the stand-in libnccl's collectives when it runs as real NCCL does
 * (FAKE_NCCL_ASYNC=1, see fake_libnccl.c): the call returns at enqueue, the stream sync
 * waits for the peers. Without that library loaded they return at once. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

#define FAKE_ERROR 999
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUfunction;
typedef void *CUgraph;
typedef void *CUgraphExec;
typedef void *CUgraphNode;
typedef struct CUgraphEdgeData_st CUgraphEdgeData;
typedef struct CUDA_GRAPH_INSTANTIATE_PARAMS_st CUDA_GRAPH_INSTANTIATE_PARAMS;
typedef int CUstreamCaptureMode;

int cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes) {
    (void)dptr;
    return bytes ? FAKE_ERROR : 1;
}
int cuMemAlloc(CUdeviceptr *dptr, size_t bytes) __attribute__((alias("cuMemAlloc_v2")));

int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    (void)dst, (void)src;
    return bytes ? FAKE_ERROR : 1;
}

int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    (void)dst, (void)src;
    return bytes ? FAKE_ERROR : 1;
}

/* A launch asking for sharedMemBytes N spins N rounds first: a launch that waits for room
 * in a full queue (test_trace_sampling.py's slow launches; every other caller asks for 0). */
int cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, CUstream stream, void **params, void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz;
    (void)stream, (void)params, (void)extra;
    for (volatile unsigned i = 0; i < shmem; i++)
        ;
    return FAKE_ERROR;
}

/* CUDA 12+: launch with a config (attributes, clusters: a CUlaunchConfig *, the stream in
 * it) and cooperative launch. */
int cuLaunchKernelEx(const void *config, CUfunction f, void **params, void **extra) {
    (void)config, (void)f, (void)params, (void)extra;
    return FAKE_ERROR;
}

int cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, unsigned shmem, CUstream stream,
                              void **params) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem;
    (void)stream, (void)params;
    return FAKE_ERROR;
}

static void wait_collectives(void) {
    void (*wait)(void) = (void (*)(void))dlsym(RTLD_DEFAULT, "fake_nccl_stream_wait");
    if (wait)
        wait();
}

int cuCtxSynchronize(void) {
    wait_collectives();
    return FAKE_ERROR;
}

/* $FAKE_CUDA_SYNC_US: each stream sync takes that long (a slow call, as a real one waiting
 * for the GPU is). */
int cuStreamSynchronize(CUstream stream) {
    (void)stream;
    const char *us = getenv("FAKE_CUDA_SYNC_US");
    if (us)
        usleep((useconds_t)atol(us));
    wait_collectives();
    return FAKE_ERROR;
}

/* Events: recorded on a stream, waited on by the host. */
typedef void *CUevent;

int cuEventRecord(CUevent event, CUstream stream) {
    (void)event, (void)stream;
    return FAKE_ERROR;
}

int cuEventRecordWithFlags(CUevent event, CUstream stream, unsigned flags) {
    (void)event, (void)stream, (void)flags;
    return FAKE_ERROR;
}

int cuEventSynchronize(CUevent event) {
    (void)event;
    return FAKE_ERROR;
}

/* CUDA graphs (cuda.h): cuStreamBeginCapture is a macro for cuStreamBeginCapture_v2 and
 * cuGraphInstantiate one for cuGraphInstantiateWithFlags; the legacy names stay exported. */
int cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    (void)hStream, (void)mode;
    return FAKE_ERROR;
}

int cuStreamBeginCaptureToGraph(CUstream hStream, CUgraph hGraph,
                                const CUgraphNode *dependencies,
                                const CUgraphEdgeData *dependencyData, size_t numDependencies,
                                CUstreamCaptureMode mode) {
    (void)hStream, (void)hGraph, (void)dependencies, (void)dependencyData;
    (void)numDependencies, (void)mode;
    return FAKE_ERROR;
}

int cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    (void)hStream, (void)phGraph;
    return FAKE_ERROR;
}

int cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                unsigned long long flags) {
    (void)phGraphExec, (void)hGraph, (void)flags;
    return FAKE_ERROR;
}

int cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                 CUDA_GRAPH_INSTANTIATE_PARAMS *instantiateParams) {
    (void)phGraphExec, (void)hGraph, (void)instantiateParams;
    return FAKE_ERROR;
}

int cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    (void)hGraphExec, (void)hStream;
    return FAKE_ERROR;
}

/* The per-thread default stream variants (-DCUDA_API_PER_THREAD_DEFAULT_STREAM): another
 * entry point each, folded into the same op. */
int cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    (void)hGraphExec, (void)hStream;
    return FAKE_ERROR;
}

int cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
    (void)hStream, (void)mode;
    return FAKE_ERROR;
}

int cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
    (void)hStream, (void)phGraph;
    return FAKE_ERROR;
}
