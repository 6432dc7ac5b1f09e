/* One rank of a job, against the stand-in libnccl (fake_libnccl.c): N iterations of
 * collectives on a communicator, with the knobs the tests need.
 *
 * Usage: nccl_ranks RANK NRANKS ITERATIONS SEED [options]
 *   -d MS      this rank sleeps MS milliseconds before each iteration (a late rank)
 *   -S N       this rank stops (pauses) before its N-th collective on comm 1, until a
 *              SIGUSR1 lets it go on (it prints "resumed" and does not stop again)
 *   -F PATH    this rank stops (as -S) before the first collective after PATH exists
 *   -g K       every K-th iteration issues a nested group of 2 collectives instead of one
 *   -2         a second communicator: one broadcast on it per iteration
 *   -x K       after K iterations, destroy comm 1 and create it again with a new id
 *   -p         one ncclSend + ncclRecv per iteration (point-to-point: not numbered)
 *   -a         end each iteration with cuStreamSynchronize of $FAKE_NCCL_LIBCUDA, as a
 *              training step does (loss.item()): with FAKE_NCCL_ASYNC=1 the collectives
 *              return at enqueue, as real NCCL's do, and the rank waits for its peers there
 * The unique id is built from SEED (all ranks of a job pass the same). Prints the ids
 * (hex) and "ready", waits for a line on stdin, runs, prints the counts and exits. */
#include <dlfcn.h>
#include <nccl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static float sendbuf[4096], recvbuf[4096];
static volatile sig_atomic_t resumed;

static void on_resume(int sig) {
    (void)sig;
    resumed = 1;
}

static ncclUniqueId make_id(int seed) {
    ncclUniqueId id;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        id.internal[i] = (char)(seed * 31 + i * 7 + 3);
    return id;
}

static void print_id(const char *name, ncclUniqueId id) {
    printf("%s=", name);
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        printf("%02x", (unsigned char)id.internal[i]);
    printf("\n");
}

#define CHECK(call)                                                                       \
    do {                                                                                  \
        ncclResult_t rc_ = (call);                                                        \
        if (rc_ != ncclSuccess) {                                                         \
            fprintf(stderr, "%s: %s\n", #call, ncclGetErrorString(rc_));                  \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s RANK NRANKS ITERATIONS SEED [-d MS] [-S N] [-g K] [-2] "
                        "[-F PATH] [-x K] [-p] [-a]\n", argv[0]);
        return 2;
    }
    int rank = atoi(argv[1]), nranks = atoi(argv[2]), seed = atoi(argv[4]);
    long iters = atol(argv[3]);
    long delay_ms = 0, stop_before = 0, group_every = 0, recreate_after = 0;
    const char *stop_file = NULL;
    int second = 0, p2p = 0, sync_each = 0;
    optind = 5;
    for (int c; (c = getopt(argc, argv, "d:S:F:g:2x:pa")) != -1;) {
        switch (c) {
        case 'd': delay_ms = atol(optarg); break;
        case 'S': stop_before = atol(optarg); break;
        case 'F': stop_file = optarg; break;
        case 'g': group_every = atol(optarg); break;
        case '2': second = 1; break;
        case 'x': recreate_after = atol(optarg); break;
        case 'p': p2p = 1; break;
        case 'a': sync_each = 1; break;
        default: return 2;
        }
    }
    int (*stream_sync)(void *) = NULL;
    if (sync_each) {
        const char *path = getenv("FAKE_NCCL_LIBCUDA");
        void *cuda = path ? dlopen(path, RTLD_NOW) : NULL;
        stream_sync = cuda ? (int (*)(void *))dlsym(cuda, "cuStreamSynchronize") : NULL;
        if (!stream_sync) {
            fprintf(stderr, "-a needs FAKE_NCCL_LIBCUDA: %s\n", path ? dlerror() : "unset");
            return 2;
        }
    }
    ncclUniqueId id1 = make_id(seed), id2 = make_id(seed + 1), id3 = make_id(seed + 2);
    print_id("id1", id1);
    print_id("id2", id2);
    print_id("id3", id3);
    printf("ready\n");
    fflush(stdout);
    char line[16];
    if (!fgets(line, sizeof line, stdin))
        return 3;
    /* SIGUSR1 stays blocked but while a stopped rank waits for it (no lost wake-up). */
    sigset_t usr1, unblocked;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    sigprocmask(SIG_BLOCK, &usr1, &unblocked);
    signal(SIGUSR1, on_resume);

    ncclComm_t comm1 = NULL, comm2 = NULL;
    CHECK(ncclCommInitRank(&comm1, nranks, id1, rank));
    if (second)
        CHECK(ncclCommInitRank(&comm2, nranks, id2, rank));
    long issued1 = 0, issued2 = 0; /* collectives on the current comm 1 and on comm 2 */
    for (long i = 1; i <= iters; i++) {
        if (delay_ms)
            usleep((useconds_t)(delay_ms * 1000));
        if ((stop_before && issued1 + 1 == stop_before) ||
            (stop_file && access(stop_file, F_OK) == 0)) {
            printf("stopped=%ld\n", issued1);
            fflush(stdout);
            while (!resumed)
                sigsuspend(&unblocked); /* a hung rank: alive, never entering the collective */
            printf("resumed\n");
            fflush(stdout);
            stop_before = 0;
            stop_file = NULL;
        }
        if (group_every && i % group_every == 0) {
            CHECK(ncclGroupStart());
            CHECK(ncclAllReduce(sendbuf, recvbuf, 1000, ncclFloat32, ncclSum, comm1, 0));
            CHECK(ncclGroupStart());
            CHECK(ncclAllGather(sendbuf, recvbuf, 64, ncclUint8, comm1, 0));
            CHECK(ncclGroupEnd());
            usleep(20000); /* the group is in flight until its outermost end */
            CHECK(ncclGroupEnd());
            issued1 += 2;
        } else {
            CHECK(ncclAllReduce(sendbuf, recvbuf, 1000, ncclFloat32, ncclSum, comm1, 0));
            issued1 += 1;
        }
        if (p2p) {
            CHECK(ncclSend(sendbuf, 256, ncclInt64, (rank + 1) % nranks, comm1, 0));
            CHECK(ncclRecv(recvbuf, 256, ncclInt64, (rank + nranks - 1) % nranks, comm1, 0));
        }
        if (second) {
            CHECK(ncclBroadcast(sendbuf, recvbuf, 300, ncclFloat16, 0, comm2, 0));
            issued2 += 1;
        }
        if (stream_sync)
            stream_sync(NULL); /* the step's end; fails in the stand-in, after waiting */
        if (recreate_after && i == recreate_after) {
            ncclComm_t old = comm1;
            CHECK(ncclCommDestroy(comm1));
            CHECK(ncclCommInitRank(&comm1, nranks, id3, rank));
            printf("recreated_after=%ld\nsame_handle=%d\n", issued1, comm1 == old);
            issued1 = 0;
        }
    }
    CHECK(ncclCommDestroy(comm1));
    if (second)
        CHECK(ncclCommDestroy(comm2));
    printf("comm1_collectives=%ld\ncomm2_collectives=%ld\n", issued1, issued2);
    fflush(stdout);
    return 0;
}
