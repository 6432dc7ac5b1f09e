/* N kernel launches and stream syncs through the runtime (fake_libcudart.c, each calling
 * the driver inside), one graph captured and instantiated and N replays of it through the
 * runtime, then N launches straight through the driver API. Waits for a line
 * on stdin first (so a tracer can attach), then prints "done". */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

typedef void *CUstream;
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shmem, CUstream stream, void **params, void **extra);

static void kernel(void) {}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100;
    char line[16];
    printf("ready\n");
    fflush(stdout);
    if (!fgets(line, sizeof line, stdin))
        return 3;
    dim3 one = {1, 1, 1};
    for (long i = 0; i < n; i++) {
        cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, 0);
        cudaStreamSynchronize(0);
    }
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal);
    cudaStreamEndCapture(0, &graph);
    cudaGraphInstantiate(&exec, graph, 0);
    for (long i = 0; i < n; i++)
        cudaGraphLaunch(exec, 0);
    for (long i = 0; i < n; i++)
        cuLaunchKernel((void *)kernel, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL);
    printf("done\n");
    return 0;
}
