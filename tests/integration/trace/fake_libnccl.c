/* A stand-in libnccl.so.2 for machines without GPUs, with NCCL's real exported signatures
 * (nccl.h from the real library): communicator init succeeds and hands out a handle, and the
 * collectives of one communicator rendezvous across processes, so a late rank makes the
 * others wait INSIDE the call and a rank that never enters leaves the others blocked in it,
 * as on a real cluster.
 *
 * Rendezvous: $FAKE_NCCL_DIR/<first 16 bytes of the unique id, hex>.ranks is a shared
 * mapping of nranks counters; rank r stores how many collectives it has entered, and a
 * collective returns once every rank has entered at least as many. Without $FAKE_NCCL_DIR
 * (or with one rank) collectives return at once. Inside ncclGroupStart/ncclGroupEnd
 * collectives are only queued; the outermost ncclGroupEnd waits for the group's last one
 * (NCCL launches a group at its end). ncclSend/ncclRecv return at once (point-to-point).
 *
 * $FAKE_NCCL_LIBCUDA names a libcuda.so.1 (fake_libcuda.c) that is loaded at start: each
 * launched collective then calls its cuLaunchKernel once, as real NCCL launches a kernel
 * per collective through the driver, so the traced process launches kernels and fleet-push
 * counts it as working (a node with no launches is idle). Without it nothing is launched.
 *
 * $FAKE_NCCL_ASYNC=1 makes the collectives behave as real NCCL's do on a GPU: the call only
 * enqueues (records the arrival, launches the kernel) and returns at once, and the wait for
 * the peers happens where the GPU stream is waited for: the stand-in driver's
 * cuStreamSynchronize/cuCtxSynchronize call fake_nccl_stream_wait() below, which returns
 * once every rank has entered every collective this process launched. A rank whose peer
 * never comes then hangs in a stream sync, having returned from the collective.
 *
 * $FAKE_NCCL_LINK names a file: while it exists no collective completes (a link down, a
 * NIC, NVLink): every rank still enters the collective and waits where it would wait for
 * a missing peer (in the call, or with FAKE_NCCL_ASYNC=1 in its stream sync). None is
 * missing; the job stops on every rank until the file is removed. */
#include <nccl.h>

#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

struct ncclComm {
    int rank, nranks;
    volatile uint64_t *arrived; /* shared: collectives entered, per rank (NULL: no peers) */
    uint64_t issued;            /* collectives this rank has issued on the communicator */
    uint64_t launched;          /* of those, launched (a group's at its outermost end) */
};

/* Live communicators with peers, for fake_nccl_stream_wait (async mode). */
#define MAX_LIVE_COMMS 16
static ncclComm_t live[MAX_LIVE_COMMS];
static int async_mode;
static const char *link_down; /* $FAKE_NCCL_LINK: while it exists, nothing completes */

#define MAX_GROUP_COMMS 16
static __thread int group_depth;
static __thread ncclComm_t group_comms[MAX_GROUP_COMMS];
static __thread int group_n;

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void *, void **, void **);
static launch_fn cu_launch;

__attribute__((constructor)) static void load_libcuda(void) {
    const char *mode = getenv("FAKE_NCCL_ASYNC");
    async_mode = mode && strcmp(mode, "1") == 0;
    link_down = getenv("FAKE_NCCL_LINK");
    const char *path = getenv("FAKE_NCCL_LIBCUDA");
    void *lib = path ? dlopen(path, RTLD_NOW) : NULL;
    if (path && !lib)
        fprintf(stderr, "fake libnccl: %s\n", dlerror());
    if (lib)
        cu_launch = (launch_fn)dlsym(lib, "cuLaunchKernel");
}

static void wait_peers(ncclComm_t comm, uint64_t n) {
    struct timespec nap = {0, 50 * 1000};
    for (int r = 0; r < comm->nranks; r++)
        while (__atomic_load_n(&comm->arrived[r], __ATOMIC_SEQ_CST) < n)
            nanosleep(&nap, NULL);
    struct timespec poll = {0, 5 * 1000 * 1000};
    while (link_down && access(link_down, F_OK) == 0)
        nanosleep(&poll, NULL);
}

static void rendezvous(ncclComm_t comm) {
    if (cu_launch) /* the collective's kernel (the stand-in driver fails it; it is counted) */
        cu_launch(NULL, 1, 1, 1, 64, 1, 1, 0, NULL, NULL, NULL);
    comm->launched = comm->issued;
    if (!comm->arrived)
        return;
    __atomic_store_n(&comm->arrived[comm->rank], comm->launched, __ATOMIC_SEQ_CST);
    if (!async_mode)
        wait_peers(comm, comm->launched);
}

