"""Fleet judges where an NCCL communicator stopped: ``collective_hang`` (ranks never
entered the collective the others wait in, past ``nccl.hang_after``) and ``collective_wait``
(the communicator stopped at one collective for ``nccl.wait_after``: the ranks behind it, or
every rank stopped at it). Pure: no I/O, no lock; the tick of
:class:`ingero.fleet.collectives.CollectiveJoin` calls it per communicator (the rules are in
that module's docstring).

Its own room: a stop is judged from each rank's last report (entered, returned, in flight),
not from the joined collectives the lag is judged on; the join, the lag episodes and the
tick that gathers both stay in :mod:`ingero.fleet.collectives`.
"""

from __future__ import annotations

from ingero.fleet.communicator import DETECTION_MODE, Comm, Hang, NcclNamed, RankState, Wait
from ingero.fleet.config import NcclConfig
from ingero.fleet.model import NodeKey
from ingero.otlp.collectives import CommReport
from ingero.schema.events import Event, new_event_id

# A collective_hang names at most this many ranks and nodes per list (a count says how many).
MAX_NAMED = 64


def judge_hang(comm: Comm, cfg: NcclConfig, now: float) -> list[Event]:
    """Open, keep or end the communicator's hang (module docstring of
    :mod:`ingero.fleet.collectives`, ``collective_hang``)."""
    top = max(st.report.entered_seq for st in comm.view.values())
    # Ranks that entered the highest collective and have entered nothing since, with
    # when they entered it (Fleet's clock), and of those the ones still inside the
    # call. Real NCCL returns once the collective is enqueued on the GPU stream, so a
    # rank waiting for a peer that never comes is not inside the call but in a later
    # stream sync: having entered N and nothing after is what a waiting rank shows.
    arrived: dict[int, float] = {}
    blocked: set[int] = set()
    for rank, st in comm.view.items():
        if st.report.entered_seq != top:
            continue
        since_ns = _inside_since(st.report, top)
        if since_ns is not None:
            blocked.add(rank)
        else:
            since_ns = st.report.last_enter_ns
        if since_ns:
            arrived[rank] = (since_ns + st.offset_ns) / 1e9
    missing = [
        r for r in range(comm.nranks) if r not in comm.view or comm.view[r].report.entered_seq < top
    ]
    # Every rank at N is a hang only when every rank is still inside the call: ranks
    # that entered N, returned and entered nothing since may as well be computing
    # (evaluation, a checkpoint) as waiting, and cannot be told apart from here.
    all_inside = not missing and len(blocked) == comm.nranks
    events: list[Event] = []
    hang = comm.hang
    if hang is not None and (hang.seq != top or not (missing or all_inside)):
        comm.hang = None
        events.append(hang_end(comm, hang, now, "moved_on"))
    if not arrived or comm.hang is not None or top == 0 or not (missing or all_inside):
        return events
    inside_for = now - min(arrived.values())
    if inside_for < float(cfg.hang_after):
        return events
    op = next(
        (
            st.report.inflight_op
            for st in comm.view.values()
            if st.report.inflight_seq == top and st.report.inflight_op
        ),
        _op_of(comm, top),
    )
    comm.hang = Hang(new_event_id(), top, op, now - inside_for, missing)
    events.append(_hang_start(comm, comm.hang, arrived, blocked, now))
    return events


def judge_wait(comm: Comm, cfg: NcclConfig, now: float) -> list[Event]:
    """Open, keep or end the communicator's wait (module docstring of
    :mod:`ingero.fleet.collectives`, ``collective_wait``)."""
    found = _stopped_at(comm, cfg)
    wait = comm.wait
    events: list[Event] = []
    if wait is not None and (found is None or (found[0], found[2]) != (wait.seq, wait.missing)):
        comm.wait = None
        events.append(wait_event(comm, wait, now, "end", reason="moved_on"))
    if found is None or comm.wait is not None:
        return events
    seq, since, missing = found
    waiting = sorted(r for r in comm.view if r not in missing)
    comm.wait = Wait(new_event_id(), seq, _op_of(comm, seq), since, missing, waiting)
    events.append(wait_event(comm, comm.wait, now, "start"))
    return events


def _stopped_at(comm: Comm, cfg: NcclConfig) -> tuple[int, float, list[int]] | None:
    """(seq, since, the ranks behind it) when the communicator has stopped at collective
    ``seq``: ranks that have not entered it, each as of a report taken at least
    ``nccl.wait_after`` after another rank entered it (they hold the others back), or,
    none behind, every rank as of a report ``wait_after`` past its last entry and its
    node quiet (every rank stopped at it). None otherwise (and while a rank of the
    communicator has not reported)."""
    view = comm.view
    if len(view) < comm.nranks:
        return None
    after = float(cfg.wait_after)
    entered = {r: st.report.entered_seq for r, st in view.items()}
    low, high = min(entered.values()), max(entered.values())
    if high == 0:
        return None
    if low < high:
        seq = low + 1
        arrivals = [_entry_s(st, seq) for st in view.values() if st.report.entered_seq >= seq]
        front = min(arrivals)
        behind = sorted(r for r, e in entered.items() if e == low)
        if all(view[r].as_of - front >= after for r in behind):
            return seq, front, behind
        return None
    lasts = [_entry_s(st, low) for st in view.values()]
    if all(
        st.quiet and st.as_of - last >= after for st, last in zip(view.values(), lasts, strict=True)
    ):
        return low, max(lasts), []
    return None


