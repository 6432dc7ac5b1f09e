/* A stand-in libcudart for machines without the NVIDIA driver, with the runtime's real
 * signatures (cuda_runtime_api.h from the toolkit): each call does what the real runtime
 * does underneath, a call into the driver API (the stand-in libcuda, fake_libcuda.c), so a
 * runtime call holds a nested traced driver call. (The real libcudart needs a real driver
 * to get that far: without one it fails before calling into libcuda.) */
#include <cuda_runtime_api.h>

typedef void *CUstream;
typedef void *CUfunction;
int cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, CUstream stream, void **params, void **extra);
int cuStreamSynchronize(CUstream stream);
int cuGraphLaunch(void *hGraphExec, CUstream hStream);
int cuStreamBeginCapture_v2(CUstream hStream, int mode);
int cuStreamEndCapture(CUstream hStream, void **phGraph);
int cuGraphInstantiateWithFlags(void **phGraphExec, void *hGraph, unsigned long long flags);

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
    cuStreamBeginCapture_v2((CUstream)stream, (int)mode);
    return cudaErrorNoDevice;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t *pGraph) {
    cuStreamEndCapture((CUstream)stream, (void **)pGraph);
    return cudaErrorNoDevice;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *pGraphExec, cudaGraph_t graph,
                                 unsigned long long flags) {
    cuGraphInstantiateWithFlags((void **)pGraphExec, (void *)graph, flags);
    return cudaErrorNoDevice;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    cuGraphLaunch((void *)graphExec, (CUstream)stream);
    return cudaErrorNoDevice;
}