/* Called by the stand-in driver's stream and context syncs (async mode): the GPU work
 * this process launched is done once every peer entered each launched collective. */
void fake_nccl_stream_wait(void) {
    if (!async_mode)
        return;
    for (int i = 0; i < MAX_LIVE_COMMS; i++)
        if (live[i])
            wait_peers(live[i], live[i]->launched);
}

static ncclResult_t collective(ncclComm_t comm) {
    if (!comm)
        return ncclInvalidArgument;
    comm->issued++;
    if (group_depth > 0) {
        for (int i = 0; i < group_n; i++)
            if (group_comms[i] == comm)
                return ncclSuccess;
        if (group_n == MAX_GROUP_COMMS)
            return ncclInvalidUsage;
        group_comms[group_n++] = comm;
        return ncclSuccess;
    }
    rendezvous(comm);
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId) {
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        uniqueId->internal[i] = (char)rand();
    return ncclSuccess;
}

/* The last destroyed communicator's memory, handed out again by the next init: a
 * re-created communicator at the same address, as an allocator may well do, so tracers
 * must not carry the old one's numbering over. */
static ncclComm_t spare;

static ncclResult_t init(ncclComm_t *out, int nranks, ncclUniqueId id, int rank) {
    if (!out || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    ncclComm_t comm = spare ? spare : malloc(sizeof(*comm));
    spare = NULL;
    if (!comm)
        return ncclSystemError;
    memset(comm, 0, sizeof(*comm));
    comm->rank = rank;
    comm->nranks = nranks;
    const char *dir = getenv("FAKE_NCCL_DIR");
    if (dir && nranks > 1) {
        char path[4096];
        int len = snprintf(path, sizeof path, "%s/", dir);
        for (int i = 0; i < 16 && len < (int)sizeof path - 3; i++)
            len += snprintf(path + len, sizeof path - len, "%02x", (unsigned char)id.internal[i]);
        snprintf(path + len, sizeof path - len, ".ranks");
        size_t size = (size_t)nranks * sizeof(uint64_t);
        int fd = open(path, O_RDWR | O_CREAT, 0600);
        /* Same size from every rank: a second ftruncate changes nothing. */
        if (fd < 0 || ftruncate(fd, (off_t)size) != 0) {
            free(comm);
            return ncclSystemError;
        }
        void *map = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (map == MAP_FAILED) {
            free(comm);
            return ncclSystemError;
        }
        comm->arrived = map;
        for (int i = 0; i < MAX_LIVE_COMMS; i++)
            if (!live[i]) {
                live[i] = comm;
                break;
            }
    }
    *out = comm;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
    return init(comm, nranks, commId, rank);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t *config) {
    (void)config;
    return init(comm, nranks, commId, rank);
}

static ncclResult_t release(ncclComm_t comm) {
    if (!comm)
        return ncclInvalidArgument;
    for (int i = 0; i < MAX_LIVE_COMMS; i++)
        if (live[i] == comm)
            live[i] = NULL;
    if (comm->arrived)
        munmap((void *)comm->arrived, (size_t)comm->nranks * sizeof(uint64_t));
    free(spare);
    spare = comm;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) { return release(comm); }
ncclResult_t ncclCommAbort(ncclComm_t comm) { return release(comm); }

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)op, (void)stream;
    return collective(comm);
}

ncclResult_t ncclBroadcast(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)root, (void)stream;
    return collective(comm);
}

ncclResult_t ncclReduce(const void *sendbuff, void *recvbuff, size_t count,
                        ncclDataType_t datatype, ncclRedOp_t op, int root, ncclComm_t comm,
                        cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff, (void)count, (void)datatype, (void)op, (void)root;
    (void)stream;
    return collective(comm);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff, (void)sendcount, (void)datatype, (void)stream;
    return collective(comm);
}

ncclResult_t ncclReduceScatter(const void *sendbuff, void *recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
    (void)sendbuff, (void)recvbuff, (void)recvcount, (void)datatype, (void)op, (void)stream;
    return collective(comm);
}

ncclResult_t ncclSend(const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    (void)sendbuff, (void)count, (void)datatype, (void)peer, (void)stream;
    return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclRecv(void *recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
    (void)recvbuff, (void)count, (void)datatype, (void)peer, (void)stream;
    return comm ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t ncclGroupStart(void) {
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void) {
    if (group_depth == 0)
        return ncclInvalidUsage;
    if (--group_depth > 0)
        return ncclSuccess;
    for (int i = 0; i < group_n; i++)
        rendezvous(group_comms[i]);
    group_n = 0;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result) {
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclSystemError: return "unhandled system error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    default: return "unknown result code";
    }
}
