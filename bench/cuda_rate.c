/* Workload for bench/trace_overhead.py: CPU work between CUDA runtime calls.
 * Usage: cuda_rate SPIN CALLS [launch|launch-ex|event] -> prints "ns_per_iter=<float>"
 * (thread CPU time) of the loop. Each iteration spins SPIN rounds of integer work, then
 * makes its call: cudaLaunchKernel (launch, the default), cudaLaunchKernelExC with a config
 * (launch-ex), or cudaEventRecord then cudaEventSynchronize of that event (event). Each
 * fails fast without a driver; the uprobes fire all the same. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "thread_cpu.h"

static void kernel_stub(void) {}

enum mode { LAUNCH, LAUNCH_EX, EVENT };

static dim3 one = {1, 1, 1};

static void call(enum mode m, const cudaLaunchConfig_t *config, cudaEvent_t event) {
    switch (m) {
    case LAUNCH:
        cudaLaunchKernel((const void *)kernel_stub, one, one, NULL, 0, 0);
        break;
    case LAUNCH_EX:
        cudaLaunchKernelExC(config, (const void *)kernel_stub, NULL);
        break;
    case EVENT:
        cudaEventRecord(event, config->stream);
        cudaEventSynchronize(event);
        break;
    }
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SPIN CALLS [launch|launch-ex|event]\n", argv[0]);
        return 2;
    }
    long spin = atol(argv[1]), calls = atol(argv[2]);
    enum mode m = LAUNCH;
    if (argc > 3 && strcmp(argv[3], "launch-ex") == 0)
        m = LAUNCH_EX;
    else if (argc > 3 && strcmp(argv[3], "event") == 0)
        m = EVENT;
    else if (argc > 3 && strcmp(argv[3], "launch") != 0) {
        fprintf(stderr, "unknown call %s\n", argv[3]);
        return 2;
    }
    /* Opaque handles: without a driver nothing dereferences them. */
    cudaLaunchConfig_t config = {.gridDim = one, .blockDim = one,
                                 .stream = (cudaStream_t)(unsigned long)0x7f00c0de0000UL};
    cudaEvent_t event = (cudaEvent_t)(unsigned long)0x7f00e0e00000UL;
    volatile unsigned long acc = 1;
    for (int i = 0; i < 1000; i++) /* first calls initialise the runtime */
        call(m, &config, event);
    double t0 = now_ns();
    for (long i = 0; i < calls; i++) {
        for (long j = 0; j < spin; j++)
            acc = acc * 6364136223846793005UL + 1442695040888963407UL;
        call(m, &config, event);
    }
    double t1 = now_ns();
    printf("ns_per_iter=%.1f\n", (t1 - t0) / calls);
    return 0;
}
