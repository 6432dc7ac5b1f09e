// ingero trace: CUDA runtime/driver and NCCL uprobes plus host tracepoints (BCC).
//
// Only uprobe registers (PT_REGS_PARMn / PT_REGS_RC / the user stack) and tracepoint
// arguments are read: the kernel headers on a node may not match the running kernel,
// so no kernel struct offset is ever used. x86-64 calling convention.
//
// Aggregation happens here: per (tgid, op) counters and a log-linear histogram of
// durations (4 sub-buckets per power of two) in one map value, so a call costs one
// lookup of its (tgid, op) entry besides the entry/return bookkeeping. Python reads
// the cumulative maps every interval and takes differences. Individual calls are sampled into a ring buffer
// without a wake-up per event; the reader polls it, and failed reservations are counted.
//
// ingero/trace/probes.py appends one PROBE_ENTRY(...) line per traced operation and
// defines SAMPLE_EVERY, OP_OFFCPU and the NCCL comm-init/destroy op ids.
//
// Per stream (STREAM_ARG of a stream sync or a kernel launch, from probes.py): the stream
// handle is read at entry, and its (tgid, stream) entry in ``streams`` counts the stream's
// syncs and launches and times its steps: a step is the time from one sync's return on the
// stream to the next one's (the work between two host waits), kept as a count, a total and
// a log-linear histogram like the per-op durations. A separate map: the (tgid, op) stats and
// their readers stay as they are, and only the ops that name a stream pay its lookup.
// A launch with a config struct (cuLaunchKernelEx, cudaLaunchKernelExC) passes the stream
// inside it: STREAM_OFF is its offset there, read from user memory at entry. An event record
// keeps its (tgid, event) -> stream in ``event_streams`` at its return; an event
// synchronize looks its event up there at its return and counts as a sync of that stream,
// step included. An event never recorded (or evicted) counts nothing per stream.
//
// NCCL collectives are numbered here, per (process, communicator handle), at entry: the
// counter lives in the communicator's map entry (reset by ncclCommInitRank), so a lost
// sample never shifts the numbers. The arrival is sampled too (KIND_ENTER), so a rank
// blocked inside a collective is seen before it returns; ingero/trace/collectives.py
// folds arrivals and returns (and group start/end) into in-flight state per interval.
//
// Call stacks (STACKS, from probes.py): a sampled or slow (STACK_SLOW_NS) call's return
// sample carries the caller's user stack (bpf_get_stack at the uretprobe: the probed
// function is the op, the first frame is its caller) and, for CPython threads, the
// interpreter's frame chain as (code object, instruction) pairs, walked from the
// PyThreadState that user space put in py_tstates with the offsets it put in py_layouts
// (ingero/trace/pyframes/); a thread not there yet is looked up in the interpreter's own
// thread list. The walk reads user memory only, and at most MAX_PY frames. A numbered
// NCCL collective carries its stack on its arrival instead (a hung one never returns).
// The walk is one program, stack_sample, that the probes tail-call (see stack_arg).

#include <uapi/linux/ptrace.h>

#define KIND_CALL 0
#define KIND_EXIT 1
#define KIND_COMM_INIT 2
#define KIND_NEW 3
#define KIND_ENTER 4  // a numbered NCCL collective entered (its arrival)

#define HOST_PAGE_ALLOCS 0
#define HOST_BLOCK_IO 1
#define HOST_BLOCK_IO_NS 2
#define HOST_TCP_RETRANS 3
#define HOST_DROPS 4
#define HOST_OFFCPU_NS 5
#define HOST_SAMPLES 6
#define HOST_NSLOTS 8

struct stat_key {
    u32 tgid;
    u32 op;
};

#define NSLOTS 160  // up to 2^40 ns (~18 min); longer durations share the last slot

struct stat_val {
    u64 count;
    u64 total_ns;
    u64 errors;
    u64 bytes;
    u64 slots[NSLOTS];
};

struct call_t {
    u64 ts;
    u64 bytes;
    u64 comm;   // NCCL communicator handle, or the ncclComm_t* of an init call
    u64 hash;   // NCCL unique-id hash (of the init call, or of the call's communicator)
    u64 seq;    // collective sequence number on the communicator (0: not numbered)
    s32 rank;
    s32 nranks;
    u32 dtype;
    u32 op;
    u64 stream;  // the stream handle (where skind says the op names one)
    u64 event;   // the event handle (STREAM_RECORD, STREAM_EVENT_SYNC)
    u32 skind;   // STREAM_*: what the call does on its stream (NONE: names none)
    u32 spad;
};

// Communicators are keyed by process and handle: handles are heap addresses, which two
// processes may share.
struct comm_key {
    u64 handle;
    u32 tgid;
    u32 pad;
};

struct comm_t {
    u64 hash;
    u64 seq;    // collectives entered on this communicator so far
    s32 rank;
    s32 nranks;
};

struct event_t {
    u64 ts;
    u64 duration_ns;
    u64 bytes;
    u64 comm_hash;
    u64 comm;   // communicator handle (NCCL calls, init and destroy)
    u64 seq;    // collective sequence number (0: not a numbered collective)
    u32 tgid;
    u32 tid;
    u32 op;
    s32 ret;
    s32 rank;
    s32 nranks;
    u32 dtype;
    u32 kind;
};

struct off_t {
    u64 ts;
    u32 tgid;
    u32 pad;
};

struct bio_key {
    u32 dev;
    u32 pad;
    u64 sector;
};

#define STREAM_NONE 0
#define STREAM_SYNC 1
#define STREAM_LAUNCH 2
#define STREAM_RECORD 3
#define STREAM_EVENT_SYNC 4

// Streams are keyed by process and handle: handles are heap addresses, which two processes
// may share (0, 1 and 2 are the default, legacy and per-thread default streams).
struct stream_key {
    u64 stream;
    u32 tgid;
    u32 pad;
};

struct stream_val {
    u64 syncs;
    u64 sync_ns;   // host time waiting in the syncs
    u64 launches;  // kernel launches naming the stream
    u64 steps;     // sync-to-sync gaps (every sync but a stream's first)
    u64 step_ns;
    u64 last_sync; // the last sync's return (ktime ns): where the next step starts
    u64 slots[NSLOTS];  // step durations
};

