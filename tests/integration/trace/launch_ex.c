/* Kernel launches with a config struct on one stream: through the driver's cuLaunchKernelEx
 * (the stand-in libcuda, fake_libcuda.c) and through the real libcudart's
 * cudaLaunchKernelExC (no driver here: it fails, but its uprobe fires at entry with its
 * arguments). Both configs are the toolkit's own structs (cuda.h, driver_types.h), the
 * stream inside them. A launch with no config (NULL: the call fails) names no stream.
 *
 * Usage: launch_ex ITERATIONS. Waits for a line on stdin first, then prints the stream's
 * handle and the calls it made. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

static void kernel(void) {}

int main(int argc, char **argv) {
    long iters = argc > 1 ? atol(argv[1]) : 100;
    CUstream stream = (CUstream)(unsigned long)0x7f00e8e80000UL;
    dim3 one = {1, 1, 1};
    cudaLaunchConfig_t runtime = {.gridDim = one, .blockDim = one, .stream = (cudaStream_t)stream};
    CUlaunchConfig driver = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1, .blockDimX = 32,
                             .blockDimY = 1, .blockDimZ = 1, .hStream = stream};
    char line[16];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 3;
    long drv = 0, rt = 0, none = 0;
    int rc_rt = 0;
    for (long i = 0; i < iters; i++) {
        cuLaunchKernelEx(&driver, (CUfunction)kernel, NULL, NULL);
        drv++;
        rc_rt = cudaLaunchKernelExC(&runtime, (const void *)kernel, NULL);
        rt++;
        if (i % 2 == 0) {
            rt++;
            cudaLaunchKernelExC(&runtime, (const void *)kernel, NULL);
            cuLaunchKernelEx(NULL, (CUfunction)kernel, NULL, NULL);
            none++;
        }
    }
    printf("stream=%016lx\ndriver_launches=%ld\nruntime_launches=%ld\nno_config=%ld\n",
           (unsigned long)stream, drv, rt, none);
    printf("cudaLaunchKernelExC=%d\n", rc_rt);
    fflush(stdout);
    return 0;
}
