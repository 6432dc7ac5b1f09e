/* Test workload for ingero trace: calls the traced CUDA runtime functions in a loop.
 * Without a GPU driver every call fails fast, but the uprobes fire all the same.
 * Usage: cuda_loop ITERATIONS SLEEP_US [WORK_NS]
 * Waits for a line on stdin before the loop (so a tracer can attach to its pid first),
 * then prints "op=<return code>" for each op, the numbers the tests compare with the DB. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void kernel_stub(void) {}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ITERATIONS SLEEP_US\n", argv[0]);
        return 2;
    }
    long iters = atol(argv[1]);
    long sleep_us = atol(argv[2]);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 3;
    static char host_a[1 << 16], host_b[1 << 16];
    int rc_malloc = 0, rc_free = 0, rc_memcpy = 0, rc_memcpy_async = 0, rc_launch = 0;
    int rc_stream = 0, rc_device = 0, rc_managed = 0, rc_graph = 0;
    int rc_begin = 0, rc_end = 0;
    cudaGraph_t graph = NULL;
    dim3 one = {1, 1, 1};
    for (long i = 0; i < iters; i++) {
        void *p = NULL;
        rc_malloc = cudaMalloc(&p, 4096);
        rc_free = cudaFree(p);
        rc_memcpy = cudaMemcpy(host_b, host_a, 1024, cudaMemcpyHostToHost);
        rc_memcpy_async = cudaMemcpyAsync(host_b, host_a, 2048, cudaMemcpyHostToHost, 0);
        rc_launch = cudaLaunchKernel((const void *)kernel_stub, one, one, NULL, 0, 0);
        rc_stream = cudaStreamSynchronize(0);
        rc_device = cudaDeviceSynchronize();
        rc_managed = cudaMallocManaged(&p, 8192, cudaMemAttachGlobal);
        rc_begin = cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal);
        rc_end = cudaStreamEndCapture(0, &graph);
        /* 11 traced calls an iteration: with a sample every 8th call, odd keeps every op
         * sampled (cudaGraphInstantiate is called by runtime_loop.c). */
        rc_graph = cudaGraphLaunch((cudaGraphExec_t)graph, 0);
        if (sleep_us)
            usleep(sleep_us);
    }
    printf("cudaMalloc=%d\ncudaFree=%d\ncudaMemcpy=%d\ncudaMemcpyAsync=%d\n", rc_malloc, rc_free,
           rc_memcpy, rc_memcpy_async);
    printf("cudaLaunchKernel=%d\ncudaStreamSynchronize=%d\ncudaDeviceSynchronize=%d\n", rc_launch,
           rc_stream, rc_device);
    printf("cudaMallocManaged=%d\ncudaGraphLaunch=%d\n", rc_managed, rc_graph);
    printf("cudaStreamBeginCapture=%d\ncudaStreamEndCapture=%d\n", rc_begin, rc_end);
    fflush(stdout);
    return 0;
}
