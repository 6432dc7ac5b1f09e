"""symbols.select: one probe per address, so NCCL's ncclX/pncclX aliases count once."""

from __future__ import annotations

from ingero.trace.ops import CUDART, NCCL, OPS, ops_for_lib
from ingero.trace.symbols import select


def test_aliases_at_one_address_are_attached_once() -> None:
    table = {"ncclAllReduce": 0x100, "pncclAllReduce": 0x100, "ncclSend": 0x200,
             "pncclSend": 0x200, "ncclCommInitRank": 0x300, "ncclCommInitRankConfig": 0x300}  # fmt: skip
    chosen = select(ops_for_lib(NCCL), table)
    addresses = [a.address for a in chosen]
    assert len(addresses) == len(set(addresses)) == 3
    assert {a.symbol for a in chosen} == {"ncclAllReduce", "ncclSend", "ncclCommInitRank"}


def test_per_thread_variants_fold_into_the_base_op() -> None:
    table = {"cudaMemcpyAsync": 0x10, "cudaMemcpyAsync_ptsz": 0x20, "cudaMalloc": 0x30}
    chosen = select(ops_for_lib(CUDART), table)
    names = {(a.op.name, a.symbol) for a in chosen}
    assert names == {("cudaMemcpyAsync", "cudaMemcpyAsync"),
                     ("cudaMemcpyAsync", "cudaMemcpyAsync_ptsz"), ("cudaMalloc", "cudaMalloc")}  # fmt: skip


def test_missing_symbols_are_skipped() -> None:
    assert select(ops_for_lib(CUDART), {"somethingElse": 1}) == []


def test_op_table_is_consistent() -> None:
    names = [op.name for op in OPS]
    assert len(names) == len(set(names))
    symbols = [s for op in OPS for s in op.symbols]
    assert len(symbols) == len(set(symbols))
    for op in OPS:
        for arg in (op.bytes_arg, op.count_arg, op.dtype_arg, op.comm_arg):
            assert 0 <= arg <= 7
        assert bool(op.count_arg) == bool(op.dtype_arg)
