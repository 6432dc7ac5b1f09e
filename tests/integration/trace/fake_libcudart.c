/* A stand-in libcudart for machines without the NVIDIA driver, with the runtime's real
 * signatures (cuda_runtime_api.h from the toolkit): each call does what the real runtime
 * does underneath, a call into the driver API (the stand-in libcuda, fake_libcuda.c), so a
 * runtime call holds a nested traced driver call. (The real libcudart needs a real driver
 * to get that far: without one it fails before calling into libcuda.) The driver's types
 * and prototypes are cuda.h's, so the config passed down is the real CUlaunchConfig. */
#include <cuda.h>
#include <cuda_runtime_api.h>

cudaError_t cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args,
                             size_t shared, cudaStream_t stream) {
    cuLaunchKernel((CUfunction)func, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                   (unsigned)shared, (CUstream)stream, args, NULL);
    return cudaErrorNoDevice;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
    cuStreamSynchronize((CUstream)stream);
    return cudaErrorNoDevice;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
    cuStreamBeginCapture_v2((CUstream)stream, (CUstreamCaptureMode)mode);
    return cudaErrorNoDevice;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    cuStreamEndCapture((CUstream)stream, (CUgraph *)pGraph);
    return cudaErrorNoDevice;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
    cuGraphInstantiateWithFlags((CUgraphExec *)pGraphExec, (CUgraph)graph, flags);
    return cudaErrorNoDevice;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    cuGraphLaunch((CUgraphExec)graphExec, (CUstream)stream);
    return cudaErrorNoDevice;
}

/* A launch with a config (Triton, torch.compile): the driver's launch with its own config,
 * the stream copied across as the real runtime does. */
cudaError_t cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
    CUlaunchConfig drv = {0};
    if (config) {
        drv.gridDimX = config->gridDim.x, drv.gridDimY = config->gridDim.y;
        drv.gridDimZ = config->gridDim.z, drv.blockDimX = config->blockDim.x;
        drv.blockDimY = config->blockDim.y, drv.blockDimZ = config->blockDim.z;
        drv.sharedMemBytes = (unsigned)config->dynamicSmemBytes;
        drv.hStream = (CUstream)config->stream;
    }
    cuLaunchKernelEx(config ? &drv : NULL, (CUfunction)func, args, NULL);
    return cudaErrorNoDevice;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
    cuEventRecord((CUevent)event, (CUstream)stream);
    return cudaErrorNoDevice;
}

cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned int flags) {
    cuEventRecordWithFlags((CUevent)event, (CUstream)stream, flags);
    return cudaErrorNoDevice;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
    cuEventSynchronize((CUevent)event);
    return cudaErrorNoDevice;
}
