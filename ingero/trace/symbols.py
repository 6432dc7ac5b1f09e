"""Choose the symbols to attach: one per address, so aliases are never counted twice.

NCCL exports ``ncclX`` and ``pncclX`` at the same address, and a library may alias one
entry point under several names; two uprobes at one address would count every call twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ingero.trace.ops import Op

# name → address (file offset) of each function symbol in a library.
SymbolTable = Mapping[str, int]


@dataclass(frozen=True)
class Attachment:
    op_id: int
    op: Op
    symbol: str
    address: int


def select(ops: Sequence[tuple[int, Op]], table: SymbolTable) -> list[Attachment]:
    """For each op, the symbols present in ``table``, keeping the first symbol per address."""
    taken: set[int] = set()
    out = []
    for op_id, op in ops:
        for symbol in op.symbols:
            address = table.get(symbol)
            if address is None or address in taken:
                continue
            taken.add(address)
            out.append(Attachment(op_id, op, symbol, address))
    return out


def bcc_symbol_table(bpf_class: Any, path: str) -> dict[str, int]:
    """The function symbols of ``path`` as BCC's ELF reader sees them (name → address)."""
    enumerate_fn: Callable[[bytes, bytes], list[tuple[bytes, int]]] = (
        bpf_class.get_user_functions_and_addresses
    )
    table: dict[str, int] = {}
    for raw, address in enumerate_fn(path.encode(), rb"^p?(cuda|cu|nccl)[A-Z]"):
        name = raw.decode(errors="replace").split("@", 1)[0]
        table.setdefault(name, address)
    return table