BPF_HASH(stats, struct stat_key, struct stat_val, 16384);
BPF_HASH(streams, struct stream_key, struct stream_val, 4096);
// Events are keyed like streams (handles are heap addresses). An engine records its step's
// event and synchronizes it milliseconds later (vLLM, SGLang: one or two a step); PyTorch's
// caching allocator also records one per block freed across streams. An entry is lost only
// when 16384 other records (1.4 MB of kernel memory) come between an event's record and
// its sync: LRU, the oldest record goes first, and a sync of its event counts per op only.
#define EVENT_STREAMS 16384
struct event_key {
    u64 event;
    u32 tgid;
    u32 pad;
};
BPF_TABLE("lru_hash", struct event_key, u64, event_streams, EVENT_STREAMS);
BPF_PERCPU_ARRAY(zero_stream, struct stream_val, 1);
BPF_PERCPU_ARRAY(zero_stat, struct stat_val, 1);  // an all-zero value too big for the stack
BPF_HASH(comms, struct comm_key, struct comm_t, 4096);
BPF_HASH(traced, u32, u8, 4096);
BPF_HASH(offstart, u32, struct off_t, 65536);
BPF_HASH(bio_start, struct bio_key, u64, 16384);
BPF_HISTOGRAM(bio_hist, int, NSLOTS);
BPF_PERCPU_ARRAY(host, u64, HOST_NSLOTS);
BPF_PERCPU_ARRAY(sample_ctr, u64, 1);
// 2 MiB: a sample with a stack is ~860 bytes, and the reader drains it every 50 ms.
BPF_RINGBUF_OUTPUT(events, 512);

#define MAX_NATIVE 32  // user frames per stack
#define MAX_PY 32      // Python frames per stack (a power of two: the index mask)
#define PY_NONE 0      // not a Python thread user space knows
#define PY_OK 1        // the whole chain
#define PY_TRUNCATED 2 // more than MAX_PY frames
#define PY_FAULT 3     // a read failed (the thread moved on, or the map is stale)
#define PY_NO_THREAD 4 // a Python process, but this thread is not in py_tstates yet

struct py_frame_t {
    u64 code;   // PyCodeObject *
    u64 instr;  // 3.11+: _Py_CODEUNIT * into the code; 3.10: f_lasti in the low 32 bits
};

// A return sample with its stack: event_t, then the frames (sizes in decode.py).
struct stack_event_t {
    struct event_t ev;
    u32 nnative;
    u32 npy;
    u32 py_state;
    u32 pad;
    u64 native[MAX_NATIVE];
    struct py_frame_t py[MAX_PY];
};

// Where a CPython version keeps the frame chain (offsets in bytes; -1: not in this version).
// A frame's fields are read in one go: the window [win_start, win_start + win_len) of the
// frame, with the fields at offsets relative to the window (8-byte aligned but owner).
struct py_layout_t {
    s32 tstate_frame;    // PyThreadState: the current frame (3.11/3.12: the _PyCFrame *)
    s32 cframe_current;  // _PyCFrame.current_frame (3.11/3.12), else -1
    u32 win_start;       // frame: first byte read
    u32 win_len;         // frame: bytes read (1..PY_WIN)
    u32 previous;        // window: the caller's frame
    u32 code;            // window: the code object
    u32 instr;           // window: the instruction
    s32 owner;           // window: owner byte (3.11+), else -1
    s32 shim_owner;      // owner value of C-stack shim frames (3.12+), else -1
    s32 threads_head;    // PyInterpreterState: its first PyThreadState (-1: no lookup)
    s32 tstate_next;     // PyThreadState: the next one
    s32 tstate_tid;      // PyThreadState: native_thread_id (3.11+), thread_id (3.10), else -1
    s32 pthread_tid;     // 3.10: the tid's offset in glibc's struct pthread (thread_id points
                         // at it), else -1 (tstate_tid is the kernel tid itself)
    s32 pad;
    u64 interp;          // the main PyInterpreterState * (0: no lookup)
};

#define PY_WIN 128           // bytes of a frame read at once (a power of two: the masks)
#define MAX_TSTATE_WALK 32   // threads looked at on a miss (new threads are at the head)
#define PY_MISS_RECHECK_NS 1000000000ULL  // a thread not found is looked for again after 1 s

struct py_win_t {
    u8 b[PY_WIN];
};

BPF_HASH(py_layouts, u32, struct py_layout_t, 4096);  // tgid → layout
BPF_HASH(py_tstates, u32, u64, 65536);                // tid → PyThreadState *
BPF_PERCPU_ARRAY(py_scratch, struct py_win_t, 1);     // one frame's window
// Threads of a Python process not in its interpreter's list when last looked for (native
// threads calling CUDA): tid → when, so a miss costs one lookup until it is due again.
BPF_TABLE("lru_hash", u32, u64, py_misses, 16384);

// NCCL datatype sizes, indexed by ncclDataType_t (int8 … fp8e5m2).
static __always_inline u64 dtype_size(u32 dtype) {
    switch (dtype) {
    case 0: case 1: case 10: case 11: return 1;
    case 6: case 9: return 2;
    case 2: case 3: case 7: return 4;
    case 4: case 5: case 8: return 8;
    }
    return 0;
}

// Log-linear bucket: exact below 4, then 4 linear sub-buckets per power of two.
static __always_inline u32 slot_of(u64 d) {
    if (d < 4)
        return (u32)d;
    u32 l = bpf_log2l(d) - 1;  // BCC's bpf_log2l is floor(log2) + 1
    u32 slot = l * 4 + (u32)((d >> (l - 2)) & 3);
    return slot < NSLOTS ? slot : NSLOTS - 1;
}

// The calls in flight on each thread, from entry to return: a stack, because traced calls
// nest. NCCL launches each collective's kernel through the driver API (cuLaunchKernel[Ex])
// inside ncclAllReduce, and the runtime calls into the driver: with one slot per thread
// the inner call's entry overwrote the outer one and its return cleared it, so the outer
// call (the collective) never returned. Returns come in LIFO order, so the top is the one
// returning. A return that never fires (a thread that exits inside a call) leaves a stale
// entry below the others; past CALL_DEPTH the top is overwritten, as one slot was.
#define CALL_DEPTH 4
struct call_stack {
    u32 depth;
    u32 pad;
    struct call_t c[CALL_DEPTH];
    // The last runtime launch counted at entry (LAUNCH_PROBE): its stack pointer at entry
    // and the return address there, so a driver launch it makes is not counted again.
    u64 rt_sp;
    u64 rt_ret;
};

// CALL_DEPTH is a power of two: the masks below are what the verifier reads as bounds.
static __always_inline void stack_push(struct call_stack *s, struct call_t *c) {
    u32 i = s->depth < CALL_DEPTH ? s->depth : CALL_DEPTH - 1;
    i &= CALL_DEPTH - 1;
    s->c[i] = *c;
    s->depth = i + 1;
}

static __always_inline struct call_t *stack_top(struct call_stack *s) {
    u32 d = s->depth;
    if (d == 0 || d > CALL_DEPTH)
        return 0;
    return &s->c[(d - 1) & (CALL_DEPTH - 1)];
}

