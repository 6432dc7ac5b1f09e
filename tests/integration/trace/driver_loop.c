/* Calls the CUDA driver API entry points ingero probes (linked against a libcuda.so.1).
 * Usage: driver_loop ITERATIONS; waits for a line on stdin first; prints return codes. */
#include <stdio.h>
#include <stdlib.h>
#include <stddef.h>

typedef unsigned long long CUdeviceptr;
int cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes);
int cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes);
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes);
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, void *stream, void **params, void **extra);
int cuLaunchKernelEx(const void *config, void *f, void **params, void **extra);
int cuLaunchCooperativeKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                              unsigned by, unsigned bz, unsigned shmem, void *stream,
                              void **params);
int cuCtxSynchronize(void);
int cuStreamBeginCapture_v2(void *stream, int mode);
int cuStreamBeginCapture_v2_ptsz(void *stream, int mode);
int cuStreamEndCapture(void *stream, void **graph);
int cuStreamEndCapture_ptsz(void *stream, void **graph);
int cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags);
int cuGraphLaunch(void *exec, void *stream);
int cuGraphLaunch_ptsz(void *exec, void *stream);
int cuStreamSynchronize(void *stream);

int main(int argc, char **argv) {
    if (argc < 2)
        return 2;
    long iters = atol(argv[1]);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 3;
    static char host[1 << 16];
    CUdeviceptr d = 0;
    int rc_alloc = 0, rc_htod = 0, rc_dtoh = 0, rc_launch = 0, rc_ctx = 0, rc_stream = 0;
    int rc_launch_ex = 0, rc_coop = 0, rc_begin = 0, rc_end = 0, rc_inst = 0, rc_graph = 0;
    void *graph = NULL, *exec = NULL;
    for (long i = 0; i < iters; i++) {
        rc_alloc = cuMemAlloc_v2(&d, 1 << 20);
        rc_htod = cuMemcpyHtoD_v2(d, host, 4096);
        rc_dtoh = cuMemcpyDtoH_v2(host, d, 512);
        rc_launch = cuLaunchKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL, NULL);
        rc_launch_ex = cuLaunchKernelEx(NULL, NULL, NULL, NULL);
        rc_coop = cuLaunchCooperativeKernel(NULL, 1, 1, 1, 32, 1, 1, 0, NULL, NULL);
        rc_ctx = cuCtxSynchronize();
        rc_stream = cuStreamSynchronize(NULL);
        /* A graph captured and instantiated, then replayed twice: each half of the
         * iterations through the per-thread default stream entry points. */
        if (i % 2) {
            rc_begin = cuStreamBeginCapture_v2(NULL, 0);
            rc_end = cuStreamEndCapture(NULL, &graph);
            rc_graph = cuGraphLaunch(exec, NULL);
        } else {
            rc_begin = cuStreamBeginCapture_v2_ptsz(NULL, 0);
            rc_end = cuStreamEndCapture_ptsz(NULL, &graph);
            rc_graph = cuGraphLaunch_ptsz(exec, NULL);
        }
        rc_inst = cuGraphInstantiateWithFlags(&exec, graph, 0);
        rc_graph = cuGraphLaunch(exec, NULL);
    }
    printf("cuMemAlloc=%d\ncuMemcpyHtoD=%d\ncuMemcpyDtoH=%d\n", rc_alloc, rc_htod, rc_dtoh);
    printf("cuLaunchKernel=%d\ncuCtxSynchronize=%d\ncuStreamSynchronize=%d\n", rc_launch, rc_ctx,
           rc_stream);
    printf("cuLaunchKernelEx=%d\ncuLaunchCooperativeKernel=%d\n", rc_launch_ex, rc_coop);
    printf("cuStreamBeginCapture=%d\ncuStreamEndCapture=%d\ncuGraphInstantiate=%d\n", rc_begin,
           rc_end, rc_inst);
    printf("cuGraphLaunch=%d\n", rc_graph);
    fflush(stdout);
    return 0;
}
