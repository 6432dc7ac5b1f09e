/* Workload for bench/nccl_overhead.py: CPU work between NCCL collectives on one live
 * communicator (the stand-in libnccl of the tests, one rank: no rendezvous, so a call
 * returns at once and only the probes' cost is measured).
 * Usage: nccl_rate SPIN CALLS -> prints "ns_per_iter=<float>" (thread CPU time). */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

#include "thread_cpu.h"

static float buf[1024];

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s SPIN CALLS\n", argv[0]);
        return 2;
    }
    long spin = atol(argv[1]), calls = atol(argv[2]);
    ncclUniqueId id;
    ncclGetUniqueId(&id);
    ncclComm_t comm;
    if (ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess)
        return 1;
    volatile unsigned long acc = 1;
    for (int i = 0; i < 100; i++) /* few: their samples share the ring with the run's */
        ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, 0);
    double t0 = now_ns();
    for (long i = 0; i < calls; i++) {
        for (long j = 0; j < spin; j++)
            acc = acc * 6364136223846793005UL + 1442695040888963407UL;
        ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, 0);
    }
    double t1 = now_ns();
    ncclCommDestroy(comm);
    printf("ns_per_iter=%.1f\n", (t1 - t0) / calls);
    return 0;
}