// The call under the top one (what called the returning call), or 0.
static __always_inline struct call_t *stack_below(struct call_stack *s) {
    u32 d = s->depth;
    if (d < 2 || d > CALL_DEPTH)
        return 0;
    return &s->c[(d - 2) & (CALL_DEPTH - 1)];
}

static __always_inline int op_in(u64 mask, u32 op) {
    return op < 64 && ((mask >> op) & 1);
}

// A driver call made inside a runtime call is the runtime's own work (cudaLaunchKernel
// launches through cuLaunchKernel, cudaStreamSynchronize waits in cuStreamSynchronize):
// it is counted once, as the runtime call the application made, whose duration holds it.
// A driver call inside an NCCL call (the collective's kernel launch) is counted: NCCL's
// own calls are not launches. RUNTIME_OPS and DRIVER_OPS come from probes.py.
static __always_inline int runtime_internal(struct call_stack *s, struct call_t *c) {
    struct call_t *outer = s ? stack_below(s) : 0;
    return outer && op_in(RUNTIME_OPS, outer->op) && op_in(DRIVER_OPS, c->op);
}

// Task-local storage is the cheapest place (no hash insert/delete per call); kernels
// without BTF for bpf_get_current_task_btf() get a hash keyed by thread (probes.py falls
// back to it).
#ifdef USE_TASK_STORAGE
BPF_TASK_STORAGE(calls, struct call_stack);

