/* CPU time of the calling thread, for the bench workloads: uprobe handlers run in its
 * context and count, while time spent waiting for a CPU on a shared machine does not. */
#include <time.h>

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}
