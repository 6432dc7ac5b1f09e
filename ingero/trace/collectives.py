"""NCCL collectives per communicator: arrivals, returns and calls in flight, per interval.

The kernel numbers each collective at entry (per process and communicator handle, from 1
after ``ncclCommInitRank``; ``ncclSend``/``ncclRecv`` are not numbered) and samples its
arrival and its return. This fold turns those samples into the node DB's ``nccl_calls``
(sampled individual collectives) and ``nccl_comms`` (one row per interval per process per
communicator) rows. It is pure: times arrive already converted to Unix seconds, and
:meth:`Collectives.close` is given the interval's end, so tests drive it with tables.

Group calls: a collective issued between ``ncclGroupStart`` and the matching
``ncclGroupEnd`` (depth counted per thread, nesting allowed) keeps its own number but
stays in flight until the outermost ``ncclGroupEnd`` returns; that return is its return
time (NCCL launches a group's collectives only then).

Calls in flight: a sampled call still in flight at its interval's end waits one more
interval (a call that merely crosses an interval's end is written once, with its return);
still in flight at that end, it is written with ``ts_return`` NULL (a hung rank's row, with
its arrival's stack, is in the node DB while it hangs) and remembered; when it returns, the
row is completed (``NcclRows.returns``: the writer updates it) rather than written again.
At most ``sample_max`` such rows are remembered per communicator, the newest.

Sampling keeps memory bounded whatever the rate: per communicator and interval every
call is kept while there are at most ``sample_max``; beyond that only calls whose number
is a multiple of the smallest power of two that brings the interval under the cap, plus
the last call. The stride grows online (doubling drops every other kept call), and
power-of-two strides nest, so ranks with slightly different rates keep the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ingero.trace.aggregate import Tags
from ingero.trace.decode import KIND_CALL, KIND_COMM_INIT, KIND_ENTER, KIND_EXIT, TraceEvent
from ingero.trace.ops import OP_COMM_DESTROY, OP_GROUP_END, OP_GROUP_START

DEFAULT_SAMPLE_MAX = 1024
# Calls in flight remembered per communicator: more means lost return samples (a thread
# runs one call at a time, and groups are launched at their end), so the oldest go.
MAX_INFLIGHT = 65536

CommKey = tuple[int, int]  # (pid, communicator handle)


def comm_hash_text(comm_hash: int) -> str:
    """The communicator hash as raw_events.detail carries it: 16 lowercase hex digits."""
    return f"{comm_hash:016x}"


@dataclass
class _Call:
    """One sampled collective (a future ``nccl_calls`` row)."""

    ts_enter: float
    pid: int
    tid: int
    seq: int
    op: str
    bytes: int
    ts_return: float | None = None
    ret: int | None = None
    stack_key: str | None = None  # the stack its arrival (or return) sample carried


@dataclass
class _Comm:
    pid: int
    handle: int
    hash: int
    comm_rank: int
    nranks: int
    entered_seq: int = 0
    returned_seq: int = 0
    last_enter_ts: float | None = None
    # seq → (op, entry, stack key of its arrival)
    inflight: dict[int, tuple[str, float, str | None]] = field(default_factory=dict)
    # This interval:
    calls: int = 0
    wait_ns: int = 0
    stride: int = 1
    kept: dict[int, _Call] = field(default_factory=dict)
    last: _Call | None = None
    # Sampled in the previous interval and still in flight at its end: written next close.
    pending: dict[int, _Call] = field(default_factory=dict)
    # Written in flight (ts_return NULL) and not returned since: their return completes
    # the row. Returned this interval: their completion goes out at the interval's end.
    open: dict[int, _Call] = field(default_factory=dict)
    completed: list[_Call] = field(default_factory=list)

    def sampled_call(self, seq: int) -> _Call | None:
        call = self.kept.get(seq) or self.pending.get(seq) or self.open.get(seq)
        if call is None and self.last is not None and self.last.seq == seq:
            call = self.last
        return call


@dataclass
class _Thread:
    depth: int = 0
    # Collectives the open group issued (ordered; a dict for O(1) membership).
    group: dict[tuple[CommKey, int], None] = field(default_factory=dict)
    current: tuple[CommKey, int] | None = None  # the last collective outside a group


@dataclass
class NcclRows:
    calls: list[dict[str, object]]
    comms: list[dict[str, object]]
    # Rows written earlier with ts_return NULL whose call has returned since: the key of
    # the row (pid, comm_hash, seq, ts_enter) with its ts_return and ret.
    returns: list[dict[str, object]] = field(default_factory=list)


class Collectives:
    """Fold of NCCL samples into per-communicator state; :meth:`close` ends an interval."""

    def __init__(self, sample_max: int = DEFAULT_SAMPLE_MAX) -> None:
        if sample_max < 1:
            raise ValueError("sample_max must be at least 1")
        self.sample_max = sample_max
        self._comms: dict[CommKey, _Comm] = {}
        self._retired: list[_Comm] = []  # destroyed (or their process exited) this interval
        self._threads: dict[tuple[int, int], _Thread] = {}

    # -- events ------------------------------------------------------------------------

    def feed(self, ev: TraceEvent, ts: float, stack_key: str | None = None) -> str | None:
        """One decoded sample; ``ts`` is its time in Unix seconds, ``stack_key`` the key of
        the stack it carried (written on its nccl_calls row). Returns the stack key of the
        sample's call: a collective's return carries no stack (its arrival did), so it gets
        its arrival's, while the call is still in flight here."""
        if ev.kind == KIND_ENTER:
            self.enter(ev.pid, ev.tid, ts, ev.comm, ev.comm_hash, ev.rank, ev.nranks, ev.seq,
                       ev.op, ev.bytes, stack_key)  # fmt: skip
        elif ev.kind == KIND_COMM_INIT:
            if ev.ret == 0 and ev.comm:
                self.comm_init(ev.pid, ev.comm, ev.comm_hash, ev.rank, ev.nranks)
        elif ev.kind == KIND_EXIT:
            self.exit(ev.pid)
        elif ev.kind == KIND_CALL:
            if ev.op_id == OP_GROUP_START:
                self.group_start(ev.pid, ev.tid)
            elif ev.op_id == OP_GROUP_END:
                self.group_end(ev.pid, ev.tid, ts)
            elif ev.op_id == OP_COMM_DESTROY:
                self.comm_destroy(ev.pid, ev.comm)
            elif ev.seq:
                comm = self._comms.get((ev.pid, ev.comm))
                entered = comm.inflight.get(ev.seq) if comm is not None else None
                stack_key = stack_key or (entered[2] if entered else None)
                self.leave(ev.pid, ev.tid, ts, ev.duration_ns, ev.comm, ev.comm_hash, ev.rank,
                           ev.nranks, ev.seq, ev.op, ev.bytes, ev.ret, stack_key)  # fmt: skip
        return stack_key

    def comm_init(self, pid: int, handle: int, comm_hash: int, rank: int, nranks: int) -> None:
        """A communicator was created (numbering restarts at 1 on this handle)."""
        old = self._comms.pop((pid, handle), None)
        if old is not None:
            self._retired.append(old)
        self._comms[(pid, handle)] = _Comm(pid, handle, comm_hash, rank, nranks)

    def comm_destroy(self, pid: int, handle: int) -> None:
        """Its last row is written at the interval's end, then it is forgotten."""
        comm = self._comms.pop((pid, handle), None)
        if comm is not None:
            self._retired.append(comm)

    def exit(self, pid: int) -> None:
        for key in [k for k in self._comms if k[0] == pid]:
            self._retired.append(self._comms.pop(key))
        for tkey in [k for k in self._threads if k[0] == pid]:
            del self._threads[tkey]

    def group_start(self, pid: int, tid: int) -> None:
        self._thread(pid, tid).depth += 1

    def group_end(self, pid: int, tid: int, ts: float) -> None:
        """The outermost end returns every collective the group issued on this thread."""
        thread = self._threads.get((pid, tid))
        if thread is None or thread.depth == 0:
            return  # a group begun before tracing started
        thread.depth -= 1
        if thread.depth:
            return
        group, thread.group = thread.group, {}
        for key, seq in group:
            comm = self._comms.get(key)
            if comm is not None:
                self._returned(comm, seq, ts)

    def enter(
        self, pid: int, tid: int, ts: float, handle: int, comm_hash: int, comm_rank: int,
        nranks: int, seq: int, op: str, nbytes: int, stack_key: str | None = None,
    ) -> None:  # fmt: skip
        """Collective ``seq`` entered on communicator ``handle`` at ``ts`` (its arrival),
        called from the stack ``stack_key``."""
        key = (pid, handle)
        comm = self._comms.get(key)
        if comm is None or comm.hash != comm_hash:
            # Its init was not seen (or its sample lost): the kernel knew it, so take it.
            self.comm_init(pid, handle, comm_hash, comm_rank, nranks)
            comm = self._comms[key]
        if seq <= comm.entered_seq:
            return  # already seen (its return arrived first, its arrival sample late)
        thread = self._thread(pid, tid)
        if thread.depth:
            thread.group[(key, seq)] = None
        else:
            # One call at a time per thread: the previous one returned, even if its return
            # sample was lost, so it must not look hung.
            if thread.current is not None and thread.current != (key, seq):
                prev = self._comms.get(thread.current[0])
                if prev is not None:
                    prev.inflight.pop(thread.current[1], None)
            thread.current = (key, seq)
        comm.entered_seq = seq
        comm.last_enter_ts = ts
        comm.calls += 1
        comm.inflight[seq] = (op, ts, stack_key)
        while len(comm.inflight) > MAX_INFLIGHT:
            del comm.inflight[min(comm.inflight)]
        call = _Call(ts, pid, tid, seq, op, nbytes, stack_key=stack_key)
        comm.last = call
        if seq % comm.stride == 0:
            comm.kept[seq] = call
            while len(comm.kept) > self.sample_max:
                comm.stride *= 2
                comm.kept = {s: c for s, c in comm.kept.items() if s % comm.stride == 0}

    def leave(
        self, pid: int, tid: int, ts: float, duration_ns: int, handle: int, comm_hash: int,
        comm_rank: int, nranks: int, seq: int, op: str, nbytes: int, ret: int,
        stack_key: str | None = None,
    ) -> None:  # fmt: skip
        """Collective ``seq`` returned at ``ts`` after ``duration_ns`` (host side)."""
        comm = self._comms.get((pid, handle))
        if comm is None or seq > comm.entered_seq:
            # The arrival sample was lost: the return says when it was.
            self.enter(pid, tid, ts - duration_ns / 1e9, handle, comm_hash, comm_rank, nranks,
                       seq, op, nbytes, stack_key)  # fmt: skip
            comm = self._comms[(pid, handle)]
        call = comm.sampled_call(seq)
        if call is not None:
            call.ret = ret
            call.stack_key = stack_key or call.stack_key
        thread = self._threads.get((pid, tid))
        if thread is not None and ((pid, handle), seq) in thread.group:
            return  # in flight until the group ends
        self._returned(comm, seq, ts)

    def _returned(self, comm: _Comm, seq: int, ts: float) -> None:
        entered = comm.inflight.pop(seq, None)
        if entered is None:
            return
        comm.returned_seq = max(comm.returned_seq, seq)
        comm.wait_ns += max(0, round((ts - entered[1]) * 1e9))
        call = comm.sampled_call(seq)
        if call is not None:
            call.ts_return = ts
            if comm.open.pop(seq, None) is not None:
                comm.completed.append(call)

    def _thread(self, pid: int, tid: int) -> _Thread:
        thread = self._threads.get((pid, tid))
        if thread is None:
            thread = self._threads[(pid, tid)] = _Thread()
        return thread

    # -- interval end ------------------------------------------------------------------

    def _remember_open(self, comm: _Comm, written: list[_Call]) -> None:
        """Remember the rows just written in flight, so their return completes them; forget
        those whose call left without a return sample (lost), and keep the newest
        ``sample_max`` (a thread runs one call at a time, so real jobs stay far below)."""
        comm.open = {s: c for s, c in comm.open.items() if s in comm.inflight}
        comm.open.update(
            (c.seq, c) for c in written if c.ts_return is None and c.seq in comm.inflight
        )
        for seq in sorted(comm.open)[: max(0, len(comm.open) - self.sample_max)]:
            del comm.open[seq]

    def close(self, ts_end: float, tags: Mapping[int, Tags], final: bool = False) -> NcclRows:
        """Rows for the interval ending at ``ts_end``; interval counters restart. ``final``:
        tracing stops, so the calls still in flight are written now (ts_return NULL)."""
        rows = NcclRows([], [])
        retired, self._retired = self._retired, []
        ending = [*retired, *self._comms.values()] if final else retired
        final_ids = {id(c) for c in ending}
        for comm in [*retired, *self._comms.values()]:
            tag = tags.get(comm.pid, Tags())
            base = {"pid": comm.pid, "job_id": tag.job_id, "rank": tag.rank,
                    "comm_hash": comm_hash_text(comm.hash), "comm_rank": comm.comm_rank,
                    "nranks": comm.nranks}  # fmt: skip
            sampled = dict(comm.kept)
            if comm.last is not None:
                sampled[comm.last.seq] = comm.last
            final = id(comm) in final_ids
            out = list(comm.pending.values())
            comm.pending = {}
            for seq, call in sorted(sampled.items()):
                if call.ts_return is None and seq in comm.inflight and not final:
                    comm.pending[seq] = call  # its return may come next interval
                else:
                    out.append(call)
            rows.calls.extend({**base, **_call_row(c)} for c in out)
            rows.returns.extend(_return_row(comm, c) for c in comm.completed)
            comm.completed = []
            if not final:
                self._remember_open(comm, out)
            oldest = min(comm.inflight) if comm.inflight else None
            op, since, _ = comm.inflight[oldest] if oldest is not None else (None, None, None)
            rows.comms.append(
                {
                    "ts": ts_end,
                    **base,
                    "calls": comm.calls,
                    "entered_seq": comm.entered_seq,
                    "returned_seq": comm.returned_seq,
                    "last_enter_ts": comm.last_enter_ts,
                    "inflight_seq": oldest,
                    "inflight_op": op,
                    "inflight_since": since,
                    "wait_ns": comm.wait_ns,
                    "sampled": len(sampled),
                    "dropped": comm.calls - len(sampled),
                }
            )
            comm.calls = comm.wait_ns = 0
            comm.stride = 1
            comm.kept = {}
            comm.last = None
        return rows


def _return_row(comm: _Comm, call: _Call) -> dict[str, object]:
    """The completion of a row written in flight: its key and what its return brought."""
    return {"pid": comm.pid, "comm_hash": comm_hash_text(comm.hash), "seq": call.seq,
            "ts_enter": call.ts_enter, "ts_return": call.ts_return, "ret": call.ret}  # fmt: skip


def _call_row(call: _Call) -> dict[str, object]:
    return {
        "ts_enter": call.ts_enter,
        "ts_return": call.ts_return,
        "tid": call.tid,
        "seq": call.seq,
        "op": call.op,
        "bytes": call.bytes,
        "ret": call.ret,
        "stack_key": call.stack_key,
    }