static __always_inline void call_put(u64 id, struct call_t *c) {
    struct task_struct *t = (struct task_struct *)bpf_get_current_task_btf();
    struct call_stack *s = calls.task_storage_get(t, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (s)
        stack_push(s, c);
}

static __always_inline struct call_stack *calls_of(u64 id) {
    struct task_struct *t = (struct task_struct *)bpf_get_current_task_btf();
    return calls.task_storage_get(t, 0, 0);
}

// The call on top returned (one write: no lookup, as the one slot's ``ts = 0`` was).
static __always_inline void call_pop(u64 id, struct call_stack *s) {
    if (s && s->depth > 0)
        s->depth -= 1;
}
#else
// Threads inside a traced call at once (an entry is deleted when its stack empties).
BPF_HASH(calls, u64, struct call_stack, 16384);
BPF_PERCPU_ARRAY(zero_stack, struct call_stack, 1);  // an empty stack, too big for the stack

static __always_inline void call_put(u64 id, struct call_t *c) {
    u32 z = 0;
    struct call_stack *zero = zero_stack.lookup(&z);
    if (!zero)
        return;
    struct call_stack *s = calls.lookup_or_try_init(&id, zero);
    if (s)
        stack_push(s, c);
}

static __always_inline struct call_stack *calls_of(u64 id) {
    return calls.lookup(&id);
}

static __always_inline void call_pop(u64 id, struct call_stack *s) {
    if (s && s->depth > 1)
        s->depth -= 1;
    else if (s)
        calls.delete(&id);
}
#endif

// The call returning on this thread (the top of its stack), or 0.
static __always_inline struct call_t *call_get(struct call_stack *s) {
    return s ? stack_top(s) : 0;
}

static __always_inline void host_add(u32 idx, u64 v) {
    u64 *p = host.lookup(&idx);
    if (p)
        *p += v;
}

// Integer argument slot n of the probed function at entry (1-6 in registers, 7-9 on the
// stack above the return address, 8 bytes each whatever the type).
static __always_inline u64 arg_n(struct pt_regs *ctx, int n) {
    u64 v = 0;
    if (n >= 7 && n <= 9) {
        bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
        return v;
    }
    switch (n) {
    case 1: return PT_REGS_PARM1(ctx);
    case 2: return PT_REGS_PARM2(ctx);
    case 3: return PT_REGS_PARM3(ctx);
    case 4: return PT_REGS_PARM4(ctx);
    case 5: return PT_REGS_PARM5(ctx);
    case 6: return PT_REGS_PARM6(ctx);
    }
    return 0;
}

static __always_inline int should_sample(int always) {
    if (always)
        return 1;
    u32 z = 0;
    u64 *c = sample_ctr.lookup(&z);
    if (!c)
        return 0;
    *c += 1;
    return (*c % SAMPLE_EVERY) == 0;
}

static __always_inline void emit(struct event_t *ev) {
    if (events.ringbuf_output(ev, sizeof(*ev), BPF_RB_NO_WAKEUP) != 0)
        host_add(HOST_DROPS, 1);
    else
        host_add(HOST_SAMPLES, 1);
}

// A thread that user space has not mapped yet (started since it last read the thread
// list): find its PyThreadState in the interpreter's own list, newest first, and map it, so
// the first (slow) call of a new thread has its Python frames. Bounded (MAX_TSTATE_WALK)
// and, for a thread that is not there, done again only after PY_MISS_RECHECK_NS.
static __always_inline u64 py_find_thread(struct py_layout_t *L, u32 tid) {
    if (!L->interp || L->threads_head < 0 || L->tstate_tid < 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 *last = py_misses.lookup(&tid);
    if (last && now - *last < PY_MISS_RECHECK_NS)
        return 0;
    u64 t = 0;
    if (bpf_probe_read_user(&t, sizeof(t), (void *)(L->interp + L->threads_head)) != 0)
        t = 0;
    for (int i = 0; i < MAX_TSTATE_WALK; i++) {  // bounded, not unrolled (its early return)
        if (!t)
            break;
        s64 native = 0;
        if (bpf_probe_read_user(&native, sizeof(native), (void *)(t + L->tstate_tid)) != 0)
            break;
        if (L->pthread_tid >= 0) {  // 3.10: a pthread_t, the address of glibc's struct pthread
            s32 k = 0;
            if (!native ||
                bpf_probe_read_user(&k, sizeof(k), (void *)(native + L->pthread_tid)) != 0)
                k = 0;
            native = k;
        }
        if (native == (s64)tid) {
            py_tstates.update(&tid, &t);
            py_misses.delete(&tid);
            return t;
        }
        if (bpf_probe_read_user(&t, sizeof(t), (void *)(t + L->tstate_next)) != 0)
            break;
    }
    py_misses.update(&tid, &now);
    return 0;
}

static __always_inline void py_walk(struct stack_event_t *r, u32 tgid, u32 tid) {
    struct py_layout_t *L = py_layouts.lookup(&tgid);
    if (!L)
        return;
    u64 tstate = 0;
    u64 *ts = py_tstates.lookup(&tid);
    if (ts)
        tstate = *ts;
    else
        tstate = py_find_thread(L, tid);
    if (!tstate) {
        r->py_state = PY_NO_THREAD;
        return;
    }
    u32 z = 0;
    struct py_win_t *w = py_scratch.lookup(&z);
    if (!w)
        return;
    u32 at_prev = L->previous & (PY_WIN - 8), at_code = L->code & (PY_WIN - 8);
    u32 at_instr = L->instr & (PY_WIN - 8), at_owner = (u32)L->owner & (PY_WIN - 1);
    int shims = L->owner >= 0 && L->shim_owner >= 0;
    u8 shim = (u8)L->shim_owner;
    u64 f = 0;
    if (bpf_probe_read_user(&f, sizeof(f), (void *)(tstate + L->tstate_frame)) != 0)
        goto fault;
    if (L->cframe_current >= 0 && f &&
        bpf_probe_read_user(&f, sizeof(f), (void *)(f + L->cframe_current)) != 0)
        goto fault;
    // One read of the frame's window per frame. C-stack shim frames (3.12+: the entry
    // frame the interpreter pushes at each call from C) are no line of the user's code, and
    // their "code" is a trampoline (3.12) or None (3.13): their slot gets code 0, which user
    // space drops. One index for visits and slots: the verifier follows a single counter,
    // where skipping in place multiplies its states past its limit.
    u32 n = 0;
#pragma unroll
    for (int i = 0; i < MAX_PY; i++) {
        if (!f)
            break;
        // 1..PY_WIN bytes, in a form the verifier bounds (win_len is 1..PY_WIN).
        u32 len = ((L->win_len - 1) & (PY_WIN - 1)) + 1;
        if (bpf_probe_read_user(w->b, len, (void *)(f + L->win_start)) != 0) {
            r->npy = n;
            goto fault;
        }
        f = *(u64 *)(w->b + at_prev);
        r->py[i].code = shims && w->b[at_owner] == shim ? 0 : *(u64 *)(w->b + at_code);
        r->py[i].instr = *(u64 *)(w->b + at_instr);
        n = i + 1;
    }
    r->npy = n;
    r->py_state = f ? PY_TRUNCATED : PY_OK;
    return;
fault:
    r->py_state = PY_FAULT;
}

#if STACKS
// A sample with the caller's stack (ring buffer memory: too big for the BPF stack). At a
// return the first user frame is the caller (the return address the uretprobe resumes at).
// At an entry (an NCCL arrival) it is the probed function itself, and frame pointers skip
// the caller, whose return address is still on top of the user stack: it takes the slot.
static __always_inline void emit_stack(struct pt_regs *ctx, struct event_t *ev, int entry) {
    struct stack_event_t *r = events.ringbuf_reserve(sizeof(struct stack_event_t));
    if (!r) {
        host_add(HOST_DROPS, 1);
        return;
    }
    r->ev = *ev;
    r->npy = 0;
    r->py_state = PY_NONE;
    r->pad = 0;
    long got = bpf_get_stack(ctx, r->native, sizeof(r->native), BPF_F_USER_STACK);
    r->nnative = got > 0 ? (u32)((u64)got >> 3) : 0;
    if (entry && r->nnative > 0 &&
        bpf_probe_read_user(&r->native[0], sizeof(u64), (void *)PT_REGS_SP(ctx)) != 0)
        r->nnative = 0;
    py_walk(r, ev->tgid, ev->tid);
    events.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
    host_add(HOST_SAMPLES, 1);
}

// The stack walk is one program, stack_sample, that every probe tail-calls with its sample
// in stack_arg: inlined into each of the ~100 probes it was most of the program's compile
// and verifier time, and BCC 0.26 cannot load a BPF-to-BPF call ("call to invalid
// destination"). A tail call keeps the probe's pt_regs, so the walk sees the probed
// thread's registers and user stack as the probe did. probes.py puts stack_sample in
// stack_progs before any probe attaches. Per CPU: a program is not migrated while it runs,
// so the tail call finds what its probe wrote, unless a probe of another thread preempted
// it in between (a preemptible kernel) and wrote its own: the walk checks the thread, and
// counts a drop rather than give one thread's sample another's stack.
struct stack_arg_t {
    struct event_t ev;
    u32 entry;  // an arrival (at the probed function's entry), not a return
    u32 pad;
};
BPF_PERCPU_ARRAY(stack_arg, struct stack_arg_t, 1);
BPF_PROG_ARRAY(stack_progs, 1);
// The kernel lets a program tail-call only programs loaded with its own attach type: a
// probe loaded for a uprobe_multi link calls a uprobe_multi copy of stack_sample, kept
// here (ingero/trace/tailcall.py points its tail call at this map when it loads it).
BPF_PROG_ARRAY(stack_progs_multi, 1);
// And the probes of uprobe session links (the launches counted at entry) a session copy.
BPF_PROG_ARRAY(stack_progs_session, 1);

int stack_sample(struct pt_regs *ctx) {
    u32 z = 0;
    struct stack_arg_t *a = stack_arg.lookup(&z);
    if (!a)
        return 0;
    if (a->ev.tid != (u32)bpf_get_current_pid_tgid()) {
        host_add(HOST_DROPS, 1);
        return 0;
    }
    emit_stack(ctx, &a->ev, a->entry);
    return 0;
}

// The sample with its stack, through stack_sample. A tail call does not return: this is the
// last thing a probe does. Past it only when the call failed (an empty slot): a drop.
static __always_inline void sample_with_stack(struct pt_regs *ctx, struct event_t *ev,
                                              int entry) {
    u32 z = 0;
    struct stack_arg_t *a = stack_arg.lookup(&z);
    if (a) {
        a->ev = *ev;
        a->entry = entry;
        a->pad = 0;
        stack_progs.call(ctx, 0);
    }
    host_add(HOST_DROPS, 1);
}
#else
static __always_inline void sample_with_stack(struct pt_regs *ctx, struct event_t *ev,
                                              int entry) {
    emit(ev);
}
#endif

// First call of a process: remember it (off-CPU time) and tell the reader at once, so it
// reads the process's job tags while the process still exists.
static __always_inline void mark_traced(u64 id) {
    u32 tgid = id >> 32;
    if (traced.lookup(&tgid))
        return;
    u8 one = 1;
    if (traced.insert(&tgid, &one) != 0)
        return;
    struct event_t ev = {};
    ev.ts = bpf_ktime_get_ns();
    ev.tgid = tgid;
    ev.tid = (u32)id;
    ev.kind = KIND_NEW;
    ev.rank = -1;
    ev.nranks = -1;
    emit(&ev);
}

// The (process, op) entry of the stats map, created on first use (``*created``).
static __always_inline struct stat_val *stat_entry(u64 id, u32 op, int *created) {
    struct stat_key sk = {.tgid = id >> 32, .op = op};
    struct stat_val *sv = stats.lookup(&sk);
    if (sv)
        return sv;
    u32 z = 0;
    struct stat_val *zero = zero_stat.lookup(&z);
    if (!zero)
        return 0;
    stats.insert(&sk, zero);
    *created = 1;
    return stats.lookup(&sk);
}

// Count one call or off-CPU period. The first of a (process, op) creates the entry,
// and the first call of a process marks it traced: the hot path is a single lookup.
static __always_inline void record(u64 id, u32 op, u64 dur, u64 bytes, int err) {
    int created = 0;
    struct stat_val *sv = stat_entry(id, op, &created);
    if (!sv)
        return;
    if (created && op != OP_OFFCPU)
        mark_traced(id);
    __sync_fetch_and_add(&sv->count, 1);
    __sync_fetch_and_add(&sv->total_ns, dur);
    if (bytes)
        __sync_fetch_and_add(&sv->bytes, bytes);
    if (err)
        __sync_fetch_and_add(&sv->errors, 1);
    u32 slot = slot_of(dur);
    if (slot < NSLOTS)
        __sync_fetch_and_add(&sv->slots[slot], 1);
}

// One stream sync or launch on its (process, stream) entry; the first creates it.
static __always_inline void record_stream(u32 tgid, u64 stream, u32 kind, u64 now, u64 dur) {
    struct stream_key k = {.stream = stream, .tgid = tgid};
    struct stream_val *v = streams.lookup(&k);
    if (!v) {
        u32 z = 0;
        struct stream_val *zero = zero_stream.lookup(&z);
        if (!zero)
            return;
        streams.insert(&k, zero);
        v = streams.lookup(&k);
        if (!v)
            return;
    }
    if (kind == STREAM_LAUNCH) {
        __sync_fetch_and_add(&v->launches, 1);
        return;
    }
    __sync_fetch_and_add(&v->syncs, 1);
    __sync_fetch_and_add(&v->sync_ns, dur);
    // Two threads syncing one stream at once race here: one gap may be lost, never invented.
    u64 last = v->last_sync;
    v->last_sync = now;
    if (!last || now <= last)
        return;
    u64 step = now - last;
    __sync_fetch_and_add(&v->steps, 1);
    __sync_fetch_and_add(&v->step_ns, step);
    u32 slot = slot_of(step);
    if (slot < NSLOTS)
        __sync_fetch_and_add(&v->slots[slot], 1);
}

static __always_inline int call_enter(struct pt_regs *ctx, u32 op, int bytes_arg, int count_arg,
                                      int dtype_arg, int comm_arg, int numbered, int stream_arg,
                                      u32 stream_kind, int stream_off, int event_arg) {
    u64 id = bpf_get_current_pid_tgid();
    struct call_t c = {};
    c.ts = bpf_ktime_get_ns();
    c.op = op;
    c.rank = -1;
    c.nranks = -1;
    if (stream_arg) {
        c.stream = arg_n(ctx, stream_arg);
        c.skind = stream_kind;
        // The stream inside a config struct (user memory): an unreadable config (NULL, a
        // bad pointer: the call fails) names no stream.
        if (stream_off >= 0) {
            u64 config = c.stream;
            c.stream = 0;
            if (!config ||
                bpf_probe_read_user(&c.stream, sizeof(c.stream), (void *)(config + stream_off)))
                c.skind = STREAM_NONE;
        }
    }
    if (event_arg) {
        c.event = arg_n(ctx, event_arg);
        c.skind = stream_kind;
    }
    if (bytes_arg)
        c.bytes = arg_n(ctx, bytes_arg);
    if (count_arg && dtype_arg) {
        c.dtype = (u32)arg_n(ctx, dtype_arg);
        c.bytes = arg_n(ctx, count_arg) * dtype_size(c.dtype);
    }
    if (comm_arg) {
        c.comm = arg_n(ctx, comm_arg);
        // The communicator is looked up here, not at return: the collective's number is
        // taken at its arrival, in the order the process issues them (NCCL's own order).
        struct comm_key k = {.handle = c.comm, .tgid = id >> 32};
        struct comm_t *cm = comms.lookup(&k);
        if (cm) {
            c.hash = cm->hash;
            c.rank = cm->rank;
            c.nranks = cm->nranks;
            if (numbered)
                c.seq = __sync_fetch_and_add(&cm->seq, 1) + 1;
        }
    }
    call_put(id, &c);
    // numbered is a constant of each probe: the arrival (and its stack walk, the largest
    // code of the program) is compiled into the NCCL collectives' entry probes only.
    if (numbered && c.seq) {
        // The arrival, so a call that never returns (a hung collective) is still seen.
        struct event_t ev = {};
        ev.ts = c.ts;
        ev.bytes = c.bytes;
        ev.comm_hash = c.hash;
        ev.comm = c.comm;
        ev.seq = c.seq;
        ev.tgid = id >> 32;
        ev.tid = (u32)id;
        ev.op = op;
        ev.rank = c.rank;
        ev.nranks = c.nranks;
        ev.dtype = c.dtype;
        ev.kind = KIND_ENTER;
        // Its stack is taken here, not at its return: a hung collective never returns,
        // and the return of one (same caller) is given this stack by user space. Last:
        // the stack's tail call does not return (without stacks it is a plain emit).
        sample_with_stack(ctx, &ev, 1);
    }
    return 0;
}

static __always_inline int call_leave(struct pt_regs *ctx, int always) {
    u64 id = bpf_get_current_pid_tgid();
    struct call_stack *s = calls_of(id);
    struct call_t *c = call_get(s);
    if (!c)
        return 0;
    if (runtime_internal(s, c)) {
        call_pop(id, s);
        return 0;
    }
    u64 now = bpf_ktime_get_ns();
    u64 dur = now - c->ts;
    u32 tgid = id >> 32;
    s32 ret = (s32)PT_REGS_RC(ctx);
    record(id, c->op, dur, c->bytes, ret != 0);
    if (c->skind == STREAM_RECORD) {
        struct event_key ek = {.event = c->event, .tgid = tgid};
        event_streams.update(&ek, &c->stream);
    } else if (c->skind == STREAM_EVENT_SYNC) {
        struct event_key ek = {.event = c->event, .tgid = tgid};
        u64 *stream = event_streams.lookup(&ek);
        if (stream)
            record_stream(tgid, *stream, STREAM_SYNC, now, dur);
    } else if (c->skind) {
        record_stream(tgid, c->stream, c->skind, now, dur);
    }
    int sampled = should_sample(always);
    // A slow call is sampled too (with its stack), whatever the counter says. The call is
    // popped before its sample: the stack's tail call does not return.
    if (sampled || (STACKS && dur >= STACK_SLOW_NS)) {
        struct event_t ev = {};
        ev.ts = now;
        ev.duration_ns = dur;
        ev.bytes = c->bytes;
        ev.tgid = tgid;
        ev.tid = (u32)id;
        ev.op = c->op;
        ev.ret = ret;
        ev.dtype = c->dtype;
        ev.comm_hash = c->hash;
        ev.comm = c->comm;
        ev.seq = c->seq;
        ev.rank = c->rank;
        ev.nranks = c->nranks;
        call_pop(id, s);
        if (!ev.seq)
            sample_with_stack(ctx, &ev, 0);
        else
            emit(&ev);
        return 0;
    }
    call_pop(id, s);
    return 0;
}

#if defined(LAUNCH_SESSIONS) && defined(USE_TASK_STORAGE)
// Launches counted at entry (the launch-class ops in sampled mode: LAUNCH_PROBE lines from
// probes.py). One program per op, attached through a uprobe session link
// (BPF_TRACE_UPROBE_SESSION, 6.13+): it runs at the entry, and its return value says
// whether the call's return runs it again (0) or not at all (1): a declined return costs
// no more than an entry-only uprobe. At entry it counts the launch in ``launches``, per
// (process, op, stream) and per CPU, one lookup: the per-op count and the per-stream
// launches are both sums of it (user space adds them up). 1 in 2^shift launches takes its
// return and is timed; the shift follows the key's launch rate (launch_shift), checked
// every LAUNCH_CHECK_EVERY launches on a CPU, so that about 1e9 / LAUNCH_GAP_NS of the
// key's launches a second are timed whatever the rate: all of them below that rate, 1 in
// 4096 at most. A timed launch
// is recorded with its weight 2^shift (Horvitz-Thompson: its count, time, errors and
// histogram slot count 2^shift calls), so the durations stay an unbiased estimate while
// the shift moves. The session cookie (8 bytes the kernel keeps from entry to return)
// holds the entry time and the shift.
//
// bpf_session_is_return() and bpf_session_cookie() are kfuncs, which BCC (0.26) cannot
// call: the program calls two placeholder helper ids, and ingero/trace/sessions.py turns
// those calls into kfunc calls by the BTF ids of the running kernel before loading it.
static long (*const session_is_return)(void *ctx) = (void *)KFUNC_SESSION_IS_RETURN;
static u64 *(*const session_cookie)(void *ctx) = (void *)KFUNC_SESSION_COOKIE;

#define LAUNCH_NAMED (1U << 16)    // launch_key.op: the launch names a stream
#define OP_TIMED (1U << 15)        // stat_key.op: the timed launches of an op (weighted)
#define LAUNCH_CHECK_EVERY 64      // launches between two rate checks (a power of two)
#define LAUNCH_MAX_SHIFT 12
#define COOKIE_SHIFT_AT 58         // ktime ns stay below 2^58 (9 years of uptime)

struct launch_key {
    u64 stream;
    u32 tgid;
    u32 op;  // the op id, | LAUNCH_NAMED where the launch names a stream
};

struct launch_val {
    u64 count;  // launches entered (this CPU)
    u32 shift;  // 1 in 2^shift launches is timed (the key's, as of this CPU's last check)
    u32 pad;
};

BPF_PERCPU_HASH(launches, struct launch_key, struct launch_val, 16384);

// The key's launch rate over all CPUs (a thread moves between them; each CPU's share of it
// would time the key's target on every CPU), measured from the launches the CPUs report
// at their checks: once a window holds LAUNCH_RATE_LAUNCHES of them or LAUNCH_RATE_NS
// passed, the shift is set from its rate and a new window starts.
#define LAUNCH_RATE_LAUNCHES 256
#define LAUNCH_RATE_NS 10000000ULL
struct launch_rate {
    u64 since;  // the window's start (ktime)
    u64 count;  // launches reported in it
    u32 shift;
    u32 pad;
};
BPF_HASH(launch_rates, struct launch_key, struct launch_rate, 16384);

static __always_inline u32 launch_shift(struct launch_key *k) {
    struct launch_rate *r = launch_rates.lookup(k);
    u64 now = bpf_ktime_get_ns();
    if (!r) {
        struct launch_rate fresh = {.since = now};
        launch_rates.insert(k, &fresh);
        return 0;
    }
    u64 count = __sync_fetch_and_add(&r->count, LAUNCH_CHECK_EVERY) + LAUNCH_CHECK_EVERY;
    u64 since = r->since;
    if (now > since && (count >= LAUNCH_RATE_LAUNCHES || now - since >= LAUNCH_RATE_NS)) {
        // Launches a wanted gap holds at the window's rate. Two CPUs closing one window at
        // once both set a shift from it: the same one, near enough.
        u64 want = count * LAUNCH_GAP_NS / (now - since);
        u32 shift = want > 1 ? bpf_log2l(want) - 1 : 0;
        r->shift = shift < LAUNCH_MAX_SHIFT ? shift : LAUNCH_MAX_SHIFT;
        r->since = now;
        r->count = 0;
    }
    return r->shift;
}

// A driver launch the runtime makes inside its own launch is the runtime's work: the runtime
// call is counted, not this one (as runtime_internal does for calls with returns). A runtime
// launch counted at entry leaves its frame, the stack pointer at its entry and the return
// address there, in its thread's task storage (rt_sp, rt_ret). The thread's next driver
// launch is the runtime's own while that launch is in flight: its stack pointer is below
// the frame's, and the frame's return address is still in its slot (the runtime's return
// pops it, the next call at that depth overwrites it). A timed runtime launch's return
// address is the kernel's return trampoline until it returns: its frame is armed (RT_ARMED
// in place of the address), live while the stack pointer test holds, and cleared at its
// return. A frame is consumed by the first driver launch that looks at it. (A per-CPU frame,
// parked in task storage when its thread was switched out, cost the same here: within the
// noise of the bench, 955-986 against 960 ns a launch.)
#define RT_ARMED 1ULL  // a return address is never 1

static __always_inline struct call_stack *frame_of(int create) {
    struct task_struct *t = (struct task_struct *)bpf_get_current_task_btf();
    return calls.task_storage_get(t, 0, create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
}

// The runtime launch on this thread left its frame.
static __always_inline void frame_put(u64 sp, u64 ret, int armed) {
    struct call_stack *s = frame_of(1);
    if (s) {
        s->rt_sp = sp;
        s->rt_ret = armed ? RT_ARMED : ret;
    }
}

// A timed runtime launch returned: its frame, if no driver launch consumed it, goes.
static __always_inline void frame_clear(void) {
    struct call_stack *s = frame_of(0);
    if (s)
        s->rt_sp = 0;
}

// This process's uretprobe trampoline (sessions.TRAMPOLINE: the offsets from the kernel's
// BTF), 0 where unknown. Another tracer's return probe on a runtime launch (a second ingero
// timing it, any uretprobe) puts this address in the launch's return slot, after every
// entry program ran: the launch is in flight all the same.
static __always_inline u64 uprobe_trampoline(void) {
#ifdef TRAMPOLINE_2
    u64 p = bpf_get_current_task(), mm = 0, area = 0, vaddr = 0;
    if (bpf_probe_read_kernel(&mm, sizeof(mm), (void *)(p + TRAMPOLINE_0)) || !mm ||
        bpf_probe_read_kernel(&area, sizeof(area), (void *)(mm + TRAMPOLINE_1)) || !area ||
        bpf_probe_read_kernel(&vaddr, sizeof(vaddr), (void *)(area + TRAMPOLINE_2)))
        return 0;
    return vaddr;
#else
    return 0;
#endif
}

// Whether this driver launch is the runtime's own (the frame consumed either way). A
// runtime launch whose session link could not be made (another tracer's perf-event uprobe
// there with another ref_ctr_offset: EINVAL) is timed with entry and return as other ops
// are: its driver launch is the runtime's own while it is on top of the thread's stack.
static __always_inline int launch_internal(u64 sp) {
    struct call_stack *s = frame_of(0);
    if (!s)
        return 0;
    if (!s->rt_sp) {
        struct call_t *top = stack_top(s);
        return top && op_in(RUNTIME_OPS, top->op);
    }
    u64 frame_sp = s->rt_sp, frame_ret = s->rt_ret;
    s->rt_sp = 0;
    if (sp >= frame_sp)
        return 0;
    if (frame_ret == RT_ARMED)
        return 1;
    u64 slot = 0;
    if (bpf_probe_read_user(&slot, sizeof(slot), (void *)frame_sp))
        return 0;
    return slot == frame_ret || (slot && slot == uprobe_trampoline());
}

// The timed launches of an op: weighted by the 2^shift launches each stands for. ``bytes``
// counts the timed calls themselves (a launch moves no bytes).
static __always_inline void record_timed(u64 id, u32 op, u64 dur, int err, u64 w) {
    int created = 0;
    struct stat_val *sv = stat_entry(id, op | OP_TIMED, &created);
    if (!sv)
        return;
    __sync_fetch_and_add(&sv->count, w);
    __sync_fetch_and_add(&sv->total_ns, dur * w);
    __sync_fetch_and_add(&sv->bytes, 1);
    if (err)
        __sync_fetch_and_add(&sv->errors, w);
    u32 slot = slot_of(dur);
    if (slot < NSLOTS)
        __sync_fetch_and_add(&sv->slots[slot], w);
}

static __always_inline int launch_enter(struct pt_regs *ctx, u32 op, int stream_arg,
                                        int stream_off, int runtime) {
    u64 id = bpf_get_current_pid_tgid();
    u64 sp = PT_REGS_SP(ctx);
    u64 ret = 0, stream = 0;
    u32 named = 0;
#ifdef LAUNCH_NO_READS
    // bench/trace_overhead.py's no-reads: what the reads of user memory cost (no stream,
    // no frame: the runtime's own driver launches count again). Never the tracer's.
    stream_arg = 0;
    runtime = 0;
#endif
    if (runtime && stream_arg >= 7 && stream_arg <= 9) {
        // The return address and the stack slots up to the stream's, in one read (a read
        // of user memory costs ~100 ns here, whatever its size).
        u64 f[4] = {};
        if (bpf_probe_read_user(f, 8 * (stream_arg - 5), (void *)sp) == 0) {
            ret = f[0];
            stream = f[(stream_arg - 6) & 3];
            named = 1;
        }
    } else {
        if (runtime && bpf_probe_read_user(&ret, sizeof(ret), (void *)sp) != 0)
            ret = 0;
        if (stream_arg) {
            stream = arg_n(ctx, stream_arg);
            named = 1;
        }
    }
    if (named && stream_off >= 0) {
        // The stream inside a config struct (user memory), as call_enter reads it.
        u64 config = stream;
        stream = 0;
        if (!config ||
            bpf_probe_read_user(&stream, sizeof(stream), (void *)(config + stream_off)))
            named = 0;
    }
    if (!runtime && launch_internal(sp))
        return 1;
    struct launch_key k = {.stream = named ? stream : 0, .tgid = id >> 32,
                           .op = op | (named ? LAUNCH_NAMED : 0)};
    struct launch_val *v = launches.lookup(&k);
    if (!v) {
        struct launch_val z = {};
        launches.insert(&k, &z);
        v = launches.lookup(&k);
        if (!v)
            return 1;
        mark_traced(id);
    }
    u64 n = v->count;
    __sync_fetch_and_add(&v->count, 1);
    if ((n & (LAUNCH_CHECK_EVERY - 1)) == LAUNCH_CHECK_EVERY - 1)
        v->shift = launch_shift(&k);
    // 1 in 2^shift launches is timed: those whose count's Fibonacci hash has its top shift
    // bits clear. The hash spreads the picks evenly over any period of the workload (a step
    // of a fixed number of launches is not sampled at one place of it) and costs a multiply,
    // where bpf_get_prandom_u32() cost ~25 ns a launch here.
    u32 shift = v->shift & 15;
    int timed = !shift || (n * 0x9E3779B97F4A7C15ULL) >> (64 - shift) == 0;
    if (runtime && ret)
        frame_put(sp, ret, timed);
    if (!timed)
        return 1;
    u64 *cookie = session_cookie(ctx);
    *cookie = bpf_ktime_get_ns() | ((u64)shift << COOKIE_SHIFT_AT);
    return 0;
}

// A timed launch returns: its duration, weighted; a raw sample (with its stack) for 1 in
// SAMPLE_EVERY launches, as near as the shift allows, and for a slow one.
static __always_inline int launch_leave(struct pt_regs *ctx, u32 op, int runtime) {
    if (runtime)
        frame_clear();
    u64 *cookie = session_cookie(ctx);
    u64 c = *cookie;
    u64 now = bpf_ktime_get_ns();
    u64 start = c & ((1ULL << COOKIE_SHIFT_AT) - 1);
    u32 shift = (c >> COOKIE_SHIFT_AT) & 15;
    if (!start || now < start)
        return 0;
    u64 dur = now - start;
    u64 id = bpf_get_current_pid_tgid();
    s32 ret = (s32)PT_REGS_RC(ctx);
    record_timed(id, op, dur, ret != 0, 1ULL << shift);
    u32 every = SAMPLE_EVERY >> shift;
    int sampled = every <= 1 || bpf_get_prandom_u32() % every == 0;
    if (sampled || (STACKS && dur >= STACK_SLOW_NS)) {
        struct event_t ev = {};
        ev.ts = now;
        ev.duration_ns = dur;
        ev.tgid = id >> 32;
        ev.tid = (u32)id;
        ev.op = op;
        ev.ret = ret;
        ev.rank = -1;
        ev.nranks = -1;
        sample_with_stack(ctx, &ev, 0);
    }
    return 0;
}

#define LAUNCH_PROBE(OP, STREAM_ARG, STREAM_OFF, RUNTIME)                              \
    int launch_##OP(struct pt_regs *ctx) {                                             \
        if (session_is_return(ctx))                                                    \
            return launch_leave(ctx, OP, RUNTIME);                                     \
        return launch_enter(ctx, OP, STREAM_ARG, STREAM_OFF, RUNTIME);                 \
    }
#endif

// An entry probe per op: what it reads at entry depends on the op. The return probes are
// two programs shared by every generic op (the op is in the call's entry, read back at the
// return): leave_always for ops sampled at every call, leave_sampled for the others.
// One copy each instead of one per op: each copy was compile and verifier time at start.
#define PROBE_ENTRY(OP, BYTES_ARG, COUNT_ARG, DTYPE_ARG, COMM_ARG, NUMBERED, STREAM_ARG,  \
                    STREAM_KIND, STREAM_OFF, EVENT_ARG)                                 \
    int enter_##OP(struct pt_regs *ctx) {                                              \
        return call_enter(ctx, OP, BYTES_ARG, COUNT_ARG, DTYPE_ARG, COMM_ARG, NUMBERED,   \
                          STREAM_ARG, STREAM_KIND, STREAM_OFF, EVENT_ARG);             \
    }

