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

#define FAKE_ERROR 999
typedef unsigned long long CUdeviceptr;
typedef void *CUstream;
typedef void *CUfunction;

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

int cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, CUstream stream, void **params, void **extra) {
    (void)f, (void)gx, (void)gy, (void)gz, (void)bx, (void)by, (void)bz, (void)shmem;
    (void)stream, (void)params, (void)extra;
    return FAKE_ERROR;
}

/* CUDA 12+: launch with a config (attributes, clusters) and cooperative launch. */
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

int cuStreamSynchronize(CUstream stream) {
    (void)stream;
    wait_collectives();
    return FAKE_ERROR;
}