def name_wait(
    comm: Comm,
    named: dict[NodeKey, NcclNamed],
    waiting: dict[NodeKey, dict[str, object]],
) -> None:
    """The nodes the wait names: those of the ranks behind (their replies name the wait,
    as a hang's do) and those of the ranks that wait (their replies say for whom)."""
    wait = comm.wait
    assert wait is not None
    missing_nodes = sorted({comm.view[r].node_id for r in wait.missing if r in comm.view})
    for rank in wait.missing:
        st = comm.view.get(rank)
        if st is not None:
            named[(comm.cluster_id, st.node_id)] = NcclNamed(
                "collective_wait", wait.event_id, wait.since, wait.op, wait.seq
            )
    said: dict[str, object] = {
        "event_id": wait.event_id,
        "comm_hash": comm.comm_hash,
        "op": wait.op or "collective",
        "seq": wait.seq,
        "since": wait.since,
        "ranks": _named(wait.missing),
        "nodes": _named(missing_nodes),
    }
    for rank in wait.waiting:
        st = comm.view.get(rank)
        if st is not None:
            waiting.setdefault((comm.cluster_id, st.node_id), said)


def _entry_s(st: RankState, seq: int) -> float:
    """When the rank entered collective ``seq`` on Fleet's clock (s): its sampled call, else
    its last entry (a later one, when it entered more since)."""
    for call_seq, _, entered_ns in st.ops:
        if call_seq == seq:
            return entered_ns / 1e9
    last = st.report.last_enter_ns
    return (last + st.offset_ns) / 1e9 if last else st.as_of


def wait_event(comm: Comm, wait: Wait, now: float, state: str, **more: object) -> Event:
    """A ``collective_wait`` start or end: the collective the communicator stopped at, the
    ranks (and nodes) it waits for, or none when every rank stopped at it."""
    missing_nodes = sorted({comm.view[r].node_id for r in wait.missing if r in comm.view})
    waiting_nodes = sorted({comm.view[r].node_id for r in wait.waiting if r in comm.view})
    extra: dict[str, object] = {
        "state": state,
        "group": comm.group,
        "comm_hash": comm.comm_hash,
        "nranks": comm.nranks,
        "seq": wait.seq,
        "op": wait.op,
        "missing_ranks": _named(wait.missing),
        "missing_count": len(wait.missing),
        "missing_nodes": _named(missing_nodes),
        "waiting_ranks": _named(wait.waiting),
        "waiting_count": len(wait.waiting),
        "waiting_nodes": _named(waiting_nodes),
        "since": wait.since,
        "waiting_for_s": round(now - wait.since, 3),
    }
    if state == "start":
        extra["reason"] = (
            "missing_ranks"
            if wait.missing
            else "all_ranks_waiting: not a rank (network, NVLink or a GPU)"
        )
    extra.update(more)
    if state == "end":
        extra["duration_s"] = round(now - wait.since, 3)
    return _comm_event(comm, "collective_wait", wait.event_id, missing_nodes, now, extra)


def _comm_event(
    comm: Comm,
    kind: str,
    event_id: str,
    missing_nodes: list[str],
    now: float,
    extra: dict[str, object],
) -> Event:
    """A job-level NCCL event: its node is the first missing one ("" when none is)."""
    return Event(
        type=kind,
        node_id=missing_nodes[0] if missing_nodes else "",
        cluster_id=comm.cluster_id,
        timestamp=now,
        event_id=event_id,
        job_id=comm.job_id,
        detection_mode=DETECTION_MODE,
        extra=extra,
    )


def _inside_since(report: CommReport, top: int) -> int | None:
    """When the rank entered collective ``top`` and is still inside it (node ns), or None."""
    if report.inflight_seq == top and report.inflight_since_ns:
        return report.inflight_since_ns
    if report.entered_seq == top and report.returned_seq < top and report.last_enter_ns:
        return report.last_enter_ns
    return None


def _op_of(comm: Comm, seq: int) -> str:
    for st in comm.view.values():
        for call_seq, op, _ in st.ops:
            if call_seq == seq:
                return op
    return comm.rows[-1].op if comm.rows else ""


def _named(values: list[int] | list[str]) -> list[int] | list[str]:
    return values[:MAX_NAMED]


def _hang_event(comm: Comm, hang: Hang, now: float, state: str, **more: object) -> Event:
    """A ``collective_hang`` start or end: the communicator, the collective, the wavefront
    (ranks and nodes that never entered it), and ``more`` of the state's own fields."""
    missing_nodes = sorted({comm.view[r].node_id for r in hang.missing if r in comm.view})
    return _comm_event(
        comm,
        "collective_hang",
        hang.event_id,
        missing_nodes,
        now,
        {
            "state": state,
            "group": comm.group,
            "comm_hash": comm.comm_hash,
            "nranks": comm.nranks,
            "seq": hang.seq,
            "op": hang.op,
            "missing_ranks": _named(hang.missing),
            "missing_count": len(hang.missing),
            "missing_nodes": _named(missing_nodes),
            **more,
        },
    )


def _hang_start(
    comm: Comm, hang: Hang, arrived: dict[int, float], blocked: set[int], now: float
) -> Event:
    inside_ranks = sorted(arrived)
    return _hang_event(
        comm,
        hang,
        now,
        "start",
        # the ranks that entered collective N (and nothing since): the ones waiting
        inside_ranks=_named(inside_ranks),
        inside_count=len(inside_ranks),
        # of those, the ones still inside the NCCL call; the others returned at enqueue,
        # as real NCCL does, and wait in a stream sync
        in_call_count=len(blocked),
        inside_for_s=round(now - hang.since, 3),
        reason="missing_ranks"
        if hang.missing
        else "all_ranks_inside: not a rank (network, NVLink or a GPU)",
    )


def hang_end(comm: Comm, hang: Hang, now: float, reason: str) -> Event:
    return _hang_event(
        comm, hang, now, "end", reason=reason, since=hang.since, duration_s=now - hang.since
    )