int leave_sampled(struct pt_regs *ctx) { return call_leave(ctx, 0); }

int leave_always(struct pt_regs *ctx) { return call_leave(ctx, 1); }

// ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank[, config]):
// the 128-byte id is passed in memory (on the stack above the return address), so it
// takes no register and rank arrives in the third integer register.
int enter_comm_init(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct call_t c = {};
    c.ts = bpf_ktime_get_ns();
    c.op = OP_COMM_INIT;
    c.comm = PT_REGS_PARM1(ctx);  // ncclComm_t *: the handle is read from it at return
    c.nranks = (s32)PT_REGS_PARM2(ctx);
    c.rank = (s32)PT_REGS_PARM3(ctx);
    u64 h = 14695981039346656037ULL;
    u64 w = 0;
    u64 base = PT_REGS_SP(ctx) + 8;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        bpf_probe_read_user(&w, sizeof(w), (void *)(base + i * 8));
        h = (h ^ w) * 1099511628211ULL;
    }
    c.hash = h;
    call_put(id, &c);
    return 0;
}

int leave_comm_init(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct call_stack *s = calls_of(id);
    struct call_t *c = call_get(s);
    if (!c)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 dur = now - c->ts;
    u32 tgid = id >> 32;
    s32 ret = (s32)PT_REGS_RC(ctx);
    u64 handle = 0;
    bpf_probe_read_user(&handle, sizeof(handle), (void *)c->comm);
    if (ret == 0 && handle) {
        // A new communicator (or a re-created one at a reused address): numbering from 1.
        struct comm_key k = {.handle = handle, .tgid = tgid};
        struct comm_t cm = {.hash = c->hash, .rank = c->rank, .nranks = c->nranks};
        comms.update(&k, &cm);
    }
    record(id, c->op, dur, 0, ret != 0);
    struct event_t ev = {};
    ev.ts = now;
    ev.duration_ns = dur;
    ev.tgid = tgid;
    ev.tid = (u32)id;
    ev.op = c->op;
    ev.ret = ret;
    ev.comm_hash = c->hash;
    ev.comm = ret == 0 ? handle : 0;
    ev.rank = c->rank;
    ev.nranks = c->nranks;
    ev.kind = KIND_COMM_INIT;
    emit(&ev);
    call_pop(id, s);
    return 0;
}

