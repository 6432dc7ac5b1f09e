/* Launches for test_trace_sampling.py, through the stand-in runtime (fake_libcudart.c, which
 * launches through the stand-in driver inside, fake_libcuda.c) and the driver itself.
 * Usage: launch_mix N SLOW_PERCENT SPIN. Waits for a line on stdin (a tracer attaches to its
 * pid first), then makes N runtime launches, each on stream A or B and 1 in 100/SLOW_PERCENT
 * of them slow (the stand-in driver spins SPIN rounds: a launch that waits for a full
 * queue), both chosen by a fixed pseudo-random sequence, and N / 10 launches straight through
 * the driver on stream C. Prints what it launched, per stream and kind. */
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

static void kernel(void) {}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s N SLOW_PERCENT SPIN\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]), slow_pct = atol(argv[2]);
    unsigned spin = (unsigned)atol(argv[3]);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 3;
    cudaStream_t streams[2] = {(cudaStream_t)0x7f00a0000000UL, (cudaStream_t)0x7f00b0000000UL};
    CUstream direct = (CUstream)0x7f00c0000000UL;
    long launched[2] = {0, 0}, slow[2] = {0, 0};
    dim3 one = {1, 1, 1};
    unsigned long x = 88172645463325252UL;
    for (long i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift64 */
        int s = (int)(x >> 62) & 1, is_slow = (long)((x >> 8) % 100) < slow_pct;
        cudaLaunchKernel((const void *)kernel, one, one, NULL, is_slow ? spin : 0, streams[s]);
        launched[s]++, slow[s] += is_slow;
    }
    for (long i = 0; i < n / 10; i++)
        cuLaunchKernel((CUfunction)kernel, 1, 1, 1, 1, 1, 1, 0, direct, NULL, NULL);
    printf("stream_a=%016lx launches_a=%ld slow_a=%ld\n", (unsigned long)streams[0], launched[0],
           slow[0]);
    printf("stream_b=%016lx launches_b=%ld slow_b=%ld\n", (unsigned long)streams[1], launched[1],
           slow[1]);
    printf("stream_c=%016lx launches_c=%ld\n", (unsigned long)direct, n / 10);
    fflush(stdout);
    return 0;
}
