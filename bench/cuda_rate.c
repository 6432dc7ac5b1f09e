/* Workload for bench/trace_overhead.py: CPU work between CUDA runtime calls.
 * Usage: cuda_rate SPIN CALLS -> prints "ns_per_iter=<float>" (thread CPU time) of the loop.
 * Each iteration spins SPIN rounds of integer work, then calls cudaLaunchKernel (which
 * fails fast without a driver; the uprobes fire all the same). */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#include "thread_cpu.h"

static void kernel_stub(void) {}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SPIN CALLS\n", argv[0]);
        return 2;
    }
    long spin = atol(argv[1]), calls = atol(argv[2]);
    dim3 one = {1, 1, 1};
    volatile unsigned long acc = 1;
    for (int i = 0; i < 1000; i++) /* first calls initialise the runtime */
        cudaLaunchKernel((const void *)kernel_stub, one, one, NULL, 0, 0);
    double t0 = now_ns();
    for (long i = 0; i < calls; i++) {
        for (long j = 0; j < spin; j++)
            acc = acc * 6364136223846793005UL + 1442695040888963407UL;
        cudaLaunchKernel((const void *)kernel_stub, one, one, NULL, 0, 0);
    }
    double t1 = now_ns();
    printf("ns_per_iter=%.1f\n", (t1 - t0) / calls);
    return 0;
}