// ncclCommDestroy / ncclCommAbort (comm): forget the communicator after the call.
int enter_comm_destroy(struct pt_regs *ctx) {
    return call_enter(ctx, OP_COMM_DESTROY, 0, 0, 0, 1, 0, 0, STREAM_NONE, -1, 0);
}

int leave_comm_destroy(struct pt_regs *ctx) {
    u64 id = bpf_get_current_pid_tgid();
    struct call_stack *s = calls_of(id);
    struct call_t *c = call_get(s);
    struct comm_key k = {.handle = c ? c->comm : 0, .tgid = id >> 32};
    // Before call_leave: its sample's tail call does not return. call_leave reads the
    // call, not the communicator.
    if (k.handle)
        comms.delete(&k);
    return call_leave(ctx, 1);
}

// Off-CPU time of traced threads: prev is the current task, next is only a pid.
TRACEPOINT_PROBE(sched, sched_switch) {
    u64 now = bpf_ktime_get_ns();
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (traced.lookup(&tgid)) {
        u32 prev = args->prev_pid;
        struct off_t o = {.ts = now, .tgid = tgid};
        offstart.update(&prev, &o);
    }
    u32 next = args->next_pid;
    struct off_t *o = offstart.lookup(&next);
    if (o) {
        u64 d = now - o->ts;
        record((u64)o->tgid << 32, OP_OFFCPU, d, 0, 0);
        host_add(HOST_OFFCPU_NS, d);
        offstart.delete(&next);
    }
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit) {
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    u32 tid = (u32)id;
    offstart.delete(&tid);
    if (tgid != tid || !traced.lookup(&tgid))
        return 0;
    struct event_t ev = {};
    ev.ts = bpf_ktime_get_ns();
    ev.tgid = tgid;
    ev.tid = tid;
    ev.kind = KIND_EXIT;
    ev.rank = -1;
    ev.nranks = -1;
    emit(&ev);
    return 0;
}

TRACEPOINT_PROBE(kmem, mm_page_alloc) {
    host_add(HOST_PAGE_ALLOCS, 1ULL << args->order);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_issue) {
    struct bio_key k = {.dev = args->dev, .sector = args->sector};
    u64 ts = bpf_ktime_get_ns();
    bio_start.update(&k, &ts);
    return 0;
}

TRACEPOINT_PROBE(block, block_rq_complete) {
    struct bio_key k = {.dev = args->dev, .sector = args->sector};
    u64 *ts = bio_start.lookup(&k);
    if (!ts)
        return 0;
    u64 d = bpf_ktime_get_ns() - *ts;
    bio_start.delete(&k);
    host_add(HOST_BLOCK_IO, 1);
    host_add(HOST_BLOCK_IO_NS, d);
    bio_hist.atomic_increment((int)slot_of(d));
    return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb) {
    host_add(HOST_TCP_RETRANS, 1);
    return 0;
}
