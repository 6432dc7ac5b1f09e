/* Test workload for ingero trace's NCCL probes, against the real libnccl.
 * Without a GPU, communicator init fails and collectives get a NULL communicator, so
 * every call returns an error, but the uprobes fire with the real arguments.
 * Usage: nccl_loop ITERATIONS NRANKS RANK
 * Prints the unique id (hex) and the return codes, then waits for a line on stdin. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s ITERATIONS NRANKS RANK\n", argv[0]);
        return 2;
    }
    long iters = atol(argv[1]);
    int nranks = atoi(argv[2]), rank = atoi(argv[3]);
    ncclUniqueId id;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        id.internal[i] = (char)(i * 7 + 3);
    int rc_id = ncclGetUniqueId(&id);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 3;
    static float sendbuf[4096], recvbuf[4096];
    ncclComm_t comm = NULL;
    int rc_init = ncclCommInitRank(&comm, nranks, id, rank);
    int rc_ar = 0, rc_send = 0, rc_bcast = 0, rc_ag = 0, rc_gs = 0, rc_ge = 0;
    for (long i = 0; i < iters; i++) {
        rc_gs = ncclGroupStart();
        rc_ge = ncclGroupEnd();
        rc_ar = ncclAllReduce(sendbuf, recvbuf, 1000, ncclFloat32, ncclSum, comm, 0);
        rc_send = ncclSend(sendbuf, 256, ncclInt64, (rank + 1) % nranks, comm, 0);
        rc_bcast = ncclBroadcast(sendbuf, recvbuf, 300, ncclFloat16, 0, comm, 0);
        rc_ag = ncclAllGather(sendbuf, recvbuf, 64, ncclUint8, comm, 0);
    }
    int rc_destroy = ncclCommDestroy(comm);
    printf("id=");
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        printf("%02x", (unsigned char)id.internal[i]);
    printf("\nncclGetUniqueId=%d\nncclCommInitRank=%d\nncclAllReduce=%d\nncclSend=%d\n", rc_id,
           rc_init, rc_ar, rc_send);
    printf("ncclBroadcast=%d\nncclAllGather=%d\nncclCommDestroy=%d\n", rc_bcast, rc_ag,
           rc_destroy);
    printf("ncclGroupStart=%d\nncclGroupEnd=%d\n", rc_gs, rc_ge);
    fflush(stdout);
    return 0;
}
