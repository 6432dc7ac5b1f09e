/* A stand-in inference engine's GPU loop, on two CUDA streams (fake_libcudart.c and
 * fake_libcuda.c: the real signatures, the toolkit's real header).
 *
 * The decode stream: each step launches DECODE_LAUNCHES kernels through the runtime
 * (cudaLaunchKernel, dim3 by value), works STREAM_DECODE_US, and waits on the stream
 * (cudaStreamSynchronize); every STREAM_PREFILL_EVERY-th step on it is a prefill step of
 * STREAM_PREFILL_US instead (an engine that prefills and decodes on one stream). The other
 * stream, every STREAM_OTHER_EVERY decode steps: one launch straight through the driver
 * (cuLaunchKernel, the stream in its 9th argument) and a driver sync (cuStreamSynchronize).
 *
 * STREAM_WAIT_BY=event: an engine that launches with a config and waits through events
 * (vLLM, SGLang; Triton and torch.compile kernels): the decode stream launches through
 * cudaLaunchKernelExC (the stream in its config) and waits by recording an event on it and
 * synchronizing the event (cudaEventRecord, cudaEventSynchronize); the other stream
 * launches through cuLaunchKernelEx and waits through cuEventRecordWithFlags and
 * cuEventSynchronize. STREAM_UNRECORDED=1: each decode step also synchronizes an event never
 * recorded. STREAM_FLOOD_EVENTS=N first records N distinct events on a third stream, never
 * synchronized.
 *
 * Environment: STREAM_ITERS (decode-stream steps; 0: until killed), STREAM_DECODE_US,
 * STREAM_PREFILL_US, STREAM_PREFILL_EVERY, STREAM_OTHER_EVERY, STREAM_CONTROL (a file
 * holding a slowdown: decode steps take 1 + it times as long; read every 20 steps),
 * STREAM_WAIT=1 (wait for a line on stdin first). The command line is free (the push test
 * runs it as `vllm serve MODEL ...`). Prints the streams' handles and counts at the end. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DECODE_LAUNCHES 3

static void kernel(void) {}

static long env(const char *name, long dflt) {
    const char *v = getenv(name);
    return v ? atol(v) : dflt;
}

static double slowdown(const char *path) {
    double s = 0;
    FILE *f = path ? fopen(path, "r") : NULL;
    if (f) {
        if (fscanf(f, "%lf", &s) != 1)
            s = 0;
        fclose(f);
    }
    return s > 0 ? s : 0;
}

int main(void) {
    long iters = env("STREAM_ITERS", 200), decode_us = env("STREAM_DECODE_US", 2000);
    long prefill_us = env("STREAM_PREFILL_US", 20000);
    long prefill_every = env("STREAM_PREFILL_EVERY", 10), other_every = env("STREAM_OTHER_EVERY", 5);
    const char *control = getenv("STREAM_CONTROL");
    const char *wait_by = getenv("STREAM_WAIT_BY");
    int events = wait_by && strcmp(wait_by, "event") == 0;
    long flood = env("STREAM_FLOOD_EVENTS", 0), unrecorded = env("STREAM_UNRECORDED", 0);
    /* Stream handles are opaque pointers to the stand-ins: two distinct values. */
    cudaStream_t decode = (cudaStream_t)(unsigned long)0x7f00c0de0000UL;
    CUstream other = (CUstream)(unsigned long)0x7f00a11e0000UL;
    cudaStream_t flooded = (cudaStream_t)(unsigned long)0x7f00f100d000UL;
    /* Event handles, opaque to the stand-ins like the streams. */
    cudaEvent_t step_done = (cudaEvent_t)(unsigned long)0x7f00e0e00000UL;
    cudaEvent_t never_recorded = (cudaEvent_t)(unsigned long)0x7f00e0e10000UL;
    CUevent other_done = (CUevent)(unsigned long)0x7f00e0e20000UL;
    if (env("STREAM_WAIT", 0)) {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 3;
    }
    dim3 one = {1, 1, 1};
    cudaLaunchConfig_t config = {.gridDim = one, .blockDim = one, .stream = decode};
    CUlaunchConfig other_config = {.gridDimX = 1, .gridDimY = 1, .gridDimZ = 1,
                                   .blockDimX = 32, .blockDimY = 1, .blockDimZ = 1,
                                   .hStream = other};
    for (long i = 0; i < flood; i++)
        cudaEventRecord((cudaEvent_t)(unsigned long)(0x7f1000000000UL + 64 * i), flooded);
    long syncs = 0, launches = 0, prefills = 0, osyncs = 0, olaunches = 0;
    double slow = slowdown(control);
    for (long i = 0; iters == 0 || i < iters; i++) {
        if (i % 20 == 0)
            slow = slowdown(control);
        for (int k = 0; k < DECODE_LAUNCHES; k++) {
            if (events)
                cudaLaunchKernelExC(&config, (const void *)kernel, NULL);
            else
                cudaLaunchKernel((const void *)kernel, one, one, NULL, 0, decode);
            launches++;
        }
        if (prefill_every > 0 && i % prefill_every == prefill_every - 1) {
            usleep((useconds_t)prefill_us);
            prefills++;
        } else {
            usleep((useconds_t)(decode_us * (1.0 + slow)));
        }
        if (events) {
            cudaEventRecord(step_done, decode);
            cudaEventSynchronize(step_done);
            if (unrecorded)
                cudaEventSynchronize(never_recorded);
        } else {
            cudaStreamSynchronize(decode);
        }
        syncs++;
        if (other_every > 0 && i % other_every == other_every - 1) {
            if (events) {
                cuLaunchKernelEx(&other_config, (CUfunction)kernel, NULL, NULL);
                cuEventRecordWithFlags(other_done, other, 0);
                cuEventSynchronize(other_done);
            } else {
                cuLaunchKernel((CUfunction)kernel, 1, 1, 1, 32, 1, 1, 0, other, NULL, NULL);
                cuStreamSynchronize(other);
            }
            olaunches++, osyncs++;
        }
    }
    printf("decode_stream=%016lx\ndecode_syncs=%ld\ndecode_launches=%ld\nprefills=%ld\n",
           (unsigned long)decode, syncs, launches, prefills);
    printf("other_stream=%016lx\nother_syncs=%ld\nother_launches=%ld\n", (unsigned long)other,
           osyncs, olaunches);
    fflush(stdout);
    return 0;
}
